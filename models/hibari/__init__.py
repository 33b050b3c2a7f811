"""The embedded CPU voice (hibari-tts). Importing this package does not load the model."""

from __future__ import annotations

from models.hibari.backend import HibariBackend, available_voices

__all__ = ["HibariBackend", "available_voices"]

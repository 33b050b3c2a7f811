"""Build the backend an ``EngineConfig`` names. Imports are lazy: torch loads only for LM models."""

from __future__ import annotations

from engine.backend import Backend
from engine.config import EngineConfig

__all__ = ["build_backend"]


def build_backend(config: EngineConfig) -> Backend:
    """Construct (load and warm up) the backend. Raises with a clear message on failure."""
    if config.model == "hibari":
        from models.hibari.backend import HibariBackend

        return HibariBackend(threads=config.hibari_threads)
    if config.model == "synthetic":
        from engine.synthetic import SyntheticBackend

        return SyntheticBackend(realtime=config.synthetic_realtime,
                                clone_voices=config.synthetic_cloning)
    from engine.llm.build import build_orpheus_backend

    model = "canopylabs/orpheus-3b-0.1-ft" if config.model == "orpheus" else config.model
    return build_orpheus_backend(model, config=config)

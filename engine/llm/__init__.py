"""The LM serving engine: page allocator, scheduler, attention backends, model runner, sampler,
model programs and ``LMBackend``. Import the submodules you need; this package imports nothing."""

from __future__ import annotations

__all__: list[str] = []

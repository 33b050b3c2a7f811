"""Build the backend an ``EngineConfig`` names (``models.registry``). Imports are lazy: torch
loads only for LM programs."""

from __future__ import annotations

from engine.backend import Backend
from engine.config import EngineConfig

__all__ = ["build_backend", "hibari_backend", "synthetic_backend"]


def hibari_backend(config: EngineConfig) -> Backend:
    from models.hibari.backend import HibariBackend

    return HibariBackend(threads=config.hibari_threads)


def synthetic_backend(config: EngineConfig) -> Backend:
    from engine.synthetic import SyntheticBackend

    return SyntheticBackend(realtime=config.synthetic_realtime,
                            clone_voices=config.synthetic_cloning)


def build_backend(config: EngineConfig) -> Backend:
    """Construct (load and warm up) the backend. Raises with a clear message on failure."""
    from models.registry import check_requirements, load_factory, resolve

    resolved = resolve(config.model)
    check_requirements(resolved)
    factory = load_factory(resolved.entry)
    if resolved.entry.kind == "backend":
        return factory(config)
    from engine.llm.build import build_lm_backend

    return build_lm_backend(factory, resolved.model_id, config=config)

"""Helpers the model program tests share: drive an LMBackend job by job and record the token rows
its program is given."""

from __future__ import annotations

from typing import Any

import numpy as np

__all__ = ["add_job", "audio_of", "drain", "record_rows"]


def record_rows(backend: Any) -> dict[int, list[list[int]]]:
    """A fresh dict: job tag -> the token rows the program is given from now on."""
    program = backend.program
    if not hasattr(program, "_test_rows"):
        real, real_new = program.launch_postprocess, program.new_state
        tags: dict[int, int] = {}

        def launch(states, tokens):  # noqa: ANN001, ANN202
            for st, row in zip(states, tokens):
                program._test_rows.setdefault(tags[id(st)], []).append(list(row))
            return real(states, tokens)

        def new_state(voice, options):  # noqa: ANN001, ANN202
            st = real_new(voice, options)
            tags[id(st)] = options["tag"]
            return st

        program.launch_postprocess, program.new_state = launch, new_state
    program._test_rows = {}
    return program._test_rows


def add_job(backend: Any, job: int, text: str, options: dict[str, Any], voice: str | None = None) -> None:
    """Validate ``options`` (a ``tag`` among them is ignored) and add the job, tagged ``job``."""
    v, opts = backend.validate(voice, {k: x for k, x in options.items() if k != "tag"})
    opts["tag"] = job
    backend.add_job(job, text, v, opts)


def drain(backend: Any, outs: list | None = None, max_steps: int = 5000) -> list:
    """Step until the backend has no work; its outputs appended to ``outs``."""
    outs = [] if outs is None else outs
    for _ in range(max_steps):
        if not backend.has_work():
            return outs
        outs.extend(backend.step())
    raise AssertionError("backend did not finish")


def audio_of(outs: list, job: int) -> np.ndarray:
    """A job's audio, its outputs' samples end to end."""
    parts = [o.pcm for o in outs if o.job_id == job and o.pcm is not None and o.pcm.size]
    return np.concatenate(parts) if parts else np.zeros(0, np.float32)

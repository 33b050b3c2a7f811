"""Helpers for the tests of the served VoxCPM2 program: a backend, jobs tagged and driven to the
end, and what each job's sequence produced (its patches as the head wrote them, its audio)."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch


def backend(model: str = "tiny", **kw: Any) -> Any:
    from models.voxcpm2.build import build_voxcpm2_backend

    kw.setdefault("load_format", "dummy")
    kw.setdefault("max_num_seqs", 8)
    kw.setdefault("max_model_len", 512)
    return build_voxcpm2_backend(model, device="cpu", warmup=False, **kw)


def record(b: Any) -> dict[int, list[torch.Tensor]]:
    """A fresh dict: job tag -> the patches [P, D] its sequence generates from now on, read where
    the decoder reads them as the program is given each one (the stop patch at ``launch_finish``)."""
    program = b.program
    if not hasattr(program, "_test_patches"):
        real_post, real_finish, real_new = program.launch_postprocess, program.launch_finish, program.new_state
        tags: dict[int, int] = {}

        def read(states: list[Any], before: list[int]) -> None:
            for st, n in zip(states, before):
                for i in range(n, st.num_patches):
                    patch = program.decoder.patch(st.chunks, i).clone()
                    program._test_patches.setdefault(tags[id(st)], []).append(patch)

        def post(states, tokens):  # noqa: ANN001, ANN202
            before = [st.num_patches for st in states]
            for st, tok in zip(states, tokens):
                assert tok[1] == st.num_patches, "column 1 is the patch index"
            out = real_post(states, tokens)
            read(states, before)
            return out

        def finish(states):  # noqa: ANN001, ANN202
            before = [st.num_patches for st in states]
            out = real_finish(states)
            read(states, before)
            return out

        def new_state(voice, options):  # noqa: ANN001, ANN202
            st = real_new(voice, options)
            tags[id(st)] = options["tag"]
            return st

        program.launch_postprocess, program.launch_finish, program.new_state = post, finish, new_state
    program._test_patches = {}
    return program._test_patches


def add(b: Any, job: int, text: str, options: dict[str, Any], voice: str | None = None) -> None:
    v, opts = b.validate(voice, options)
    opts["tag"] = job
    b.add_job(job, text, v, opts)


def drain(b: Any, outs: list | None = None, max_steps: int = 2000) -> list:
    outs = [] if outs is None else outs
    for _ in range(max_steps):
        if not b.has_work():
            return outs
        outs.extend(b.step())
    raise AssertionError("backend did not finish")


def audio(outs: list, job: int) -> np.ndarray:
    parts = [o.pcm for o in outs if o.job_id == job and o.pcm is not None and o.pcm.size]
    return np.concatenate(parts) if parts else np.zeros(0, np.float32)


def run(b: Any, text: str, options: dict[str, Any], *, job: int = 1, voice: str | None = None
        ) -> tuple[torch.Tensor, np.ndarray]:
    """One job alone to its end: (its patches [T, P, D], its audio)."""
    patches = record(b)
    add(b, job, text, options, voice)
    outs = drain(b)
    assert not [o.error for o in outs if o.error is not None]
    assert [o.job_id for o in outs if o.is_finished] == [job]
    return torch.stack(patches[job]), audio(outs, job)


def whole_decode(b: Any, patches: torch.Tensor, context: torch.Tensor | None = None) -> np.ndarray:
    """The VAE's whole (not streamed) decode of ``patches`` [T, P, D] after ``context``, cut."""
    vae, c = b.program.vae, b.program.config
    z = patches if context is None else torch.cat((context, patches))
    with torch.no_grad():
        wav = vae.decode(z.reshape(-1, z.shape[-1]).T[None])[0]
    return wav[(0 if context is None else len(context)) * c.patch_samples:].numpy()

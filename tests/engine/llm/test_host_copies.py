"""The detector of host-blocking writes (tests/engine/llm/host_copies.py) finds what it must."""

from __future__ import annotations

import pytest
import torch
from tests.engine.llm.host_copies import HostCopies


def test_a_scalar_stored_by_index_is_found_and_a_fill_is_not() -> None:
    t = torch.zeros(4, dtype=torch.int64)
    with HostCopies() as found:
        t[2] = 5
    assert found.found == [()]
    with HostCopies() as found:
        t[2].fill_(5)
        t[0:2].copy_(t[2:4])  # tensor to tensor
    assert found.found == [] and t.tolist() == [5, 0, 5, 0]


PROGRAM_HOOKS = ("bind_slot", "next_input", "flush_inputs", "launch_postprocess", "launch_finish", "allowed_row",
                 "push_text", "release")


@pytest.mark.parametrize("model", ["kyutai-tts-tiny", "voxcpm2-tiny", "qwen3-tts-tiny", "csm-tiny", "tiny"])
def test_no_program_hook_blocks_the_host_on_a_copy(model: str) -> None:
    """What the runtime calls on a program between steps (binding a slot, a row's input, its
    audio) stores no host value with a blocking copy: on CUDA each would wait for the step in
    flight (a scalar stored by index: ``t[i] = v``; use ``t[i].fill_(v)``). The model's forward
    is left out: on CUDA it runs in captured graphs."""
    from engine.llm.build import build_lm_backend
    from models.registry import load_factory, resolve

    resolved = resolve(model)
    backend = build_lm_backend(load_factory(resolved.entry), resolved.model_id, device="cpu", load_format="dummy",
                               max_model_len=1024, max_waiting=8, max_num_seqs=4, async_steps="on", warmup=False)
    program = backend.program
    found: list[tuple[str, tuple[int, ...]]] = []
    calls: dict[str, int] = {}
    for name in PROGRAM_HOOKS:
        fn = getattr(program, name, None)
        if fn is None:
            continue

        def watched(*args, _fn=fn, _name=name, **kwargs):
            calls[_name] = calls.get(_name, 0) + 1
            with HostCopies() as hc:
                out = _fn(*args, **kwargs)
            found.extend((_name, shape) for shape in hc.found)
            return out
        setattr(program, name, watched)
    backend._flush_inputs = getattr(program, "flush_inputs", None)  # (bound at build)
    voice, options = backend.validate(None, {"max_tokens": 40, "seed": 1})
    for job in range(2):
        backend.add_job(job, "Hello there, this is a test.", voice, options)
        if backend.info.input_streaming:
            backend.push_text(job, "", final=True)
    for _ in range(12):
        backend.step()
    assert calls.get("launch_postprocess", 0) > 0 and found == [], (calls, found)

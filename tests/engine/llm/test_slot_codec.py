"""``SlotCodec`` on the CPU: a step's slots and frame codes reach the codec stream as tensors
(whatever sequences the runner gave), fresh slots are reset first, and each row's audio comes
back as its own float32 row."""

from __future__ import annotations

import numpy as np
import torch

from engine.llm.slot_codec import SlotCodec


class _Stream:
    scratch_slot = 7

    def __init__(self) -> None:
        self.calls: list[tuple[str, list]] = []

    def reset(self, slots: torch.Tensor) -> None:
        self.calls.append(("reset", slots.tolist()))

    def step(self, slots: torch.Tensor, codes: torch.Tensor) -> torch.Tensor:
        assert slots.dtype == codes.dtype == torch.int64 and codes.shape == (slots.shape[0], 3)
        self.calls.append(("step", [slots.tolist(), codes.tolist()]))
        # a row's audio: its slot, then its codes, as bf16 (the codec's dtype on a GPU)
        return torch.cat([slots[:, None], codes], dim=1).to(torch.bfloat16)


def test_a_steps_rows_go_in_as_tensors_and_come_back_as_float32_rows() -> None:
    stream = _Stream()
    codec = SlotCodec(stream, num_codes=3, device="cpu")
    collect = codec.launch([4, 1], [(5, 6, 7), [8, 9, 10]], fresh=[1])
    assert stream.calls == [("reset", [1]), ("step", [[4, 1], [[5, 6, 7], [8, 9, 10]]])]
    rows = collect()
    assert [r.tolist() for r in rows] == [[4, 5, 6, 7], [1, 8, 9, 10]]
    assert all(isinstance(r, np.ndarray) and r.dtype == np.float32 and r.ndim == 1 for r in rows)


def test_no_rows_no_call() -> None:
    stream = _Stream()
    assert SlotCodec(stream, num_codes=3, device="cpu").launch([], [])() == []
    assert stream.calls == []


def test_clip_bounds_every_row_to_one_and_leaves_the_codecs_output_as_it_was() -> None:
    """``clip=True`` (CSM, Kyutai: Mimi may overshoot) gives samples within [-1, 1], clamped once
    over the batch; without it the samples come as the codec made them."""
    stream = _Stream()
    codec = SlotCodec(stream, num_codes=3, device="cpu")
    assert [r.tolist() for r in codec.launch([0, 2], [(-3, 0, 1), (1, 2, -1)], clip=True)()] == [
        [0, -1, 0, 1], [1, 1, 1, -1]]
    assert [r.tolist() for r in codec.launch([0, 2], [(-3, 0, 1), (1, 2, -1)])()] == [[0, -3, 0, 1], [2, 1, 2, -1]]

"""A program's per-slot streaming codec, run for it: one frame per row, all rows in one call.

``SlotCodec`` resets starting slots, decodes a step's frames in one batched call (a CUDA graph
per batch bucket) on its own CUDA stream, overlapping the next LM step, and ``collect()``
gives each row's float32 samples.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np
import torch

__all__ = ["FRAME_CODEC_BUCKETS", "SlotCodec"]

# Every stream decodes a frame each step, so the codec's batches follow the decode rows'.
FRAME_CODEC_BUCKETS: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 48, 64, *range(96, 513, 32), *range(576, 4097, 64))


def _rows(out: torch.Tensor) -> list[np.ndarray]:
    """A host [N, S] tensor's rows as numpy views (one conversion, not one a row)."""
    return list(out.numpy())


class SlotCodec:
    """``stream``'s per-slot ``step`` over a step's rows; see the module docstring."""

    def __init__(self, stream: Any, *, num_codes: int, device: torch.device | str) -> None:
        self.stream = stream
        self.num_codes = num_codes
        self.device = torch.device(device)
        self.graphs: Any = None  # engine.llm.cuda_graphs.BatchGraphs once captured
        self._cuda_stream = torch.cuda.Stream(self.device) if self.device.type == "cuda" else None

    def capture(self, max_rows: int, *, buckets: Sequence[int] = FRAME_CODEC_BUCKETS,
                desc: str = "codec graphs") -> None:
        """A CUDA graph of ``stream.step`` per batch bucket up to ``max_rows`` (inputs: slot + 1,
        0 being a padding row that the step sends to the scratch slot, and the frame's codes)."""
        from engine.llm.cuda_graphs import BatchGraphs

        stream, scratch = self.stream, self.stream.scratch_slot

        def step(slot1: torch.Tensor, codes: torch.Tensor) -> torch.Tensor:
            slots = torch.where(slot1 > 0, slot1 - 1, torch.full_like(slot1, scratch))
            return stream.step(slots, codes).float()

        sizes = [b for b in buckets if b <= max_rows] or [max_rows]
        graphs = BatchGraphs(step, [((), torch.int64), ((self.num_codes,), torch.int64)], buckets=sizes,
                             device=self.device)
        graphs.capture(desc=desc)
        self.graphs = graphs

    @contextlib.contextmanager
    def _on_codec_stream(self) -> Iterator[None]:
        if self._cuda_stream is None:
            yield
        else:
            with torch.cuda.stream(self._cuda_stream):
                yield

    def launch(self, slots: Sequence[int], codes: Sequence[Sequence[int]],
               fresh: Sequence[int] = (), *, clip: bool = False) -> Callable[[], list[np.ndarray]]:
        """Decode one frame per row (``codes[i]`` in slot ``slots[i]``), the ``fresh`` slots reset
        first; the returned call gives each row's audio (float32 [S]), within [-1, 1] if ``clip``
        (one clamp over the batch on the device, not one a row on the host)."""
        if not slots:
            return lambda: []
        dev = self.device
        with self._on_codec_stream():
            if fresh:
                self.stream.reset(torch.tensor(list(fresh), dtype=torch.int64).to(dev, non_blocking=True))
            # (numpy builds the host arrays: a tensor from nested lists costs ~3 us a row more)
            s = torch.from_numpy(np.asarray(slots, dtype=np.int64)).to(dev, non_blocking=True)
            c = torch.from_numpy(np.asarray(codes, dtype=np.int64).reshape(len(slots), -1)).to(dev, non_blocking=True)  # [N, C]
            if self.graphs is not None:
                from engine.llm.host_copy import start_host_copy

                waits = []
                largest = self.graphs.max_batch_size
                for i in range(0, len(slots), largest):
                    (out,) = self.graphs.run(s[i:i + largest] + 1, c[i:i + largest])
                    if clip:
                        out = out.clamp(-1.0, 1.0)
                    waits.append(start_host_copy(out))  # before a later replay overwrites it
                return lambda: [row for wait in waits for row in _rows(wait())]
            with torch.inference_mode():
                out = self.stream.step(s, c).float().cpu()  # [N, S]
                if clip:
                    out = out.clamp(-1.0, 1.0)
        return lambda: _rows(out)

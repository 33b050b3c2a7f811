"""``StreamingSnac.step`` replayed from CUDA graphs per batch bucket (eager on the CPU).

Each step, every stream that completed a frame (or is flushing) contributes one row, all decoded
in one replay and copied to the host once; padding rows carry slot index 0 (inputs hold
``slot + 1``), which maps to the pool's scratch slot, and are fully masked.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
import torch

from engine.llm.cuda_graphs import STREAM_CODEC_BUCKETS, BatchGraphs
from engine.llm.host_copy import start_host_copy
from models.orpheus.snac_stream import StreamingSnac
from models.orpheus.tokens import SAMPLES_PER_FRAME, TOKENS_PER_FRAME

__all__ = ["StreamingCodecGraphs", "CodecRow"]

CodecRow = tuple[int, Sequence[int], int]  # (slot, 7 per-position codes, end_frames)


class StreamingCodecGraphs:
    """Batched streaming SNAC steps: CUDA graphs on a CUDA device, eager elsewhere.

    ``buckets`` above ``snac.max_streams`` are dropped, and ``max_streams`` is added as the
    largest bucket when the given ones stop short of it, so one replay always holds every
    stream. ``capture=False`` (or a CPU device) runs ``StreamingSnac.step`` eagerly.

    ``compile``: None keeps ``snac`` as built; True / False switches its ``torch.compile``
    path on or off (``StreamingSnac.use_compile``; True needs ``channels_last=True``) before
    capture. Compiled, the first bucket's warm-up compiles one dynamic-batch graph (tens of
    seconds on a GPU host) that every bucket then reuses.
    """

    def __init__(self, snac: StreamingSnac, *, buckets: Sequence[int] = STREAM_CODEC_BUCKETS,
                 capture: bool = True, progress: bool = True, compile: bool | None = None) -> None:
        if compile is not None:
            snac.use_compile(compile)
        self.snac = snac
        self.device = snac.device
        sizes = sorted({b for b in buckets if 1 <= b <= snac.max_streams})
        if not sizes or sizes[-1] < snac.max_streams:
            sizes.append(snac.max_streams)
        self.buckets = tuple(sizes)
        self._graphs: BatchGraphs | None = None
        if capture and self.device.type == "cuda":
            i64 = torch.int64
            specs = [((), i64), ((TOKENS_PER_FRAME,), i64), ((), i64)]
            self._graphs = BatchGraphs(self._graph_step, specs, buckets=self.buckets, device=self.device)
            self._graphs.capture(progress=progress, desc="streaming codec graphs")

    @property
    def is_graphed(self) -> bool:
        return self._graphs is not None

    @property
    def rows_replayed(self) -> int:
        """Rows the graph replays computed since start, padding included (0 when eager)."""
        return self._graphs.rows_replayed if self._graphs is not None else 0

    def _graph_step(self, slot1: torch.Tensor, frames: torch.Tensor, end_frames: torch.Tensor) -> torch.Tensor:
        slots = (slot1 - 1).remainder(self.snac.max_streams + 1)  # padding (0) -> scratch slot
        return self.snac.step(slots, frames, end_frames)

    def reset(self, slots: Sequence[int]) -> None:
        """Zero the state of ``slots`` (a new stream takes them); device work, no sync."""
        if slots:
            self.snac.reset(torch.tensor(list(slots), dtype=torch.int64).to(self.device, non_blocking=True))

    def step(self, slots: torch.Tensor, frames: torch.Tensor, end_frames: torch.Tensor) -> torch.Tensor:
        """Device rows in (slots [n], frames [n, 7], end_frames [n]) -> device audio [n, 2048].

        Graphed: the result may be a view of a graph's output buffer; consume it before the
        next call.
        """
        if self._graphs is None:
            return self.snac.step(slots, frames, end_frames)
        n = slots.shape[0]
        largest = self._graphs.max_batch_size
        outs = []
        for i in range(0, n, largest):
            (audio,) = self._graphs.run(slots[i:i + largest] + 1, frames[i:i + largest], end_frames[i:i + largest])
            outs.append(audio if n <= largest else audio.clone())
        return outs[0] if len(outs) == 1 else torch.cat(outs)

    def decode(self, rows: Sequence[CodecRow]) -> np.ndarray:
        """One step for each row (slot, codes, end_frames): host float32 audio [n, 2048].

        Row i's audio is at the positions ``StreamingSnac.step`` documents (``StreamCursor``
        says which part to emit). One host-to-device copy of the inputs, one copy back.
        """
        return self.launch(rows)()

    def launch(self, rows: Sequence[CodecRow]) -> Callable[[], np.ndarray]:
        """``decode`` started on the device (current CUDA stream); the returned call waits."""
        if not rows:
            return lambda: np.zeros((0, SAMPLES_PER_FRAME), dtype=np.float32)
        dev = self._rows_to_device(rows)  # [n, 9]
        wait = start_host_copy(self.step(dev[:, 0], dev[:, 2:], dev[:, 1]))  # [n, 2048]
        return lambda: wait().float().numpy()

    def flush(self, rows: Sequence[tuple[int, int]], num_steps: int | None = None) -> np.ndarray:
        """Finished streams (slot, end_frames): ``num_steps`` (default ``snac.num_flush_steps``)
        flush steps in a row -> host audio [n, num_steps * 2048], one copy back.

        Step k's samples are columns ``[k * 2048, (k + 1) * 2048)``; ``StreamCursor.flush()``
        gives each step's range to emit. Flushing at finish, in the finishing engine step,
        frees the slot at once for the next stream.
        """
        return self.launch_flush(rows, num_steps)()

    def launch_flush(self, rows: Sequence[tuple[int, int]], num_steps: int | None = None
                     ) -> Callable[[], np.ndarray]:
        """``flush`` started on the device (current CUDA stream); the returned call waits."""
        k = self.snac.num_flush_steps if num_steps is None else num_steps
        if not rows or k == 0:
            return lambda: np.zeros((len(rows), k * SAMPLES_PER_FRAME), dtype=np.float32)
        dev = self._rows_to_device([(slot, (0,) * TOKENS_PER_FRAME, end) for slot, end in rows])
        outs = [self.step(dev[:, 0], dev[:, 2:], dev[:, 1]).clone() for _ in range(k)]  # k x [n, 2048]
        wait = start_host_copy(torch.cat(outs, dim=1))
        return lambda: wait().float().numpy()

    def _rows_to_device(self, rows: Sequence[CodecRow]) -> torch.Tensor:
        slots = [r[0] for r in rows]
        if len(set(slots)) != len(rows):
            raise ValueError("a slot appears twice in one codec step")
        if not 0 <= min(slots) <= max(slots) < self.snac.max_streams:
            raise ValueError(f"slots must be in [0, {self.snac.max_streams}), got {slots}")
        host = torch.tensor([[slot, end, *codes] for slot, codes, end in rows], dtype=torch.int64)  # [n, 9]
        if host.shape[1] != 2 + TOKENS_PER_FRAME:
            raise ValueError(f"each row needs {TOKENS_PER_FRAME} codes")
        return host.to(self.device, non_blocking=True)

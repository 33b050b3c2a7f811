"""Patches to 48 kHz audio for the VoxCPM2 program: the streaming VAE decoder, a chunk of
``chunk_patches`` patches per slot at a time, each chunk decoded once into the slot's state
(where chunks come from, how reads are ordered against slot reuse and the early first audio of
``first_chunk_patches``: docs/models/voxcpm2.md, "Chunked decoding").
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import Tensor

from engine.llm.program import Collect
from models.voxcpm2.prompt import CONTEXT_PATCHES
from models.voxcpm2.vae import VAEStream

__all__ = ["ChunkDecoder", "ChunkRow"]

# where a chunk position's patch comes from: nothing (padding), the context, the ring, or their
# copies set aside when the slot was taken before the sequence's last chunk was read (``spill``)
_ZERO, _CONTEXT, _RING, _CONTEXT_SPILLED, _RING_SPILLED = 0, 1, 2, 3, 4


@dataclass
class ChunkRow:
    """One sequence's decode progress: ``start`` virtual positions decoded of ``available``."""

    slot: int
    num_context: int  # K: context patches before the generated ones
    start: int  # virtual positions already decoded
    available: int  # virtual positions known (context + patches generated)
    spilled: bool = False  # its ring row and context were copied aside (``ChunkDecoder.spill``)
    sent: int = 0  # virtual positions whose audio an early first chunk gave already


class ChunkDecoder:
    """See the module docstring. ``ring`` is ``PatchHead.ring`` [S+1, R, P, D]."""

    def __init__(self, vae: Any, ring: Tensor, *, max_slots: int, chunk_patches: int,
                 first_chunk_patches: int = 0) -> None:
        if chunk_patches < 1:
            raise ValueError(f"chunk_patches must be >= 1, got {chunk_patches}")
        if not 0 <= first_chunk_patches < chunk_patches:
            raise ValueError(f"first_chunk_patches must be 0 (off) or below chunk_patches ({chunk_patches}), "
                             f"got {first_chunk_patches}")
        rows, ring_len, p, d = ring.shape
        if ring_len < chunk_patches + 3:
            raise ValueError(f"the ring holds {ring_len} patches; chunks of {chunk_patches} need {chunk_patches + 3}")
        self.ring = ring
        self.chunk = chunk_patches
        # An early first chunk: once a fresh sequence has ``first`` patches, and again at each
        # patch after until its first whole chunk, the patches so far are decoded at once,
        # padded, through a state slot of their own that starts at zero (``probe_slot``, zeroed
        # after each call) and not into the sequence's slot, and the audio not yet given leaves;
        # its first whole chunk is decoded later as always and the audio already given cut from
        # it. The decoder is causal, so the padding changes none of those samples: the same
        # audio, first sooner and then a patch a step (no wait of a chunk after the first
        # patch's 160 ms: under load that gap underran, docs/performance.md), up to
        # ``chunk - first`` more chunks' work per sequence.
        self.first = first_chunk_patches
        self.patch_size, self.feat_dim = p, d
        self.device = ring.device
        # VAE state slots: the sequences' 0..S-1, the probe's S, padding rows' S+1 (its scratch);
        # the ring's and the context's padding row is S
        self.stream = VAEStream(vae, max_slots + 1, chunk_patches * p)
        self.probe_slot = self.pad_row = max_slots
        self._probe_slots = torch.tensor([max_slots], dtype=torch.int64, device=self.device)
        self.patch_samples = p * self.stream.hop
        self.context = torch.zeros(rows, CONTEXT_PATCHES, p, d, device=self.device, dtype=ring.dtype)
        self.spilled_ring = torch.zeros_like(ring)
        self.spilled_context = torch.zeros_like(self.context)
        self.graphs: Any = None  # BatchGraphs of ``step_fn`` (CUDA), or None: eager
        self._cuda_stream = torch.cuda.Stream(self.device) if self.device.type == "cuda" else None
        self._read: dict[int, Any] = {}  # slot -> event after a finished sequence's last gather
        self.num_chunks = 0  # chunks decoded since start (totals)

    # -- per slot ---------------------------------------------------------------------------

    def wait_slot(self, slot: int) -> None:
        """Before a new sequence uses ``slot``: the LM's stream waits until the previous
        sequence's last chunk has been gathered (a no-op on the CPU)."""
        event = self._read.pop(slot, None)
        if event is not None:
            torch.cuda.current_stream(self.device).wait_event(event)

    def spill(self, row: ChunkRow) -> None:
        """Another sequence takes ``row``'s slot before its last chunk is read: copy the slot's
        ring row and context aside (on the current stream, before the new sequence's first step);
        ``row``'s chunks read the copies from now on."""
        s = row.slot
        self.spilled_ring[s].copy_(self.ring[s])
        self.spilled_context[s].copy_(self.context[s])
        row.spilled = True

    def patch(self, row: ChunkRow, i: int) -> Tensor:
        """Generated patch ``i`` of ``row``'s sequence [P, D], where its chunks read it (tests)."""
        ring = self.spilled_ring if row.spilled else self.ring
        return ring[row.slot, i % ring.shape[1]]

    def set_context(self, slot: int, context: Tensor | None) -> None:
        """A continuation voice's warm-up patches [K, P, D] for the slot (after ``wait_slot``)."""
        if context is not None:
            self.context[slot, : context.shape[0]].copy_(context.to(self.context.dtype), non_blocking=True)

    # -- decoding ---------------------------------------------------------------------------

    def step_fn(self, slot1: Tensor, ring_idx: Tensor, ctx_idx: Tensor, kind: Tensor, probe: Tensor) -> Tensor:
        """The captured work: slot + 1 [N] (0: padding, the scratch slot), per chunk position the
        ring index, the context index and the source [N, C], and [N] 1 for an early first chunk
        (decoded through the probe slot) -> audio [N, C * P * hop] float32."""
        real = slot1 > 0
        rows = torch.where(real, slot1 - 1, torch.full_like(slot1, self.pad_row))[:, None]  # ring / context rows
        slots = torch.where(real, slot1 - 1, torch.full_like(slot1, self.stream.scratch_slot))  # VAE state slots
        k = kind[:, :, None, None]
        x = torch.zeros(kind.shape + self.ring.shape[2:], device=kind.device, dtype=self.ring.dtype)  # [N, C, P, D]
        for code, src, idx in ((_RING, self.ring, ring_idx), (_CONTEXT, self.context, ctx_idx),
                               (_RING_SPILLED, self.spilled_ring, ring_idx),
                               (_CONTEXT_SPILLED, self.spilled_context, ctx_idx)):
            x = torch.where(k == code, src[rows, idx], x)
        z = x.reshape(x.shape[0], -1, self.feat_dim).transpose(1, 2)  # [N, D, C * P]
        if not self.first:
            return self.stream.step(slots, z).float()
        # (each layer reads every row's state before it writes any: probes sharing the slot all read zeros)
        pcm = self.stream.step(torch.where(probe > 0, torch.full_like(slots, self.probe_slot), slots), z).float()
        self.stream.reset(self._probe_slots)
        return pcm

    def run(self, rows: list[ChunkRow], *, final: bool) -> Collect:
        """Decode every chunk due in ``rows`` (all that remain, padded, with ``final``); advances
        each row's ``start``. ``collect()`` gives each row's audio (None: nothing due)."""
        pieces: list[list[tuple[int, Any, int, int]]] = [[] for _ in rows]  # (round, handle, cut from, to)
        with self._on_stream():
            fresh = [r.slot for r in rows if r.start == 0 and self._due(r, final)]
            if fresh:
                self.stream.reset(torch.tensor(fresh, dtype=torch.int64).to(self.device, non_blocking=True))
            probes = [] if final else [i for i, r in enumerate(rows) if self._probe_due(r)]
            while True:
                due = [i for i, r in enumerate(rows) if self._due(r, final)]
                if not due and not probes:
                    break
                out = self._decode([rows[i] for i in due + probes], num_probes=len(probes))  # (a handle)
                for j, i in enumerate(due):
                    r = rows[i]
                    end = min(r.available, r.start + self.chunk)
                    cut_from = max(r.num_context - r.start, r.sent - r.start, 0) * self.patch_samples
                    cut_to = (end - r.start) * self.patch_samples
                    if cut_to > cut_from:
                        pieces[i].append((j, out, cut_from, cut_to))
                    r.start += self.chunk
                for j, i in enumerate(probes, start=len(due)):
                    r = rows[i]
                    pieces[i].append((j, out, r.sent * self.patch_samples, r.available * self.patch_samples))
                    r.sent = r.available
                probes = []
            if final and self._cuda_stream is not None:
                event = torch.cuda.Event()
                event.record(self._cuda_stream)
                for r in rows:
                    self._read[r.slot] = event

        def collect() -> list[np.ndarray | None]:
            result: list[np.ndarray | None] = []
            for parts in pieces:
                got = [out()[j, a:b] for j, out, a, b in parts]
                result.append(np.concatenate(got) if got else None)
            return result

        return collect

    def _due(self, r: ChunkRow, final: bool) -> bool:
        return r.available - r.start >= (1 if final else self.chunk)

    def _probe_due(self, r: ChunkRow) -> bool:
        """An early first chunk: a fresh sequence without context, at least ``first`` patches
        made, some not given yet, its first whole chunk not yet due."""
        return (self.first > 0 and r.start == 0 and r.num_context == 0 and r.sent < r.available
                and self.first <= r.available < self.chunk)

    def _decode(self, rows: list[ChunkRow], num_probes: int = 0) -> Any:
        """One VAE call over ``rows``' next chunks, the last ``num_probes`` of them early first
        chunks; a handle whose call gives the audio [N, S] (numpy)."""
        n, c, ring_len = len(rows), self.chunk, self.ring.shape[1]
        v = np.array([r.start for r in rows])[:, None] + np.arange(c)[None]  # [N, C] virtual positions
        k = np.array([r.num_context for r in rows])[:, None]
        avail = np.array([r.available for r in rows])[:, None]
        spilled = np.array([r.spilled for r in rows])[:, None]
        kind = np.where(v < k, np.where(spilled, _CONTEXT_SPILLED, _CONTEXT),
                        np.where(v < avail, np.where(spilled, _RING_SPILLED, _RING), _ZERO))
        ctx_idx = np.clip(v, 0, CONTEXT_PATCHES - 1)
        ring_idx = np.maximum(v - k, 0) % ring_len
        dev = self.device

        def dev_t(a: np.ndarray) -> Tensor:
            return torch.from_numpy(np.ascontiguousarray(a, dtype=np.int64)).to(dev, non_blocking=True)

        slot1 = dev_t(np.array([r.slot + 1 for r in rows]))
        probe = dev_t((np.arange(n) >= n - num_probes).astype(np.int64))
        args = (slot1, dev_t(ring_idx), dev_t(ctx_idx), dev_t(kind), probe)
        self.num_chunks += n
        if self.graphs is not None:
            from engine.llm.host_copy import start_host_copy

            waits = []
            largest = self.graphs.max_batch_size
            for i in range(0, n, largest):
                (out,) = self.graphs.run(*(a[i:i + largest] for a in args))
                waits.append(start_host_copy(out))
            return _Joined(waits)
        with torch.inference_mode():
            out = self.step_fn(*args).cpu().numpy()  # [N, C * P * hop]
        return lambda: out

    @contextlib.contextmanager
    def _on_stream(self) -> Iterator[None]:
        if self._cuda_stream is None:
            yield
        else:
            with torch.cuda.stream(self._cuda_stream):
                yield

    def make_graphs(self, buckets: list[int]) -> Any:
        """Capture ``step_fn`` per batch bucket (CUDA)."""
        from engine.llm.cuda_graphs import BatchGraphs

        c, i64 = self.chunk, torch.int64
        graphs = BatchGraphs(self.step_fn, [((), i64), ((c,), i64), ((c,), i64), ((c,), i64), ((), i64)],
                             buckets=buckets, device=self.device)
        graphs.capture(desc="voxcpm2 VAE graphs")
        self.graphs = graphs
        return graphs


class _Joined:
    """Host copies of several replays' outputs, waited for once and joined (numpy [N, S])."""

    def __init__(self, waits: list[Any]) -> None:
        self._waits = waits
        self._out: np.ndarray | None = None

    def __call__(self) -> np.ndarray:
        if self._out is None:
            self._out = np.concatenate([w().numpy() for w in self._waits])
        return self._out

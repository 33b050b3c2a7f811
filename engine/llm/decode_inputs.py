"""Host-side inputs of a graphed decode step, built with numpy from per-slot tables.

``DecodeInputBuilder`` gives the same inputs as ``build_attention_metadata`` +
``pad_decode_metadata`` and ``CudaGraphModelRunner.graph_inputs`` (tests compare them), in a
few vectorised gathers (why: docs/architecture.md, "The LM runtime").
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from engine.llm.attention import AttentionMetadata
from engine.llm.sequence import PENDING

__all__ = ["DecodeInputBuilder"]


class DecodeInputBuilder:
    """Padded decode metadata + graph inputs for ``max_num_seqs`` slots."""

    def __init__(self, *, max_num_seqs: int, max_pages_per_seq: int, page_size: int, scratch_page: int) -> None:
        self.page_size = page_size
        self.scratch_page = scratch_page
        self.max_pages_per_seq = max_pages_per_seq
        self._table = np.zeros((max_num_seqs, max_pages_per_seq), dtype=np.int32)  # pages per slot
        self._owner: list[Any] = [None] * max_num_seqs  # the sequence whose table/params a slot holds
        self._num_pages = np.zeros(max_num_seqs, dtype=np.int64)  # len(seq.pages) when filled
        self._floats = np.zeros((max_num_seqs, 3), dtype=np.float32)  # temperature, top_p, penalty
        self._seed = np.zeros(max_num_seqs, dtype=np.int64)
        self._top_k = np.zeros(max_num_seqs, dtype=np.int64)

    def _refresh(self, seqs: Sequence[Any]) -> None:
        owner, num_pages = self._owner, self._num_pages
        for s in seqs:
            slot = s.slot
            if owner[slot] is s and num_pages[slot] == len(s.pages):
                continue
            if len(s.pages) > self.max_pages_per_seq:
                raise ValueError(f"sequence {s.seq_id} holds {len(s.pages)} pages, more than {self.max_pages_per_seq}")
            self._table[slot, : len(s.pages)] = s.pages
            num_pages[slot] = len(s.pages)
            p = s.params
            self._floats[slot] = (p.temperature, p.top_p, p.repetition_penalty)
            self._seed[slot] = p.seed
            self._top_k[slot] = p.top_k
            owner[slot] = s

    def build(self, seqs: Sequence[Any], bucket: int, is_sampled: Sequence[bool]
              ) -> tuple[AttentionMetadata, torch.Tensor, torch.Tensor, torch.Tensor]:
        """Decode rows ``seqs`` (one new token each) padded to ``bucket`` rows.

        Returns (metadata on the CPU, int64 [bucket, 7] = token (``PENDING`` if still on the
        device), seed, step, slot + 1, allowed row, 1 + the pending token's row in the launched
        step (0: none), top_k; float32 [bucket, 3] = temperature, top_p, repetition penalty; bool [bucket] keep).
        Padding rows: one token in the scratch page, zeros elsewhere (slot + 1 = 0).
        """
        n = len(seqs)
        if not 1 <= n <= bucket:
            raise ValueError(f"{n} rows do not fit a bucket of {bucket}")
        self._refresh(seqs)
        ps = self.page_size
        # one pass over the rows: slot, the new token's position, the token (a decode row's is
        # its sequence's last), tokens generated so far, allowed row
        per_row = np.array([(s.slot, s.num_computed_tokens,
                             s.next_input if s.next_input is not None else
                             s.output_ids[-1] if s.output_ids else s.prompt_ids[-1],
                             len(s.output_ids), s.allowed_row) for s in seqs], np.int64).reshape(n, 5)
        slots = per_row[:, 0]
        pos = per_row[:, 1]
        kv_len = pos + 1
        npages = (kv_len + ps - 1) // ps
        if np.any(npages > self._num_pages[slots]):
            bad = int(np.flatnonzero(npages > self._num_pages[slots])[0])
            raise ValueError(f"sequence {seqs[bad].seq_id} needs {int(npages[bad])} pages, holds "
                             f"{int(self._num_pages[slots[bad]])}")
        pad = bucket - n
        rows = self._table[slots]  # [n, maxp]
        keep_pages = np.arange(self.max_pages_per_seq) < npages[:, None]  # [n, maxp]
        kv_indices = np.concatenate([rows[keep_pages], np.full(pad, self.scratch_page, np.int32)])
        counts = np.concatenate([npages, np.ones(pad, np.int64)])
        kv_indptr = np.zeros(bucket + 1, np.int32)
        np.cumsum(counts, out=kv_indptr[1:])
        last_len = np.concatenate([kv_len - (npages - 1) * ps, np.ones(pad, np.int64)]).astype(np.int32)
        slot_map = np.concatenate([rows[np.arange(n), pos // ps].astype(np.int64) * ps + pos % ps,
                                   np.full(pad, self.scratch_page * ps, np.int64)])
        meta = AttentionMetadata(
            qo_indptr=torch.arange(bucket + 1, dtype=torch.int32),
            kv_indptr=torch.from_numpy(kv_indptr),
            kv_indices=torch.from_numpy(kv_indices),
            kv_last_page_len=torch.from_numpy(last_len),
            slot_mapping=torch.from_numpy(slot_map),
            positions=torch.from_numpy(np.concatenate([pos, np.zeros(pad, np.int64)])),
            num_decode_seqs=bucket,
        )
        ints = np.zeros((bucket, 7), np.int64)
        ints[:n, 0] = per_row[:, 2]
        pending = np.flatnonzero(ints[:n, 0] == PENDING)
        if pending.size:  # last token still on the device: the launched step's row holds it
            ints[pending, 5] = [seqs[i].pending_row + 1 for i in pending]
        ints[:n, 1] = self._seed[slots]
        ints[:n, 2] = per_row[:, 3]
        ints[:n, 3] = slots + 1
        ints[:n, 4] = per_row[:, 4]
        ints[:n, 6] = self._top_k[slots]
        floats = np.zeros((bucket, 3), np.float32)
        floats[:n] = self._floats[slots]
        keep = np.zeros(bucket, np.bool_)
        keep[:n] = is_sampled
        return meta, torch.from_numpy(ints), torch.from_numpy(floats), torch.from_numpy(keep)

"""The last stage of a step: hidden states of the sampled rows -> the tokens of the next position.

A program's ``TokenHead`` samples one token per row (``SingleTokenHead``) or a frame of several
codebooks, inside the captured step; its contract is in docs/adding_a_model.md, "The token head".
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import torch

from engine.llm.sampler import Sampler

__all__ = ["RowInputs", "SingleTokenHead", "TokenHead", "allowed_columns"]


@dataclass
class RowInputs:
    """Per-row sampling inputs of one step (device tensors, ``[B]`` each)."""

    temperature: torch.Tensor  # float32; 0 = greedy
    top_p: torch.Tensor  # float32 in (0, 1]
    repetition_penalty: torch.Tensor  # float32; 1 = off
    seeds: torch.Tensor  # int64
    steps: torch.Tensor  # int64: tokens (frames) the row's sequence generated so far
    rows: torch.Tensor  # int64: the head's state row (the slot; padding rows: max_num_seqs)
    allowed_rows: torch.Tensor  # int64: the program's position mask row (SingleTokenHead)
    keep: torch.Tensor  # bool: the row's sample is used (False: padding, or a prompt chunk)
    top_k: torch.Tensor | None = None  # int64; 0 = off (None: no row uses it)
    # Host-side hints for eager steps (a graph always runs the whole sampler):
    all_greedy: bool = False
    any_top_p: bool = True


class TokenHead(Protocol):
    """Optional, for a head with cheaper ways to sample some steps (docs/adding_a_model.md,
    "Step variants"): ``variants`` (a tuple: variant ``i + 1`` is captured in the decode graphs
    up to ``variants[i]`` rows), ``variant(steps)`` (host side: the variant for decode rows that
    have generated ``steps`` (int64 [B]) so far, 0 for the full step) and ``sample(..., variant=v)``.
    A variant must give exactly the tokens of variant 0 for the rows it is chosen for. With
    them, ``light_until_step`` (int): a row that has generated fewer tokens runs a variant, so
    the scheduler may give such rows steps of their own (``SchedulerConfig.light_steps_max``)."""

    num_columns: int  # tokens sampled per row (1, or the codebooks of a frame)

    def reset(self, rows: torch.Tensor) -> None:
        """New sequences took these state rows (int64 [N]): forget their predecessors' state."""
        ...

    def sample(self, hidden: torch.Tensor, r: RowInputs) -> tuple[torch.Tensor, torch.Tensor]:
        """hidden [B, H] of each row's last token -> (tokens int64 [B] (or [B, C]), an auxiliary
        tensor with B rows that checks may read, e.g. the raw logits)."""
        ...


def allowed_columns(table: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """bool [R, K] column masks -> (int64 [R, M] each row's allowed columns ascending, padded
    with column 0; bool [R, M] which entries are real), M = the largest row count."""
    counts = table.sum(dim=1)  # [R]
    m = max(int(counts.max()), 1)
    cols = torch.zeros(table.shape[0], m, dtype=torch.int64, device=table.device)
    valid = torch.arange(m, device=table.device).unsqueeze(0) < counts.unsqueeze(1)  # [R, M]
    for r in range(table.shape[0]):
        idx = torch.nonzero(table[r]).flatten()
        cols[r, : idx.numel()] = idx
    return cols, valid


class SingleTokenHead:
    """One token per row from ``compute_logits(hidden, vocab_ids)``.

    ``vocab_ids`` restricts the head (and sampling) to a subset of the vocabulary; sampled
    indices are mapped back to token ids. ``allowed_table`` (bool [R, K]) masks columns per
    position: each row's ``allowed_rows`` entry picks one mask. The repetition penalty applies
    to the tokens the row's sequence generated (``seen``, one row per slot plus the padding row).
    ``uses_top_k``: pass the rows' top-k to the sampler (off: the sampler skips it).
    """

    num_columns = 1

    def __init__(self, compute_logits: Callable[..., torch.Tensor], *, vocab_size: int, max_num_seqs: int,
                 device: torch.device | str, vocab_ids: torch.Tensor | list[int] | None = None,
                 allowed_table: torch.Tensor | None = None, uses_top_k: bool = False) -> None:
        self.compute_logits = compute_logits
        self.device = torch.device(device)
        self.max_num_seqs = max_num_seqs
        self.uses_top_k = uses_top_k
        self.vocab_ids: torch.Tensor | None = None
        if vocab_ids is not None:
            self.vocab_ids = torch.as_tensor(vocab_ids, dtype=torch.int64).to(self.device)  # [K]
        num_cols = vocab_size if self.vocab_ids is None else int(self.vocab_ids.numel())
        if allowed_table is not None and allowed_table.shape[-1] != num_cols:
            raise ValueError(f"allowed_table has {allowed_table.shape[-1]} columns, logits have {num_cols}")
        self.allowed_table = None if allowed_table is None else allowed_table.to(self.device, torch.bool)
        # The sampler works on each row's allowed columns only (e.g. 4,097 of 28,673 columns).
        self.allowed_cols: torch.Tensor | None = None  # int64 [R, M]
        self.allowed_valid: torch.Tensor | None = None  # bool [R, M]
        if self.allowed_table is not None:
            self.allowed_cols, self.allowed_valid = allowed_columns(self.allowed_table)
        # Tokens each slot's sequence generated so far (repetition penalty), in column space; the
        # last row is the padding rows'.
        self.seen_rows = torch.zeros(max_num_seqs + 1, num_cols, dtype=torch.bool, device=self.device)
        self.sampler = Sampler()

    @property
    def seen(self) -> torch.Tensor:
        """The slots' penalty rows (a view without the padding row)."""
        return self.seen_rows[: self.max_num_seqs]

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """float32 [B, K] logits over the head's columns."""
        return self.compute_logits(hidden, self.vocab_ids)

    def reset(self, rows: torch.Tensor) -> None:
        self.seen_rows.index_fill_(0, rows, False)

    def sample(self, hidden: torch.Tensor, r: RowInputs) -> tuple[torch.Tensor, torch.Tensor]:
        logits = self.logits(hidden)  # [B, K] float32
        allowed = columns = None
        if self.allowed_table is not None:
            columns = self.allowed_cols.index_select(0, r.allowed_rows)  # [B, M]
            allowed = self.allowed_valid.index_select(0, r.allowed_rows)  # [B, M]
        cols = self.sampler(
            logits, temperature=r.temperature, top_p=r.top_p, repetition_penalty=r.repetition_penalty,
            seeds=r.seeds, steps=r.steps, seen=self.seen_rows.index_select(0, r.rows), allowed=allowed,
            columns=columns, all_greedy=r.all_greedy, any_top_p=r.any_top_p,
            top_k=r.top_k if self.uses_top_k else None,
        )  # [B]
        self.seen_rows[r.rows, cols] = self.seen_rows[r.rows, cols] | r.keep
        tokens = cols if self.vocab_ids is None else self.vocab_ids.index_select(0, cols)
        return tokens, logits

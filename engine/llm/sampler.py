"""Batch-invariant sampling on device tensors.

Each row is sampled from its own logits with its own temperature, top-p, repetition penalty
and random stream. The randomness is Gumbel-max with noise from a counter-based integer hash of
(seed, step, vocab index), computed with int64 torch ops: no ``torch.Generator`` is shared
across rows, so a row's sample does not depend on which rows share its batch or on their order.
Every op is elementwise or per-row (sort, cumsum, argmax), so there is no host sync and the
whole sampler can be captured in a CUDA graph.

Repetition penalty (CTRL / HF / vLLM formula: positive logits divided by the penalty, negative
ones multiplied) applies to the tokens this sequence has *generated* (``seen``), not to its
prompt. For Orpheus this is the same as penalising prompt + output, as vLLM does, because the
prompt's text ids lie outside the audio vocabulary the head is restricted to.
"""

from __future__ import annotations

import torch

__all__ = ["Sampler", "gumbel_noise", "uniform_noise"]

_MASK32 = 0xFFFFFFFF


def _mul32(x: torch.Tensor, c: int) -> torch.Tensor:
    """(x * c) mod 2**32 for x in [0, 2**32) without int64 overflow (16-bit halves of c)."""
    lo = x * (c & 0xFFFF)  # < 2**48
    hi = ((x * (c >> 16)) & 0xFFFF) << 16  # < 2**32
    return (lo + hi) & _MASK32


def _mix32(x: torch.Tensor) -> torch.Tensor:
    """A 32-bit integer finaliser (xor-shift-multiply); input/output int64 in [0, 2**32)."""
    x = x & _MASK32
    x = x ^ (x >> 16)
    x = _mul32(x, 0x7FEB352D)
    x = x ^ (x >> 15)
    x = _mul32(x, 0x846CA68B)
    return x ^ (x >> 16)


def uniform_noise(seeds: torch.Tensor, steps: torch.Tensor, num_cols: int) -> torch.Tensor:
    """float32 [B, num_cols] in (0, 1), a pure function of (seed, step, column) per element."""
    row = _mix32((seeds & _MASK32) ^ 0x9E3779B9)
    row = _mix32(row ^ ((seeds >> 32) & _MASK32))
    row = _mix32(row ^ (steps & _MASK32))  # [B]
    cols = _mix32(torch.arange(num_cols, device=seeds.device, dtype=torch.int64) + 0x632BE5AB)  # [K]
    bits = _mix32(row.unsqueeze(1) ^ cols.unsqueeze(0)) >> 8  # [B, K] 24 random bits
    return (bits.to(torch.float32) + 0.5) * (1.0 / (1 << 24))


def gumbel_noise(seeds: torch.Tensor, steps: torch.Tensor, num_cols: int) -> torch.Tensor:
    """float32 [B, num_cols] standard Gumbel noise."""
    return -torch.log(-torch.log(uniform_noise(seeds, steps, num_cols)))


class Sampler:
    """``__call__`` returns column indices [B] (into the logits' last dim)."""

    def __call__(
        self,
        logits: torch.Tensor,  # float32 [B, K]
        *,
        temperature: torch.Tensor,  # float32 [B]; 0 = greedy
        top_p: torch.Tensor,  # float32 [B] in (0, 1]
        repetition_penalty: torch.Tensor,  # float32 [B]; 1 = off
        seeds: torch.Tensor,  # int64 [B]
        steps: torch.Tensor,  # int64 [B] tokens this row generated so far
        seen: torch.Tensor | None = None,  # bool [B, K] tokens this row generated
        allowed: torch.Tensor | None = None,  # bool [B, K] columns a row may emit
    ) -> torch.Tensor:
        logits = logits.float()
        if seen is not None:
            penalty = repetition_penalty.unsqueeze(1)  # [B, 1]
            penalised = torch.where(logits > 0, logits / penalty, logits * penalty)
            logits = torch.where(seen, penalised, logits)
        if allowed is not None:
            logits = logits.masked_fill(~allowed, float("-inf"))
        greedy = logits.argmax(dim=-1)  # [B]

        is_greedy = temperature <= 0  # [B]
        temp = torch.where(is_greedy, torch.ones_like(temperature), temperature)
        scaled = logits / temp.unsqueeze(1)  # [B, K]
        probs = torch.softmax(scaled, dim=-1)
        sorted_probs, order = probs.sort(dim=-1, descending=True, stable=True)  # [B, K]
        mass_before = sorted_probs.cumsum(dim=-1) - sorted_probs
        drop_sorted = mass_before >= top_p.unsqueeze(1)  # the top token is always kept
        drop = torch.zeros_like(drop_sorted).scatter(1, order, drop_sorted)
        scaled = scaled.masked_fill(drop, float("-inf"))
        sampled = (scaled + gumbel_noise(seeds, steps, logits.shape[1])).argmax(dim=-1)  # [B]
        return torch.where(is_greedy, greedy, sampled)

"""Batch-invariant sampling on device tensors, capturable in a CUDA graph.

Each row samples with its own temperature, top-p, top-k, repetition penalty and random stream,
so a row's sample does not depend on what shares its batch (docs/architecture.md,
"The LM runtime").
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

__all__ = ["RowSettings", "Sampler", "bits_to_unit", "column_keys", "gumbel_noise", "gumbel_noise_salts",
           "uniform_noise"]

_MASK32 = 0xFFFFFFFF
# Odd multipliers below 2**31: a 32-bit value times one stays below 2**63 (no int64 overflow).
_M1 = 0x7FEB352D
_M2 = 0x1B873593


def _mix32(x: torch.Tensor) -> torch.Tensor:
    """A 32-bit xor-shift-multiply finaliser; int64 in, int64 in [0, 2**32) out."""
    x = x & _MASK32
    x = x ^ (x >> 16)
    x = (x * _M1) & _MASK32
    x = x ^ (x >> 15)
    x = (x * _M2) & _MASK32
    return x ^ (x >> 16)


def _row_keys(seeds: torch.Tensor, steps: torch.Tensor, salt: int = 0) -> torch.Tensor:
    """int64 [B] in [0, 2**32): one hash of (seed, step[, salt]) per row."""
    row = _mix32((seeds & _MASK32) ^ 0x9E3779B9)
    row = _mix32(row ^ ((seeds >> 32) & _MASK32))
    if salt:  # another stream of noise for the same row and step (a second codebook)
        row = _mix32(row ^ (salt & _MASK32))
    return _mix32(row ^ (steps & _MASK32))


def column_keys(num_cols: int, device: torch.device) -> torch.Tensor:
    """int64 [K] in [0, 2**32): one hash per column index (``uniform_noise``'s ``col_keys``: a
    caller that draws the same width every step may build them once)."""
    return _mix32(torch.arange(num_cols, device=device, dtype=torch.int64) + 0x632BE5AB)


def uniform_noise(
    seeds: torch.Tensor, steps: torch.Tensor, num_cols: int, col_keys: torch.Tensor | None = None, salt: int = 0
) -> torch.Tensor:
    """float32 [B, num_cols] in (0, 1), a pure function of (seed, step, column) per element.

    Both keys are fully mixed, so one more xor-shift-multiply round over their xor suffices.
    ``col_keys`` [B, num_cols] gives each row its own columns' keys (a gathered subset).
    """
    cols = column_keys(num_cols, seeds.device) if col_keys is None else col_keys  # [K] or [B, K]
    return _unit_from_keys(_row_keys(seeds, steps, salt).unsqueeze(1), cols)


def _unit_from_keys(rows: torch.Tensor, cols: torch.Tensor) -> torch.Tensor:
    """rows [..., 1] and column keys [K] (or broadcastable) -> float32 [..., K] in (0, 1).

    In place where it can: a frame head's noise for every codebook at once is [S, B, K], and
    each int64 temporary of that size would stay in the CUDA graph's memory pool."""
    x = rows ^ cols
    x ^= x >> 16
    x.mul_(_M1).bitwise_and_(_MASK32)
    x ^= x >> 15
    x >>= 9  # the top 23 bits
    return bits_to_unit(x)


def bits_to_unit(bits: torch.Tensor) -> torch.Tensor:
    """int64 in [0, 2**23) -> float32 (bits + 0.5) / 2**23, strictly inside (0, 1).

    23 bits, not 24: (bits + 0.5) must be exact in float32's 24-bit significand, else the top
    value rounds to 1.0 and the Gumbel noise -log(-log(1)) becomes +inf.
    """
    return bits.to(torch.float32).add_(0.5).mul_(1.0 / (1 << 23))


def gumbel_noise(
    seeds: torch.Tensor, steps: torch.Tensor, num_cols: int, col_keys: torch.Tensor | None = None, salt: int = 0
) -> torch.Tensor:
    """float32 [B, num_cols] standard Gumbel noise, always finite (|g| < 17)."""
    return -torch.log(-torch.log(uniform_noise(seeds, steps, num_cols, col_keys, salt)))


def gumbel_noise_salts(seeds: torch.Tensor, steps: torch.Tensor, num_cols: int, salts: range) -> torch.Tensor:
    """float32 [S, B, num_cols]: ``gumbel_noise(seeds, steps, num_cols, salt=s)`` for each salt
    of ``salts``, bit for bit, in one batch of kernels instead of one per salt (a head that
    samples many codebooks a step, each with its own salt, draws all their noise at once)."""
    m = _MASK32
    row = _mix32((seeds & m) ^ 0x9E3779B9)
    row = _mix32(row ^ ((seeds >> 32) & m))  # [B]
    salt = torch.arange(salts.start, salts.stop, salts.step, device=seeds.device, dtype=torch.int64)  # [S]
    salted = torch.where((salt != 0)[:, None], _mix32(row[None, :] ^ (salt[:, None] & m)), row[None, :])  # [S, B]
    keys = _mix32(salted ^ (steps & m)[None, :])  # [S, B]
    u = _unit_from_keys(keys.unsqueeze(2), column_keys(num_cols, seeds.device))  # [S, B, K]
    return u.log_().neg_().log_().neg_()  # -log(-log(u)), in place


@dataclass
class RowSettings:
    """Each row's sampling settings as the sampler uses them (``Sampler.rows``), for a head that
    samples many codebooks a step with the same settings: made once, not once per codebook."""

    top_k: torch.Tensor | None  # int64 [B]; 0 = off
    is_greedy: torch.Tensor  # bool [B]
    divisor: torch.Tensor  # float32 [B, 1]: the temperature, 1 for greedy rows
    top_p_col: torch.Tensor  # float32 [B, 1]
    top_k_col: torch.Tensor | None  # int64 [B, 1]
    top_k_on: torch.Tensor | None  # bool [B, 1]: top_k > 0
    top_k_off: torch.Tensor | None  # bool [B, 1]: top_k <= 0
    _kth_index: dict[int, torch.Tensor] = field(default_factory=dict)  # per logits width

    def kth_index(self, num_cols: int) -> torch.Tensor:
        """int64 [B, 1]: the index of each row's k-th largest value among ``num_cols``."""
        idx = self._kth_index.get(num_cols)
        if idx is None:
            idx = self._kth_index[num_cols] = self.top_k_col.clamp(1, num_cols) - 1  # type: ignore[union-attr]
        return idx


class Sampler:
    """``__call__`` returns column indices [B] (into the logits' last dim). ``kernel``: "torch",
    or "triton" for the draw in one Triton kernel where a row has at most 8,192 columns and the
    logits are on CUDA (``sample_triton``; the engine sets it for the process from
    ``--sampler-kernel`` before a model's heads make their samplers)."""

    kernel = "torch"

    @staticmethod
    def rows(temperature: torch.Tensor, top_p: torch.Tensor, top_k: torch.Tensor | None = None) -> RowSettings:
        """The rows' settings, prepared (``__call__``'s ``settings``)."""
        is_greedy = temperature <= 0
        top_k_col = None if top_k is None else top_k.unsqueeze(1)
        top_k_on = None if top_k_col is None else top_k_col > 0
        return RowSettings(top_k, is_greedy,
                           torch.where(is_greedy, torch.ones_like(temperature), temperature).unsqueeze(1),
                           top_p.unsqueeze(1), top_k_col, top_k_on, None if top_k_on is None else ~top_k_on)

    def __init__(self) -> None:
        self._col_keys: torch.Tensor | None = None  # cached per (K, device)

    def __call__(
        self,
        logits: torch.Tensor,  # float32 [B, K]
        *,
        temperature: torch.Tensor | None = None,  # float32 [B]; 0 = greedy
        top_p: torch.Tensor | None = None,  # float32 [B] in (0, 1]
        repetition_penalty: torch.Tensor,  # float32 [B]; 1 = off
        seeds: torch.Tensor,  # int64 [B]
        steps: torch.Tensor,  # int64 [B] tokens this row generated so far
        seen: torch.Tensor | None = None,  # bool [B, K] tokens this row generated
        allowed: torch.Tensor | None = None,  # bool [B, K] columns a row may emit
        all_greedy: bool = False,  # host-side hint: every temperature is 0, skip the sampling
        any_top_p: bool = True,  # host-side hint: False when every top_p is 1, skip the sort
        columns: torch.Tensor | None = None,  # int64 [B, M] ascending: the only columns a row may emit
        top_k: torch.Tensor | None = None,  # int64 [B]; 0 = off
        salt: int = 0,  # another noise stream (one per codebook sampled in the same step)
        noise: torch.Tensor | None = None,  # float32 [B, K]: this call's Gumbel noise, drawn ahead
        settings: RowSettings | None = None,  # ``rows(temperature, top_p, top_k)``, in their place
    ) -> torch.Tensor:
        """Sample one column per row. With ``columns`` (and ``allowed`` [B, M] marking the real
        entries of each row's list) the work runs on the gathered [B, M] logits only; the
        noise stays keyed by the original column, so the sample is the same as on all K.
        ``noise`` (``gumbel_noise_salts(seeds, steps, K, ...)[i]`` for salt ``salts[i]``) stands
        for the noise this call would draw with that salt: the same sample, fewer kernels;
        ``settings`` for ``temperature``, ``top_p`` and ``top_k`` likewise."""
        if settings is None:
            if temperature is None or top_p is None:
                raise ValueError("the sampler needs temperature and top_p, or settings")
            if not all_greedy:  # (greedy needs none of them)
                settings = self.rows(temperature, top_p, top_k)
        elif temperature is not None or top_p is not None or top_k is not None:
            raise ValueError("give settings or temperature, top_p and top_k, not both")
        if columns is not None:
            if noise is not None:
                raise ValueError("noise drawn ahead is for full-width logits, not with columns")
            k = logits.shape[1]
            if self._col_keys is None or self._col_keys.numel() != k or self._col_keys.device != logits.device:
                self._col_keys = column_keys(k, logits.device)
            picked = self._sample(
                logits.gather(1, columns), settings, repetition_penalty, seeds, steps,
                None if seen is None else seen.gather(1, columns), allowed, all_greedy, any_top_p,
                self._col_keys[columns], salt,
            )  # [B] indices into each row's list
            return columns.gather(1, picked.unsqueeze(1)).squeeze(1)
        return self._sample(logits, settings, repetition_penalty, seeds, steps, seen, allowed,
                            all_greedy, any_top_p, None, salt, noise)

    def _sample(self, logits: torch.Tensor, rs: RowSettings | None,
                repetition_penalty: torch.Tensor, seeds: torch.Tensor, steps: torch.Tensor,
                seen: torch.Tensor | None, allowed: torch.Tensor | None, all_greedy: bool, any_top_p: bool,
                col_keys: torch.Tensor | None, salt: int = 0,
                noise: torch.Tensor | None = None) -> torch.Tensor:
        logits = logits.float()
        if seen is not None:
            penalty = repetition_penalty.unsqueeze(1)  # [B, 1]
            penalised = torch.where(logits > 0, logits / penalty, logits * penalty)
            logits = torch.where(seen, penalised, logits)
        if allowed is not None:
            logits = logits.masked_fill(~allowed, float("-inf"))
        if all_greedy or rs is None:
            return logits.argmax(dim=-1)
        if self.kernel == "triton" and logits.shape[1] <= _triton_columns() and _on_triton_device(logits):
            from engine.llm.sample_triton import draw_rows

            if noise is None:
                noise = self._noise(logits.shape[1], logits.device, seeds, steps, col_keys, salt)
            return draw_rows(logits, rs.divisor, rs.top_p_col, rs.top_k, rs.is_greedy, noise)
        greedy = logits.argmax(dim=-1)  # [B]
        top_k = rs.top_k
        scaled = logits / rs.divisor  # [B, K]
        drop = torch.isneginf(logits)  # disallowed columns, [B, K]
        if top_k is not None:
            # k = 0 keeps every column; a row keeps the columns at or above its k-th largest
            # value (ties with it included), as transformers' TopKLogitsWarper does.
            k_idx = rs.kth_index(logits.shape[1])  # [B, 1]
        if any_top_p:
            probs = torch.softmax(scaled, dim=-1)
            sorted_probs, order = probs.sort(dim=-1, descending=True, stable=True)  # [B, K]
            mass_before = sorted_probs.cumsum(dim=-1) - sorted_probs
            mass = rs.top_p_col  # [B, 1]
            if top_k is not None:  # top-p over what top-k kept, renormalised (transformers' order)
                kth = sorted_probs.gather(1, k_idx)  # [B, 1]
                in_top_k = rs.top_k_off | (sorted_probs >= kth)  # [B, K], sorted order
                mass = mass * (sorted_probs * in_top_k).sum(dim=-1, keepdim=True)
                drop_sorted = (mass_before >= mass) | ~in_top_k  # the top token is always kept
            else:
                drop_sorted = mass_before >= mass  # the top token is always kept
            drop = drop | torch.zeros_like(drop_sorted).scatter(1, order, drop_sorted)
        elif top_k is not None:  # no top-p: the k-th value alone, no softmax, cumsum or scatter
            kth = scaled.sort(dim=-1, descending=True).values.gather(1, k_idx)  # [B, 1]
            drop = drop | (rs.top_k_on & (scaled < kth))
        if noise is None:
            noise = self._noise(logits.shape[1], logits.device, seeds, steps, col_keys, salt)
        # Mask after adding the noise, so a dropped column can never win (no -inf + x = NaN).
        sampled = (scaled + noise).masked_fill(drop, float("-inf")).argmax(dim=-1)  # [B]
        return torch.where(rs.is_greedy, greedy, sampled)

    def _noise(self, k: int, device: torch.device, seeds: torch.Tensor, steps: torch.Tensor,
               col_keys: torch.Tensor | None, salt: int) -> torch.Tensor:
        """This call's Gumbel noise [B, k], keyed by ``col_keys`` (default: the columns 0..k-1)."""
        if col_keys is None:
            if self._col_keys is None or self._col_keys.numel() != k or self._col_keys.device != device:
                self._col_keys = column_keys(k, device)
            col_keys = self._col_keys
        return gumbel_noise(seeds, steps, k, col_keys, salt)


def _triton_columns() -> int:
    from engine.llm.sample_triton import MAX_COLUMNS

    return MAX_COLUMNS


def _on_triton_device(t: torch.Tensor) -> bool:
    """The kernel runs on CUDA tensors, or anywhere under Triton's CPU interpreter (the tests)."""
    import os

    return t.is_cuda or os.environ.get("TRITON_INTERPRET") == "1"

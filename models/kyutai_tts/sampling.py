"""Kyutai's audio and text sampling with a constant top-k, on tensors alone (no settings
objects), so that the depth transformer's codebook step can run it inside ``torch.compile``
(``models.kyutai_tts.head.sample_top_k`` is the same draw for the runtime's row settings).
"""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["top_k_draw"]


def top_k_draw(logits: Tensor, k: int, divisor: Tensor, noise: Tensor | None, top_p: Tensor) -> Tensor:
    """One sample per row among its ``k`` largest logits: logits [B, V] (any float dtype), scaled
    by ``divisor`` [B, 1] in float32, top-p over those ``k`` renormalised (``top_p`` [B, 1], inf
    for none), Gumbel ``noise`` [B, V] zero on greedy rows (None: every row greedy) -> ids [B]."""
    if noise is None:
        return logits.argmax(dim=-1)
    # The k largest, unsorted (a sort of the kept k took as long as finding them: about 20 us a
    # call on an H200, 25 calls a frame). Top-p then drops a kept logit when the mass of those
    # strictly above it reaches top_p: what the sorted exclusive cumulative sum gives, all pairs
    # compared ([B, k, k], one fused reduction when compiled); the largest is always kept.
    vals, idx = (logits / divisor).topk(min(k, logits.shape[1]), dim=-1, sorted=False)  # float32 [B, k]
    probs = vals.softmax(dim=-1)
    above = torch.where(probs[:, None, :] > probs[:, :, None], probs[:, None, :], 0.0).sum(-1)  # [B, k]
    drop = above >= top_p
    pick = (vals + noise.gather(1, idx)).masked_fill(drop, float("-inf")).argmax(dim=-1)  # [B]
    return idx.gather(1, pick[:, None])[:, 0]

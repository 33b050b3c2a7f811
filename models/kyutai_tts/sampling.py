"""Kyutai's audio and text sampling with a constant top-k, on tensors alone (no settings
objects), so that the depth transformer can run it through ``torch.compile``
(``models.kyutai_tts.head.sample_top_k`` is the same draw for the runtime's row settings).
"""

from __future__ import annotations

from torch import Tensor

__all__ = ["top_k_draw"]


def top_k_draw(logits: Tensor, k: int, divisor: Tensor, noise: Tensor | None, top_p: Tensor) -> Tensor:
    """One sample per row among its ``k`` largest logits: logits [B, V] (any float dtype), scaled
    by ``divisor`` [B, 1] in float32, top-p over those ``k`` renormalised (``top_p`` [B, 1], inf
    for none), Gumbel ``noise`` [B, V] zero on greedy rows (None: every row greedy) -> ids [B]."""
    if noise is None:
        return logits.argmax(dim=-1)
    vals, idx = (logits / divisor).topk(min(k, logits.shape[1]), dim=-1)  # float32 [B, k], descending
    probs = vals.softmax(dim=-1)
    drop = (probs.cumsum(dim=-1) - probs) >= top_p  # the top one is always kept
    pick = (vals + noise.gather(1, idx)).masked_fill(drop, float("-inf")).argmax(dim=-1)  # [B]
    return idx.gather(1, pick[:, None])[:, 0]

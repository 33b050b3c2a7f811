"""A contiguous-cache causal attention backend (the ``AttentionBackend`` contract) for CPU parity
tests of ``LlamaModel``."""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["DenseAttention", "causal_attention"]


def causal_attention(layer: int, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
    """One sequence's causal attention over the step's own tokens, GQA, in float32 (a fused
    forward's ``attn`` argument for one-step tests): q [T, Hq, D], k / v [T, Hkv, D] -> [T, Hq, D]."""
    rep = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1)
    o = torch.nn.functional.scaled_dot_product_attention(q.transpose(0, 1).float(), k.transpose(0, 1).float(),
                                                         v.transpose(0, 1).float(), is_causal=True)
    return o.transpose(0, 1).to(q.dtype)


class DenseAttention:
    """Per-sequence contiguous K/V cache, GQA, plain ``softmax(q k^T / sqrt(D))``."""

    def __init__(self, num_layers: int) -> None:
        self.num_layers = num_layers
        self.cache: dict[int, list[tuple[Tensor, Tensor]]] = {}  # seq -> per-layer (k, v)
        self.seq_ids: list[int] = [0]
        self.lengths: list[int] = []

    def plan(self, seq_ids: list[int], num_tokens: list[int]) -> None:
        """Declare the next step: sequence ``seq_ids[i]`` contributes ``num_tokens[i]`` tokens."""
        if len(seq_ids) != len(num_tokens):
            raise ValueError("seq_ids and num_tokens differ in length")
        self.seq_ids, self.lengths = list(seq_ids), list(num_tokens)

    def drop(self, seq_id: int) -> None:
        self.cache.pop(seq_id, None)

    def __call__(self, layer: int, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        lengths = self.lengths or [q.shape[0]]
        if sum(lengths) != q.shape[0]:
            raise ValueError(f"planned {sum(lengths)} tokens, got {q.shape[0]}")
        outs = []
        start = 0
        for seq, n in zip(self.seq_ids, lengths):
            layers = self.cache.setdefault(seq, [])
            kn, vn = k[start:start + n], v[start:start + n]  # [n, Hkv, D]
            if len(layers) <= layer:
                layers.append((kn, vn))
            else:
                pk, pv = layers[layer]
                layers[layer] = (torch.cat((pk, kn)), torch.cat((pv, vn)))
            kc, vc = layers[layer]  # [S, Hkv, D]
            outs.append(_causal(q[start:start + n], kc, vc))
            start += n
        return torch.cat(outs)


def _causal(q: Tensor, k: Tensor, v: Tensor) -> Tensor:
    # q [n, H, D] are the last n positions of a sequence whose keys are k/v [S, Hkv, D]
    n, h, d = q.shape
    s, hkv, _ = k.shape
    k = k.repeat_interleave(h // hkv, dim=1)  # [S, H, D]
    v = v.repeat_interleave(h // hkv, dim=1)
    scores = torch.einsum("nhd,shd->hns", q.float(), k.float()) * d**-0.5  # [H, n, S]
    qpos = torch.arange(s - n, s)[:, None]
    mask = torch.arange(s)[None, :] > qpos  # [n, S] future keys
    scores = scores.masked_fill(mask, float("-inf"))
    o = torch.einsum("hns,shd->nhd", scores.softmax(-1), v.float())  # [n, H, D]
    return o.to(q.dtype)

"""CSM's Mimi: the project's codec (``models.mimi``) loaded from transformers' ``MimiModel`` keys,
and its encoder run the way transformers runs it (docs/models/csm.md, "Codec").
"""

from __future__ import annotations

import math
import re

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from models.mimi.codec import Mimi
from models.mimi.modules import StreamConv, _ResBlock

__all__ = ["encode_frames", "moshi_state"]

_RENAMES = (  # transformers' flat MimiModel names -> moshi's (order matters)
    (r"^encoder\.layers\.", "encoder.model."),
    (r"^decoder\.layers\.", "decoder.model."),
    (r"^(encoder|decoder)_transformer\.layers\.", r"\1_transformer.transformer.layers."),
    (r"\.mlp\.fc1\.", ".linear1."),
    (r"\.mlp\.fc2\.", ".linear2."),
    (r"\.self_attn\.o_proj\.", ".self_attn.out_projs.0."),
    (r"\.input_layernorm\.", ".norm1."),
    (r"\.post_attention_layernorm\.", ".norm2."),
    (r"\.self_attn_layer_scale\.", ".layer_scale_1."),
    (r"\.mlp_layer_scale\.", ".layer_scale_2."),
    (r"^quantizer\.semantic_residual_vector_quantizer\.layers\.", "quantizer.rvq_first.vq.layers."),
    (r"^quantizer\.acoustic_residual_vector_quantizer\.layers\.", "quantizer.rvq_rest.vq.layers."),
    (r"^quantizer\.semantic_residual_vector_quantizer\.", "quantizer.rvq_first."),
    (r"^quantizer\.acoustic_residual_vector_quantizer\.", "quantizer.rvq_rest."),
    (r"\.codebook\.initialized$", "._codebook._initialized"),
    (r"\.codebook\.cluster_usage$", "._codebook.cluster_usage"),
    (r"\.codebook\.embed_sum$", "._codebook.embedding_sum"),
    (r"^downsample\.conv\.", "downsample.conv.conv.conv."),
    (r"^upsample\.conv\.", "upsample.convtr.convtr.convtr."),
)


def _unpermute(w: Tensor, heads: int) -> Tensor:
    """Rows of a q or k projection from rotate-half order back to interleaved pairs (the
    inverse of transformers' conversion: ``view(h, d/2, 2, in).transpose(1, 2)``)."""
    rows, cols = w.shape
    return w.view(heads, 2, rows // heads // 2, cols).transpose(1, 2).reshape(rows, cols)


def moshi_state(hf: dict[str, Tensor], mimi: Mimi) -> dict[str, Tensor]:
    """transformers' ``MimiModel`` state (the ``codec_model.`` prefix removed) -> ``mimi``'s keys.

    Raises ``ValueError`` naming what does not map."""
    expected = set(mimi.state_dict())
    heads = mimi.config.transformer.num_heads
    out: dict[str, Tensor] = {}
    qkv: dict[str, dict[str, Tensor]] = {}
    unknown = []
    for key, value in hf.items():
        k = key
        for pattern, repl in _RENAMES:
            k = re.sub(pattern, repl, k)
        m = re.match(r"^(.*\.self_attn\.)(q|k|v)_proj\.weight$", k)
        if m:
            qkv.setdefault(m.group(1), {})[m.group(2)] = value
            continue
        if k not in expected and k.endswith((".conv.weight", ".conv.bias")):  # a SEANet convolution
            stem, leaf = k.rsplit(".conv.", 1)
            for cand in (f"{stem}.conv.conv.{leaf}", f"{stem}.convtr.convtr.{leaf}"):
                if cand in expected:
                    k = cand
                    break
        if k in expected:
            out[k] = value
        else:
            unknown.append(key)
    for prefix, parts in qkv.items():
        if set(parts) != {"q", "k", "v"}:
            unknown.append(prefix + "?_proj")
            continue
        out[prefix + "in_projs.0.weight"] = torch.cat(
            (_unpermute(parts["q"], heads), _unpermute(parts["k"], heads), parts["v"]), dim=0)
    missing = sorted(expected - set(out))
    if unknown or missing:
        raise ValueError(f"the codec's weights do not match its config: unexpected {sorted(unknown)[:5]}, "
                         f"missing {missing[:5]}")
    return out


def _conv(m: StreamConv, x: Tensor) -> Tensor:
    """transformers' causal ``MimiConv1d``: left ``kernel - stride``, right up to a whole stride."""
    extra = math.ceil(x.shape[-1] / m.stride) * m.stride - x.shape[-1]
    mode = "replicate" if m.pad_mode == "replicate" else "constant"
    if m.context or extra:
        x = F.pad(x, (m.context, extra), mode=mode)
    return m.inner(x)


def _seanet_encoder(model: nn.Sequential, x: Tensor) -> Tensor:
    for m in model:
        if isinstance(m, StreamConv):
            x = _conv(m, x)
        elif isinstance(m, _ResBlock):
            h = x
            for sub in m.block:
                h = _conv(sub, h) if isinstance(sub, StreamConv) else sub(h)
            x = x + h
        elif isinstance(m, nn.ELU):
            x = m(x)
        else:  # a module this path does not know would silently change the codes
            raise TypeError(f"encode_frames: unexpected encoder module {type(m).__name__}")
    return x


@torch.no_grad()
def encode_frames(mimi: Mimi, wav: Tensor, num_codebooks: int) -> Tensor:
    """wav float [B, 1, S] at the codec's rate -> codes int64 [B, num_codebooks, ceil(S / 1920)],
    as transformers' ``MimiModel.encode`` computes them (see the module docstring)."""
    if wav.dim() != 3 or wav.shape[1] != mimi.config.channels:
        raise ValueError(f"encode_frames expects [B, {mimi.config.channels}, S], got {tuple(wav.shape)}")
    emb = mimi.encoder_transformer(_seanet_encoder(mimi.encoder.model, wav))
    if mimi.downsample is not None:
        emb = _conv(mimi.downsample.conv, emb)
    return mimi.quantizer.encode(emb, num_codebooks)


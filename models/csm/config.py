"""CSM configuration: the checkpoint's ``config.json`` (transformers' ``CsmConfig`` layout) as
validated dataclasses, the released size and a tiny one (where each number comes from:
docs/models/csm.md, "Config").
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from models.mimi.config import MIMI, MimiConfig, QuantizerConfig, SEANetConfig, TransformerConfig
from models.mimi.config import TINY as MIMI_TINY
from models.orpheus.config import LlamaConfig

__all__ = ["CsmConfig", "CSM_1B", "TINY", "PRESETS", "load_config", "mimi_from_hf", "mimi_to_hf"]

BACKBONE_ROPE = {"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 0.125, "high_freq_factor": 0.5,
                 "original_max_position_embeddings": 1024}
DEPTH_ROPE = {"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 0.001953125, "high_freq_factor": 0.0078125,
              "original_max_position_embeddings": 16}


@dataclass(frozen=True)
class CsmConfig:
    """The backbone and depth decoder (``LlamaConfig`` each: ``vocab_size`` is the codebook size),
    the special ids and the codec."""

    backbone: LlamaConfig
    depth: LlamaConfig
    mimi: MimiConfig = field(default_factory=lambda: MIMI)
    num_codebooks: int = 32
    text_vocab_size: int = 128_256
    bos_token_id: int = 128_000
    eos_token_id: int = 128_001  # the tokenizer's <|end_of_text|>, closing each turn's text
    audio_token_id: int = 128_002
    audio_eos_token_id: int = 128_003
    codebook_eos_token_id: int = 0
    codebook_pad_token_id: int = 2050
    tie_codebooks_embeddings: bool = True

    def __post_init__(self) -> None:
        b, d = self.backbone, self.depth
        if not isinstance(self.num_codebooks, int) or self.num_codebooks < 2:
            raise ValueError(f"CsmConfig.num_codebooks must be an int >= 2, got {self.num_codebooks!r}")
        if b.vocab_size != d.vocab_size:
            raise ValueError(f"backbone and depth decoder codebook sizes differ ({b.vocab_size} vs {d.vocab_size})")
        if self.mimi.quantizer.n_q < self.num_codebooks:
            raise ValueError(f"the codec has {self.mimi.quantizer.n_q} codebooks, the model {self.num_codebooks}")
        if self.mimi.quantizer.bins > b.vocab_size:
            raise ValueError(f"codec bins ({self.mimi.quantizer.bins}) exceed the codebook size ({b.vocab_size})")
        if d.max_position_embeddings < self.num_codebooks + 1:
            raise ValueError(f"the depth decoder needs {self.num_codebooks + 1} positions, has "
                             f"{d.max_position_embeddings}")
        for name in ("bos_token_id", "eos_token_id", "audio_token_id", "audio_eos_token_id"):
            value = getattr(self, name)
            if not isinstance(value, int) or not 0 <= value < self.text_vocab_size:
                raise ValueError(f"CsmConfig.{name}={value!r} is outside the text vocabulary ({self.text_vocab_size})")
        if not 0 <= self.codebook_eos_token_id < b.vocab_size:
            raise ValueError(f"codebook_eos_token_id {self.codebook_eos_token_id} is not a codebook id")

    @property
    def codebook_size(self) -> int:
        """Ids per codebook (2,051: 2,048 codes and three specials)."""
        return self.backbone.vocab_size

    @property
    def frame_size(self) -> int:
        return self.mimi.frame_size

    @property
    def sample_rate(self) -> int:
        return self.mimi.sample_rate

    # -- transformers' layout -----------------------------------------------------------------
    @classmethod
    def from_hf_dict(cls, d: dict[str, Any]) -> CsmConfig:
        """Parse transformers' ``CsmConfig`` ``config.json`` (4.5x ``rope_scaling`` or 5.x
        ``rope_parameters``); the codec from its ``codec_config`` (``mimi_from_hf``)."""
        if d.get("model_type") != "csm":
            raise ValueError(f"expected a CSM config (model_type 'csm'), got {d.get('model_type')!r}")
        n = int(d.get("num_codebooks", 32))
        backbone = _llama(d, "backbone", vocab=int(d.get("vocab_size", 2051)), default_positions=2048)
        dd = dict(d.get("depth_decoder_config") or {})
        depth = _llama(dd, "depth decoder", vocab=int(dd.get("vocab_size", backbone.vocab_size)), default_positions=33)
        backbone_width = int(dd.get("backbone_hidden_size", backbone.hidden_size))
        if backbone_width != backbone.hidden_size:
            raise ValueError(f"depth_decoder_config.backbone_hidden_size {backbone_width} != hidden_size "
                             f"{backbone.hidden_size}")
        if int(dd.get("num_codebooks", n)) != n:
            raise ValueError("depth_decoder_config.num_codebooks differs from num_codebooks")
        codec = d.get("codec_config")
        return cls(
            backbone=backbone, depth=depth, mimi=mimi_from_hf(codec) if codec else MIMI, num_codebooks=n,
            text_vocab_size=int(d.get("text_vocab_size", 128_256)), bos_token_id=int(d.get("bos_token_id", 128_000)),
            audio_token_id=int(d.get("audio_token_id", 128_002)),
            audio_eos_token_id=int(d.get("audio_eos_token_id", 128_003)),
            codebook_eos_token_id=int(d.get("codebook_eos_token_id", 0)),
            codebook_pad_token_id=int(d.get("codebook_pad_token_id", 2050)),
            tie_codebooks_embeddings=bool(d.get("tie_codebooks_embeddings", True)),
        )

    def to_hf_dict(self) -> dict[str, Any]:
        """``config.json`` in transformers' 5.x layout (what ``CsmConfig(**d)`` accepts)."""
        b, dd = self.backbone, self.depth

        def stack(c: LlamaConfig) -> dict[str, Any]:
            rope: dict[str, Any] = {"rope_type": "default", "rope_theta": c.rope_theta}
            if c.rope_scaling:
                rope = {**c.rope_scaling, "rope_theta": c.rope_theta}
            return {"hidden_size": c.hidden_size, "intermediate_size": c.intermediate_size,
                    "num_hidden_layers": c.num_hidden_layers, "num_attention_heads": c.num_attention_heads,
                    "num_key_value_heads": c.num_key_value_heads, "head_dim": c.head_dim,
                    "rms_norm_eps": c.rms_norm_eps, "max_position_embeddings": c.max_position_embeddings,
                    "rope_parameters": rope, "vocab_size": c.vocab_size, "hidden_act": "silu"}

        return {
            "architectures": ["CsmForConditionalGeneration"], "model_type": "csm", **stack(b),
            "num_codebooks": self.num_codebooks, "text_vocab_size": self.text_vocab_size,
            "bos_token_id": self.bos_token_id, "pad_token_id": self.audio_token_id,
            "audio_token_id": self.audio_token_id, "audio_eos_token_id": self.audio_eos_token_id,
            "codebook_eos_token_id": self.codebook_eos_token_id, "codebook_pad_token_id": self.codebook_pad_token_id,
            "tie_codebooks_embeddings": self.tie_codebooks_embeddings,
            "depth_decoder_config": {"model_type": "csm_depth_decoder_model", **stack(dd),
                                     "num_codebooks": self.num_codebooks, "backbone_hidden_size": b.hidden_size},
            "codec_config": mimi_to_hf(self.mimi),
        }


def _llama(d: dict[str, Any], what: str, *, vocab: int, default_positions: int) -> LlamaConfig:
    """One stack's fields (a LlamaConfig whose ``vocab_size`` is the codebook size)."""
    for flag in ("attention_bias", "mlp_bias"):
        if d.get(flag):
            raise ValueError(f"{what}: {flag}=true is not supported")
    if d.get("hidden_act", "silu") != "silu":
        raise ValueError(f"{what}: hidden_act must be 'silu', got {d.get('hidden_act')!r}")
    try:
        hidden, heads = int(d["hidden_size"]), int(d["num_attention_heads"])
        layers, inter = int(d["num_hidden_layers"]), int(d["intermediate_size"])
    except KeyError as e:
        raise ValueError(f"{what} config is missing the field {e.args[0]!r}") from None
    params = dict(d.get("rope_parameters") or {})
    scaling = d.get("rope_scaling") or (params or None)
    theta = float(d.get("rope_theta", params.get("rope_theta", 500_000.0)))
    if scaling is not None:
        kind = scaling.get("rope_type", scaling.get("type", "default"))
        scaling = None if kind == "default" else {"rope_type": kind, **{
            k: scaling[k] for k in ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings")
            if k in scaling}}
    return LlamaConfig(vocab_size=vocab, hidden_size=hidden, intermediate_size=inter, num_hidden_layers=layers,
                       num_attention_heads=heads, num_key_value_heads=int(d.get("num_key_value_heads") or heads),
                       head_dim=int(d.get("head_dim") or hidden // heads), rms_norm_eps=float(d.get("rms_norm_eps", 1e-5)),
                       rope_theta=theta, rope_scaling=scaling,
                       max_position_embeddings=int(d.get("max_position_embeddings", default_positions)),
                       tie_word_embeddings=False, bos_token_id=None, eos_token_id=None)


# -- the codec in transformers' MimiConfig layout ---------------------------------------------
_MIMI_FIXED = {"audio_channels": 1, "use_causal_conv": True, "pad_mode": "constant", "use_conv_shortcut": False,
               "num_semantic_quantizers": 1, "hidden_act": "gelu", "trim_right_ratio": 1.0}


def mimi_from_hf(d: dict[str, Any]) -> MimiConfig:
    """transformers' ``MimiConfig`` fields -> ``MimiConfig`` (what those checkpoints use; anything
    else is refused with ``ValueError``)."""
    for key, want in _MIMI_FIXED.items():
        if key in d and d[key] != want:
            raise ValueError(f"codec_config.{key}={d[key]!r} is not supported (only {want!r})")
    hidden = int(d.get("hidden_size", 512))
    heads = int(d.get("num_attention_heads", 8))
    if int(d.get("num_key_value_heads", heads)) != heads:
        raise ValueError("codec_config: grouped KV heads are not supported")
    if int(d.get("head_dim", hidden // heads)) * heads != hidden:
        raise ValueError("codec_config: head_dim * num_attention_heads must equal hidden_size")
    dim = int(d.get("codebook_dim", 256))
    if int(d.get("vector_quantization_hidden_dimension", dim)) != dim:
        raise ValueError("codec_config: vector_quantization_hidden_dimension must equal codebook_dim")
    if int(d.get("upsample_groups", hidden)) != hidden:
        raise ValueError("codec_config: upsample_groups must equal hidden_size (a channel-wise upsampling)")
    rope = dict(d.get("rope_parameters") or {})
    theta = float(d.get("rope_theta", rope.get("rope_theta", 10000.0)))
    ratios = tuple(int(r) for r in d.get("upsampling_ratios", (8, 6, 5, 4)))
    seanet = SEANetConfig(dimension=hidden, n_filters=int(d.get("num_filters", 64)),
                          n_residual_layers=int(d.get("num_residual_layers", 1)), ratios=ratios,
                          compress=int(d.get("compress", 2)), dilation_base=int(d.get("dilation_growth_rate", 2)),
                          kernel_size=int(d.get("kernel_size", 7)), residual_kernel_size=int(d.get("residual_kernel_size", 3)),
                          last_kernel_size=int(d.get("last_kernel_size", 3)))
    quantizer = QuantizerConfig(dimension=dim, n_q=int(d.get("num_quantizers", 32)),
                                bins=int(d.get("codebook_size", 2048)), input_dimension=hidden, output_dimension=hidden)
    transformer = TransformerConfig(d_model=hidden, num_heads=heads, num_layers=int(d.get("num_hidden_layers", 8)),
                                    dim_feedforward=int(d.get("intermediate_size", 2048)),
                                    context=int(d.get("sliding_window", 250)),
                                    layer_scale=float(d.get("layer_scale_initial_scale", 0.01)), max_period=theta,
                                    input_dimension=hidden, output_dimensions=(hidden,))
    frame_rate = d.get("frame_rate", d.get("_frame_rate")) or 12.5
    return MimiConfig(sample_rate=int(d.get("sampling_rate", 24000)), frame_rate=float(frame_rate), seanet=seanet,
                      quantizer=quantizer, transformer=transformer)


def mimi_to_hf(c: MimiConfig) -> dict[str, Any]:
    """``MimiConfig`` -> transformers' ``MimiConfig`` fields (``codec_config``)."""
    s, q, t = c.seanet, c.quantizer, c.transformer
    return {**_MIMI_FIXED, "model_type": "mimi", "sampling_rate": c.sample_rate, "frame_rate": c.frame_rate,
            "hidden_size": s.dimension, "num_filters": s.n_filters, "num_residual_layers": s.n_residual_layers,
            "upsampling_ratios": list(s.ratios), "kernel_size": s.kernel_size, "last_kernel_size": s.last_kernel_size,
            "residual_kernel_size": s.residual_kernel_size, "dilation_growth_rate": s.dilation_base,
            "compress": s.compress, "num_hidden_layers": t.num_layers, "intermediate_size": t.dim_feedforward,
            "num_attention_heads": t.num_heads, "num_key_value_heads": t.num_heads, "head_dim": t.head_dim,
            "sliding_window": t.context, "layer_scale_initial_scale": t.layer_scale,
            "rope_parameters": {"rope_type": "default", "rope_theta": t.max_period}, "norm_eps": 1e-5,
            "codebook_size": q.bins, "codebook_dim": q.dimension, "vector_quantization_hidden_dimension": q.dimension,
            "num_quantizers": q.n_q, "upsample_groups": s.dimension}


def load_config(d: str | Path) -> CsmConfig:
    f = Path(d) / "config.json"
    if not f.is_file():
        raise FileNotFoundError(f"model directory {str(d)!r} has no config.json")
    return CsmConfig.from_hf_dict(json.loads(f.read_text()))


CSM_1B = CsmConfig(
    backbone=LlamaConfig(vocab_size=2051, hidden_size=2048, intermediate_size=8192, num_hidden_layers=16,
                         num_attention_heads=32, num_key_value_heads=8, head_dim=64, rms_norm_eps=1e-5,
                         rope_theta=500_000.0, rope_scaling=BACKBONE_ROPE, max_position_embeddings=2048,
                         tie_word_embeddings=False, bos_token_id=None, eos_token_id=None),
    depth=LlamaConfig(vocab_size=2051, hidden_size=1024, intermediate_size=8192, num_hidden_layers=4,
                      num_attention_heads=8, num_key_value_heads=2, head_dim=128, rms_norm_eps=1e-5,
                      rope_theta=500_000.0, rope_scaling=DEPTH_ROPE, max_position_embeddings=33,
                      tie_word_embeddings=False, bos_token_id=None, eos_token_id=None),
    mimi=MIMI,
)

# Toy widths, the real ids and RoPE; Mimi's tiny codec with the real 250-step window (so short
# streams stay inside it: see models.mimi.stream).
TINY = replace(
    CSM_1B,
    backbone=CSM_1B.backbone.with_(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                                   num_key_value_heads=2, head_dim=16),
    depth=CSM_1B.depth.with_(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
                             num_key_value_heads=1, head_dim=16),
    mimi=replace(MIMI_TINY, transformer=replace(MIMI_TINY.transformer, context=250)),
)

PRESETS: dict[str, CsmConfig] = {"csm-1b": CSM_1B, "tiny": TINY}

"""Llama backbone configuration: a validated dataclass, presets, and ``config.json`` parsing.

``from_hf_dict`` reads both the transformers 4.x layout (``rope_theta`` + ``rope_scaling``) and
the 5.x layout (``rope_parameters`` holding ``rope_theta`` and the scaling fields).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

__all__ = ["LlamaConfig", "PRESETS", "ORPHEUS_3B", "TINY"]

_LLAMA3_KEYS = ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings")


@dataclass(frozen=True)
class LlamaConfig:
    """Architecture of a Llama-3 style decoder (what the model code needs, nothing more)."""

    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    rms_norm_eps: float = 1e-5
    rope_theta: float = 500000.0
    # None (plain RoPE) or {"rope_type": "llama3", "factor", "low_freq_factor",
    # "high_freq_factor", "original_max_position_embeddings"}.
    rope_scaling: dict[str, Any] | None = None
    max_position_embeddings: int = 131072
    tie_word_embeddings: bool = True
    bos_token_id: int | None = 128000
    eos_token_id: int | tuple[int, ...] | None = 128009
    pad_token_id: int | None = None
    extra: dict[str, Any] = field(default_factory=dict, compare=False, repr=False)

    def __post_init__(self) -> None:
        positive = (
            "vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
            "num_attention_heads", "num_key_value_heads", "head_dim", "max_position_embeddings",
        )
        for name in positive:
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise ValueError(f"LlamaConfig.{name} must be a positive int, got {value!r}")
        if self.num_attention_heads % self.num_key_value_heads != 0:
            raise ValueError(
                f"num_attention_heads ({self.num_attention_heads}) must be a multiple of "
                f"num_key_value_heads ({self.num_key_value_heads})"
            )
        if self.head_dim % 2 != 0:
            raise ValueError(f"head_dim must be even for RoPE, got {self.head_dim}")
        if not self.rms_norm_eps > 0:
            raise ValueError(f"rms_norm_eps must be > 0, got {self.rms_norm_eps}")
        if not self.rope_theta > 0:
            raise ValueError(f"rope_theta must be > 0, got {self.rope_theta}")
        if self.rope_scaling is not None:
            kind = self.rope_scaling.get("rope_type", self.rope_scaling.get("type"))
            if kind != "llama3":
                raise ValueError(f"only llama3 rope scaling is supported, got rope_type={kind!r}")
            missing = [k for k in _LLAMA3_KEYS if k not in self.rope_scaling]
            if missing:
                raise ValueError(f"llama3 rope scaling is missing {missing}")
            low, high = self.rope_scaling["low_freq_factor"], self.rope_scaling["high_freq_factor"]
            if not (self.rope_scaling["factor"] > 0 and 0 < low < high):
                raise ValueError(
                    "llama3 rope scaling needs factor > 0 and 0 < low_freq_factor < "
                    f"high_freq_factor, got {self.rope_scaling}"
                )

    @property
    def num_kv_groups(self) -> int:
        return self.num_attention_heads // self.num_key_value_heads

    def with_(self, **changes: Any) -> LlamaConfig:
        """A copy with some fields changed (validated again)."""
        return replace(self, **changes)

    @classmethod
    def from_hf_dict(cls, d: dict[str, Any]) -> LlamaConfig:
        """Parse a Hugging Face ``config.json`` of a ``LlamaForCausalLM``."""
        arch = d.get("architectures") or ["LlamaForCausalLM"]
        if d.get("model_type", "llama") != "llama" or "LlamaForCausalLM" not in arch:
            raise ValueError(
                f"expected a llama LlamaForCausalLM config, got model_type={d.get('model_type')!r} "
                f"architectures={arch!r}"
            )
        for flag in ("attention_bias", "mlp_bias"):
            if d.get(flag):
                raise ValueError(f"{flag}=true is not supported by this Llama implementation")
        if d.get("hidden_act", "silu") != "silu":
            raise ValueError(f"hidden_act must be 'silu', got {d.get('hidden_act')!r}")
        try:
            hidden, heads = int(d["hidden_size"]), int(d["num_attention_heads"])
            required = {k: d[k] for k in ("vocab_size", "intermediate_size", "num_hidden_layers")}
        except KeyError as e:
            raise ValueError(f"config.json is missing the field {e.args[0]!r}") from None
        params = dict(d.get("rope_parameters") or {})
        scaling = d.get("rope_scaling") or (params if params else None)
        theta = d.get("rope_theta", params.get("rope_theta", 10000.0))
        if scaling is not None:
            kind = scaling.get("rope_type", scaling.get("type", "default"))
            if kind == "default":
                scaling = None
            else:
                scaling = {"rope_type": kind, **{k: scaling[k] for k in _LLAMA3_KEYS if k in scaling}}
        eos = d.get("eos_token_id", 128009)
        return cls(
            vocab_size=int(required["vocab_size"]),
            hidden_size=hidden,
            intermediate_size=int(required["intermediate_size"]),
            num_hidden_layers=int(required["num_hidden_layers"]),
            num_attention_heads=heads,
            num_key_value_heads=int(d.get("num_key_value_heads") or heads),
            head_dim=int(d.get("head_dim") or hidden // heads),
            rms_norm_eps=float(d.get("rms_norm_eps", 1e-6)),
            rope_theta=float(theta),
            rope_scaling=scaling,
            max_position_embeddings=int(d.get("max_position_embeddings", 2048)),
            tie_word_embeddings=bool(d.get("tie_word_embeddings", False)),
            bos_token_id=d.get("bos_token_id"),
            eos_token_id=tuple(eos) if isinstance(eos, list) else eos,
            pad_token_id=d.get("pad_token_id"),
            extra={k: v for k, v in d.items() if k in ("torch_dtype", "dtype", "transformers_version")},
        )

    def to_hf_dict(self) -> dict[str, Any]:
        """The transformers 4.x-style ``config.json`` fields (readable by 4.x and 5.x)."""
        d: dict[str, Any] = {
            "architectures": ["LlamaForCausalLM"],
            "model_type": "llama",
            "vocab_size": self.vocab_size,
            "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size,
            "num_hidden_layers": self.num_hidden_layers,
            "num_attention_heads": self.num_attention_heads,
            "num_key_value_heads": self.num_key_value_heads,
            "head_dim": self.head_dim,
            "rms_norm_eps": self.rms_norm_eps,
            "rope_theta": self.rope_theta,
            "rope_scaling": dict(self.rope_scaling) if self.rope_scaling else None,
            "max_position_embeddings": self.max_position_embeddings,
            "tie_word_embeddings": self.tie_word_embeddings,
            "bos_token_id": self.bos_token_id,
            "eos_token_id": list(self.eos_token_id) if isinstance(self.eos_token_id, tuple)
            else self.eos_token_id,
            "hidden_act": "silu",
        }
        return d


_LLAMA3_ROPE = {
    "rope_type": "llama3",
    "factor": 32.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 8192,
}

# Orpheus 3B = Llama-3.2-3B with the vocabulary extended to 156,940 ids (7 x 4096 audio codes).
ORPHEUS_3B = LlamaConfig(
    vocab_size=156940,
    hidden_size=3072,
    intermediate_size=8192,
    num_hidden_layers=28,
    num_attention_heads=24,
    num_key_value_heads=8,
    head_dim=128,
    rms_norm_eps=1e-5,
    rope_theta=500000.0,
    rope_scaling=_LLAMA3_ROPE,
    max_position_embeddings=131072,
    tie_word_embeddings=True,
    bos_token_id=128000,
    eos_token_id=128009,
)

# Same vocabulary (so real Orpheus token ids are valid), toy sizes: for tests and smoke runs.
TINY = ORPHEUS_3B.with_(
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
)

PRESETS: dict[str, LlamaConfig] = {"orpheus-3b": ORPHEUS_3B, "tiny": TINY}

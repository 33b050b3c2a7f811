"""VoxCPM2 configuration: validated dataclasses parsed from a checkpoint's ``config.json``, the
released checkpoint's numbers and a tiny preset (sections and sources: docs/models/voxcpm2.md,
"Loading").
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Any

__all__ = ["MiniCPMConfig", "LocalConfig", "AudioVAEConfig", "VoxCPM2Config", "PRESETS", "VOXCPM2", "TINY"]


def _positive(obj: object, *names: str) -> None:
    for name in names:
        value = getattr(obj, name)
        if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
            raise ValueError(f"{type(obj).__name__}.{name} must be a positive int, got {value!r}")


@dataclass(frozen=True)
class MiniCPMConfig:
    """One MiniCPM4 stack (the backbone, the residual LM, the local encoder or the DiT)."""

    hidden_size: int = 2048
    intermediate_size: int = 6144
    num_hidden_layers: int = 28
    num_attention_heads: int = 16
    num_key_value_heads: int = 2
    kv_channels: int | None = 128
    vocab_size: int = 73448  # 0: no token table (residual LM, local transformers)
    rms_norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    max_position_embeddings: int = 32768
    original_max_position_embeddings: int = 32768
    long_factor: tuple[float, ...] = ()
    short_factor: tuple[float, ...] = ()
    use_mup: bool = False
    scale_emb: float = 12.0
    scale_depth: float = 1.4
    dim_model_base: int = 256
    no_rope: bool = False
    bos_token_id: int = 1
    eos_token_id: int = 2

    def __post_init__(self) -> None:
        _positive(self, "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                  "num_key_value_heads", "max_position_embeddings", "original_max_position_embeddings")
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError("MiniCPM: num_attention_heads must be a multiple of num_key_value_heads")
        if self.head_dim % 2:
            raise ValueError(f"MiniCPM: head_dim must be even, got {self.head_dim}")
        if not self.no_rope:
            half = self.head_dim // 2
            for name in ("long_factor", "short_factor"):
                if len(getattr(self, name)) != half:
                    raise ValueError(f"MiniCPM: rope_scaling.{name} needs head_dim/2 = {half} entries, "
                                     f"got {len(getattr(self, name))}")

    @property
    def head_dim(self) -> int:
        return self.kv_channels if self.kv_channels else self.hidden_size // self.num_attention_heads

    @property
    def residual_scale(self) -> float:
        """The factor on each sub-layer's output before the residual add (mup), else 1."""
        return self.scale_depth / math.sqrt(self.num_hidden_layers) if self.use_mup else 1.0

    @property
    def embed_scale(self) -> float:
        return self.scale_emb if self.use_mup else 1.0

    def derived(self, **changes: Any) -> MiniCPMConfig:
        """A copy with some fields changed (how the reference builds its other stacks)."""
        return replace(self, **changes)

    @classmethod
    def from_hf_dict(cls, d: dict[str, Any]) -> MiniCPMConfig:
        rope = d.get("rope_scaling") or {}
        kw: dict[str, Any] = {k: d[k] for k in (
            "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
            "kv_channels", "vocab_size", "max_position_embeddings", "use_mup", "dim_model_base", "no_rope",
            "bos_token_id", "eos_token_id") if k in d}
        for k in ("rms_norm_eps", "rope_theta", "scale_emb", "scale_depth"):
            if k in d:
                kw[k] = float(d[k])
        if rope:
            kind = rope.get("type", rope.get("rope_type", "longrope"))
            if kind != "longrope":
                raise ValueError(f"MiniCPM: only longrope scaling is supported, got {kind!r}")
            kw["long_factor"] = tuple(float(x) for x in rope["long_factor"])
            kw["short_factor"] = tuple(float(x) for x in rope["short_factor"])
            kw["original_max_position_embeddings"] = int(rope["original_max_position_embeddings"])
        return cls(**kw)

    def to_hf_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {k: getattr(self, k) for k in (
            "bos_token_id", "eos_token_id", "hidden_size", "intermediate_size", "max_position_embeddings",
            "num_attention_heads", "num_hidden_layers", "num_key_value_heads", "rms_norm_eps", "vocab_size",
            "use_mup", "scale_emb", "dim_model_base", "scale_depth", "rope_theta", "kv_channels", "no_rope")}
        d["rope_scaling"] = {"type": "longrope", "long_factor": list(self.long_factor),
                             "short_factor": list(self.short_factor),
                             "original_max_position_embeddings": self.original_max_position_embeddings}
        return d


@dataclass(frozen=True)
class LocalConfig:
    """``encoder_config`` / ``dit_config``: a small bidirectional MiniCPM stack over one patch."""

    hidden_dim: int = 1024
    ffn_dim: int = 4096
    num_heads: int = 16
    num_layers: int = 12
    kv_channels: int | None = 128
    mean_mode: bool = False  # DiT only; the reference's inference never uses it (dt is zeroed)

    def __post_init__(self) -> None:
        _positive(self, "hidden_dim", "ffn_dim", "num_heads", "num_layers")

    @classmethod
    def from_hf_dict(cls, d: dict[str, Any]) -> LocalConfig:
        kw = {k: d[k] for k in ("hidden_dim", "ffn_dim", "num_heads", "num_layers", "kv_channels") if k in d}
        # The reference reads only `dit_mean_mode` (the released config's `mean_mode` key is ignored).
        kw["mean_mode"] = bool(d.get("dit_mean_mode", False))
        return cls(**kw)

    def to_hf_dict(self) -> dict[str, Any]:
        return {"hidden_dim": self.hidden_dim, "ffn_dim": self.ffn_dim, "num_heads": self.num_heads,
                "num_layers": self.num_layers, "kv_channels": self.kv_channels}


@dataclass(frozen=True)
class AudioVAEConfig:
    """``audio_vae_config``: a causal conv VAE, ``sample_rate`` in, ``out_sample_rate`` out."""

    encoder_dim: int = 128
    encoder_rates: tuple[int, ...] = (2, 5, 8, 8)
    latent_dim: int = 64
    decoder_dim: int = 2048
    decoder_rates: tuple[int, ...] = (8, 6, 5, 2, 2, 2)
    depthwise: bool = True
    sample_rate: int = 16000
    out_sample_rate: int = 48000
    use_noise_block: bool = False
    sr_bin_boundaries: tuple[int, ...] | None = (20000, 30000, 40000)
    cond_type: str = "scale_bias"

    def __post_init__(self) -> None:
        _positive(self, "encoder_dim", "latent_dim", "decoder_dim", "sample_rate", "out_sample_rate")
        if not self.encoder_rates or not self.decoder_rates or min(*self.encoder_rates, *self.decoder_rates) <= 0:
            raise ValueError("AudioVAE: rates must be non-empty positive ints")
        if self.decoder_dim % (2 ** len(self.decoder_rates)):
            raise ValueError("AudioVAE: decoder_dim must halve once per decoder rate")
        if self.use_noise_block:
            # Its torch.randn in the decoder would make audio depend on the batch; not served.
            raise ValueError("AudioVAE: use_noise_block is not supported")
        if self.cond_type not in ("scale_bias", "scale_bias_init", "add"):
            raise ValueError(f"AudioVAE: cond_type {self.cond_type!r} is not supported")

    @property
    def hop_length(self) -> int:
        """Input samples per latent frame (``chunk_size`` in the reference)."""
        return math.prod(self.encoder_rates)

    @property
    def decode_hop(self) -> int:
        """Output samples per latent frame (``decode_chunk_size``)."""
        return math.prod(self.decoder_rates)

    @property
    def sr_bucket(self) -> int:
        """The decoder's sample-rate condition bucket for ``out_sample_rate`` (torch.bucketize)."""
        return sum(1 for b in (self.sr_bin_boundaries or ()) if b < self.out_sample_rate)

    @classmethod
    def from_hf_dict(cls, d: dict[str, Any]) -> AudioVAEConfig:
        kw: dict[str, Any] = {}
        for k in cls.__dataclass_fields__:
            if k in d:
                v = d[k]
                kw[k] = tuple(v) if isinstance(v, list) else v
        if d.get("cond_out_layer"):
            raise ValueError("AudioVAE: cond_out_layer is not supported")
        return cls(**kw)

    def to_hf_dict(self) -> dict[str, Any]:
        return {k: list(v) if isinstance(v, tuple) else v for k, v in
                ((k, getattr(self, k)) for k in self.__dataclass_fields__)}


@dataclass(frozen=True)
class VoxCPM2Config:
    lm: MiniCPMConfig = field(default_factory=MiniCPMConfig)
    encoder: LocalConfig = field(default_factory=LocalConfig)
    dit: LocalConfig = field(default_factory=LocalConfig)
    vae: AudioVAEConfig = field(default_factory=AudioVAEConfig)
    patch_size: int = 4
    feat_dim: int = 64
    residual_lm_num_layers: int = 8
    residual_lm_no_rope: bool = True
    scalar_quantization_latent_dim: int = 512
    scalar_quantization_scale: int = 9
    max_length: int = 8192
    dtype: str = "bfloat16"
    sigma_min: float = 1e-6

    def __post_init__(self) -> None:
        _positive(self, "patch_size", "feat_dim", "residual_lm_num_layers", "scalar_quantization_latent_dim",
                  "scalar_quantization_scale", "max_length")
        if self.vae.latent_dim != self.feat_dim:
            raise ValueError(f"feat_dim ({self.feat_dim}) must equal the VAE latent_dim ({self.vae.latent_dim})")
        if self.lm.vocab_size <= 104:
            raise ValueError("the backbone vocabulary must hold the audio special ids 101..104")

    # -- the derived stacks, as the reference builds them ---------------------------------------
    @property
    def residual(self) -> MiniCPMConfig:
        return self.lm.derived(num_hidden_layers=self.residual_lm_num_layers, vocab_size=0,
                               no_rope=self.residual_lm_no_rope)

    def _local(self, c: LocalConfig) -> MiniCPMConfig:
        return self.lm.derived(hidden_size=c.hidden_dim, intermediate_size=c.ffn_dim, num_attention_heads=c.num_heads,
                               num_hidden_layers=c.num_layers, kv_channels=c.kv_channels, vocab_size=0)

    @property
    def encoder_lm(self) -> MiniCPMConfig:
        return self._local(self.encoder)

    @property
    def dit_lm(self) -> MiniCPMConfig:
        return self._local(self.dit)

    @property
    def patch_samples(self) -> int:
        """Output samples per patch (48 kHz)."""
        return self.patch_size * self.vae.decode_hop

    @property
    def sample_rate(self) -> int:
        return self.vae.out_sample_rate

    def with_(self, **changes: Any) -> VoxCPM2Config:
        return replace(self, **changes)

    @classmethod
    def from_hf_dict(cls, d: dict[str, Any]) -> VoxCPM2Config:
        arch = str(d.get("architecture", "")).lower()
        if arch != "voxcpm2":
            raise ValueError(f"expected architecture 'voxcpm2', got {d.get('architecture')!r}")
        for k in ("lm_config", "encoder_config", "dit_config"):
            if k not in d:
                raise ValueError(f"config.json has no {k}")
        dit = d["dit_config"]
        cfm = dit.get("cfm_config") or {}
        if cfm.get("solver", "euler") != "euler":
            raise ValueError(f"only the Euler solver is supported, got {cfm.get('solver')!r}")
        kw: dict[str, Any] = {k: d[k] for k in ("patch_size", "feat_dim", "residual_lm_num_layers",
                                                "residual_lm_no_rope", "scalar_quantization_latent_dim",
                                                "scalar_quantization_scale", "max_length", "dtype") if k in d}
        return cls(lm=MiniCPMConfig.from_hf_dict(d["lm_config"]), encoder=LocalConfig.from_hf_dict(d["encoder_config"]),
                   dit=LocalConfig.from_hf_dict(dit), vae=AudioVAEConfig.from_hf_dict(d.get("audio_vae_config") or {}),
                   sigma_min=float(cfm.get("sigma_min", 1e-6)), **kw)

    def to_hf_dict(self) -> dict[str, Any]:
        dit = self.dit.to_hf_dict()
        dit["dit_mean_mode"] = self.dit.mean_mode
        dit["cfm_config"] = {"sigma_min": self.sigma_min, "solver": "euler", "t_scheduler": "log-norm",
                             "inference_cfg_rate": 2.0}
        return {"architecture": "voxcpm2", "lm_config": self.lm.to_hf_dict(), "patch_size": self.patch_size,
                "feat_dim": self.feat_dim, "residual_lm_num_layers": self.residual_lm_num_layers,
                "residual_lm_no_rope": self.residual_lm_no_rope,
                "scalar_quantization_latent_dim": self.scalar_quantization_latent_dim,
                "scalar_quantization_scale": self.scalar_quantization_scale,
                "encoder_config": self.encoder.to_hf_dict(), "dit_config": dit,
                "audio_vae_config": self.vae.to_hf_dict(), "max_length": self.max_length, "dtype": self.dtype}


# The published LongRoPE factors of the backbone (64 = head_dim / 2 entries; long == short).
_LONGROPE_FACTORS = (
    0.9977997200264581, 1.014658295992452, 1.0349680404997148, 1.059429246056193, 1.0888815016813513,
    1.1243301355211495, 1.166977103606075, 1.2182568066927284, 1.2798772354275727, 1.3538666751582975,
    1.4426259039919596, 1.5489853358570191, 1.6762658237220625, 1.8283407612492941, 2.0096956085876183,
    2.225478927469756, 2.481536379650452, 2.784415934557119, 3.1413289096347365, 3.560047844772632,
    4.048719380066383, 4.615569542115128, 5.2684819496549835, 6.014438591970396, 6.858830049237097,
    7.804668263503327, 8.851768731513417, 9.99600492938444, 11.228766118181639, 12.536757560834843,
    13.902257701387796, 15.303885189125953, 16.717837610115794, 18.119465097853947, 19.484965238406907,
    20.792956681060105, 22.02571786985731, 23.16995406772833, 24.217054535738416, 25.16289275000465,
    26.007284207271347, 26.753240849586767, 27.40615325712662, 27.973003419175363, 28.461674954469114,
    28.880393889607006, 29.237306864684626, 29.540186419591297, 29.79624387177199, 30.01202719065413,
    30.193382037992453, 30.34545697551969, 30.47273746338473, 30.579096895249787, 30.66785612408345,
    30.741845563814174, 30.80346599254902, 30.85474569563567, 30.897392663720595, 30.932841297560394,
    30.962293553185553, 30.986754758742034, 31.007064503249293, 31.02392307921529,
)

VOXCPM2 = VoxCPM2Config(lm=MiniCPMConfig(long_factor=_LONGROPE_FACTORS, short_factor=_LONGROPE_FACTORS))

# Toy sizes with the real layout. The LongRoPE table is longer than its original length so the
# long factors and a scaling factor != 1 are exercised; mup is on so its scalings are too (the
# released model has it off); the VAE keeps the real rate structure at small widths.
_TINY_HEAD = 16
_TINY_FACTORS = tuple(1.0 + 0.25 * i for i in range(_TINY_HEAD // 2))
TINY = VoxCPM2Config(
    lm=MiniCPMConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                     num_key_value_heads=2, kv_channels=_TINY_HEAD, vocab_size=640, max_position_embeddings=1024,
                     original_max_position_embeddings=512, long_factor=tuple(f * 1.5 for f in _TINY_FACTORS),
                     short_factor=_TINY_FACTORS, use_mup=True, scale_emb=2.0, scale_depth=1.4, dim_model_base=32),
    encoder=LocalConfig(hidden_dim=32, ffn_dim=64, num_heads=2, num_layers=2, kv_channels=_TINY_HEAD),
    dit=LocalConfig(hidden_dim=32, ffn_dim=64, num_heads=2, num_layers=2, kv_channels=_TINY_HEAD),
    vae=AudioVAEConfig(encoder_dim=4, latent_dim=8, decoder_dim=128),
    feat_dim=8, residual_lm_num_layers=2, scalar_quantization_latent_dim=16, max_length=1024, dtype="float32",
)

PRESETS: dict[str, VoxCPM2Config] = {"voxcpm2": VOXCPM2, "tiny": TINY}

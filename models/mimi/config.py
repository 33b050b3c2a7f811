"""Mimi codec configuration: validated dataclasses in the layout of moshi's ``mimi_config``;
``MIMI`` is moshi 0.2.13's (docs/models/kyutai_tts.md, "The Mimi codec").
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace
from typing import Any

__all__ = ["SEANetConfig", "QuantizerConfig", "TransformerConfig", "MimiConfig", "MIMI", "TINY", "PRESETS"]


def _positive(obj: object, *names: str) -> None:
    for name in names:
        value = getattr(obj, name)
        if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
            raise ValueError(f"{type(obj).__name__}.{name} must be a positive int, got {value!r}")


def _require(obj: object, name: str, allowed: tuple[Any, ...]) -> None:
    value = getattr(obj, name)
    if value not in allowed:
        raise ValueError(f"{type(obj).__name__}.{name}={value!r} is not supported (only {allowed})")


@dataclass(frozen=True)
class SEANetConfig:
    """The convolutional encoder / decoder (moshi ``SEANetEncoder`` / ``SEANetDecoder`` arguments)."""

    channels: int = 1
    dimension: int = 512
    n_filters: int = 64
    n_residual_layers: int = 1
    ratios: tuple[int, ...] = (8, 6, 5, 4)  # decoder order; the encoder runs them reversed
    activation: str = "ELU"
    compress: int = 2
    dilation_base: int = 2
    disable_norm_outer_blocks: int = 0
    kernel_size: int = 7
    residual_kernel_size: int = 3
    last_kernel_size: int = 3
    norm: str = "none"
    pad_mode: str = "constant"
    true_skip: bool = True
    causal: bool = True

    def __post_init__(self) -> None:
        _positive(self, "channels", "dimension", "n_filters", "n_residual_layers", "compress", "dilation_base",
                  "kernel_size", "residual_kernel_size", "last_kernel_size")
        _require(self, "activation", ("ELU",))
        _require(self, "norm", ("none",))
        _require(self, "pad_mode", ("constant",))
        _require(self, "true_skip", (True,))
        _require(self, "causal", (True,))
        if not self.ratios or any(not isinstance(r, int) or r <= 0 for r in self.ratios):
            raise ValueError(f"SEANetConfig.ratios must be positive ints, got {self.ratios!r}")
        if (self.n_filters * 2 ** len(self.ratios)) % self.compress or self.n_filters % self.compress:
            raise ValueError("SEANetConfig: every block width must divide by compress")

    @property
    def hop_length(self) -> int:
        n = 1
        for r in self.ratios:
            n *= r
        return n


@dataclass(frozen=True)
class QuantizerConfig:
    """Split residual VQ: one semantic codebook plus ``n_q - 1`` acoustic ones."""

    dimension: int = 256  # codebook vector size
    n_q: int = 32
    bins: int = 2048
    input_dimension: int = 512
    output_dimension: int = 512

    def __post_init__(self) -> None:
        _positive(self, "dimension", "n_q", "bins", "input_dimension", "output_dimension")
        if self.n_q < 2:
            raise ValueError("QuantizerConfig.n_q must be >= 2 (one semantic + acoustic codebooks)")


@dataclass(frozen=True)
class TransformerConfig:
    """The encoder / decoder transformers (moshi ``ProjectedTransformer`` arguments)."""

    d_model: int = 512
    num_heads: int = 8
    num_layers: int = 8
    dim_feedforward: int = 2048
    context: int = 250  # causal window, in encoder steps (25 Hz)
    layer_scale: float = 0.01
    max_period: float = 10000.0
    input_dimension: int = 512
    output_dimensions: tuple[int, ...] = (512,)
    causal: bool = True
    conv_layout: bool = True
    gating: str = "none"
    norm: str = "layer_norm"
    positional_embedding: str = "rope"

    def __post_init__(self) -> None:
        _positive(self, "d_model", "num_heads", "num_layers", "dim_feedforward", "context", "input_dimension")
        _require(self, "causal", (True,))
        _require(self, "conv_layout", (True,))
        _require(self, "gating", ("none",))
        _require(self, "norm", ("layer_norm",))
        _require(self, "positional_embedding", ("rope",))
        if self.d_model % self.num_heads or (self.d_model // self.num_heads) % 2:
            raise ValueError("TransformerConfig: d_model / num_heads must be an even integer")
        if len(self.output_dimensions) != 1:
            raise ValueError("TransformerConfig: exactly one output dimension is supported")

    @property
    def head_dim(self) -> int:
        return self.d_model // self.num_heads


@dataclass(frozen=True)
class MimiConfig:
    sample_rate: int = 24000
    channels: int = 1
    frame_rate: float = 12.5
    seanet: SEANetConfig = field(default_factory=SEANetConfig)
    quantizer: QuantizerConfig = field(default_factory=QuantizerConfig)
    transformer: TransformerConfig = field(default_factory=TransformerConfig)

    def __post_init__(self) -> None:
        _positive(self, "sample_rate", "channels")
        s, q, t = self.seanet, self.quantizer, self.transformer
        if s.channels != self.channels:
            raise ValueError("MimiConfig: seanet.channels must equal channels")
        if not (s.dimension == q.input_dimension == q.output_dimension == t.input_dimension == t.output_dimensions[0]):
            raise ValueError("MimiConfig: the SEANet dimension, the quantizer's and the transformer's in/out "
                             "dimensions must agree")
        stride = self.encoder_frame_rate / self.frame_rate
        if stride != int(stride) or int(stride) < 1:
            raise ValueError(f"MimiConfig: encoder frame rate {self.encoder_frame_rate} must be an integer "
                             f"multiple of frame_rate {self.frame_rate}")

    @property
    def encoder_frame_rate(self) -> float:
        return self.sample_rate / self.seanet.hop_length

    @property
    def resample_stride(self) -> int:
        """Encoder steps per codec frame (2 for Mimi: 25 Hz -> 12.5 Hz); 1 = no resampling."""
        return int(self.encoder_frame_rate / self.frame_rate)

    @property
    def frame_size(self) -> int:
        """Samples per codec frame (1,920 for Mimi)."""
        return int(self.sample_rate / self.frame_rate)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> MimiConfig:
        """Parse moshi's ``mimi_config`` layout (unknown keys are refused: they change the model)."""
        def build(kind: type, sub: dict[str, Any]) -> Any:
            names = set(kind.__dataclass_fields__)
            unknown = sorted(set(sub) - names)
            if unknown:
                raise ValueError(f"mimi config: unsupported {kind.__name__} keys {unknown}")
            return kind(**{k: tuple(v) if isinstance(v, list) else v for k, v in sub.items()})

        t = dict(d.get("transformer", {}))
        t.pop("device", None)
        return cls(sample_rate=int(d.get("sample_rate", 24000)), channels=int(d.get("channels", 1)),
                   frame_rate=float(d.get("frame_rate", 12.5)), seanet=build(SEANetConfig, d.get("seanet", {})),
                   quantizer=build(QuantizerConfig, d.get("quantizer", {})), transformer=build(TransformerConfig, t))

    def to_dict(self) -> dict[str, Any]:
        """moshi's ``mimi_config`` layout (``loaders.get_mimi(..., mimi_config=...)`` accepts it)."""
        def plain(obj: Any) -> dict[str, Any]:
            return {k: list(v) if isinstance(v, tuple) else v for k, v in asdict(obj).items()}

        return {"sample_rate": self.sample_rate, "channels": self.channels, "frame_rate": self.frame_rate,
                "seanet": plain(self.seanet), "quantizer": plain(self.quantizer),
                "transformer": plain(self.transformer)}


MIMI = MimiConfig()

# Toy widths with the real strides (1,920 samples a frame, 2,048 bins, 32 codebooks), and a
# window of 6 encoder steps (3 frames) so that short test sequences cross it.
TINY = MimiConfig(
    seanet=replace(SEANetConfig(), dimension=32, n_filters=4),
    quantizer=QuantizerConfig(dimension=16, input_dimension=32, output_dimension=32),
    transformer=TransformerConfig(d_model=32, num_heads=2, num_layers=2, dim_feedforward=64, context=6,
                                  input_dimension=32, output_dimensions=(32,)),
)

PRESETS: dict[str, MimiConfig] = {"mimi": MIMI, "tiny": TINY}

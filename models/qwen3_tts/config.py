"""Qwen3-TTS (12 Hz) configuration: validated dataclasses parsed from the checkpoint layout
(``config.json`` and ``speech_tokenizer/config.json``), and ``PRESETS`` of the released
checkpoints for ``--load-format dummy`` (their sources: docs/models/qwen3_tts.md).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

__all__ = [
    "TalkerConfig", "CodePredictorConfig", "SpeakerEncoderConfig", "CodecConfig", "Qwen3TTSConfig",
    "PRESETS", "QWEN3_TTS_1_7B_CUSTOM_VOICE", "QWEN3_TTS_1_7B_BASE", "QWEN3_TTS_0_6B_CUSTOM_VOICE",
    "QWEN3_TTS_0_6B_BASE", "TINY", "TINY_BASE",
]

MODEL_TYPES = ("custom_voice", "base", "voice_design")


def _positive(obj: object, *names: str) -> None:
    for name in names:
        value = getattr(obj, name)
        if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
            raise ValueError(f"{type(obj).__name__}.{name} must be a positive int, got {value!r}")


def _pick(d: dict[str, Any], cls: type, **renames: str) -> dict[str, Any]:
    """The keys of ``d`` that are fields of ``cls`` (lists become tuples)."""
    names = set(cls.__dataclass_fields__)
    out = {}
    for k, v in d.items():
        k = renames.get(k, k)
        if k in names:
            out[k] = tuple(v) if isinstance(v, list) else v
    return out


@dataclass(frozen=True)
class CodePredictorConfig:
    """The depth transformer sampling codebooks 1..15 of each frame (plain RoPE, q/k norm)."""

    hidden_size: int = 1024
    intermediate_size: int = 3072
    num_hidden_layers: int = 5
    num_attention_heads: int = 16
    num_key_value_heads: int = 8
    head_dim: int = 128
    vocab_size: int = 2048  # codes per codebook
    num_code_groups: int = 16
    rms_norm_eps: float = 1e-6
    rope_theta: float = 1_000_000.0

    def __post_init__(self) -> None:
        _positive(self, "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                  "num_key_value_heads", "head_dim", "vocab_size", "num_code_groups")
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError("code predictor: num_attention_heads must be a multiple of num_key_value_heads")
        if self.head_dim % 2:
            raise ValueError(f"code predictor: head_dim must be even, got {self.head_dim}")


@dataclass(frozen=True)
class TalkerConfig:
    """The Qwen3 talker: codec-id LM over text embeddings projected to its width."""

    hidden_size: int = 2048
    intermediate_size: int = 6144
    num_hidden_layers: int = 28
    num_attention_heads: int = 16
    num_key_value_heads: int = 8
    head_dim: int = 128
    vocab_size: int = 3072  # codec ids: 2048 codes + specials + languages + speakers
    text_vocab_size: int = 151_936
    text_hidden_size: int = 2048
    num_code_groups: int = 16
    rms_norm_eps: float = 1e-6
    rope_theta: float = 1_000_000.0
    mrope_section: tuple[int, ...] = (24, 20, 20)
    mrope_interleaved: bool = True
    max_position_embeddings: int = 32768
    codec_pad_id: int = 2148
    codec_bos_id: int = 2149
    codec_eos_token_id: int = 2150
    codec_think_id: int = 2154
    codec_nothink_id: int = 2155
    codec_think_bos_id: int = 2156
    codec_think_eos_id: int = 2157
    codec_language_id: dict[str, int] = field(default_factory=dict)
    spk_id: dict[str, int] = field(default_factory=dict)
    spk_is_dialect: dict[str, Any] = field(default_factory=dict)
    code_predictor: CodePredictorConfig = field(default_factory=CodePredictorConfig)

    def __post_init__(self) -> None:
        _positive(self, "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                  "num_key_value_heads", "head_dim", "vocab_size", "text_vocab_size", "text_hidden_size",
                  "num_code_groups", "max_position_embeddings")
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError("talker: num_attention_heads must be a multiple of num_key_value_heads")
        if self.head_dim % 2 or sum(self.mrope_section) != self.head_dim // 2:
            raise ValueError(f"talker: mrope_section {self.mrope_section} must sum to head_dim/2 "
                             f"({self.head_dim // 2})")
        if self.code_predictor.num_code_groups != self.num_code_groups:
            raise ValueError("talker and code predictor disagree on num_code_groups")
        if self.code_predictor.vocab_size >= self.codec_pad_id:
            raise ValueError("codec special ids must lie above the code range")
        specials = [self.codec_pad_id, self.codec_bos_id, self.codec_eos_token_id, self.codec_think_id,
                    self.codec_nothink_id, self.codec_think_bos_id, self.codec_think_eos_id,
                    *self.codec_language_id.values(), *self.spk_id.values()]
        bad = [i for i in specials if not 0 <= i < self.vocab_size]
        if bad:
            raise ValueError(f"talker: codec ids {bad} outside the codec vocabulary [0, {self.vocab_size})")

    @classmethod
    def from_hf_dict(cls, d: dict[str, Any]) -> TalkerConfig:
        kw = _pick(d, cls)
        rope = d.get("rope_scaling") or {}
        if "mrope_section" in rope:
            kw["mrope_section"] = tuple(rope["mrope_section"])
        kw["mrope_interleaved"] = bool(rope.get("interleaved", rope.get("mrope_interleaved", False)))
        for k in ("codec_language_id", "spk_id", "spk_is_dialect"):
            kw[k] = {str(n).lower(): v for n, v in (d.get(k) or {}).items()}
        kw["code_predictor"] = CodePredictorConfig(**_pick(d.get("code_predictor_config") or {}, CodePredictorConfig))
        if "rope_theta" in kw:
            kw["rope_theta"] = float(kw["rope_theta"])
        return cls(**kw)

    def to_hf_dict(self) -> dict[str, Any]:
        """The ``talker_config`` of a checkpoint's config.json."""
        cp = self.code_predictor
        d: dict[str, Any] = {k: getattr(self, k) for k in self.__dataclass_fields__
                             if k not in ("mrope_section", "mrope_interleaved", "code_predictor")}
        d["rope_scaling"] = {"interleaved": self.mrope_interleaved, "mrope_section": list(self.mrope_section),
                             "rope_type": "default", "type": "default"}
        d["code_predictor_config"] = {k: getattr(cp, k) for k in cp.__dataclass_fields__}
        d["hidden_act"] = d["code_predictor_config"]["hidden_act"] = "silu"
        d["model_type"] = "qwen3_tts_talker"
        return d


@dataclass(frozen=True)
class SpeakerEncoderConfig:
    """ECAPA-TDNN x-vector encoder over a 128-bin log-mel at 24 kHz (Base checkpoints)."""

    mel_dim: int = 128
    enc_dim: int = 2048
    enc_channels: tuple[int, ...] = (512, 512, 512, 512, 1536)
    enc_kernel_sizes: tuple[int, ...] = (5, 3, 3, 3, 1)
    enc_dilations: tuple[int, ...] = (1, 2, 3, 4, 1)
    enc_attention_channels: int = 128
    enc_res2net_scale: int = 8
    enc_se_channels: int = 128
    sample_rate: int = 24000

    def __post_init__(self) -> None:
        _positive(self, "mel_dim", "enc_dim", "enc_attention_channels", "enc_res2net_scale",
                  "enc_se_channels", "sample_rate")
        n = len(self.enc_channels)
        if n < 3 or len(self.enc_kernel_sizes) != n or len(self.enc_dilations) != n:
            raise ValueError("speaker encoder: enc_channels, enc_kernel_sizes and enc_dilations must "
                             "have one common length of at least 3")
        if any(c % self.enc_res2net_scale for c in self.enc_channels[1:-1]):
            raise ValueError("speaker encoder: SE-Res2Net channels must divide by enc_res2net_scale")
        if sum(self.enc_channels[1:-1]) != self.enc_channels[-1]:
            raise ValueError("speaker encoder: the last channel count must be the sum of the SE-Res2Net ones")

    @classmethod
    def from_hf_dict(cls, d: dict[str, Any]) -> SpeakerEncoderConfig:
        return cls(**_pick(d, cls))

    def to_hf_dict(self) -> dict[str, Any]:
        return {k: list(v) if isinstance(v, tuple) else v for k, v in
                ((k, getattr(self, k)) for k in self.__dataclass_fields__)}


@dataclass(frozen=True)
class CodecConfig:
    """The 12 Hz speech-tokenizer *decoder*: RVQ -> causal conv -> sliding-window transformer ->
    causal upsampling convs. 1,920 samples a frame at 24 kHz."""

    codebook_size: int = 2048
    codebook_dim: int = 512
    num_quantizers: int = 16
    latent_dim: int = 1024
    hidden_size: int = 512
    intermediate_size: int = 1024
    num_hidden_layers: int = 8
    num_attention_heads: int = 16
    num_key_value_heads: int = 16
    head_dim: int = 64
    sliding_window: int = 72
    rope_theta: float = 10000.0
    rms_norm_eps: float = 1e-5
    layer_scale_initial_scale: float = 0.01
    upsample_rates: tuple[int, ...] = (8, 5, 4, 3)
    upsampling_ratios: tuple[int, ...] = (2, 2)
    decoder_dim: int = 1536
    sample_rate: int = 24000

    def __post_init__(self) -> None:
        _positive(self, "codebook_size", "codebook_dim", "num_quantizers", "latent_dim", "hidden_size",
                  "intermediate_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
                  "head_dim", "sliding_window", "decoder_dim", "sample_rate")
        if self.num_quantizers < 2:
            raise ValueError("codec: num_quantizers must be >= 2 (one semantic + acoustic)")
        if self.codebook_dim % 2:
            raise ValueError("codec: codebook_dim must be even")
        if self.decoder_dim % (2 ** len(self.upsample_rates)):
            raise ValueError("codec: decoder_dim must halve once per upsample rate")

    @property
    def samples_per_frame(self) -> int:
        n = 1
        for r in (*self.upsampling_ratios, *self.upsample_rates):
            n *= r
        return n

    @classmethod
    def from_hf_dict(cls, d: dict[str, Any]) -> CodecConfig:
        """Parse ``speech_tokenizer/config.json`` (its ``decoder_config``) or a bare decoder config."""
        dec = d.get("decoder_config", d)
        kw = _pick(dec, cls)
        if "head_dim" not in dec:
            kw["head_dim"] = int(dec.get("hidden_size", 512)) // int(dec.get("num_attention_heads", 16))
        if "output_sample_rate" in d:
            kw["sample_rate"] = int(d["output_sample_rate"])
        for k in ("rope_theta", "rms_norm_eps", "layer_scale_initial_scale"):
            if k in kw:
                kw[k] = float(kw[k])
        return cls(**kw)

    def to_hf_dict(self) -> dict[str, Any]:
        """``speech_tokenizer/config.json`` without its (Mimi) ``encoder_config``."""
        dec = {k: list(v) if isinstance(v, tuple) else v for k, v in
               ((k, getattr(self, k)) for k in self.__dataclass_fields__ if k != "sample_rate")}
        dec["hidden_act"] = "silu"
        return {"model_type": "qwen3_tts_tokenizer_12hz", "decoder_config": dec,
                "encoder_valid_num_quantizers": self.num_quantizers, "input_sample_rate": self.sample_rate,
                "output_sample_rate": self.sample_rate, "decode_upsample_rate": self.samples_per_frame,
                "encode_downsample_rate": self.samples_per_frame}


@dataclass(frozen=True)
class Qwen3TTSConfig:
    """The whole checkpoint: talker (+ code predictor), codec decoder, speaker encoder, text ids."""

    talker: TalkerConfig
    codec: CodecConfig
    speaker_encoder: SpeakerEncoderConfig | None = None  # Base checkpoints only
    tts_model_type: str = "custom_voice"
    tts_model_size: str = "1b7"
    im_start_token_id: int = 151644
    im_end_token_id: int = 151645
    tts_pad_token_id: int = 151671
    tts_bos_token_id: int = 151672
    tts_eos_token_id: int = 151673

    def __post_init__(self) -> None:
        if self.tts_model_type not in MODEL_TYPES:
            raise ValueError(f"tts_model_type must be one of {MODEL_TYPES}, got {self.tts_model_type!r}")
        if self.tts_model_type == "base" and self.speaker_encoder is None:
            raise ValueError("a Base checkpoint needs a speaker_encoder_config")
        if self.speaker_encoder is not None and self.speaker_encoder.enc_dim != self.talker.hidden_size:
            raise ValueError(f"speaker encoder enc_dim ({self.speaker_encoder.enc_dim}) must equal the "
                             f"talker width ({self.talker.hidden_size}): the x-vector is a codec embedding")
        ids = [self.im_start_token_id, self.im_end_token_id, self.tts_pad_token_id, self.tts_bos_token_id,
               self.tts_eos_token_id]
        bad = [i for i in ids if not 0 <= i < self.talker.text_vocab_size]
        if bad:
            raise ValueError(f"special text ids {bad} outside the text vocabulary")
        if self.codec.num_quantizers != self.talker.num_code_groups:
            raise ValueError("codec num_quantizers must equal the talker's num_code_groups")

    @property
    def can_clone(self) -> bool:
        return self.speaker_encoder is not None

    @property
    def supports_instruct(self) -> bool:
        """The reference drops ``instruct`` for 0.6B checkpoints."""
        return self.tts_model_size != "0b6"

    def with_(self, **changes: Any) -> Qwen3TTSConfig:
        return replace(self, **changes)

    def to_hf_dict(self) -> dict[str, Any]:
        """The checkpoint's config.json (``speech_tokenizer/config.json``: ``codec.to_hf_dict()``)."""
        d: dict[str, Any] = {
            "model_type": "qwen3_tts", "tokenizer_type": "qwen3_tts_tokenizer_12hz",
            "tts_model_type": self.tts_model_type, "tts_model_size": self.tts_model_size,
            "talker_config": self.talker.to_hf_dict(),
        }
        for k in ("im_start_token_id", "im_end_token_id", "tts_pad_token_id", "tts_bos_token_id", "tts_eos_token_id"):
            d[k] = getattr(self, k)
        if self.speaker_encoder is not None:
            d["speaker_encoder_config"] = self.speaker_encoder.to_hf_dict()
        return d

    @classmethod
    def from_hf_dict(cls, d: dict[str, Any], speech_tokenizer: dict[str, Any] | None = None) -> Qwen3TTSConfig:
        """Parse a checkpoint's ``config.json`` and (optionally) ``speech_tokenizer/config.json``."""
        if d.get("model_type", "qwen3_tts") != "qwen3_tts":
            raise ValueError(f"expected model_type 'qwen3_tts', got {d.get('model_type')!r}")
        if d.get("tokenizer_type", "qwen3_tts_tokenizer_12hz") != "qwen3_tts_tokenizer_12hz":
            raise ValueError(f"only the 12 Hz speech tokenizer is supported, got {d.get('tokenizer_type')!r}")
        if "talker_config" not in d:
            raise ValueError("config.json has no talker_config")
        mtype = d.get("tts_model_type") or "custom_voice"
        spk = d.get("speaker_encoder_config")
        speaker = SpeakerEncoderConfig.from_hf_dict(spk) if (spk and mtype == "base") else None
        codec = CodecConfig.from_hf_dict(speech_tokenizer) if speech_tokenizer else CodecConfig()
        kw = {k: d[k] for k in ("im_start_token_id", "im_end_token_id", "tts_pad_token_id",
                                "tts_bos_token_id", "tts_eos_token_id") if k in d}
        return cls(talker=TalkerConfig.from_hf_dict(d["talker_config"]), codec=codec, speaker_encoder=speaker,
                   tts_model_type=mtype, tts_model_size=d.get("tts_model_size") or "1b7", **kw)


# The CustomVoice speakers and the languages (codec ids), as published.
_LANGUAGES = {
    "chinese": 2055, "english": 2050, "german": 2053, "italian": 2070, "portuguese": 2071, "spanish": 2054,
    "japanese": 2058, "korean": 2064, "french": 2061, "russian": 2069, "beijing_dialect": 2074,
    "sichuan_dialect": 2062,
}
_SPEAKERS = {
    "serena": 3066, "vivian": 3065, "uncle_fu": 3010, "ryan": 3061, "aiden": 2861, "ono_anna": 2873,
    "sohee": 2864, "eric": 2875, "dylan": 2878,
}
_DIALECTS = {name: False for name in _SPEAKERS} | {"dylan": "beijing_dialect", "eric": "sichuan_dialect"}

_TALKER_1_7B = TalkerConfig(codec_language_id=dict(_LANGUAGES), spk_id=dict(_SPEAKERS),
                            spk_is_dialect=dict(_DIALECTS))
_TALKER_0_6B = replace(_TALKER_1_7B, hidden_size=1024, intermediate_size=3072)

QWEN3_TTS_1_7B_CUSTOM_VOICE = Qwen3TTSConfig(talker=_TALKER_1_7B, codec=CodecConfig())
QWEN3_TTS_1_7B_BASE = Qwen3TTSConfig(
    talker=replace(_TALKER_1_7B, spk_id={}, spk_is_dialect={}), codec=CodecConfig(),
    speaker_encoder=SpeakerEncoderConfig(enc_dim=2048), tts_model_type="base",
)
QWEN3_TTS_0_6B_CUSTOM_VOICE = Qwen3TTSConfig(talker=_TALKER_0_6B, codec=CodecConfig(), tts_model_size="0b6")
QWEN3_TTS_0_6B_BASE = Qwen3TTSConfig(
    talker=replace(_TALKER_0_6B, spk_id={}, spk_is_dialect={}), codec=CodecConfig(),
    speaker_encoder=SpeakerEncoderConfig(enc_dim=1024), tts_model_type="base", tts_model_size="0b6",
)

# Toy sizes with the real id layout (real text / codec ids stay valid): tests and CPU runs. The
# codec window is 8 frames (not 72) so that short test sequences cross it; the code predictor is
# narrower than the talker so the projection between them exists.
_TINY_TALKER = replace(
    _TALKER_1_7B, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
    num_key_value_heads=2, head_dim=16, text_hidden_size=32, mrope_section=(4, 2, 2),
    code_predictor=CodePredictorConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                       num_attention_heads=4, num_key_value_heads=2, head_dim=8),
)
_TINY_CODEC = CodecConfig(
    codebook_dim=16, latent_dim=32, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
    num_attention_heads=4, num_key_value_heads=2, head_dim=8, sliding_window=8, decoder_dim=64,
)
TINY = Qwen3TTSConfig(talker=_TINY_TALKER, codec=_TINY_CODEC)
TINY_BASE = Qwen3TTSConfig(
    talker=replace(_TINY_TALKER, spk_id={}, spk_is_dialect={}), codec=_TINY_CODEC,
    speaker_encoder=SpeakerEncoderConfig(mel_dim=128, enc_dim=64, enc_channels=(16, 16, 16, 16, 48),
                                         enc_attention_channels=8, enc_res2net_scale=4, enc_se_channels=8),
    tts_model_type="base",
)

PRESETS: dict[str, Qwen3TTSConfig] = {
    "qwen3-tts-1.7b-customvoice": QWEN3_TTS_1_7B_CUSTOM_VOICE,
    "qwen3-tts-1.7b-base": QWEN3_TTS_1_7B_BASE,
    "qwen3-tts-0.6b-customvoice": QWEN3_TTS_0_6B_CUSTOM_VOICE,
    "qwen3-tts-0.6b-base": QWEN3_TTS_0_6B_BASE,
    "tiny": TINY,
    "tiny-base": TINY_BASE,
}

"""Kyutai TTS configuration: the checkpoint's ``config.json`` as validated dataclasses, and
``TTS_1_6B_EN_FR`` for ``--load-format dummy`` (where its numbers come from:
docs/models/kyutai_tts.md, "Checkpoint and config").
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from models.mimi.config import MIMI, TINY as MIMI_TINY, MimiConfig

__all__ = ["LMConfig", "ConditionConfig", "TTSConfig", "KyutaiTTSConfig", "TTS_1_6B_EN_FR", "TINY", "PRESETS",
           "load_config"]

_SCHEDULE_1_6B = tuple(range(8)) + (8,) * 8 + (9,) * 8 + (10,) * 8
_CFG_VALUES = ("1.0", "1.5", "2.0", "2.5", "3.0", "3.5", "4.0")


def _positive(obj: object, *names: str) -> None:
    for name in names:
        value = getattr(obj, name)
        if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
            raise ValueError(f"{type(obj).__name__}.{name} must be a positive int, got {value!r}")


@dataclass(frozen=True)
class LMConfig:
    """moshi ``LMModel`` arguments (the parts of ``config.json`` that shape the weights)."""

    card: int = 2048
    n_q: int = 32
    dep_q: int = 32
    delays: tuple[int, ...] = (0, 0) + (2,) * 31  # [text, codebook 0, ..., codebook n_q - 1]
    dim: int = 2048
    text_card: int = 8000
    existing_text_padding_id: int = 3
    num_heads: int = 16
    num_layers: int = 16
    hidden_scale: float = 4.125
    context: int = 500
    max_period: float = 10000.0
    depformer_dim: int = 1024
    depformer_num_heads: int = 16
    depformer_num_layers: int = 4
    depformer_dim_feedforward: int = 3072
    depformer_low_rank_embeddings: int | None = 128
    depformer_weights_per_step_schedule: tuple[int, ...] | None = _SCHEDULE_1_6B
    demux_second_stream: bool = True
    cross_attention: bool = True

    def __post_init__(self) -> None:
        _positive(self, "card", "n_q", "dep_q", "dim", "text_card", "num_heads", "num_layers", "context",
                  "depformer_dim", "depformer_num_heads", "depformer_num_layers", "depformer_dim_feedforward")
        if self.dep_q != self.n_q:
            raise ValueError("only TTS checkpoints (dep_q == n_q: every codebook is generated) are supported")
        if len(self.delays) != self.n_q + 1 or any(d < 0 for d in self.delays):
            raise ValueError(f"delays must have n_q + 1 = {self.n_q + 1} non-negative entries")
        if self.delays[0] != 0:
            raise ValueError("the text stream's delay must be 0")
        if self.dim % self.num_heads or self.depformer_dim % self.depformer_num_heads:
            raise ValueError("dim / depformer_dim must divide by their head counts")
        if (self.dim // self.num_heads) % 2:
            raise ValueError("the temporal transformer's head_dim must be even (RoPE)")
        s = self.depformer_weights_per_step_schedule
        if s is not None and (len(s) != self.dep_q or min(s) < 0 or sorted(set(s)) != list(range(max(s) + 1))):
            raise ValueError("depformer_weights_per_step_schedule must map each of dep_q codebooks to 0..n-1")

    @property
    def head_dim(self) -> int:
        return self.dim // self.num_heads

    @property
    def dim_feedforward(self) -> int:
        return int(self.hidden_scale * self.dim)

    @property
    def num_depformer_weights(self) -> int:
        s = self.depformer_weights_per_step_schedule
        return self.dep_q if s is None else max(s) + 1

    def schedule(self, codebook: int) -> int:
        s = self.depformer_weights_per_step_schedule
        return codebook if s is None else s[codebook]


@dataclass(frozen=True)
class ConditionConfig:
    """The conditioners (``speaker_wavs`` tensor, ``cfg`` and ``control`` look-up tables) and the fuser."""

    speaker_dim: int = 512  # a voice embedding's width (``speaker_wavs`` [1, 512, frames])
    cfg_dim: int = 16
    cfg_values: tuple[str, ...] = _CFG_VALUES
    control_dim: int = 2048
    control_values: tuple[str, ...] = ("ok",)
    cross_pos_emb_scale: float = 1.0  # fuser.cross_attention_pos_emb (always on here)
    max_speakers: int = 5  # moshi TTSModel.max_speakers: voices per cross-attention source
    voice_frames: int = 125  # frames of one published voice embedding (10 s)

    def __post_init__(self) -> None:
        _positive(self, "speaker_dim", "cfg_dim", "control_dim", "max_speakers", "voice_frames")

    @property
    def cross_len(self) -> int:
        return self.max_speakers * self.voice_frames


@dataclass(frozen=True)
class TTSConfig:
    audio_delay_s: float = 1.28
    second_stream_ahead: int = 2
    initial_padding: int = 2
    max_padding: int = 8
    final_padding: int = 4
    padding_between: int = 1
    temperature: float = 0.6
    top_k_text: int = 25
    top_k_audio: int = 250
    n_q: int = 24  # codebooks generated and decoded (Kyutai's server); at most LMConfig.n_q
    cfg: str | None = "2.0"  # the distilled-CFG condition (Kyutai's server: cfg_coef 2.0)

    def __post_init__(self) -> None:
        if self.second_stream_ahead not in (0, 2):
            raise ValueError("second_stream_ahead must be 0 or 2")
        _positive(self, "n_q", "max_padding")


@dataclass(frozen=True)
class KyutaiTTSConfig:
    lm: LMConfig
    condition: ConditionConfig
    tts: TTSConfig
    mimi: MimiConfig = MIMI
    model_id: dict[str, Any] = field(default_factory=lambda: {"sig": "1e68beda", "epoch": 240})
    moshi_name: str = "dsm_tts_1e68beda@240.safetensors"
    mimi_name: str = "tokenizer-e351c8d8-checkpoint125.safetensors"
    tokenizer_name: str = "tokenizer_spm_8k_en_fr_audio.model"

    def __post_init__(self) -> None:
        if self.tts.n_q > self.lm.n_q:
            raise ValueError(f"tts.n_q={self.tts.n_q} exceeds the model's {self.lm.n_q} codebooks")
        if self.tts.n_q > self.mimi.quantizer.n_q or self.lm.card != self.mimi.quantizer.bins:
            raise ValueError("the LM's codebooks must fit the codec's (count and size)")
        if self.tts.second_stream_ahead and not self.lm.demux_second_stream:
            raise ValueError("second_stream_ahead needs demux_second_stream")
        if self.tts.cfg is not None and self.tts.cfg not in self.condition.cfg_values:
            raise ValueError(f"cfg {self.tts.cfg!r} is not one of {self.condition.cfg_values}")
        if self.lm.text_card < 4:
            raise ValueError("text_card must hold the special ids 0..3 (word, main, other, pad)")

    @property
    def delay_steps(self) -> int:
        """Frames the audio lags the text (16 for 1.28 s at 12.5 Hz)."""
        return int(self.tts.audio_delay_s * self.mimi.frame_rate)

    @property
    def text_card_in(self) -> int:
        """Rows of the text embedding, and the multiplexing stride of the look-ahead stream."""
        return self.lm.text_card + 1

    @property
    def max_delay(self) -> int:
        return max(self.lm.delays)

    def with_(self, **changes: Any) -> KyutaiTTSConfig:
        return replace(self, **changes)

    def with_tts(self, **changes: Any) -> KyutaiTTSConfig:
        return replace(self, tts=replace(self.tts, **changes))

    # -- config.json ---------------------------------------------------------------------------
    def to_hf_dict(self) -> dict[str, Any]:
        """The checkpoint's ``config.json`` (moshi's ``CheckpointInfo`` reads it)."""
        lm, c, t = self.lm, self.condition, self.tts
        d: dict[str, Any] = {
            "card": lm.card, "n_q": lm.n_q, "dep_q": lm.dep_q, "delays": list(lm.delays), "dim": lm.dim,
            "text_card": lm.text_card, "existing_text_padding_id": lm.existing_text_padding_id,
            "num_heads": lm.num_heads, "num_layers": lm.num_layers, "hidden_scale": lm.hidden_scale, "causal": True,
            "layer_scale": None, "context": lm.context, "max_period": lm.max_period, "gating": "silu",
            "norm": "rms_norm_f32", "positional_embedding": "rope", "depformer_dim": lm.depformer_dim,
            "depformer_num_heads": lm.depformer_num_heads, "depformer_num_layers": lm.depformer_num_layers,
            "depformer_dim_feedforward": lm.depformer_dim_feedforward, "depformer_multi_linear": True,
            "depformer_pos_emb": "none", "depformer_weights_per_step": True,
            "depformer_low_rank_embeddings": lm.depformer_low_rank_embeddings,
            "demux_second_stream": lm.demux_second_stream, "text_card_out": None,
            "cross_attention": lm.cross_attention,
            "conditioners": {
                "speaker_wavs": {"type": "tensor", "tensor": {"dim": c.speaker_dim}},
                "cfg": {"type": "lut", "lut": {"n_bins": len(c.cfg_values), "dim": c.cfg_dim, "tokenizer": "noop",
                                               "possible_values": list(c.cfg_values)}},
                "control": {"type": "lut", "lut": {"dim": c.control_dim, "n_bins": len(c.control_values),
                                                   "tokenizer": "noop", "possible_values": list(c.control_values)}},
            },
            "fuser": {"cross_attention_pos_emb": True, "cross_attention_pos_emb_scale": c.cross_pos_emb_scale,
                      "sum": ["control", "cfg"], "prepend": [], "cross": ["speaker_wavs"]},
            "tts_config": {"audio_delay": t.audio_delay_s, "second_stream_ahead": t.second_stream_ahead},
            "model_id": dict(self.model_id), "model_type": "tts",
            "lm_gen_config": {"temp": t.temperature, "text_temp": t.temperature},
            "tokenizer_name": self.tokenizer_name, "mimi_name": self.mimi_name, "moshi_name": self.moshi_name,
        }
        if lm.depformer_weights_per_step_schedule is not None:
            d["depformer_weights_per_step_schedule"] = list(lm.depformer_weights_per_step_schedule)
        return d

    @classmethod
    def from_hf_dict(cls, d: dict[str, Any], *, mimi: MimiConfig = MIMI, tts: TTSConfig | None = None,
                     voice_frames: int = 125) -> KyutaiTTSConfig:
        """Parse a checkpoint's ``config.json``; refuses what changes the model in unsupported ways."""
        if d.get("model_type", "tts") != "tts":
            raise ValueError(f"expected model_type 'tts', got {d.get('model_type')!r}")
        fixed = {"causal": True, "layer_scale": None, "gating": "silu", "norm": "rms_norm_f32",
                 "positional_embedding": "rope", "depformer_multi_linear": True, "depformer_pos_emb": "none",
                 "depformer_weights_per_step": True, "text_card_out": None}
        for key, wanted in fixed.items():
            if d.get(key, wanted) != wanted:
                raise ValueError(f"config.json: {key}={d[key]!r} is not supported (only {wanted!r})")
        if d.get("kv_repeat", 1) != 1 or d.get("depformer_norm") is not None or d.get("extra_heads_num_heads", 0):
            raise ValueError("config.json: kv_repeat, depformer_norm and extra heads are not supported")
        names = set(LMConfig.__dataclass_fields__)
        kw = {k: tuple(v) if isinstance(v, list) else v for k, v in d.items() if k in names}
        if "demux_second_text_stream" in d:
            kw["demux_second_stream"] = d["demux_second_text_stream"]
        lm = LMConfig(**kw)
        conds = d.get("conditioners") or {}
        if lm.cross_attention and "speaker_wavs" not in conds:
            raise ValueError("config.json: cross_attention needs a speaker_wavs conditioner")
        cfg_lut = (conds.get("cfg") or {}).get("lut") or {}
        ctl_lut = (conds.get("control") or {}).get("lut") or {}
        fuser = d.get("fuser") or {}
        if fuser.get("sum", ["control", "cfg"]) != ["control", "cfg"] or fuser.get("cross", ["speaker_wavs"]) != [
                "speaker_wavs"] or fuser.get("prepend"):
            raise ValueError(f"config.json: fuser {fuser!r} is not supported")
        cond = ConditionConfig(
            speaker_dim=int(((conds.get("speaker_wavs") or {}).get("tensor") or {}).get("dim", 512)),
            cfg_dim=int(cfg_lut.get("dim", 16)), cfg_values=tuple(cfg_lut.get("possible_values", _CFG_VALUES)),
            control_dim=int(ctl_lut.get("dim", lm.dim)), control_values=tuple(ctl_lut.get("possible_values", ("ok",))),
            cross_pos_emb_scale=float(fuser.get("cross_attention_pos_emb_scale", 1.0)), voice_frames=voice_frames)
        if not fuser.get("cross_attention_pos_emb", True):
            raise ValueError("config.json: fuser.cross_attention_pos_emb=false is not supported")
        tc = d.get("tts_config") or {}
        base = tts or TTSConfig()
        tts_cfg = replace(base, audio_delay_s=float(tc.get("audio_delay", base.audio_delay_s)),
                          second_stream_ahead=int(tc.get("second_stream_ahead", base.second_stream_ahead)),
                          n_q=min(base.n_q, lm.n_q))
        gen = d.get("lm_gen_config") or {}
        if "temp" in gen:
            tts_cfg = replace(tts_cfg, temperature=float(gen["temp"]))
        extra = {k: d[k] for k in ("moshi_name", "mimi_name", "tokenizer_name") if k in d}
        return cls(lm=lm, condition=cond, tts=tts_cfg, mimi=mimi, model_id=dict(d.get("model_id") or {}), **extra)


def load_config(d: str | Path, **kw: Any) -> KyutaiTTSConfig:
    """A checkpoint folder's config.json (and the Mimi config it names in ``mimi_config_name``, if any)."""
    f = Path(d) / "config.json"
    if not f.is_file():
        raise FileNotFoundError(f"model directory {str(d)!r} has no config.json")
    raw = json.loads(f.read_text())
    if "mimi" not in kw and raw.get("mimi_config_name"):
        kw["mimi"] = MimiConfig.from_dict(json.loads((Path(d) / raw["mimi_config_name"]).read_text()))
    return KyutaiTTSConfig.from_hf_dict(raw, **kw)


TTS_1_6B_EN_FR = KyutaiTTSConfig(lm=LMConfig(), condition=ConditionConfig(), tts=TTSConfig())

# Toy widths with the real layout (32 codebooks of 2,048 with the real delays and weight
# schedule, demuxed look-ahead stream, cross-attention to 5 voices, the 500-frame window): tests
# and CPU runs. The audio delay is 6 frames (not 16) so that short test runs have audio.
TINY = KyutaiTTSConfig(
    lm=LMConfig(dim=64, text_card=160, num_heads=4, num_layers=2, depformer_dim=32,
                depformer_num_heads=2, depformer_num_layers=2, depformer_dim_feedforward=48,
                depformer_low_rank_embeddings=8),
    condition=ConditionConfig(speaker_dim=16, cfg_dim=4, control_dim=64, voice_frames=10),
    tts=TTSConfig(audio_delay_s=0.48, n_q=32),
    mimi=MIMI_TINY,
    model_id={"sig": "0000tiny", "epoch": 1}, moshi_name="lm_tiny.safetensors", mimi_name="mimi_tiny.safetensors",
    tokenizer_name="tokenizer_tiny.model",
)

PRESETS: dict[str, KyutaiTTSConfig] = {"tts-1.6b-en_fr": TTS_1_6B_EN_FR, "tiny": TINY}

"""Config presets, config.json round trips, validation helpers and the dummy loader."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from models.qwen3_tts.codec import CodecStream
from models.qwen3_tts.config import PRESETS, CodecConfig, Qwen3TTSConfig, TalkerConfig
from models.qwen3_tts.loader import load_qwen3_tts
from models.qwen3_tts.prompt import build_prompt, languages, resolve_language, resolve_speaker, speakers
from models.qwen3_tts.talker import NO_CODEC, XVECTOR, Qwen3TTSModel, pack, unpack


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_presets_round_trip_through_config_json(name):
    """Every preset survives to_hf_dict -> from_hf_dict unchanged."""
    cfg = PRESETS[name]
    again = Qwen3TTSConfig.from_hf_dict(cfg.to_hf_dict(), cfg.codec.to_hf_dict())
    assert again == cfg


def test_real_model_geometry_builds_on_meta():
    """The 1.7B preset has the projection between talker (2048) and predictor (1024); 0.6B has none."""
    with torch.device("meta"):
        big = Qwen3TTSModel(PRESETS["qwen3-tts-1.7b-customvoice"])
        small = Qwen3TTSModel(PRESETS["qwen3-tts-0.6b-base"])
    assert "talker.code_predictor.small_to_mtp_projection.weight" in big.state_dict()
    assert "talker.code_predictor.small_to_mtp_projection.weight" not in small.state_dict()
    assert small.speaker_encoder is not None and big.speaker_encoder is None
    n = sum(p.numel() for p in big.parameters())
    assert 1.5e9 < n < 2.2e9, n
    assert PRESETS["qwen3-tts-1.7b-customvoice"].codec.samples_per_frame == 1920


def test_bad_configs_raise_value_error():
    """Inconsistent configs are refused with ValueError naming the problem."""
    with pytest.raises(ValueError, match="mrope_section"):
        TalkerConfig(head_dim=64)
    with pytest.raises(ValueError, match="speaker_encoder"):
        dataclasses.replace(PRESETS["tiny"], tts_model_type="base")
    with pytest.raises(ValueError, match="num_quantizers"):
        dataclasses.replace(PRESETS["tiny"], codec=CodecConfig(num_quantizers=8))
    with pytest.raises(ValueError, match="qwen3_tts"):
        Qwen3TTSConfig.from_hf_dict({"model_type": "llama"})


def test_pack_round_trip():
    """pack/unpack keep a text id and a codec field (ids, NO_CODEC, XVECTOR) apart."""
    text = torch.tensor([0, 151671, 151935, 42])
    codec = torch.tensor([2149, NO_CODEC, XVECTOR, 0])
    t, c = unpack(pack(text, codec))
    assert t.tolist() == text.tolist() and c.tolist() == codec.tolist()


def test_unknown_speaker_and_language_list_what_is_served():
    """Validation errors name the served speakers and languages."""
    cfg = PRESETS["qwen3-tts-1.7b-customvoice"]
    assert "ryan" in speakers(cfg) and "english" in languages(cfg) and "beijing_dialect" not in languages(cfg)
    with pytest.raises(ValueError, match="served speakers: aiden, dylan"):
        resolve_speaker(cfg, "bob")
    with pytest.raises(ValueError, match="served languages: auto, chinese"):
        resolve_language(cfg, "klingon")
    assert resolve_speaker(cfg, "Ryan") == "ryan" and resolve_language(cfg, None) == "auto"
    with pytest.raises(ValueError, match="cannot clone"):
        build_prompt(cfg, [1], role_ids=[151644, 2, 3], xvector=True)


def test_dummy_load_makes_audible_audio():
    """--load-format dummy: random weights, no files, a codec whose streamed output is not silent."""
    loaded = load_qwen3_tts("tiny", load_format="dummy", dtype=torch.float32)
    assert loaded.tokenizer is None
    stream = CodecStream(loaded.codec, max_slots=1)
    codes = torch.randint(0, 2048, (4, 16), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        pcm = torch.cat([stream.step(torch.tensor([0]), codes[t:t + 1])[0] for t in range(4)])
        whole = loaded.codec(codes[None])[0]
    assert float(pcm.abs().max()) > 1e-3
    assert float((pcm - whole).abs().max()) <= 1e-5 * float(whole.abs().max())


def test_dummy_load_reads_a_folders_config(tmp_path):
    """A folder with only config.json gives that config and random weights."""
    import json

    cfg = PRESETS["tiny-base"]
    (tmp_path / "config.json").write_text(json.dumps(cfg.to_hf_dict()))
    (tmp_path / "speech_tokenizer").mkdir()
    (tmp_path / "speech_tokenizer" / "config.json").write_text(json.dumps(cfg.codec.to_hf_dict()))
    loaded = load_qwen3_tts(tmp_path, load_format="dummy", dtype=torch.float32)
    assert loaded.config == cfg and loaded.model.speaker_encoder is not None


def test_missing_weights_fail_clearly(tmp_path):
    """A folder without weights raises FileNotFoundError naming it."""
    import json

    (tmp_path / "config.json").write_text(json.dumps(PRESETS["tiny"].to_hf_dict()))
    with pytest.raises(FileNotFoundError, match="safetensors"):
        load_qwen3_tts(tmp_path, dtype=torch.float32)


def test_codec_step_defaults_follow_the_device(monkeypatch: pytest.MonkeyPatch) -> None:
    """On CUDA the codec step is channels-last with SnakeBeta compiled and its dense convolutions
    the Triton implicit GEMM in its fused form (the faster step measured), falling back to unfused where
    it cannot compile since nobody asked for it, and to gathered taps where Triton is missing; on
    the CPU the reference's layout; a setting given wins (a compile asked for has no fallback),
    and asking for the channels-first layout on CUDA turns the compile and the kernel off with it."""
    from types import SimpleNamespace

    from models.qwen3_tts import build
    from models.qwen3_tts.build import codec_settings

    def ctx(device: str, **given):
        return SimpleNamespace(device=device, setting=lambda name, default: given.get(name, default))

    monkeypatch.setattr(build, "triton_available", lambda: True)
    assert codec_settings(ctx("cuda")) == ("nwc", True, True, "fused")
    assert codec_settings(ctx("cuda:1")) == ("nwc", True, True, "fused")
    assert codec_settings(ctx("cuda", codec_conv="triton")) == ("nwc", True, True, "triton")
    assert codec_settings(ctx("cuda", codec_conv="gemm")) == ("nwc", True, True, "gemm")
    assert codec_settings(ctx("cpu")) == ("ncw", False, True, None)
    assert codec_settings(ctx("cuda", codec_layout="ncw")) == ("ncw", False, True, None)
    assert codec_settings(ctx("cuda", codec_compile="false")) == ("nwc", False, False, "fused")
    assert codec_settings(ctx("cuda", codec_compile="on")) == ("nwc", True, False, "fused")
    assert codec_settings(ctx("cpu", codec_layout="nwc", codec_compile=True)) == ("nwc", True, False, None)
    assert codec_settings(ctx("cpu", codec_layout="nwc", codec_conv="cudnn")) == ("nwc", False, True, "cudnn")
    monkeypatch.setattr(build, "triton_available", lambda: False)
    assert codec_settings(ctx("cuda")) == ("nwc", True, True, None)
    with pytest.raises(ValueError, match="codec_compile=maybe: expects true or false"):
        codec_settings(ctx("cuda", codec_compile="maybe"))


def test_the_code_predictor_attention_setting() -> None:
    """``code_predictor_attention``: "sdpa" leaves the cache writes and torch's attention (None),
    "triton" is the one-kernel ``attend_position`` (the default on CUDA where Triton imports),
    refused without CUDA outside Triton's interpreter and where Triton is missing; another name is
    refused with the two it takes."""
    import os
    from types import SimpleNamespace

    from models.qwen3_tts.build import code_predictor_attention

    def ctx(device: str, **given):
        return SimpleNamespace(device=device, setting=lambda name, default: given.get(name, default))

    assert code_predictor_attention(ctx("cuda", code_predictor_attention="sdpa")) is None
    assert code_predictor_attention(ctx("cpu")) is None
    with pytest.raises(ValueError, match="sdpa or triton"):
        code_predictor_attention(ctx("cuda", code_predictor_attention="flash"))
    if os.environ.get("TRITON_INTERPRET") != "1":
        with pytest.raises(ValueError, match="CUDA"):
            code_predictor_attention(ctx("cpu", code_predictor_attention="triton"))
    from models.qwen3_tts import attend_triton

    if attend_triton.triton is not None:
        assert code_predictor_attention(ctx("cuda", code_predictor_attention="triton")) is attend_triton.attend_position


def test_the_code_predictor_attention_default_follows_cuda_and_triton(monkeypatch: pytest.MonkeyPatch) -> None:
    """Nothing set: the Triton kernel on CUDA where Triton imports, SDPA on the CPU and on CUDA
    without Triton; "triton" asked for on CUDA without Triton is refused, saying so."""
    from types import SimpleNamespace

    from models.qwen3_tts import attend_triton
    from models.qwen3_tts.build import code_predictor_attention

    def ctx(device: str, **given):
        return SimpleNamespace(device=device, setting=lambda name, default: given.get(name, default))

    monkeypatch.setattr(attend_triton, "triton", object())
    assert code_predictor_attention(ctx("cuda")) is attend_triton.attend_position
    assert code_predictor_attention(ctx("cuda:1")) is attend_triton.attend_position
    assert code_predictor_attention(ctx("cpu")) is None
    monkeypatch.setattr(attend_triton, "triton", None)
    assert code_predictor_attention(ctx("cuda")) is None
    with pytest.raises(ValueError, match="needs Triton"):
        code_predictor_attention(ctx("cuda", code_predictor_attention="triton"))


def test_the_codec_attention_setting() -> None:
    """``codec_attention``: "torch" leaves the ring writes and ``_attend`` (None); "triton" is
    ``ring_attend``, refused without CUDA outside Triton's interpreter; another name is refused
    with the two it takes."""
    import os
    from types import SimpleNamespace

    from models.qwen3_tts import ring_attend_triton
    from models.qwen3_tts.build import codec_attention

    def ctx(device: str, **given):
        return SimpleNamespace(device=device, setting=lambda name, default: given.get(name, default))

    assert codec_attention(ctx("cpu")) is None
    assert codec_attention(ctx("cuda", codec_attention="torch")) is None
    with pytest.raises(ValueError, match="torch or triton"):
        codec_attention(ctx("cuda", codec_attention="flash"))
    if os.environ.get("TRITON_INTERPRET") != "1":
        with pytest.raises(ValueError, match="CUDA"):
            codec_attention(ctx("cpu", codec_attention="triton"))
    if ring_attend_triton.triton is not None:
        assert codec_attention(ctx("cuda", codec_attention="triton")) is ring_attend_triton.ring_attend
    else:
        with pytest.raises(ValueError, match="needs Triton"):
            codec_attention(ctx("cuda", codec_attention="triton"))


def test_the_codec_attention_default_follows_cuda_and_triton(monkeypatch: pytest.MonkeyPatch) -> None:
    """Nothing set: the ring kernel on CUDA where Triton imports (the faster codec step
    measured), the torch path on the CPU and on CUDA without Triton."""
    from types import SimpleNamespace

    from models.qwen3_tts import ring_attend_triton
    from models.qwen3_tts.build import codec_attention

    def ctx(device: str, **given):
        return SimpleNamespace(device=device, setting=lambda name, default: given.get(name, default))

    monkeypatch.setattr(ring_attend_triton, "triton", object())
    assert codec_attention(ctx("cuda")) is ring_attend_triton.ring_attend
    assert codec_attention(ctx("cuda:1")) is ring_attend_triton.ring_attend
    assert codec_attention(ctx("cuda", codec_attention="torch")) is None
    assert codec_attention(ctx("cpu")) is None
    monkeypatch.setattr(ring_attend_triton, "triton", None)
    assert codec_attention(ctx("cuda")) is None

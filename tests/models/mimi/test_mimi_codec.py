"""Mimi whole-sequence parity with moshi 0.2.13: decode and encode, all or some codebooks; loading."""

from __future__ import annotations

import pytest
import torch
from tests.models.mimi.mimi_fixtures import jobs

from models.mimi.config import MIMI, TINY, MimiConfig
from models.mimi.loader import load_mimi, normalize_keys

REL = 1e-5


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).abs().max() / b.abs().max())


def test_reference_decode_is_not_silent(mimi_reference):
    """The tiny reference codec makes audible output, so the comparisons are not vacuous."""
    whole = mimi_reference["decode32"]["whole"]
    assert float(whole.abs().max()) > 1e-2 and float(whole.std()) > 1e-3


@pytest.mark.parametrize("key", ["decode32", "decode8"])
def test_whole_decode_equals_reference(mimi_ckpt, mimi_reference, key):
    """Mimi.decode equals moshi's whole-sequence decode within 1e-5 relative (32 and 8 codebooks)."""
    mimi = load_mimi(mimi_ckpt, config=TINY)
    codes = torch.tensor(jobs()[key]["codes"])
    ref = mimi_reference[key]["whole"]
    ours = mimi.decode(codes)
    assert ours.shape == ref.shape == (codes.shape[0], 1, codes.shape[2] * 1920)
    assert _rel(ours, ref) < REL


@pytest.mark.parametrize("key,k", [("encode32", 32), ("encode12_ragged", 12)])
def test_encode_equals_reference(mimi_ckpt, mimi_reference, key, k):
    """Mimi.encode gives moshi's codes exactly, including a waveform that is not a whole number of frames."""
    mimi = load_mimi(mimi_ckpt, config=TINY)
    mimi.set_num_codebooks(k)
    wav = torch.tensor(jobs()[key]["wav"])
    ref = mimi_reference[key]["codes"]
    ours = mimi.encode(wav)
    assert ours.shape == ref.shape and ours.shape[1] == k
    assert ours.tolist() == ref.tolist()


def test_codes_of_the_reference_are_varied(mimi_reference):
    """The encoded test signal uses many different codes (the exact match above is not vacuous)."""
    codes = mimi_reference["encode32"]["codes"]
    assert len(set(codes.flatten().tolist())) > 50


def test_legacy_attention_keys_load():
    """moshi's legacy ``in_proj_weight`` / ``out_proj.weight`` names map onto ``in_projs.0`` / ``out_projs.0``."""
    w = torch.randn(6, 2)
    out = normalize_keys({"a.self_attn.in_proj_weight": w, "a.self_attn.out_proj.weight": w[:2],
                          "b.output_proj.weight": w, "c.in_projs.0.weight": w})
    assert set(out) == {"a.self_attn.in_projs.0.weight", "a.self_attn.out_projs.0.weight", "b.output_proj.weight",
                        "c.in_projs.0.weight"}
    split = normalize_keys({"d.in_proj_weight": torch.arange(12.).view(6, 2)}, {"d.": 3})
    assert [tuple(split[f"d.in_projs.{i}.weight"].shape) for i in range(3)] == [(2, 2)] * 3


def test_real_config_has_the_checkpoint_layout():
    """The MIMI preset builds 318 tensors (the published checkpoint's count) and 1,920-sample frames."""
    from models.mimi.codec import Mimi

    with torch.device("meta"):
        mimi = Mimi(MIMI)
    assert len(mimi.state_dict()) == 318
    assert MIMI.frame_size == 1920 and MIMI.resample_stride == 2 and MIMI.encoder_frame_rate == 25


def test_config_round_trip_and_refusals():
    """The moshi mimi_config layout round-trips; unsupported choices are refused with ValueError."""
    assert MimiConfig.from_dict(TINY.to_dict()) == TINY
    bad = TINY.to_dict()
    bad["seanet"]["activation"] = "GELU"
    with pytest.raises(ValueError):
        MimiConfig.from_dict(bad)
    bad = TINY.to_dict()
    bad["transformer"]["bogus"] = 1
    with pytest.raises(ValueError):
        MimiConfig.from_dict(bad)


def test_decode_refuses_bad_shapes():
    """Codes with too many codebooks or the wrong rank are a ValueError, not a crash deep inside."""
    mimi = load_mimi(config=TINY, load_format="dummy")
    with pytest.raises(ValueError):
        mimi.decode(torch.zeros(1, 33, 2, dtype=torch.int64))
    with pytest.raises(ValueError):
        mimi.decode(torch.zeros(33, 2, dtype=torch.int64))

"""CSM configuration: the presets' numbers, transformers' config.json (as the reference writes
it, 4.x and 5.x RoPE layouts), round trips and refusals."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from models.csm.config import CSM_1B, TINY, CsmConfig, mimi_from_hf, mimi_to_hf
from models.mimi.config import MIMI


def test_the_csm_1b_preset_has_the_released_geometry() -> None:
    """Llama-3.2-1B backbone, 4 x 1024 depth decoder, 32 codebooks of 2,051, the real special ids."""
    b, d = CSM_1B.backbone, CSM_1B.depth
    assert (b.num_hidden_layers, b.hidden_size, b.intermediate_size, b.num_attention_heads,
            b.num_key_value_heads, b.head_dim) == (16, 2048, 8192, 32, 8, 64)
    assert (d.num_hidden_layers, d.hidden_size, d.num_attention_heads, d.num_key_value_heads, d.head_dim,
            d.max_position_embeddings) == (4, 1024, 8, 2, 128, 33)
    assert (CSM_1B.num_codebooks, CSM_1B.codebook_size, CSM_1B.text_vocab_size) == (32, 2051, 128_256)
    assert (CSM_1B.bos_token_id, CSM_1B.audio_token_id, CSM_1B.audio_eos_token_id) == (128_000, 128_002, 128_003)
    assert CSM_1B.mimi == MIMI and CSM_1B.tie_codebooks_embeddings
    assert TINY.backbone.rope_scaling == b.rope_scaling and TINY.text_vocab_size == CSM_1B.text_vocab_size


def test_the_csm_1b_preset_has_the_original_checkpoints_size() -> None:
    """Built on the meta device, csm-1b has 1,552,791,552 parameters besides the codec (its
    codebook table counted once): 6.21 GB in float32, the size of Sesame's ckpt.pt."""
    import torch

    from models.csm.model import CsmModel

    with torch.device("meta"):
        m = CsmModel(CSM_1B)
    m.setup("meta")
    assert sum(p.numel() for p in m.parameters()) == 1_552_791_552


def test_the_reference_config_json_parses_to_the_preset_it_was_written_from(ckpt_root) -> None:
    """config.json as transformers' save_pretrained writes it reads back as TINY (and the
    untied variant as untied)."""
    main = CsmConfig.from_hf_dict(json.loads((ckpt_root / "main" / "config.json").read_text()))
    stop = CsmConfig.from_hf_dict(json.loads((ckpt_root / "stop" / "config.json").read_text()))
    assert main == TINY
    assert stop == replace(TINY, tie_codebooks_embeddings=False)


def test_the_4x_rope_scaling_layout_reads_as_the_5x_one() -> None:
    """transformers 4.5x's rope_theta + rope_scaling and 5.x's rope_parameters give one config."""
    d = CSM_1B.to_hf_dict()
    old = dict(d)
    params = old.pop("rope_parameters")
    old["rope_theta"] = params.pop("rope_theta")
    old["rope_scaling"] = params
    assert CsmConfig.from_hf_dict(old) == CsmConfig.from_hf_dict(d) == CSM_1B


def test_the_codec_config_round_trips_through_transformers_layout() -> None:
    """MimiConfig -> transformers' MimiConfig fields -> MimiConfig is the identity (MIMI, tiny)."""
    assert mimi_from_hf(mimi_to_hf(MIMI)) == MIMI
    assert mimi_from_hf(mimi_to_hf(TINY.mimi)) == TINY.mimi


@pytest.mark.parametrize("change, needle", [
    ({"model_type": "llama"}, "model_type 'csm'"),
    ({"attention_bias": True}, "attention_bias"),
    ({"hidden_act": "gelu"}, "hidden_act"),
    ({"num_codebooks": 40}, "codebooks"),
])
def test_configs_it_cannot_serve_are_refused(change: dict, needle: str) -> None:
    """What this implementation does not support is refused with ValueError, not misread."""
    d = {**CSM_1B.to_hf_dict(), **change}
    with pytest.raises(ValueError, match=needle):
        CsmConfig.from_hf_dict(d)


def test_codec_configs_it_cannot_serve_are_refused() -> None:
    """Grouped KV heads or a non-causal codec in codec_config are refused."""
    with pytest.raises(ValueError, match="grouped"):
        mimi_from_hf({**mimi_to_hf(MIMI), "num_key_value_heads": 2})
    with pytest.raises(ValueError, match="use_causal_conv"):
        mimi_from_hf({**mimi_to_hf(MIMI), "use_causal_conv": False})

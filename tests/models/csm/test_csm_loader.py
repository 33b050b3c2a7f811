"""Loading CSM: the reference's checkpoints (tied and untied codebook tables), random weights,
the stored layouts of the tied table, refusals, and the registry entry."""

from __future__ import annotations

import pytest
import torch

from models.csm.config import TINY


def test_the_reference_checkpoints_load_with_their_tables(ckpt_root) -> None:
    """The tied checkpoint (its table stored once) shares one table between the backbone and the
    depth decoder; the untied one keeps two; both carry the reference's tokenizer."""
    from models.csm.loader import load_csm

    tied = load_csm(ckpt_root / "main", dtype=torch.float32)
    untied = load_csm(ckpt_root / "stop", dtype=torch.float32)
    for loaded, shared in ((tied, True), (untied, False)):
        m = loaded.model
        a = m.backbone_model.embed_tokens.embed_audio_tokens.weight
        b = m.depth_decoder.model.embed_tokens.weight
        assert (a.data_ptr() == b.data_ptr()) is shared
        assert loaded.tokenizer is not None and loaded.root is not None
    assert not torch.equal(untied.model.backbone_model.embed_tokens.embed_audio_tokens.weight,
                           untied.model.depth_decoder.model.embed_tokens.weight)


def test_random_weights_give_an_audible_codec_and_tied_tables() -> None:
    """--load-format dummy: the tiny preset, tied tables, a codec that does not decode to silence."""
    from models.csm.loader import load_csm

    loaded = load_csm("tiny", load_format="dummy", dtype=torch.float32)
    m = loaded.model
    assert loaded.config == TINY and loaded.tokenizer is None
    assert m.backbone_model.embed_tokens.embed_audio_tokens.weight is m.depth_decoder.model.embed_tokens.weight
    with torch.no_grad():
        wav = loaded.mimi.decode(torch.randint(0, 2048, (1, 32, 3)))
    assert wav.abs().max() > 1e-3


def test_the_tied_table_is_read_under_either_name() -> None:
    """A tied checkpoint may store the codebook table as the depth decoder's or the backbone's;
    with neither, or without the codec, the load is refused naming what is missing."""
    from models.csm.loader import _split

    t = torch.zeros(2, 2)
    lm, codec = _split({"backbone_model.embed_tokens.embed_audio_tokens.weight": t, "codec_model.x": t}, TINY, "ck")
    assert lm["depth_decoder.model.embed_tokens.weight"] is t and codec == {"x": t}
    with pytest.raises(ValueError, match="neither"):
        _split({"codec_model.x": t}, TINY, "ck")
    with pytest.raises(ValueError, match="codec_model"):
        _split({"depth_decoder.model.embed_tokens.weight": t}, TINY, "ck")


def test_the_registry_serves_csm_by_name_alias_hub_id_and_folder(ckpt_root) -> None:
    """--model csm, csm-tiny, sesame/csm-* hub ids and a local checkpoint folder select CSM."""
    from models.registry import resolve

    assert resolve("csm").model_id == "sesame/csm-1b" and resolve("csm").entry.factory == "models.csm.build:load"
    assert resolve("csm-tiny").model_id == "tiny"
    assert resolve("sesame/csm-1b").entry.name == "csm"
    assert resolve(str(ckpt_root / "main")).entry.name == "csm"

"""Loading: HF directories, sharded checkpoints, clear errors, dummy weights, config parsing."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from tests.models.orpheus.orpheus_fixtures import save_tiny_checkpoint

from models.orpheus.config import PRESETS, LlamaConfig
from models.orpheus.loader import PieceTokenizer, load_orpheus, load_snac


def test_loads_hf_directory(tiny_dir):
    """A save_pretrained directory loads with HF parameter names, tied head, tokenizer."""
    model, tok, config = load_orpheus(tiny_dir, device="cpu", dtype=torch.float32, max_seq_len=256)
    assert config.tie_word_embeddings and model.lm_head is None
    assert config.rope_scaling["rope_type"] == "llama3" and config.rope_theta == 500000.0
    assert "model.layers.1.self_attn.q_proj.weight" in model.state_dict()
    assert model.rope.shape == (256, 2, 16)
    assert tok.encode("hello")[0] == 128000


def test_loads_bf16(tiny_dir):
    """dtype=bfloat16 converts every weight."""
    model, _, _ = load_orpheus(tiny_dir, device="cpu", dtype=torch.bfloat16, max_seq_len=64)
    assert {p.dtype for p in model.parameters()} == {torch.bfloat16}


def test_sharded_checkpoint_with_untied_head(tmp_path):
    """A sharded safetensors checkpoint (index json) with a separate lm_head loads equal to HF."""
    from transformers import LlamaForCausalLM

    src = save_tiny_checkpoint(tmp_path / "src", seed=1, tie_word_embeddings=False, vocab_size=500)
    hf = LlamaForCausalLM.from_pretrained(src, dtype=torch.float32)
    hf.save_pretrained(tmp_path / "sharded", max_shard_size="100KB")
    shutil.copy(src / "tokenizer.json", tmp_path / "sharded")
    shutil.copy(src / "tokenizer_config.json", tmp_path / "sharded")
    assert (tmp_path / "sharded" / "model.safetensors.index.json").is_file()
    model, _, config = load_orpheus(tmp_path / "sharded", device="cpu", dtype=torch.float32,
                                    max_seq_len=64)
    assert model.lm_head is not None
    torch.testing.assert_close(model.lm_head.weight, hf.lm_head.weight)


def test_missing_config_is_named(tmp_path, tiny_dir):
    """A directory without config.json raises FileNotFoundError naming config.json."""
    d = tmp_path / "noconfig"
    shutil.copytree(tiny_dir, d)
    (d / "config.json").unlink()
    with pytest.raises(FileNotFoundError, match="config.json"):
        load_orpheus(d, device="cpu", dtype=torch.float32)


def test_missing_weights_are_named(tmp_path, tiny_dir):
    """A directory without safetensors raises FileNotFoundError naming *.safetensors."""
    d = tmp_path / "noweights"
    shutil.copytree(tiny_dir, d)
    (d / "model.safetensors").unlink()
    with pytest.raises(FileNotFoundError, match="safetensors"):
        load_orpheus(d, device="cpu", dtype=torch.float32)


def test_missing_shard_is_named(tmp_path, tiny_dir):
    """An index naming an absent shard raises FileNotFoundError naming the shard."""
    d = tmp_path / "badindex"
    shutil.copytree(tiny_dir, d)
    (d / "model.safetensors.index.json").write_text(json.dumps(
        {"weight_map": {"model.norm.weight": "model-00002-of-00002.safetensors"}}))
    with pytest.raises(FileNotFoundError, match="model-00002-of-00002"):
        load_orpheus(d, device="cpu", dtype=torch.float32)


def test_missing_tokenizer_is_named(tmp_path, tiny_dir):
    """A directory without tokenizer files says so."""
    d = tmp_path / "notok"
    shutil.copytree(tiny_dir, d)
    for f in d.glob("tokenizer*"):
        f.unlink()
    with pytest.raises(FileNotFoundError, match="tokenizer"):
        load_orpheus(d, device="cpu", dtype=torch.float32)


def test_nonexistent_local_path(tmp_path):
    """A path that is neither a directory nor a hub id raises FileNotFoundError."""
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_orpheus(tmp_path / "nope", device="cpu")


def test_hub_id_offline_is_a_clear_error(tmp_path):
    """An uncached hub id with no network raises RuntimeError with the fix (offline machine)."""
    with pytest.raises(RuntimeError, match="dummy") as e:
        load_orpheus("voxgate-test/not-a-model", device="cpu", cache_dir=str(tmp_path))
    assert "voxgate-test/not-a-model" in str(e.value)


def test_dummy_builds_without_files():
    """load_format='dummy' builds the preset with random weights and the piece tokenizer."""
    model, tok, config = load_orpheus("tiny", device="cpu", dtype=torch.float32,
                                      load_format="dummy", max_seq_len=64)
    assert config == PRESETS["tiny"]
    assert isinstance(tok, PieceTokenizer)
    assert model.model.embed_tokens.weight.std() > 0
    h = model(torch.tensor([1, 2, 3]), torch.arange(3), lambda layer, q, k, v: q)
    assert model.compute_logits(h).shape == (3, config.vocab_size)


def test_dummy_uses_directory_config_and_tokenizer(tiny_dir):
    """Dummy from a directory uses its config.json and tokenizer but not its weights."""
    model, tok, config = load_orpheus(tiny_dir, device="cpu", dtype=torch.float32,
                                      load_format="dummy", max_seq_len=64)
    assert config.hidden_size == 64 and not isinstance(tok, PieceTokenizer)


def test_bad_load_format():
    """An unknown load_format raises ValueError."""
    with pytest.raises(ValueError, match="load_format"):
        load_orpheus("tiny", load_format="pt")


def test_snac_local_dir_and_dummy(tmp_path):
    """SNAC loads from a snac-format directory; dummy builds the 24 kHz config from a seed."""
    m = load_snac(load_format="dummy", seed=3)
    assert m.sampling_rate == 24000 and list(m.vq_strides) == [4, 2, 1]
    (tmp_path / "config.json").write_text(json.dumps({"sampling_rate": 24000, "encoder_dim": 4,
        "encoder_rates": [2, 4, 8, 8], "decoder_dim": 64, "decoder_rates": [8, 8, 4, 2],
        "attn_window_size": None, "vq_strides": [4, 2, 1], "noise": True, "depthwise": True}))
    import snac

    src = snac.SNAC.from_config(str(tmp_path / "config.json"))
    torch.save(src.state_dict(), tmp_path / "pytorch_model.bin")
    loaded = load_snac(tmp_path)
    for (k, a), (_, b) in zip(src.state_dict().items(), loaded.state_dict().items()):
        torch.testing.assert_close(a, b, msg=k)
    (tmp_path / "pytorch_model.bin").unlink()
    with pytest.raises(FileNotFoundError, match="pytorch_model.bin"):
        load_snac(tmp_path)


def test_config_presets_and_validation():
    """The orpheus-3b preset matches Llama-3.2-3B + Orpheus vocab; bad values raise ValueError."""
    c = PRESETS["orpheus-3b"]
    assert (c.hidden_size, c.intermediate_size, c.num_hidden_layers) == (3072, 8192, 28)
    assert (c.num_attention_heads, c.num_key_value_heads, c.head_dim, c.vocab_size) == (24, 8, 128, 156940)
    assert c.rope_scaling["factor"] == 32.0 and c.tie_word_embeddings
    with pytest.raises(ValueError, match="num_key_value_heads"):
        c.with_(num_key_value_heads=7)
    with pytest.raises(ValueError, match="hidden_size"):
        c.with_(hidden_size=0)
    with pytest.raises(ValueError, match="llama3"):
        c.with_(rope_scaling={"rope_type": "yarn"})


def test_config_reads_transformers_4_layout():
    """A 4.x config.json (rope_theta + rope_scaling) parses to the same config as the preset."""
    d = PRESETS["orpheus-3b"].to_hf_dict()
    assert "rope_parameters" not in d
    assert LlamaConfig.from_hf_dict(d) == PRESETS["orpheus-3b"]
    with pytest.raises(ValueError, match="vocab_size"):
        LlamaConfig.from_hf_dict({k: v for k, v in d.items() if k != "vocab_size"})


def test_piece_tokenizer_splits_as_llama3_pre_tokenizes_and_hashes_stably():
    """One id per pre-token piece (Llama 3's split: a word with its leading space or mark,
    contractions, up to three digits, punctuation runs, whitespace), after the BOS; the same
    text always gives the same ids, all text ids below 128,000; a prompt is about a third of
    its bytes."""
    tok = PieceTokenizer()
    assert tok.pieces("Hello there, this is a test.") == ["Hello", " there", ",", " this", " is", " a", " test", "."]
    assert tok.pieces("I'll pay $1234.") == ["I", "'ll", " pay", " $", "123", "4", "."]
    assert tok.pieces("two\n\nlines  ") == ["two", "\n\n", "lines", "  "]
    ids = tok.encode("Hello there, this is a test.")
    assert ids[0] == tok.bos_token_id and len(ids) == 9
    assert ids == tok.encode("Hello there, this is a test.")
    assert all(0 <= i < 128000 for i in ids[1:]) and len(set(ids[1:])) == 8
    assert tok.encode("") == [tok.bos_token_id]
    text = "The quick brown fox jumps over the lazy dog, twice: at 10:45 and again at 11:02."
    assert 2.5 * len(tok.encode(text)) < len(text.encode())

"""Test helpers: a tiny random Orpheus-shaped Llama checkpoint in HF layout, with tokenizer."""

from __future__ import annotations

from pathlib import Path

import torch

BOS, EOT = 128000, 128009
WORDS = ["hello", "world", "the", "quick", "brown", "fox", ":", ",", ".", "!"]
# Word ids are chosen by the test, so prompt ids can be checked against known numbers.
WORD_IDS = {w: 1000 + i for i, w in enumerate(WORDS)}
VOICE_IDS = {v: 2000 + i for i, v in enumerate(("tara", "leah", "jess", "leo", "dan", "mia", "zac", "zoe"))}


def build_tokenizer():
    """A WordLevel tokenizer with a Llama-3 style BOS post-processor, as PreTrainedTokenizerFast."""
    from tokenizers import Tokenizer, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    vocab = {"<unk>": 0, "<|begin_of_text|>": BOS, "<|eot_id|>": EOT, **WORD_IDS, **VOICE_IDS}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.post_processor = processors.TemplateProcessing(
        single="<|begin_of_text|> $A", special_tokens=[("<|begin_of_text|>", BOS)]
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="<|begin_of_text|>", eos_token="<|eot_id|>", unk_token="<unk>"
    )


def hf_tiny_config(**overrides):
    from transformers import LlamaConfig

    kw = dict(
        vocab_size=156940, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16, rms_norm_eps=1e-5,
        max_position_embeddings=131072, tie_word_embeddings=True, bos_token_id=BOS,
        eos_token_id=EOT,
        rope_parameters={
            "rope_type": "llama3", "rope_theta": 500000.0, "factor": 32.0, "low_freq_factor": 1.0,
            "high_freq_factor": 4.0, "original_max_position_embeddings": 8192,
        },
    )
    kw.update(overrides)
    return LlamaConfig(**kw)


def save_tiny_checkpoint(path: Path, seed: int = 0, **overrides) -> Path:
    """Write a random LlamaForCausalLM (fp32, safetensors) and the tokenizer to ``path``."""
    from transformers import LlamaForCausalLM

    torch.manual_seed(seed)
    model = LlamaForCausalLM(hf_tiny_config(**overrides))
    with torch.no_grad():  # HF inits norms at 1; perturb them so RMSNorm weights are exercised
        for name, p in model.named_parameters():
            if "norm" in name:
                p.add_(0.1 * torch.randn_like(p))
    model.save_pretrained(path)
    build_tokenizer().save_pretrained(path)
    return path


def make_small_codec():
    """A ``SnacDecoder`` over a random SNAC 24 kHz with a narrow decoder (fast on the CPU)."""
    import snac

    from models.orpheus.codec import SnacDecoder
    from models.orpheus.loader import SNAC_24KHZ_CONFIG

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = snac.SNAC(**{**SNAC_24KHZ_CONFIG, "decoder_dim": 64, "encoder_dim": 8})
    return SnacDecoder(model.eval())

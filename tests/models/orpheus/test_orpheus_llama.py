"""LlamaModel parity with transformers' LlamaForCausalLM on a tiny random checkpoint (fp32)."""

from __future__ import annotations

import torch
from tests.models.orpheus.dense_attention import DenseAttention

from models.orpheus.loader import load_orpheus

# fp32 on CPU: the two implementations differ only in op order (attention kernel, matmul
# blocking), which moves logits by ~1e-6; 1e-4 absolute leaves a wide margin.
ATOL = 1e-4


def _ours(tiny_dir):
    model, tok, config = load_orpheus(tiny_dir, device="cpu", dtype=torch.float32, max_seq_len=4096)
    return model, tok, config


def test_prefill_and_decode_logits_match_transformers(tiny_dir, hf_model):
    """Prefill logits and every decode step's logits equal LlamaForCausalLM's within 1e-4."""
    model, _, config = _ours(tiny_dir)
    g = torch.Generator().manual_seed(1)
    prompt = torch.randint(0, config.vocab_size, (11,), generator=g)
    steps = torch.randint(0, config.vocab_size, (6,), generator=g)
    attn = DenseAttention(config.num_hidden_layers)
    with torch.no_grad():
        hidden = model(prompt, torch.arange(11), attn)  # [11, hidden]
        ours = [model.compute_logits(hidden)]  # [11, V]
        for i, tok in enumerate(steps):
            h = model(tok.view(1), torch.tensor([11 + i]), attn)
            ours.append(model.compute_logits(h))
        ref = hf_model(torch.cat((prompt, steps))[None]).logits[0].float()  # [17, V]
    ours_all = torch.cat(ours)
    assert ours_all.dtype == torch.float32
    torch.testing.assert_close(ours_all, ref, atol=ATOL, rtol=0)


def test_ragged_batch_equals_each_sequence_alone(tiny_dir):
    """A flattened batch of two sequences (prefill beside decode) gives each one's solo logits."""
    model, _, config = _ours(tiny_dir)
    g = torch.Generator().manual_seed(2)
    a = torch.randint(0, config.vocab_size, (9,), generator=g)
    b = torch.randint(0, config.vocab_size, (5,), generator=g)
    with torch.no_grad():
        solo = {}
        for name, seq in (("a", a), ("b", b)):
            att = DenseAttention(config.num_hidden_layers)
            solo[name] = model.compute_logits(model(seq, torch.arange(len(seq)), att))
        att = DenseAttention(config.num_hidden_layers)
        att.plan([0], [8])  # a's first 8 tokens alone
        model(a[:8], torch.arange(8), att)
        att.plan([0, 1], [1, 5])  # a decodes its 9th token while b prefills
        h = model(torch.cat((a[8:], b)), torch.cat((torch.tensor([8]), torch.arange(5))), att)
        mixed = model.compute_logits(h)
    torch.testing.assert_close(mixed[0], solo["a"][8], atol=ATOL, rtol=0)
    torch.testing.assert_close(mixed[1:], solo["b"], atol=ATOL, rtol=0)


def test_restricted_head_equals_columns_of_full_head(tiny_dir):
    """compute_logits(hidden, vocab_ids) returns exactly those columns of the full logits."""
    model, _, config = _ours(tiny_dir)
    hidden = torch.randn(3, config.hidden_size)
    ids = torch.tensor([5, 128258, 128266, 156939])
    full = model.compute_logits(hidden)
    sub = model.compute_logits(hidden, ids)
    assert sub.shape == (3, 4)
    torch.testing.assert_close(sub, full[:, ids])
    torch.testing.assert_close(model.compute_logits(hidden, ids), sub)  # cached path


def test_greedy_generation_equals_transformers_generate(tiny_dir, hf_model):
    """Greedy decoding with our model reproduces transformers' greedy generate token for token."""
    model, _, config = _ours(tiny_dir)
    g = torch.Generator().manual_seed(3)
    prompt = torch.randint(0, config.vocab_size, (7,), generator=g)
    n_new = 24
    with torch.no_grad():
        ref = hf_model.generate(prompt[None], max_new_tokens=n_new, min_new_tokens=n_new,
                                do_sample=False, attention_mask=torch.ones(1, 7, dtype=torch.long),
                                pad_token_id=0)[0, 7:].tolist()
        attn = DenseAttention(config.num_hidden_layers)
        h = model(prompt, torch.arange(7), attn)
        ours = []
        for i in range(n_new):
            tok = model.compute_logits(h[-1:]).argmax(-1)  # [1]
            ours.append(int(tok))
            h = model(tok, torch.tensor([7 + i]), attn)
    assert ours == ref

"""Sampler: distribution vs transformers' logits processors, greedy, penalty, per-row invariance."""

from __future__ import annotations

import pytest
import torch
from transformers import (RepetitionPenaltyLogitsProcessor, TemperatureLogitsWarper, TopKLogitsWarper,
                          TopPLogitsWarper)

from engine.llm.sampler import Sampler, gumbel_noise, gumbel_noise_salts, uniform_noise


def _call(logits, *, temperature=1.0, top_p=1.0, penalty=1.0, seeds=None, steps=None, seen=None, allowed=None):
    b = logits.shape[0]
    full = lambda v, dt=torch.float32: torch.full((b,), v, dtype=dt)  # noqa: E731
    return Sampler()(
        logits,
        temperature=full(temperature), top_p=full(top_p), repetition_penalty=full(penalty),
        seeds=torch.arange(b, dtype=torch.int64) if seeds is None else seeds,
        steps=torch.zeros(b, dtype=torch.int64) if steps is None else steps,
        seen=seen, allowed=allowed,
    )


def test_sample_frequencies_match_transformers_temperature_top_p():
    """Over 40k seeds, frequencies match HF's temperature + top-p distribution (within 1%)."""
    logits = torch.tensor([[2.0, 1.5, 1.0, 0.2, -1.0, -3.0]])
    n = 40_000
    got = _call(logits.expand(n, -1).contiguous(), temperature=0.7, top_p=0.9)
    freq = torch.bincount(got, minlength=6).float() / n
    ref = TopPLogitsWarper(0.9)(None, TemperatureLogitsWarper(0.7)(None, logits.clone()))
    expected = torch.softmax(ref, dim=-1)[0]
    assert torch.allclose(freq, expected, atol=0.01), (freq, expected)
    assert freq[expected == 0].sum() == 0


def test_greedy_and_repetition_penalty_match_transformers():
    """temperature 0 is argmax after HF's repetition penalty over the seen tokens."""
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(64, 50, generator=g)
    history = torch.randint(0, 50, (64, 6), generator=g)
    seen = torch.zeros(64, 50, dtype=torch.bool).scatter(1, history, True)
    ref = RepetitionPenaltyLogitsProcessor(1.3)(history, logits.clone()).argmax(-1)
    assert torch.equal(_call(logits, temperature=0.0, penalty=1.3, seen=seen), ref)
    assert torch.equal(_call(logits, temperature=0.0), logits.argmax(-1))


def test_row_sample_does_not_depend_on_batch_neighbours():
    """A row's sample is the same alone and at any position in a batch of others."""
    g = torch.Generator().manual_seed(1)
    logits = torch.randn(9, 300, generator=g)
    seeds = torch.randint(0, 2**62, (9,), generator=g)
    steps = torch.randint(0, 1000, (9,), generator=g)
    batched = _call(logits, temperature=1.0, top_p=0.95, seeds=seeds, steps=steps)
    for i in range(9):
        alone = _call(logits[i : i + 1], temperature=1.0, top_p=0.95, seeds=seeds[i : i + 1], steps=steps[i : i + 1])
        assert alone.item() == batched[i].item()
    perm = torch.randperm(9, generator=g)
    shuffled = _call(logits[perm], temperature=1.0, top_p=0.95, seeds=seeds[perm], steps=steps[perm])
    assert torch.equal(shuffled, batched[perm])


def test_allowed_mask_is_respected():
    """Columns outside a row's allowed set are never sampled."""
    logits = torch.zeros(2000, 10)
    allowed = torch.zeros(2000, 10, dtype=torch.bool)
    allowed[:, 3:5] = True
    got = _call(logits, temperature=1.5, allowed=allowed)
    assert set(got.tolist()) == {3, 4}


def test_noise_is_uniform_and_keyed_by_seed_and_step():
    """Noise is in (0, 1), mean ~0.5, reproducible, and changes with seed and step."""
    seeds = torch.tensor([5, 5, 6, -7], dtype=torch.int64)
    steps = torch.tensor([0, 1, 0, 3], dtype=torch.int64)
    u = uniform_noise(seeds, steps, 50_000)
    assert 0 < u.min() and u.max() < 1 and abs(u.mean().item() - 0.5) < 0.01
    assert torch.equal(u, uniform_noise(seeds, steps, 50_000))
    assert not torch.equal(u[0], u[1]) and not torch.equal(u[0], u[2])


def test_noise_endpoints_stay_finite():
    """The extreme random words map strictly inside (0, 1), so Gumbel noise is never infinite."""
    from engine.llm.sampler import bits_to_unit

    u = bits_to_unit(torch.tensor([0, 2**23 - 1]))
    assert 0 < u[0] and u[1] < 1
    assert torch.isfinite(-torch.log(-torch.log(u))).all()


def test_sampling_on_each_rows_allowed_columns_equals_sampling_on_all() -> None:
    """Gathering each row's allowed columns (the engine's fast path) samples exactly the token
    the full-width sampler picks: same noise per column, same penalties, top-p and greedy ties."""
    from engine.llm.model_runner import allowed_columns

    k, b = 70, 64
    table = torch.zeros(4, k, dtype=torch.bool)
    for r in range(4):  # disjoint ranges, as Orpheus' positions, plus one extra column on row 0
        table[r, 16 * r : 16 * r + 16] = True
    table[0, k - 1] = True
    cols, valid = allowed_columns(table)
    assert cols.shape == (4, 17) and valid.sum().item() == table.sum().item()
    g = torch.Generator().manual_seed(0)
    rows = torch.randint(0, 4, (b,), generator=g)
    logits = torch.randn(b, k, generator=g).round(decimals=1)  # rounding makes ties
    kw = dict(
        temperature=torch.where(torch.arange(b) % 5 == 0, 0.0, torch.rand(b, generator=g) + 0.3),
        top_p=torch.where(torch.arange(b) % 3 == 0, 1.0, torch.rand(b, generator=g) * 0.9 + 0.05),
        repetition_penalty=torch.full((b,), 1.3), seeds=torch.arange(b) * 7919, steps=torch.arange(b) % 11,
    )
    seen = torch.rand(b, k, generator=g) < 0.1
    full = Sampler()(logits, **kw, seen=seen, allowed=table[rows])
    gathered = Sampler()(logits, **kw, seen=seen, allowed=valid[rows], columns=cols[rows])
    assert torch.equal(full, gathered)
    assert bool(table[rows, gathered].all())


def _call_top_k(logits, top_k, *, temperature=1.0, top_p=1.0, noise=None, salt=0):
    b = logits.shape[0]
    return Sampler()(
        logits, temperature=torch.full((b,), temperature), top_p=torch.full((b,), top_p),
        repetition_penalty=torch.ones(b), seeds=torch.arange(b, dtype=torch.int64),
        steps=torch.zeros(b, dtype=torch.int64), top_k=torch.full((b,), top_k, dtype=torch.int64),
        any_top_p=top_p < 1, noise=noise, salt=salt,
    )


@pytest.mark.parametrize(("top_k", "top_p"), [(3, 1.0), (3, 0.8), (0, 0.9), (4, 0.7)])
def test_sample_frequencies_match_transformers_top_k_then_top_p(top_k: int, top_p: float) -> None:
    """Over 40k seeds, top-k (then top-p over what it kept, renormalised) matches HF's
    TemperatureLogitsWarper, TopKLogitsWarper and TopPLogitsWarper in that order; without top-p
    a tie at the k-th value keeps both, as HF's threshold does (with top-p, which of two tied
    columns HF's sort keeps is its sort's accident: no tie there)."""
    logits = torch.tensor([[2.0, 1.5, 1.0, 1.0 if top_p == 1 else 0.9, 0.2, -1.0, -3.0]])
    n = 40_000
    got = _call_top_k(logits.expand(n, -1).contiguous(), top_k, temperature=0.7, top_p=top_p)
    freq = torch.bincount(got, minlength=7).float() / n
    ref = TemperatureLogitsWarper(0.7)(None, logits.clone())
    if top_k:
        ref = TopKLogitsWarper(top_k)(None, ref)
    ref = TopPLogitsWarper(top_p)(None, ref) if top_p < 1 else ref
    expected = torch.softmax(ref, dim=-1)[0]
    assert torch.allclose(freq, expected, atol=0.01), (freq, expected)
    assert freq[expected == 0].sum() == 0


def test_noise_drawn_ahead_for_many_salts_samples_as_each_call_would() -> None:
    """gumbel_noise_salts is each salt's gumbel_noise bit for bit (salt 0 included), and a call
    given its slice samples the token it would have drawn itself."""
    g = torch.Generator().manual_seed(3)
    b, k = 33, 257
    seeds = torch.randint(-(2**62), 2**62, (b,), generator=g)
    steps = torch.randint(0, 5000, (b,), generator=g)
    salts = range(0, 9)
    ahead = gumbel_noise_salts(seeds, steps, k, salts)
    assert ahead.shape == (len(salts), b, k)
    for i, salt in enumerate(salts):
        assert torch.equal(ahead[i], gumbel_noise(seeds, steps, k, salt=salt))
    logits = torch.randn(b, k, generator=g)
    s = Sampler()
    kw = dict(temperature=torch.full((b,), 0.9), top_p=torch.ones(b), repetition_penalty=torch.ones(b),
              seeds=seeds, steps=steps, top_k=torch.full((b,), 50, dtype=torch.int64), any_top_p=False)
    for i, salt in enumerate(salts):
        assert torch.equal(s(logits, **kw, salt=salt), s(logits, **kw, salt=0, noise=ahead[i]))


@pytest.mark.parametrize("any_top_p", [True, False])
def test_settings_made_once_sample_as_the_settings_given_each_call(any_top_p: bool) -> None:
    """``Sampler.rows`` made once for many calls (a frame head's codebooks, of two widths)
    samples what each call given temperature, top_p and top_k samples: greedy rows, top-k off
    (0) and on, any top-p; giving both is refused."""
    g = torch.Generator().manual_seed(4)
    b = 12
    temperature = torch.rand(b, generator=g) + 0.3
    temperature[::4] = 0.0  # greedy rows
    top_p = torch.rand(b, generator=g) * 0.5 + 0.5
    top_k = torch.randint(0, 40, (b,), generator=g)
    top_k[1::3] = 0
    seeds, steps = torch.arange(b, dtype=torch.int64), torch.full((b,), 7, dtype=torch.int64)
    s = Sampler()
    settings = s.rows(temperature, top_p, top_k)
    common = dict(repetition_penalty=torch.ones(b), seeds=seeds, steps=steps, any_top_p=any_top_p)
    for salt, width in enumerate((257, 31, 257, 64)):
        logits = torch.randn(b, width, generator=g)
        each = s(logits, temperature=temperature, top_p=top_p, top_k=top_k, salt=salt, **common)
        assert torch.equal(s(logits, settings=settings, salt=salt, **common), each)
    with pytest.raises(ValueError, match="not both"):
        s(logits, settings=settings, temperature=temperature, **common)
    with pytest.raises(ValueError, match="settings"):
        s(logits, **common)

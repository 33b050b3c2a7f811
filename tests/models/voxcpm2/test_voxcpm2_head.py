"""The patch head and its noise: batch invariance at equal seeds, per-slot settings, the stop rule,
frozen slots after a stop, padding rows (on a dummy tiny model; no reference needed)."""

from __future__ import annotations

import pytest
import torch
from tests.models.orpheus.dense_attention import DenseAttention
from tests.models.voxcpm2.voxcpm2_fixtures import row_inputs

from models.voxcpm2.flow import Schedule, patch_noise
from models.voxcpm2.head import PatchHead
from models.voxcpm2.model import LAST_PATCH, STOP, SlotFeatures
from models.voxcpm2.prompt import build_prompt


@pytest.fixture(scope="module")
def tiny():
    from models.voxcpm2.loader import load_voxcpm2

    return load_voxcpm2("tiny", load_format="dummy", dtype=torch.float32, seed=3)


def _head(loaded, slots: int = 4, max_steps: int = 10) -> tuple[PatchHead, SlotFeatures]:
    c = loaded.config
    feats = SlotFeatures(slots, 4, c.patch_size, c.feat_dim, device="cpu")
    loaded.model.slot_feats = feats
    return PatchHead(loaded.model, feats, max_num_seqs=slots, max_steps=max_steps, ring_patches=8), feats


def test_noise_is_a_function_of_seed_and_patch_index():
    """Each row's noise depends on its own (seed, patch index) only, not on the batch around it;
    it is close to a standard normal."""
    seeds, steps = torch.tensor([5, 7, 5, 9]), torch.tensor([0, 3, 1, 0])
    batch = patch_noise(seeds, steps, 64, 4)
    for i in range(4):
        assert torch.equal(batch[i], patch_noise(seeds[i:i + 1], steps[i:i + 1], 64, 4)[0])
    assert not torch.equal(batch[0], batch[2]) and not torch.equal(batch[0], batch[3])
    big = patch_noise(torch.arange(64), torch.zeros(64, dtype=torch.int64), 64, 4)
    assert abs(float(big.mean())) < 0.02 and abs(float(big.std()) - 1) < 0.02 and bool(big.isfinite().all())


def test_batched_rows_equal_each_alone(tiny):
    """Rows with their own seeds, patch indices, step counts and guidance, batched with a padding
    row, give the same patch and token as each alone."""
    head, feats = _head(tiny)
    settings = {0: (10, 2.0), 1: (4, 1.0), 2: (7, 3.5)}
    g = torch.Generator().manual_seed(1)
    hidden = torch.randn(3, 2 * tiny.config.lm.hidden_size, generator=g)
    conds = torch.randn(3, tiny.config.patch_size, tiny.config.feat_dim, generator=g)

    def setup():
        for s, (n, cfg) in settings.items():
            head.configure(s, steps=n, cfg=cfg, min_len=100, cond=conds[s])

    order, seeds, steps = [2, 0, 1], [11, 12, 13], [4, 0, 9]
    setup()
    with torch.no_grad():
        tok, _ = head.sample(torch.cat((hidden[order], hidden[:1])),
                             row_inputs(seeds + [0], steps + [0], order + [head.feats.last.shape[0] - 1],
                                        [True, True, True, False]))
        batched = feats.last[:3].clone()
        solo = {}
        for i, s in enumerate(order):
            setup()
            t1, _ = head.sample(hidden[s:s + 1], row_inputs([seeds[i]], [steps[i]], [s]))
            assert t1[0].tolist() == tok[i].tolist()
            solo[s] = feats.last[s].clone()
    for s in order:
        torch.testing.assert_close(batched[s], solo[s], atol=1e-5, rtol=1e-5)
    assert tok[:3, 0].tolist() == [LAST_PATCH] * 3 and tok[:3, 1].tolist() == steps


def _ragged(loaded, prompts, n_patches, seeds, *, together: bool):
    """Latents of several zero-shot sequences, generated together (one ragged batch per step) or
    one at a time."""
    model = loaded.model
    head, feats = _head(loaded, slots=len(prompts))
    for s in range(len(prompts)):
        head.configure(s, steps=10, cfg=2.0, min_len=100)
    groups = [list(range(len(prompts)))] if together else [[i] for i in range(len(prompts))]
    out = {}
    for group in groups:
        attn = DenseAttention(model.num_layers)
        ids = [torch.tensor(prompts[i].ids) for i in group]
        attn.plan(group, [len(x) for x in ids])
        with torch.no_grad():
            h = model(torch.cat(ids), torch.cat([torch.arange(len(x)) for x in ids]), attn,
                      torch.cat([torch.full((len(x),), i) for i, x in zip(group, ids)]))
            last = torch.tensor([len(x) for x in ids]).cumsum(0) - 1
            h = h[last]
            for k in range(n_patches):
                head.sample(h, row_inputs([seeds[i] for i in group], [k] * len(group), group))
                for i in group:
                    out.setdefault(i, []).append(feats.last[i].clone())
                attn.plan(group, [1] * len(group))
                h = model(torch.full((len(group),), LAST_PATCH), torch.tensor([len(x) + k for x in ids]), attn,
                          torch.tensor(group))
    return {i: torch.stack(v) for i, v in out.items()}


def test_generation_is_batch_invariant_at_equal_seeds(tiny):
    """Whole generations (backbone, residual LM, head) batched together equal each alone: equal
    requests at equal seeds render equal latents whatever shares the batch."""
    prompts = [build_prompt([5, 9, 44, 300]), build_prompt([7, 7]), build_prompt([5, 9, 44, 300])]
    seeds = [1, 2, 1]
    alone = _ragged(tiny, prompts, 4, seeds, together=False)
    together = _ragged(tiny, prompts, 4, seeds, together=True)
    for i in range(3):
        torch.testing.assert_close(together[i], alone[i], atol=1e-5, rtol=1e-5)
    assert torch.equal(alone[0], alone[2])
    assert not torch.allclose(alone[0], alone[1])


def test_stop_rule_min_len_and_frozen_slot(tiny):
    """Stop is ignored up to patch index min_len; the stop step's patch is kept; after a stop the
    slot's state is frozen and the head answers STOP again until reset."""
    import copy

    loaded = copy.deepcopy(tiny)
    with torch.no_grad():  # a stop head that always says stop
        loaded.model.stop_head.weight.zero_()
        loaded.model.stop_proj.bias.fill_(1.0)
        loaded.model.stop_proj.weight.zero_()
        loaded.model.stop_head.weight[1] = 1.0
    head, feats = _head(loaded)
    head.configure(1, steps=10, cfg=2.0, min_len=2)
    h = torch.randn(1, 2 * loaded.config.lm.hidden_size, generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        cols = [int(head.sample(h, row_inputs([1], [k], [1]))[0][0, 0]) for k in range(3)]
        assert cols == [LAST_PATCH, LAST_PATCH, LAST_PATCH]  # indices 0..2 <= min_len
        tok, _ = head.sample(h, row_inputs([1], [3], [1]))
        assert int(tok[0, 0]) == STOP
        kept = feats.last[1].clone()
        assert torch.equal(head.ring[1, 3], kept)
        tok, _ = head.sample(h * 2, row_inputs([9], [4], [1]))  # a step already in flight
        assert int(tok[0, 0]) == STOP and torch.equal(feats.last[1], kept)
        head.reset(torch.tensor([1]))
        assert int(head.sample(h, row_inputs([1], [0], [1]))[0][0, 0]) == LAST_PATCH


def test_rows_not_kept_write_nothing(tiny):
    """A row whose sample is not used (a prompt chunk, padding) leaves the slot's state alone."""
    head, feats = _head(tiny)
    head.configure(0, steps=10, cfg=2.0, min_len=2)
    before = feats.last[0].clone(), head.ring[0].clone()
    h = torch.randn(1, 2 * tiny.config.lm.hidden_size)
    with torch.no_grad():
        head.sample(h, row_inputs([1], [0], [0], [False]))
    assert torch.equal(feats.last[0], before[0]) and torch.equal(head.ring[0], before[1])


def test_settings_are_validated(tiny):
    """Step counts outside [1, max_steps] are refused."""
    head, _ = _head(tiny, max_steps=10)
    with pytest.raises(ValueError, match="steps"):
        head.configure(0, steps=11, cfg=2.0, min_len=2)
    with pytest.raises(ValueError, match="steps"):
        head.configure(0, steps=0, cfg=2.0, min_len=2)


def test_one_step_schedule_returns_the_noise():
    """The reference's CFG-zero* skips the first update: with one step no update applies (the
    output is the noise); with ten, nine do."""
    assert Schedule(1).live == [False]
    assert sum(Schedule(10).live) == 9
    assert sum(Schedule(60).live) == 58


def test_max_len_stops_at_the_cap_whatever_min_len(tiny):
    """A slot's max_len makes the patch at index max_len - 1 the stop patch, even while stop would
    be ignored (min_len); without one, min_len alone rules."""
    head, _ = _head(tiny)
    head.configure(0, steps=2, cfg=2.0, min_len=100, max_len=3)
    head.configure(1, steps=2, cfg=2.0, min_len=100)
    h = torch.randn(2, 2 * tiny.config.lm.hidden_size, generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        cols = [head.sample(h, row_inputs([1, 1], [k, k], [0, 1]))[0][:, 0].tolist() for k in range(3)]
    assert cols == [[LAST_PATCH, LAST_PATCH], [LAST_PATCH, LAST_PATCH], [STOP, LAST_PATCH]]
    with pytest.raises(ValueError, match="max_len"):
        head.configure(0, steps=2, cfg=2.0, min_len=2, max_len=0)


@pytest.mark.parametrize("heads", [2, 4])
def test_fused_dit_velocity_equals_the_modules(tiny, heads):
    """FusedDiT (fused weights, one RoPE pass, the time embeddings of all steps at once, the
    guidance halves sharing their equal parts) gives LocalDiT.forward's velocity on the doubled
    batch (conditional rows, then mu = 0), with and without grouped-query attention."""
    from models.voxcpm2.dit import FusedDiT
    from models.voxcpm2.model import LocalDiT

    c = tiny.config
    lc = c.dit_lm.derived(num_attention_heads=heads)
    torch.manual_seed(5)
    dit = LocalDiT(lc, c.feat_dim).eval()
    with torch.no_grad():
        for name, p in dit.named_parameters():
            if name.endswith("layernorm.weight") or name.endswith("norm.weight"):
                p.uniform_(0.5, 1.5)
    fused = FusedDiT(dit, lc, c.patch_size)
    g = torch.Generator().manual_seed(6)
    b, p, d, hd = 3, c.patch_size, c.feat_dim, lc.hidden_size
    mu = torch.randn(b, 2 * hd, generator=g)
    cond, x = torch.randn(b, p, d, generator=g), torch.randn(b, p, d, generator=g)
    t, dt = torch.rand(b, 4, generator=g), torch.rand(b, 4, generator=g)
    with torch.no_grad():
        prefix = fused.prefix(mu, cond, t, dt)
        for j in range(4):
            got = fused.velocity(prefix[j], x)  # [2, B, P, D]
            want = dit(torch.cat((x, x)).transpose(1, 2), torch.cat((mu, torch.zeros_like(mu))),
                       torch.cat((t[:, j], t[:, j])), torch.cat((cond, cond)).transpose(1, 2),
                       torch.cat((dt[:, j], dt[:, j])))  # [2B, D, P]
            torch.testing.assert_close(got.reshape(2 * b, p, d), want.transpose(1, 2), atol=1e-5, rtol=1e-5)

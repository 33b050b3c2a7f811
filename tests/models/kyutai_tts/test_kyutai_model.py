"""Kyutai TTS model pieces: conditions equal the reference's, checkpoint layouts, batch invariance
of the depth step, the device state machine equal to the host one."""

from __future__ import annotations

import random

import pytest
import torch
from tests.models.kyutai_tts.kyutai_fixtures import JOBS, load_ours, voice_file

from models.kyutai_tts.config import TTS_1_6B_EN_FR, KyutaiTTSConfig
from models.kyutai_tts.depformer import GREEDY, AudioSampling, decode_frame
from models.kyutai_tts.device_machine import DeviceMachine
from models.kyutai_tts.lm import KyutaiLM
from models.kyutai_tts.loader import load_voice
from models.kyutai_tts.machine import NEW_WORD, PAD, Entry, HostMachine, MachineParams


def test_conditions_equal_reference(tts_ckpt, tts_reference):
    """The sum condition (control + cfg) and the two-voice cross-attention source equal moshi's."""
    lm = load_ours(tts_ckpt).lm
    job, ref = JOBS["conditions"], tts_reference["conditions"]
    cp = lm.condition_provider
    torch.testing.assert_close(cp.sum_condition("1.5"), ref["sum"], atol=1e-6, rtol=1e-6)
    voices = [load_voice(voice_file(tts_ckpt, v)) for v in job["voices"]]
    torch.testing.assert_close(cp.cross_source(voices), ref["cross"], atol=1e-6, rtol=1e-6)


def test_published_layout_counts():
    """The 1.6B preset builds moshi's 498 unstacked tensors (1.84 B parameters); the published
    file's legacy layout (attention weights stacked per module) has 418."""
    with torch.device("meta"):
        lm = KyutaiLM(TTS_1_6B_EN_FR)
    sd = lm.state_dict()
    assert len(sd) == 498
    assert 1.83e9 < sum(v.numel() for v in sd.values()) < 1.84e9
    stacked = {k.split("in_projs.")[0] + "in" if "in_projs." in k else
               k.split("out_projs.")[0] + "out" if "out_projs." in k else k for k in sd}
    assert len(stacked) == 418
    assert sum(1 for k in sd if k.startswith("condition_provider.")) == 8


def test_config_round_trip():
    """config.json -> KyutaiTTSConfig -> config.json is lossless for the 1.6B preset."""
    d = TTS_1_6B_EN_FR.to_hf_dict()
    back = KyutaiTTSConfig.from_hf_dict(d)
    assert back.lm == TTS_1_6B_EN_FR.lm and back.condition == TTS_1_6B_EN_FR.condition
    assert back.delay_steps == 16 and back.text_card_in == 8001
    bad = dict(d, gating="none")
    with pytest.raises(ValueError):
        KyutaiTTSConfig.from_hf_dict(bad)


def _frame_inputs(lm: KyutaiLM, b: int, sampled: bool) -> tuple[torch.Tensor, torch.Tensor, AudioSampling]:
    """A batch of ``b`` temporal hiddens and text outputs, and how to sample their codebooks."""
    from engine.llm.sampler import gumbel_noise_salts

    g = torch.Generator().manual_seed(3)
    hidden = torch.randn(b, lm.config.lm.dim, generator=g)
    text = torch.tensor([3, 163, 8000 + 161 * 5, 44, 7, 1200, 9][:b])
    if not sampled:
        return hidden, text, GREEDY
    noise = gumbel_noise_salts(torch.arange(b) * 31, torch.full((b,), 5), lm.config.lm.card, range(1, 33))
    temperature = torch.rand(b, 1, generator=g) + 0.5
    top_p = torch.where(torch.arange(b)[:, None] % 2 == 0, 0.8, float("inf"))
    return hidden, text, AudioSampling(250, temperature, noise, top_p)


def _rows(s: AudioSampling, i: int) -> AudioSampling:
    if s.noise is None:
        return s
    return AudioSampling(s.top_k, s.divisor[i:i + 1], s.noise[:, i:i + 1], s.top_p[i:i + 1])


@pytest.mark.parametrize("sampled", [False, True])
def test_depth_step_is_batch_invariant(tts_ckpt, sampled):
    """decode_frame on a batch gives each row the codes it gets alone (all 32 codebooks; argmax,
    and top-k sampling with noise, temperatures and top-p per row)."""
    lm = load_ours(tts_ckpt).lm
    hidden, text, sampling = _frame_inputs(lm, 4, sampled)
    with torch.no_grad():
        batch = decode_frame(lm, hidden, text, sampling, 32)
        rows = [decode_frame(lm, hidden[i:i + 1], text[i:i + 1], _rows(sampling, i), 32) for i in range(4)]
    assert batch.shape == (4, 32)
    assert batch.tolist() == torch.cat(rows).tolist()
    assert len(set(batch.flatten().tolist())) > 20  # (not one code everywhere)


def test_the_compiled_depth_pieces_give_the_eager_codes_with_one_trace_each(tts_ckpt):
    """``FrameFns.compiled``: each fused piece traces whole (fullgraph) and, traced with a
    dynamic batch, serves every codebook and every batch of two or more rows without tracing
    again (a single row is one more trace each); the codes equal the plain pieces'."""
    from torch._dynamo.testing import CompileCounter

    from models.kyutai_tts.depformer import FrameFns

    lm = load_ours(tts_ckpt).lm
    torch._dynamo.reset()
    counter = CompileCounter()
    fns = FrameFns.compiled(counter)
    traces = []
    with torch.no_grad():
        for b in (4, 3, 7):
            hidden, text, sampling = _frame_inputs(lm, b, True)
            want = decode_frame(lm, hidden, text, sampling, 32)
            assert torch.equal(decode_frame(lm, hidden, text, sampling, 32, fns), want)
            traces.append(counter.frame_count)
        hidden, text, sampling = _frame_inputs(lm, 1, True)
        assert torch.equal(decode_frame(lm, hidden, text, sampling, 32, fns), decode_frame(lm, hidden, text, sampling, 32))
    # five pieces, the folded embedding's traced twice (its table a view at offset 0, then not)
    assert traces == [6, 6, 6] and counter.frame_count <= 12
    torch._dynamo.reset()


def test_the_compiled_backbone_pieces_give_the_plain_hidden_with_one_trace_each():
    """``KyutaiLM.compile_backbone``: RoPE written out over real pairs, the gating's product and
    the input embedding (from the joined audio tables and the folded text one), each traced
    whole, once for every row count of two or more and once for one row (at load); the temporal
    transformer's output and the embedding equal the plain modules' within float32 rounding,
    and a row count it was not traced for runs without tracing again."""
    from torch._dynamo.testing import CompileCounter

    from models.kyutai_tts.lm import PLAIN_BACKBONE, rope_cos_sin, rotate_real
    from models.kyutai_tts.loader import load_kyutai_tts
    from models.mimi.modules import rope_table, rotate

    x = torch.randn(5, 2, 4, 16)
    pos = torch.tensor([0, 3, 17, 250, 999])
    torch.testing.assert_close(rotate_real(x, rope_cos_sin(pos, 16, 10_000)[:, None]),
                               rotate(x, rope_table(pos, 16, 10_000)[:, None]), rtol=1e-6, atol=1e-6)
    lm = load_kyutai_tts("tiny", load_format="dummy", dtype=torch.float32).lm
    c = lm.config.lm
    torch._dynamo.reset()
    counter = CompileCounter()
    lm.compile_backbone(counter)
    assert counter.frame_count == 8 and lm.frozen_stance == "eager_on_recompile"

    def attn(layer, q, k, v):  # noqa: ANN001, ANN202 (one frame each: it attends to itself)
        return v

    with torch.inference_mode():  # (as the runtime's steps and the warm-up)
        for t in (3, 1, 9):
            h = torch.randn(t, c.dim)
            p = torch.randint(0, 400, (t,))
            got = lm.backbone(h, p, attn, None)
            fns, lm.fns, kept = lm.fns, PLAIN_BACKBONE, lm.frozen_stance
            lm.frozen_stance = None
            try:
                want = lm.backbone(h, p, attn, None)
            finally:
                lm.fns, lm.frozen_stance = fns, kept
            torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
        # the input embedding from the joined and folded tables, compiled, equals the modules'
        frame = torch.randint(-1, c.card, (6, 1 + c.n_q))
        n = c.text_card + 1
        frame[:, 0] = torch.tensor([-1, 3, n - 1, n + 7, 5 * n + 2, c.text_card])
        pos = torch.tensor([0, 1, 2, 7, 30, 200])
        cond = torch.randn(6, c.dim)
        got = lm.embed(frame, pos, cond)
        tables = lm.audio_emb_joint, lm.text_emb_folded
        lm.audio_emb_joint = lm.text_emb_folded = None
        try:
            want = lm.embed(frame, pos, cond)
        finally:
            lm.audio_emb_joint, lm.text_emb_folded = tables
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    assert counter.frame_count == 8
    torch._dynamo.reset()


def test_folded_depth_embeddings_equal_the_low_rank_ones():
    """``KyutaiLM.fold_depformer_emb`` (at load): each codebook's input row, and the text's
    demultiplexed pair (none, one token, two tokens), equal the low-rank modules' within float32
    rounding, and a frame's codes are the same with the tables as without."""
    from models.kyutai_tts.depformer import PLAIN
    from models.kyutai_tts.loader import load_kyutai_tts

    lm = load_kyutai_tts("tiny", load_format="dummy", dtype=torch.float32).lm
    c = lm.config.lm
    assert lm.depformer_emb_folded.shape == (c.dep_q - 1, c.card + 1, c.depformer_dim)
    codes = torch.tensor([0, 5, c.card - 1])
    for k in (0, 7, c.dep_q - 2):
        torch.testing.assert_close(lm.depformer_emb_folded[k][codes], lm.depformer_emb[k](codes), rtol=1e-6, atol=1e-6)
    n = c.text_card + 1
    ids = torch.tensor([-1, 3, n - 1, n + 7, 5 * n + 2, n * n - 1])
    x = torch.randn(len(ids), c.depformer_dim)
    alpha = torch.rand(c.depformer_dim) + 0.5
    got = PLAIN.text_add_norm(x, lm.depformer_text_folded, ids, n, alpha, 1e-8)
    want = PLAIN.add_norm(x, lm.depformer_text_emb(ids), alpha, 1e-8)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    assert torch.equal(got[0][0], x[0])  # -1: nothing added
    with torch.no_grad():
        for sampled in (False, True):
            hidden, text, sampling = _frame_inputs(lm, 7, sampled)
            text[0] = -1
            folded = decode_frame(lm, hidden, text, sampling, 32)
            tables = lm.depformer_emb_folded, lm.depformer_text_folded
            lm.depformer_emb_folded = lm.depformer_text_folded = None
            try:
                assert torch.equal(decode_frame(lm, hidden, text, sampling, 32), folded)
            finally:
                lm.depformer_emb_folded, lm.depformer_text_folded = tables


def _random_entries(rng: random.Random, n: int) -> list[Entry]:
    out = []
    for _ in range(n):
        if rng.random() < 0.15:
            out.append(Entry(tokens=(), padding=rng.randint(0, 5)))
        else:
            toks = tuple(rng.choice([0, 1, 5, 9, 40, 77]) for _ in range(rng.randint(1, 4)))
            out.append(Entry(tokens=toks, padding=rng.randint(0, 4)))
    return out


@pytest.mark.parametrize("ahead", [2, 0])
def test_device_machine_equals_host_machine(ahead):
    """On random entries (words, pauses, <unk>-like 0 tokens) and random samples, batched over
    slots, the device machine's outputs, end steps and stop flags equal the host machine's."""
    rng = random.Random(ahead)
    params = MachineParams(card=161, second_stream_ahead=ahead, max_padding=5, initial_padding=2)
    dev = DeviceMachine(params, max_slots=3, device="cpu")
    hosts, texts = [], []
    for slot in range(3):
        entries = _random_entries(rng, rng.randint(1, 12))
        h = HostMachine(params)
        h.add(entries, final=True)
        hosts.append(h)
        texts.append(entries)
        dev.write(slot, 0, 0, entries, (len(entries), sum(1 for e in entries if e.tokens)))
    for step in range(80):
        sampled = [rng.choice([NEW_WORD, PAD, 7]) for _ in range(3)]
        rows = torch.tensor([2, 0, 1, 3])  # slot 3: the padding row
        out = dev.step(rows, torch.tensor([sampled[2], sampled[0], sampled[1], 0]), torch.full((4,), step),
                       torch.tensor([True, True, True, False]))
        want = [hosts[2].step(sampled[2]), hosts[0].step(sampled[0]), hosts[1].step(sampled[1])]
        assert out[:3].tolist() == want, step
    for slot in range(3):
        assert int(dev.end_step[slot]) == hosts[slot].end_step
        assert bool(dev.ended[slot]) == (hosts[slot].end_step is not None)


def test_host_machine_readiness():
    """ready_to_run is False exactly when a possible pop lacks its entry or look-ahead word."""
    params = MachineParams(card=161, second_stream_ahead=2, max_padding=5, initial_padding=2)
    h = HostMachine(params)
    assert h.ready_to_run(2)  # the two initial frames never pop
    assert not h.ready_to_run(3)  # frame 2 may pop word 0, whose look-ahead (word 2) is missing
    h.add([Entry((5,), 1), Entry((9,), 1)])
    assert not h.ready_to_run(3)
    h.add([Entry((40,), 1)])
    assert h.ready_to_run(3)
    h.step(PAD), h.step(PAD), h.step(NEW_WORD)  # word 0 popped at frame 2
    assert h.consumption_times == [2]
    assert h.ready_to_run(1)  # frame 3 pads (word 0's forced padding)
    assert not h.ready_to_run(2)  # frame 4 may pop word 1, whose look-ahead (word 3) is missing
    h.add([], final=True)
    assert h.ready_to_run(10)


def test_host_machine_readiness_shortcut_agrees_with_the_search():
    """The check without the search (entries enough for a pop per frame) never says ready where
    the search over both samples of every frame says not, and it is taken where text is ahead."""
    rng = random.Random(7)
    params = MachineParams(card=161, second_stream_ahead=2, max_padding=4, initial_padding=2)
    taken = 0
    for _ in range(300):
        h = HostMachine(params)
        pool = [Entry(tuple(rng.randrange(4, 160) for _ in range(rng.randint(1, 3))), 1) if rng.random() < 0.85
                else Entry((), rng.randint(1, 3)) for _ in range(rng.randint(0, 12))]
        h.add(pool[: rng.randint(0, len(pool))])
        for _ in range(rng.randint(0, 20)):  # frames that may run, sampled at random
            if not h.ready_to_run(1):
                h.add(pool[len(h.entries): len(h.entries) + 1])
                if not h.ready_to_run(1):
                    break
            h.step(rng.choice([NEW_WORD, PAD, 9]))
        for n in range(1, 7):
            search = h._ready(n, set())
            if h._enough_entries(n):
                taken += 1
                assert search, (n, h)
            assert h.ready_to_run(n) == search
    assert taken > 100


@pytest.mark.parametrize("k", [1, 25, 250])
def test_constant_top_k_sampling_equals_the_runtime_sampler(k):
    """``sample_top_k`` (the head's constant top-k) draws what the runtime's sampler draws with
    that top-k per row and the same noise, top-p and temperatures (greedy rows included), on
    logits without ties; and a row's draw does not depend on the rows beside it."""
    from engine.llm.sampler import Sampler, gumbel_noise
    from models.kyutai_tts.head import sample_top_k

    g = torch.Generator().manual_seed(k)
    b, v = 64, 2048
    logits = torch.randn(b, v, generator=g) * 3
    temperature = torch.rand(b, generator=g) + 0.2
    temperature[::7] = 0.0  # greedy rows
    top_p = torch.where(torch.rand(b, generator=g) < 0.5, torch.rand(b, generator=g) * 0.9 + 0.05, torch.ones(b))
    seeds, steps = torch.arange(b) * 7919, torch.full((b,), 12)
    noise = gumbel_noise(seeds, steps, v, salt=3)
    sampler = Sampler()
    want = sampler(logits, temperature=temperature, top_p=top_p, top_k=torch.full((b,), k), repetition_penalty=torch.ones(b),
                   seeds=seeds, steps=steps, salt=3)
    thr = torch.where(top_p < 1, top_p, torch.full_like(top_p, float("inf")))[:, None]
    rs = Sampler.rows(temperature, top_p)
    noise = noise.masked_fill(rs.is_greedy[:, None], 0.0)  # (its contract: no noise on greedy rows)
    got = sample_top_k(logits, k, rs, noise, thr)
    assert torch.equal(got, want)
    assert len(set(got.tolist())) > 10  # (not one token for every row)
    rows = [3, 10, 41]
    alone = sample_top_k(logits[rows], k, Sampler.rows(temperature[rows], top_p[rows]), noise[rows], thr[rows])
    # bfloat16 logits (the model's) are scaled in float32: as if cast first. (They tie often, so
    # the runtime's sampler, which keeps every logit tied with the k-th, may keep more.)
    half = logits.bfloat16()
    assert torch.equal(sample_top_k(half, k, rs, noise, thr), sample_top_k(half.float(), k, rs, noise, thr))
    assert torch.equal(alone, got[rows])


def test_staged_writes_flushed_once_equal_writes_made_one_by_one():
    """Writes of many slots staged and flushed together (one copy a step) leave the device
    machine's tables as the same writes made one at a time do, a later write of the same ring
    place or slot winning; a word too long is refused before anything is staged."""
    rng = random.Random(5)
    params = MachineParams(card=161, second_stream_ahead=2, max_padding=5, initial_padding=2)
    one, staged = DeviceMachine(params, max_slots=4, device="cpu"), DeviceMachine(params, max_slots=4, device="cpu")
    writes = []
    for _ in range(30):
        slot = rng.randrange(4)
        entries = _random_entries(rng, rng.randint(0, 5))
        totals = (rng.randint(1, 90), rng.randint(1, 90)) if rng.random() < 0.3 else None
        writes.append((slot, rng.randrange(200), rng.randrange(200), entries, totals))
    for w in writes:
        one.write(*w)
        staged.stage(*w)
    assert not torch.equal(staged.num_entries, one.num_entries) or not torch.equal(staged.entry_word, one.entry_word)
    staged.flush()
    for name in ("entry_word", "entry_pad", "word_tok", "word_len", "num_entries", "num_words"):
        assert torch.equal(getattr(staged, name), getattr(one, name)), name
    staged.flush()  # nothing staged: nothing changes
    assert torch.equal(staged.word_tok, one.word_tok)
    with pytest.raises(ValueError, match="split it first"):
        staged.stage(0, 0, 0, [Entry(tokens=[3] * (DeviceMachine.WORD_TOKENS + 1), padding=0)])
    assert staged._staged_entries is None

"""CPU tests of the fused forward and of the graphed decode step's function (run without graphs)."""

from __future__ import annotations

import copy

import pytest
import torch

from engine.llm.attention import KVCacheSpec, TorchPagedAttention, allocate_kv_caches, build_attention_metadata
from engine.llm.attention import torch_paged_attention_factory
from engine.llm.cuda_graphs import CudaGraphModelRunner, pad_decode_metadata
from models.orpheus.fused_forward import FusedLlamaForward
from engine.llm.model_runner import ModelRunner
from engine.llm.scheduler import ScheduledBatch
from engine.llm.sequence import SamplingParams, Sequence
from models.orpheus.config import TINY
from models.orpheus.llama import LlamaModel

PAGE = 16


def _model(seed: int = 0) -> LlamaModel:
    torch.manual_seed(seed)
    return LlamaModel(TINY, max_seq_len=512).init_random_(seed=seed).eval()


def _spec(num_pages: int = 32) -> KVCacheSpec:
    return KVCacheSpec(num_layers=TINY.num_hidden_layers, num_pages=num_pages, page_size=PAGE,
                       num_qo_heads=TINY.num_attention_heads, num_kv_heads=TINY.num_key_value_heads,
                       head_dim=TINY.head_dim, dtype=torch.float32, device=torch.device("cpu"), max_num_seqs=8)


def _seqs(contexts: list[int], params: SamplingParams) -> list[Sequence]:
    seqs = []
    for i, ctx in enumerate(contexts):
        s = Sequence(seq_id=i, prompt_ids=[(37 * i + 5 * j) % 1000 for j in range(ctx)], params=params, slot=i)
        s.pages = list(range(4 * i, 4 * i + 4))
        seqs.append(s)
    return seqs


@pytest.mark.parametrize("compiled", [False, True])
def test_fused_forward_equals_model_forward(compiled: bool) -> None:
    """Fused QKV / gate-up GEMMs and fused norms give the model's own hidden states (fp32)."""
    model = _model()
    ref_model = copy.deepcopy(model)
    fused = FusedLlamaForward(model, compile=compiled)
    seqs = _seqs([9, 23, 4], SamplingParams())
    batch = ScheduledBatch(seqs=seqs, num_new_tokens=[9, 23, 4], is_sampled=[True] * 3, num_decode_seqs=0)
    meta = build_attention_metadata(batch, PAGE)
    ids = torch.tensor([t for s in seqs for t in s.prompt_ids])
    outs = []
    for fwd in (ref_model, fused):
        attn = TorchPagedAttention(_spec(), allocate_kv_caches(_spec()))
        attn.begin_step(meta)
        with torch.no_grad():
            outs.append(fwd(ids, meta.positions, attn))
    torch.testing.assert_close(outs[1], outs[0], atol=1e-4, rtol=1e-4)
    with torch.no_grad():  # the model's own forward still works on the shared weights
        attn = TorchPagedAttention(_spec(), allocate_kv_caches(_spec()))
        attn.begin_step(meta)
        torch.testing.assert_close(model(ids, meta.positions, attn), outs[0], atol=1e-5, rtol=1e-5)


def test_fused_forward_shares_weights() -> None:
    """Building the fused forward does not copy the QKV and gate-up weights."""
    model = _model()
    fused = FusedLlamaForward.for_model(model, compile=False)
    assert FusedLlamaForward.for_model(model) is fused
    a = model.model.layers[0].self_attn
    assert a.k_proj.weight.untyped_storage().data_ptr() == fused.layers[0][1].untyped_storage().data_ptr()


def test_graph_step_function_samples_like_the_eager_runner() -> None:
    """The graphed step's function (forward, head, sampler, penalty update) on a padded batch
    gives the eager runner's tokens for the real rows, step after step."""
    params = SamplingParams(temperature=0.8, top_p=0.9, repetition_penalty=1.3, seed=11)
    ref_model = _model(3)
    eager = ModelRunner(ref_model, TINY, device="cpu", dtype=torch.float32, num_pages=32, page_size=PAGE,
                        max_num_seqs=8)
    runner = CudaGraphModelRunner(copy.deepcopy(ref_model), TINY, device="cpu", dtype=torch.float32, num_pages=32,
                                  page_size=PAGE, max_num_seqs=8, capture=False,
                                  attention_backend_factory=torch_paged_attention_factory)
    runner.forward_fn = FusedLlamaForward(runner.model, compile=False)
    pad_attn = TorchPagedAttention(runner.spec, runner.kv_caches)
    seqs = {name: _seqs([7, 12, 3], params) for name in ("eager", "graph")}
    prefill = {k: ScheduledBatch(seqs=v, num_new_tokens=[7, 12, 3], is_sampled=[True] * 3, num_decode_seqs=0)
               for k, v in seqs.items()}
    for step in range(6):
        if step == 0:
            toks = {"eager": eager.execute(prefill["eager"]), "graph": runner.execute(prefill["graph"])}
        else:
            batch = ScheduledBatch(seqs=seqs["eager"], num_new_tokens=[1] * 3, is_sampled=[True] * 3, num_decode_seqs=3)
            toks = {"eager": eager.execute(batch)}
            gseqs = seqs["graph"]
            meta = pad_decode_metadata(
                build_attention_metadata(ScheduledBatch(gseqs, [1] * 3, [True] * 3, 3), PAGE),
                4, scratch_page=runner.scratch_page, page_size=PAGE)
            pad_attn.begin_step(meta)
            ids = torch.tensor([s.token_slice(s.num_computed_tokens, s.num_computed_tokens + 1)[0] for s in gseqs] + [0])
            z = torch.zeros(1)
            extras = [torch.cat([torch.full((3,), v), z]) for v in (0.8, 0.9, 1.3)]
            extras += [torch.tensor([11, 11, 11, 0]), torch.tensor([s.num_output_tokens for s in gseqs] + [0]),
                       torch.tensor([s.slot + 1 for s in gseqs] + [0]), torch.zeros(4, dtype=torch.int64),
                       torch.tensor([True, True, True, False]), torch.zeros(4, dtype=torch.int64)]
            with torch.inference_mode():
                toks["graph"] = runner._graph_step(ids, meta.positions, pad_attn, *extras)[0][:3]
        assert toks["graph"].tolist() == toks["eager"].tolist()
        for name in ("eager", "graph"):
            for s, t in zip(seqs[name], toks[name].tolist()):
                s.num_computed_tokens = s.num_tokens
                s.output_ids.append(t)
    assert torch.equal(runner.seen, eager.seen)  # penalty state identical; padding touched the extra row only


def test_prefill_step_function_matches_eager_prefill() -> None:
    """The graphed single-prompt prefill's function (padded at the end, causal SDPA over the new
    tokens) gives the eager runner's token, logits and K/V for a fresh sequence."""
    from engine.llm.prefill_graphs import GraphPrefillAttention, pad_prefill_slots

    params = SamplingParams(temperature=0.7, top_p=0.9, repetition_penalty=1.3, seed=5)
    ref_model = _model(4)
    eager = ModelRunner(ref_model, TINY, device="cpu", dtype=torch.float32, num_pages=32, page_size=PAGE,
                        max_num_seqs=8)
    runner = CudaGraphModelRunner(copy.deepcopy(ref_model), TINY, device="cpu", dtype=torch.float32, num_pages=32,
                                  page_size=PAGE, max_num_seqs=8, capture=False,
                                  attention_backend_factory=torch_paged_attention_factory)
    runner.forward_fn = FusedLlamaForward(runner.model, compile=False)
    runner.head.seen_rows[2, :50] = True  # a predecessor's penalty state in the slot: must be forgotten
    (e_seq,), (g_seq,) = _seqs([21], params), _seqs([21], params)
    e_seq.slot = g_seq.slot = 2
    batch = ScheduledBatch(seqs=[e_seq], num_new_tokens=[21], is_sampled=[True], num_decode_seqs=0)
    meta = build_attention_metadata(batch, PAGE)
    with torch.inference_mode():
        ref_logits = eager._forward(torch.tensor(e_seq.prompt_ids), meta)
        ref_token = eager.execute(batch)
        attn = GraphPrefillAttention(runner.kv_caches, num_q_heads=TINY.num_attention_heads, num_tokens=32)
        attn.begin_step(pad_prefill_slots(meta.slot_mapping, 32, scratch_page=runner.scratch_page, page_size=PAGE))
        gbatch = ScheduledBatch(seqs=[g_seq], num_new_tokens=[21], is_sampled=[True], num_decode_seqs=0)
        _, *extras = runner.graph_inputs(gbatch)
        ids = torch.tensor(g_seq.prompt_ids + [0] * 11)
        token, logits = runner._prefill_step(ids, torch.arange(32), attn, torch.tensor([20]), *extras)
    torch.testing.assert_close(logits, ref_logits, atol=1e-4, rtol=1e-4)
    assert token.tolist() == ref_token.tolist()
    assert torch.equal(runner.seen, eager.seen)
    pages = e_seq.pages[:2]
    for a, b in zip(runner.kv_caches, eager.kv_caches):
        torch.testing.assert_close(a[pages], b[pages], atol=1e-5, rtol=1e-5)


def test_execute_splits_mixed_step_into_decode_and_prefill_graphs() -> None:
    """Two fresh prompts packed in one (emulated) prefill replay, then decode rows, then decode
    rows plus a fresh prompt as two replays: the eager runner's tokens at every step."""
    from tests.engine.llm.graph_emulation import emulate_replays

    params = SamplingParams(temperature=0.8, top_p=0.9, repetition_penalty=1.3, seed=2)
    ref_model = _model(6)
    eager = ModelRunner(ref_model, TINY, device="cpu", dtype=torch.float32, num_pages=32, page_size=PAGE,
                        max_num_seqs=8)
    runner = CudaGraphModelRunner(copy.deepcopy(ref_model), TINY, device="cpu", dtype=torch.float32, num_pages=32,
                                  page_size=PAGE, max_num_seqs=8, capture=False, prefill_buckets=(32,),
                                  attention_backend_factory=torch_paged_attention_factory)
    runner.forward_fn = FusedLlamaForward(runner.model, compile=False)
    replays: list[str] = []
    emulate_replays(runner, num_tokens=32, record=replays)
    seqs = {name: _seqs([7, 12, 20], params) for name in ("eager", "graph")}
    for name in seqs:  # the third sequence arrives later
        seqs[name][2].slot = 2
    steps = [([0, 1], 0), ([0, 1], 2), ([0, 1, 2], 2), ([0, 1, 2], 3)]
    for rows, nd in steps:
        toks = {}
        for name, runner_ in (("eager", eager), ("graph", runner)):
            ss = [seqs[name][i] for i in rows]
            batch = ScheduledBatch(seqs=ss, num_new_tokens=[s.num_uncomputed_tokens for s in ss],
                                   is_sampled=[True] * len(ss), num_decode_seqs=nd)
            toks[name] = runner_.execute(batch).tolist()
            for s, t in zip(ss, toks[name]):
                s.num_computed_tokens = s.num_tokens
                s.output_ids.append(t)
        assert toks["graph"] == toks["eager"]
    # step 1: two prompts packed; step 2: 2 decodes; step 3: 2 decodes + a fresh prompt; step 4: 3 decodes
    assert replays == ["prefill", "decode", "decode", "prefill", "decode"]
    assert torch.equal(runner.seen, eager.seen)

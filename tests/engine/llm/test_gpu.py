"""GPU tests of the FlashInfer backend and CUDA graphs (run on a CUDA machine with flashinfer)."""

from __future__ import annotations

import pytest
import torch

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]

PAGE = 16


def _caches(num_pages: int, hkv: int, d: int, dtype: torch.dtype) -> list[torch.Tensor]:
    return [torch.randn(num_pages, 2, PAGE, hkv, d, device="cuda").to(dtype) for _ in range(2)]


def test_flashinfer_mixed_step_matches_torch_paged_attention() -> None:
    """FlashInfer decode + prefill rows of one step equal the torch reference (bf16 tolerance)."""
    pytest.importorskip("flashinfer")
    from engine.llm.attention import KVCacheSpec, TorchPagedAttention, build_attention_metadata
    from engine.llm.flashinfer_attention import FlashInferAttention
    from tests.engine.llm.test_flashinfer_attention import _mixed_batch

    hq, hkv, d = 24, 8, 128
    spec = KVCacheSpec(num_layers=2, num_pages=32, page_size=PAGE, num_qo_heads=hq, num_kv_heads=hkv,
                       head_dim=d, dtype=torch.bfloat16, device=torch.device("cuda"), max_num_seqs=8)
    ref_caches = _caches(32, hkv, d, torch.bfloat16)
    fi_caches = [c.clone() for c in ref_caches]
    meta = build_attention_metadata(_mixed_batch(), PAGE)
    t = int(meta.qo_indptr[-1])
    q, k, v = (torch.randn(t, h, d, device="cuda", dtype=torch.bfloat16) for h in (hq, hkv, hkv))
    ref_attn, fi_attn = TorchPagedAttention(spec, ref_caches), FlashInferAttention(fi_caches, num_q_heads=hq)
    ref_attn.begin_step(meta)
    fi_attn.begin_step(meta)
    for layer in (0, 1):
        torch.testing.assert_close(fi_attn(layer, q, k, v).float(), ref_attn(layer, q, k, v).float(),
                                   atol=2e-2, rtol=2e-2)
    for a, b in zip(fi_caches, ref_caches):
        torch.testing.assert_close(a, b)


@pytest.mark.parametrize("decode_attention", ["cuda-cores", "tensor-cores", "triton"])
def test_decode_graph_replay_matches_eager_and_ignores_padding(decode_attention: str) -> None:
    """A captured decode step on a padded batch gives the eager step's logits for the real rows,
    with either FlashInfer decode kernel or the runtime's Triton one in the graphs (3 query heads
    per KV head, as Orpheus; the eager step is FlashInfer's)."""
    pytest.importorskip("flashinfer")
    from engine.llm.attention import build_attention_metadata
    from engine.llm.cuda_graphs import CudaGraphModelRunner
    from engine.llm.scheduler import ScheduledBatch
    from engine.llm.sequence import SamplingParams, Sequence
    from models.orpheus.config import TINY
    from models.orpheus.llama import LlamaModel

    cfg = TINY.with_(hidden_size=256, intermediate_size=512, num_attention_heads=6, num_key_value_heads=2,
                     head_dim=128, num_hidden_layers=2)
    model = LlamaModel(cfg, max_seq_len=512).init_random_(seed=0).to("cuda", torch.bfloat16)
    model.setup_rope("cuda")
    runner = CudaGraphModelRunner(model, cfg, device="cuda", dtype=torch.bfloat16, num_pages=64,
                                  max_model_len=512, max_num_seqs=8, decode_buckets=(1, 4, 8), progress=False,
                                  decode_attention=decode_attention)
    assert all((decode_attention == "triton") if not hasattr(a, "_wrapper")
               else a._wrapper.use_tensor_cores is (decode_attention == "tensor-cores")
               for a in runner.graphs.decode_attentions())
    for c in runner.kv_caches:
        c.normal_()
    seqs = []
    for i, ctx in enumerate((40, 3, 17)):
        s = Sequence(seq_id=i, prompt_ids=list(range(100, 100 + ctx)), params=SamplingParams(), slot=i)
        s.output_ids.append(7)
        s.num_computed_tokens = ctx
        s.pages = list(range(i * 4, i * 4 + 4))
        seqs.append(s)
    batch = ScheduledBatch(seqs=seqs, num_new_tokens=[1, 1, 1], is_sampled=[True] * 3, num_decode_seqs=3)
    meta = build_attention_metadata(batch, PAGE)
    ids = torch.tensor([7, 7, 7])
    with torch.inference_mode():
        eager = runner._forward(ids, meta).clone()
        g_ids, *extras = runner.graph_inputs(batch)
        assert g_ids.tolist() == ids.tolist()
        _, graph = runner.graphs.run(g_ids, meta, *extras)
    torch.testing.assert_close(graph, eager, atol=2e-2, rtol=2e-2)
    assert torch.equal(graph.argmax(-1), eager.argmax(-1))


def test_codec_graph_matches_eager() -> None:
    """SnacDecoder.decode_windows replayed from a CUDA graph equals the eager call."""
    pytest.importorskip("snac")
    from engine.llm.cuda_graphs import BatchGraphs
    from models.orpheus.codec import SnacDecoder
    from models.orpheus.loader import load_snac

    dec = SnacDecoder(load_snac(load_format="dummy", device="cuda"))
    w = 6
    specs = [((w * m,), torch.int64) for m in (1, 2, 4)] + [((), torch.int64)] * 3
    graphs = BatchGraphs(dec.decode_windows, specs, buckets=(1, 4), device="cuda")
    graphs.capture(progress=False)
    codes = [torch.randint(0, 4096, (3, w * m), device="cuda") for m in (1, 2, 4)]
    aux = [torch.tensor([0, 5, 9], device="cuda"), torch.tensor([2, 0, 0], device="cuda"),
           torch.full((3,), w, device="cuda")]
    (graph,) = graphs.run(*codes, *aux)
    torch.testing.assert_close(graph, dec.decode_windows(*codes, *aux), atol=1e-5, rtol=1e-4)


def test_prefill_graph_matches_eager_flashinfer() -> None:
    """One fresh prompt, and three packed in one replay, give eager FlashInfer's logits."""
    pytest.importorskip("flashinfer")
    from engine.llm.attention import build_attention_metadata
    from engine.llm.cuda_graphs import CudaGraphModelRunner
    from engine.llm.scheduler import ScheduledBatch
    from engine.llm.sequence import SamplingParams, Sequence
    from models.orpheus.config import TINY
    from models.orpheus.llama import LlamaModel

    cfg = TINY.with_(hidden_size=256, intermediate_size=512, num_attention_heads=6, num_key_value_heads=2,
                     head_dim=128, num_hidden_layers=2)
    model = LlamaModel(cfg, max_seq_len=512).init_random_(seed=0).to("cuda", torch.bfloat16)
    model.setup_rope("cuda")
    runner = CudaGraphModelRunner(model, cfg, device="cuda", dtype=torch.bfloat16, num_pages=64, max_model_len=512,
                                  max_num_seqs=8, decode_buckets=(1,), prefill_buckets=(32, 64), progress=False)
    from engine.llm.prefill_graphs import pack_prefill

    seqs = []
    for i, n in enumerate((41, 7, 13)):  # alone, then three prompts packed in one replay
        seq = Sequence(seq_id=i, prompt_ids=[500 + 3 * i + j for j in range(n)], params=SamplingParams(), slot=i)
        seq.pages = [3 * i + 3, 3 * i + 4, 3 * i + 5]
        seqs.append(seq)
    for rows in (seqs[:1], seqs):
        batch = ScheduledBatch(seqs=rows, num_new_tokens=[s.num_tokens for s in rows], is_sampled=[True] * len(rows),
                               num_decode_seqs=0)
        assert runner.prefill_graphs.can_run(batch)
        meta = build_attention_metadata(batch, PAGE)
        ids, positions, seg, last = pack_prefill([s.prompt_ids for s in rows])
        with torch.inference_mode():
            eager = runner._forward(ids, meta).clone()
            _, *extras = runner.graph_inputs(batch)
            _, graph = runner.prefill_graphs.run(ids, positions, seg, meta.slot_mapping, last, *extras)
        assert graph.shape == eager.shape == (len(rows), graph.shape[1])
        torch.testing.assert_close(graph, eager, atol=5e-2, rtol=5e-2)


def test_graph_decode_fn_matches_eager_decode_requests() -> None:
    """The CUDA-graph decode_fn gives decode_requests' samples for a stream's windows."""
    pytest.importorskip("snac")
    from models.orpheus.codec_graphs import make_graph_decode_fn
    from models.orpheus.codec import SnacDecoder, StreamingDecoder, decode_requests
    from models.orpheus.loader import load_snac

    dec = SnacDecoder(load_snac(load_format="dummy", device="cuda"))
    decode_fn = make_graph_decode_fn(dec, buckets=(1, 2, 4), progress=False)
    streams = [StreamingDecoder(None) for _ in range(5)]
    gen = torch.Generator().manual_seed(0)
    for _ in range(8):
        reqs = [s.push_frame(torch.randint(0, 4096, (7,), generator=gen)) for s in streams]
        reqs = [r for r in reqs if r is not None]
        for a, b in zip(decode_fn(reqs), decode_requests(dec, reqs)):
            assert a.shape == b.shape
            assert abs(a - b).max() < 1e-4


def test_async_steps_feed_tokens_on_the_device_and_match_the_synchronous_loop() -> None:
    """The CUDA-graph runner with ``LMBackend(async_steps=True)``: decode rows take their input
    token from the previous replay's output on the device. Without stop tokens both loops run
    the same batches (every job admitted at once), so the tokens must be the same, bf16 and all."""
    pytest.importorskip("flashinfer")
    from engine.llm.backend import LMBackend
    from engine.llm.cuda_graphs import CudaGraphModelRunner
    from engine.llm.page_allocator import PageAllocator
    from engine.llm.scheduler import Scheduler, SchedulerConfig
    from models.orpheus.config import TINY
    from models.orpheus.llama import LlamaModel
    from tests.engine.llm.conftest import TokenProgram, drain

    cfg = TINY.with_(hidden_size=256, intermediate_size=512, num_attention_heads=6, num_key_value_heads=2,
                     head_dim=128, num_hidden_layers=2)
    model = LlamaModel(cfg, max_seq_len=512).init_random_(seed=0).to("cuda", torch.bfloat16)
    model.setup_rope("cuda")
    tokens = []
    # (async steps, async plan): the plan that does not wait for the step in flight must give
    # the same tokens too (it stages the page ids and reuses FlashInfer's pinned plan buffer)
    for async_steps, async_plan in ((False, False), (True, False), (True, True)):
        runner = CudaGraphModelRunner(model, cfg, device="cuda", dtype=torch.bfloat16, num_pages=256,
                                      max_model_len=512, max_num_seqs=16, decode_buckets=(1, 2, 4, 8, 16),
                                      prefill_buckets=(32, 64), progress=False, async_plan=async_plan)
        assert all(a.async_plan is async_plan for a in runner.graphs.decode_attentions())
        sched = Scheduler(SchedulerConfig(max_num_seqs=16, max_num_batched_tokens=80, max_model_len=512,
                                          max_waiting=16, max_num_prefill_seqs=4, max_num_prefill_tokens=64,
                                          whole_prompts=True),
                          PageAllocator(runner.scratch_page, PAGE))
        program = TokenProgram()
        backend = LMBackend(program, runner, sched, async_steps=async_steps)
        for i in range(12):
            prompt = " ".join(str(300 + 17 * i + k) for k in range(5 + i % 7))
            backend.add_job(i, prompt, "v", dict(tag=i, temperature=0.8, top_p=0.9, seed=i, max_tokens=6 + 5 * i))
        outs = drain(backend)
        assert not any(o.error for o in outs) and runner.num_eager_steps == 0
        tokens.append(program.tokens)
    assert tokens[0] == tokens[1] == tokens[2]


def test_mixed_graph_matches_a_decode_and_a_prefill_replay() -> None:
    """``MixedGraphs`` on the GPU: a step with 3 decode rows and 2 fresh prompts replayed as one
    graph gives the logits of the decode graph plus the prefill graph (bf16: the GEMMs run at
    another row count, so close, not equal), and the run goes on without eager steps."""
    pytest.importorskip("flashinfer")
    from engine.llm.backend import LMBackend
    from engine.llm.cuda_graphs import CudaGraphModelRunner, bucket_for
    from engine.llm.page_allocator import PageAllocator
    from engine.llm.scheduler import Scheduler, SchedulerConfig
    from models.orpheus.config import TINY
    from models.orpheus.llama import LlamaModel
    from tests.engine.llm.conftest import TokenProgram, drain

    cfg = TINY.with_(hidden_size=256, intermediate_size=512, num_attention_heads=6, num_key_value_heads=2,
                     head_dim=128, num_hidden_layers=2)
    model = LlamaModel(cfg, max_seq_len=512).init_random_(seed=0).to("cuda", torch.bfloat16)
    model.setup_rope("cuda")
    prompts = [" ".join(str(300 + 17 * i + k) for k in range(5 + i)) for i in range(5)]
    rows = {}
    for mixed in (False, True):
        runner = CudaGraphModelRunner(model, cfg, device="cuda", dtype=torch.bfloat16, num_pages=256,
                                      max_model_len=512, max_num_seqs=16, decode_buckets=(1, 2, 4, 8, 16),
                                      prefill_buckets=(32, 64), progress=False, mixed=mixed,
                                      mixed_decode_buckets=(8, 16), mixed_token_buckets=(32, 64))
        sched = Scheduler(SchedulerConfig(max_num_seqs=16, max_num_batched_tokens=80, max_model_len=512,
                                          max_waiting=16, max_num_prefill_seqs=4, max_num_prefill_tokens=64,
                                          whole_prompts=True),
                          PageAllocator(runner.scratch_page, PAGE))
        program = TokenProgram()
        backend = LMBackend(program, runner, sched)
        for i in range(3):
            backend.add_job(i, prompts[i], "v", dict(tag=i, temperature=0.0, max_tokens=12))
        for _ in range(3):
            backend.step()
        for i in (3, 4):
            backend.add_job(i, prompts[i], "v", dict(tag=i, temperature=0.0, max_tokens=12))
        backend.step()  # launches the step with 3 decode rows and 2 fresh prompts
        torch.cuda.synchronize()
        lengths = [len(program.build_prompt(prompts[i], "v", {})) for i in (3, 4)]
        if mixed:
            b = bucket_for(3, runner.mixed_graphs.decode_buckets)
            out = runner.mixed_graphs._graphs[(b, bucket_for(sum(lengths), runner.mixed_graphs.token_buckets))].outs[1]
            rows[mixed] = (out[:3].float().clone(), out[b : b + 2].float().clone())
        else:
            dec = runner.graphs._graphs[(0, bucket_for(3, runner.graphs.buckets))].outs[1]  # (variant 0: full steps)
            key = (bucket_for(sum(lengths), runner.prefill_graphs.buckets), bucket_for(2, runner.prefill_graphs.row_buckets))
            pre = runner.prefill_graphs._graphs[key].outs[1]
            rows[mixed] = (dec[:3].float().clone(), pre[:2].float().clone())
        outs = drain(backend)
        assert not any(o.error for o in outs) and runner.num_eager_steps == 0
    for got, ref in zip(rows[True], rows[False]):
        assert torch.nn.functional.cosine_similarity(got, ref, dim=-1).min() > 0.999
        assert (got - ref).abs().max() < 0.1 * ref.abs().max()

"""CPU tests of the FlashInfer backend's planning and K/V writes against a torch stand-in of its
wrappers (the real kernels: tests/engine/llm/test_gpu.py and ``benchmark.gpu.gpu_check``)."""

from __future__ import annotations

import sys
import types

import pytest
import torch
import torch.nn.functional as F

from engine.llm.attention import KVCacheSpec, TorchPagedAttention, allocate_kv_caches, build_attention_metadata
from engine.llm.cuda_graphs import pad_decode_metadata
from engine.llm.scheduler import ScheduledBatch
from engine.llm.sequence import SamplingParams, Sequence

PAGE, HQ, HKV, D = 16, 6, 2, 8


def _attend(q, cache, pages, kv_len, causal):  # noqa: ANN001
    # q [n, Hq, D] over the sequence's first kv_len cached tokens
    keys = cache[pages, 0].flatten(0, 1)[:kv_len].repeat_interleave(HQ // HKV, 1).transpose(0, 1)
    vals = cache[pages, 1].flatten(0, 1)[:kv_len].repeat_interleave(HQ // HKV, 1).transpose(0, 1)
    n = q.shape[0]
    mask = None
    if causal:
        mask = torch.arange(kv_len).unsqueeze(0) <= torch.arange(n).unsqueeze(1) + (kv_len - n)
    return F.scaled_dot_product_attention(q.transpose(0, 1), keys, vals, attn_mask=mask).transpose(0, 1)


class _FakeWrapper:
    """FlashInfer's wrappers as documented, in plain torch: a paged NHD cache, decode over whole
    sequences, prefill causal to the end of each sequence."""

    def __init__(self, workspace, layout, use_cuda_graph=False, paged_kv_indptr_buffer=None,  # noqa: ANN001
                 paged_kv_indices_buffer=None, paged_kv_last_page_len_buffer=None, use_tensor_cores=False) -> None:
        assert layout == "NHD"
        self.graph = use_cuda_graph
        self.use_tensor_cores = use_tensor_cores  # (the stand-in computes the same either way)
        self.bufs = (paged_kv_indptr_buffer, paged_kv_indices_buffer, paged_kv_last_page_len_buffer)
        self.qo = None

    def _plan(self, qo, indptr, indices, last, hq, hkv, d, ps, **kw) -> None:  # noqa: ANN001
        assert (hq, hkv, d, ps) == (HQ, HKV, D, PAGE) and kw["q_data_type"] == kw["kv_data_type"]
        assert indptr.device.type == last.device.type == "cpu"  # plan must not sync
        assert int(indptr[0]) == 0 and int(indptr[-1]) == indices.numel()
        if self.graph:
            ip, ix, lp = self.bufs
            assert last.numel() == lp.numel()
            ip.copy_(indptr), lp.copy_(last), ix[: indices.numel()].copy_(indices)
        else:
            self.bufs = (indptr.clone(), indices.clone(), last.clone())
        self.qo = qo

    def run(self, q, cache, out=None):  # noqa: ANN001
        ip, ix, lp = self.bufs
        res = torch.empty_like(q) if out is None else out
        qo = self.qo if self.qo is not None else torch.arange(lp.numel() + 1)
        for b in range(lp.numel()):
            pages = ix[int(ip[b]) : int(ip[b + 1])].long()
            kv_len = (pages.numel() - 1) * PAGE + int(lp[b])
            s, e = int(qo[b]), int(qo[b + 1])
            res[s:e] = _attend(q[s:e], cache, pages, kv_len, causal=self.qo is not None)
        return res


class _FakeDecode(_FakeWrapper):
    def plan(self, indptr, indices, last, *a, **kw) -> None:  # noqa: ANN001
        self._plan(None, indptr, indices, last, *a, **kw)


class _FakePrefill(_FakeWrapper):
    def plan(self, qo, indptr, indices, last, *a, causal=False, **kw) -> None:  # noqa: ANN001
        assert causal
        self._plan(qo, indptr, indices, last, *a, **kw)


@pytest.fixture()
def fake_flashinfer(monkeypatch):  # noqa: ANN001, ANN201
    mod = types.ModuleType("flashinfer")
    mod.BatchDecodeWithPagedKVCacheWrapper = _FakeDecode
    mod.BatchPrefillWithPagedKVCacheWrapper = _FakePrefill
    monkeypatch.setitem(sys.modules, "flashinfer", mod)
    return mod


def _spec(num_pages: int = 32) -> KVCacheSpec:
    return KVCacheSpec(num_layers=2, num_pages=num_pages, page_size=PAGE, num_qo_heads=HQ, num_kv_heads=HKV,
                       head_dim=D, dtype=torch.float32, device=torch.device("cpu"), max_num_seqs=8)


def _mixed_batch() -> ScheduledBatch:
    """Two decode rows (contexts 20 and 3) then two prefill rows (a fresh 18 and a chunk 5 after 16)."""
    p = SamplingParams()
    specs = [(20, 1, [3, 5]), (3, 1, [7]), (0, 18, [9, 10]), (16, 5, [11, 12])]
    seqs = []
    for i, (done, new, pages) in enumerate(specs):
        s = Sequence(seq_id=i, prompt_ids=list(range(done + new)), params=p, pages=pages, slot=i)
        s.num_computed_tokens = done
        seqs.append(s)
    return ScheduledBatch(seqs=seqs, num_new_tokens=[n for _, n, _ in specs], is_sampled=[True] * 4, num_decode_seqs=2)


def _two_decode_rows(seed: int) -> tuple[KVCacheSpec, list[torch.Tensor], object]:
    """Random caches and the metadata of the mixed batch's two decode rows."""
    torch.manual_seed(seed)
    spec = _spec()
    caches = allocate_kv_caches(spec)
    for c in caches:
        c.normal_()
    batch = _mixed_batch()
    batch = ScheduledBatch(seqs=batch.seqs[:2], num_new_tokens=[1, 1], is_sampled=[True] * 2, num_decode_seqs=2)
    return spec, caches, build_attention_metadata(batch, PAGE)


def _run(backend, meta, qkv, layers=(0, 1)):  # noqa: ANN001
    backend.begin_step(meta)
    return [backend(layer, *qkv) for layer in layers]


def test_mixed_step_matches_torch_paged_attention(fake_flashinfer) -> None:  # noqa: ANN001
    """Decode and prefill rows of one step give TorchPagedAttention's outputs and cache."""
    from engine.llm.flashinfer_attention import FlashInferAttention

    torch.manual_seed(0)
    spec = _spec()
    ref_caches = allocate_kv_caches(spec)
    for c in ref_caches:
        c.normal_()
    fi_caches = [c.clone() for c in ref_caches]
    meta = build_attention_metadata(_mixed_batch(), PAGE)
    t = int(meta.qo_indptr[-1])
    qkv = (torch.randn(t, HQ, D), torch.randn(t, HKV, D), torch.randn(t, HKV, D))
    ref = _run(TorchPagedAttention(spec, ref_caches), meta, qkv)
    got = _run(FlashInferAttention(fi_caches, num_q_heads=HQ, workspace_bytes=16), meta, qkv)
    for r, g in zip(ref, got):
        torch.testing.assert_close(g, r)
    for r, g in zip(ref_caches, fi_caches):
        torch.testing.assert_close(g, r)


def test_graph_attention_on_padded_batch_matches_unpadded(fake_flashinfer) -> None:  # noqa: ANN001
    """The fixed-buffer graph variant on a padded decode batch gives the real rows' outputs."""
    from engine.llm.flashinfer_attention import GraphDecodeAttention

    spec, caches, meta = _two_decode_rows(seed=1)
    qkv = (torch.randn(2, HQ, D), torch.randn(2, HKV, D), torch.randn(2, HKV, D))
    ref_caches = [c.clone() for c in caches]
    ref = _run(TorchPagedAttention(spec, ref_caches), meta, qkv)
    scratch = spec.num_pages - 1
    padded = pad_decode_metadata(meta, 4, scratch_page=scratch, page_size=PAGE)
    attn = GraphDecodeAttention(caches, num_q_heads=HQ, batch_size=4, max_num_pages=4 * 8, workspace=torch.empty(0))
    pad_qkv = tuple(torch.cat([x, torch.randn(2, *x.shape[1:])]) for x in qkv)
    got = _run(attn, padded, pad_qkv)
    for r, g in zip(ref, got):
        torch.testing.assert_close(g[:2], r)
    for r, g in zip(ref_caches, caches):  # only the scratch page differs
        torch.testing.assert_close(g[:scratch], r[:scratch])


def test_async_plan_orders_its_waits_and_gives_the_same_outputs(fake_flashinfer, monkeypatch) -> None:  # noqa: ANN001
    """``async_plan``: the page ids are staged (pinned, copied without waiting), each plan after
    the first first waits for the previous plan's event, and each plan records one; the
    attention is that of the blocking plan. (CPU: pinning and events are stand-ins here; the
    real ones run in tests/engine/llm/test_gpu.py.)"""
    from engine.llm.flashinfer_attention import GraphDecodeAttention

    log: list[str] = []

    class _Event:
        def record(self) -> None:
            log.append("record")

        def synchronize(self) -> None:
            log.append("wait")

    def pin(t: torch.Tensor) -> torch.Tensor:
        log.append("pin")
        return t.clone()

    monkeypatch.setattr(torch.cuda, "Event", _Event)
    monkeypatch.setattr(torch.Tensor, "pin_memory", pin)
    spec, caches, meta = _two_decode_rows(seed=2)
    padded = pad_decode_metadata(meta, 4, scratch_page=spec.num_pages - 1, page_size=PAGE)
    qkv = tuple(torch.randn(4, h, D) for h in (HQ, HKV, HKV))
    outs = []
    for async_plan in (False, True):
        attn = GraphDecodeAttention([c.clone() for c in caches], num_q_heads=HQ, batch_size=4, max_num_pages=32,
                                    workspace=torch.empty(0), async_plan=async_plan)
        plan = attn._wrapper.plan

        def logged_plan(*a, plan=plan, **kw):  # noqa: ANN001, ANN202
            log.append("plan")
            return plan(*a, **kw)

        attn._wrapper.plan = logged_plan
        log.clear()
        outs.append(_run(attn, padded, qkv))
        outs.append(_run(attn, padded, qkv))
        if not async_plan:
            assert log == ["plan", "plan"]  # no staging, no events
    assert log == ["pin", "plan", "record", "pin", "wait", "plan", "record"]
    for blocking, staged in zip(outs[:2], outs[2:]):
        for a, b in zip(blocking, staged):
            torch.testing.assert_close(b, a)


def test_decode_kernel_choice_reaches_the_graph_wrappers(fake_flashinfer) -> None:  # noqa: ANN001
    """``decode_attention="tensor-cores"`` reaches FlashInfer's decode wrapper of every decode
    graph (through ``CudaGraphModelRunner`` and ``DecodeGraphs``); an unknown kernel is refused
    with the choices named. (The kernels' outputs: tests/engine/llm/test_gpu.py.)"""
    from engine.llm.cuda_graphs import CudaGraphModelRunner, DecodeGraphs
    from engine.llm.flashinfer_attention import GraphDecodeAttention
    from models.orpheus.config import TINY
    from models.orpheus.llama import LlamaModel

    spec, caches, meta = _two_decode_rows(seed=3)
    for tc in (False, True):
        attn = GraphDecodeAttention(caches, num_q_heads=HQ, batch_size=4, max_num_pages=32,
                                    workspace=torch.empty(0), tensor_cores=tc)
        assert attn._wrapper.use_tensor_cores is tc and attn.tensor_cores is tc
    cfg = TINY.with_(hidden_size=48, intermediate_size=96, num_attention_heads=HQ, num_key_value_heads=HKV,
                     head_dim=D, num_hidden_layers=2)
    model = LlamaModel(cfg, max_seq_len=64).init_random_(seed=0)
    for kernel, tc in (("cuda-cores", False), ("tensor-cores", True), ("triton", False)):
        runner = CudaGraphModelRunner(model, cfg, device="cpu", dtype=torch.float32, num_pages=16, max_model_len=64,
                                      max_num_seqs=4, decode_buckets=(1, 4), prefill_buckets=(), capture=False,
                                      decode_attention=kernel)
        assert isinstance(runner.graphs, DecodeGraphs) and runner.graphs.tensor_cores is tc
        assert runner.graphs.decode_kernel == kernel
        mixed = CudaGraphModelRunner(model, cfg, device="cpu", dtype=torch.float32, num_pages=16, max_model_len=64,
                                     max_num_seqs=4, decode_buckets=(1, 4), prefill_buckets=(32,), capture=False,
                                     mixed=True, mixed_decode_buckets=(4,), decode_attention=kernel)
        assert mixed.mixed_graphs is not None and mixed.mixed_graphs.decode_tensor_cores is tc
        assert mixed.mixed_graphs.decode_kernel == kernel
    # what each kernel captures: FlashInfer's wrapper, or the runtime's Triton attention
    from engine.llm.cuda_graphs import graph_decode_attention
    from engine.llm.decode_attention_triton import GraphTritonDecodeAttention

    kw = dict(num_q_heads=HQ, batch_size=4, max_num_pages=32, workspace=torch.empty(0))
    assert graph_decode_attention("tensor-cores", caches, **kw)._wrapper.use_tensor_cores is True
    assert isinstance(graph_decode_attention("triton", caches, **kw), GraphTritonDecodeAttention)
    with pytest.raises(ValueError, match="cuda-cores, tensor-cores, triton"):
        graph_decode_attention("tpu", caches, **kw)
    with pytest.raises(ValueError, match="cuda-cores, tensor-cores"):
        CudaGraphModelRunner(model, cfg, device="cpu", dtype=torch.float32, num_pages=16, max_model_len=64,
                             max_num_seqs=4, prefill_buckets=(), capture=False, decode_attention="tpu")


def test_set_async_plan_reaches_every_captured_decode_attention(fake_flashinfer) -> None:  # noqa: ANN001
    """``CudaGraphModelRunner.set_async_plan`` switches the plans of the decode graphs and of the
    mixed graphs' decode rows (graphs stood in for: capture needs CUDA)."""
    from types import SimpleNamespace

    from engine.llm.cuda_graphs import CudaGraphModelRunner
    from engine.llm.mixed_graphs import MixedAttention
    from models.orpheus.config import TINY
    from models.orpheus.llama import LlamaModel

    cfg = TINY.with_(hidden_size=48, intermediate_size=96, num_attention_heads=HQ, num_key_value_heads=HKV,
                     head_dim=D, num_hidden_layers=2)
    model = LlamaModel(cfg, max_seq_len=64).init_random_(seed=0)
    runner = CudaGraphModelRunner(model, cfg, device="cpu", dtype=torch.float32, num_pages=16, max_model_len=64,
                                  max_num_seqs=4, decode_buckets=(1, 4), prefill_buckets=(32,), capture=False,
                                  mixed=True, mixed_decode_buckets=(4,), async_plan=True)
    plain, mixed_dec = (SimpleNamespace(async_plan=True) for _ in range(2))
    runner.graphs._graphs = {4: SimpleNamespace(attn=plain)}
    runner.mixed_graphs._graphs = {(4, 32): SimpleNamespace(attn=MixedAttention(mixed_dec, None, 4))}
    assert runner.graphs.decode_attentions() == [plain] and runner.mixed_graphs.decode_attentions() == [mixed_dec]
    runner.set_async_plan(False)
    assert runner.async_plan is False and plain.async_plan is False and mixed_dec.async_plan is False
    runner.set_async_plan(True)
    assert plain.async_plan is True and mixed_dec.async_plan is True

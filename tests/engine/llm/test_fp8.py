"""fp8 option: quantisation, fp8 linears, the fp8 KV cache and the option's validation, against
float references with bounds from e4m3's precision (GPU-marked tests at the end)."""

from __future__ import annotations

import copy
import sys
import types

import pytest
import torch

from engine.llm.attention import (
    KVCacheSpec,
    TorchPagedAttention,
    allocate_kv_caches,
    build_attention_metadata,
    write_kv,
)
from engine.llm.fp8 import (
    FP8_DTYPE,
    FP8_MAX,
    Fp8Linear,
    dequantise,
    fp8_gemm,
    fp8_linear,
    fp8_linear_reference,
    parse_kv_cache_dtype,
    quantise_decoder_linears_,
    quantise_rowwise,
    quantise_weight,
    resolve_fp8_options,
    to_fp8_saturated,
)
from models.orpheus.fused_forward import FusedLlamaForward
from engine.llm.model_runner import ModelRunner, kv_bytes_per_page
from engine.llm.scheduler import ScheduledBatch
from engine.llm.sequence import SamplingParams, Sequence
from models.orpheus.config import ORPHEUS_3B, TINY
from models.orpheus.llama import LlamaModel

HALF_ULP = 2.0**-4  # e4m3: 3 mantissa bits, round to nearest -> relative error <= 2^-4 (normal range)
SUBNORMAL_ABS = 2.0**-10  # half the subnormal spacing 2^-9, in units of the scale
PAGE = 4


def _bound(x: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """Largest rounding error of one e4m3 quantisation of ``x`` with ``scale`` (broadcastable)."""
    return x.abs() * HALF_ULP + scale * SUBNORMAL_ABS


# -- quantisation ---------------------------------------------------------------------------------


def test_quantise_weight_round_trip_within_half_ulp() -> None:
    """Dequantised weights differ from the originals by at most e4m3's half ulp per element."""
    torch.manual_seed(0)
    w = torch.randn(48, 64) * torch.logspace(-3, 1, 48).unsqueeze(1)  # rows of very different size
    w8, scale = quantise_weight(w)
    assert w8.dtype == FP8_DTYPE and scale.shape == (48,) and scale.dtype == torch.float32
    err = (dequantise(w8, scale) - w).abs()
    assert (err <= _bound(w, scale.unsqueeze(1)) * 1.0001).all()
    # each row's largest magnitude lands on the top of the fp8 range
    torch.testing.assert_close(w8.float().abs().amax(dim=1), torch.full((48,), FP8_MAX))


def test_quantise_rowwise_handles_zero_rows_and_bf16() -> None:
    """An all-zero row quantises to zeros (no NaN); bf16 input gives float32 scales [M, 1]."""
    x = torch.randn(3, 32, dtype=torch.bfloat16)
    x[1] = 0
    x8, s = quantise_rowwise(x)
    assert s.shape == (3, 1) and s.dtype == torch.float32
    assert torch.isfinite(dequantise(x8, s)).all() and (dequantise(x8, s)[1] == 0).all()


def test_to_fp8_saturated_clamps_instead_of_overflowing() -> None:
    """Values beyond +-448 become +-448, not NaN or inf."""
    y = to_fp8_saturated(torch.tensor([1000.0, -1e6, 3.0, 0.0])).float()
    assert y.tolist() == [448.0, -448.0, 3.0, 0.0]


def test_fp8_linear_reference_within_fp8_bound_of_float_matmul() -> None:
    """fp8_linear (reference path) vs the float32 matmul: every output within the propagated
    per-element bound (x and w each off by <= half an ulp), and ~2% in norm."""
    torch.manual_seed(1)
    x, w = torch.randn(2, 5, 64), torch.randn(32, 64) * 0.05
    w8, ws = quantise_weight(w)
    y = fp8_linear_reference(x, w8, ws)
    ref = x @ w.t()
    assert y.shape == (2, 5, 32) and y.dtype == x.dtype
    # |x'w' - xw| <= |x||w| ((1+e)^2 - 1) + subnormal terms, e = 2^-4
    bound = (x.abs() @ w.abs().t()) * (2 * HALF_ULP + HALF_ULP**2) + 1e-3
    assert ((y - ref).abs() <= bound).all()
    assert float((y - ref).norm() / ref.norm()) < 0.05


def test_fp8_gemm_reference_is_the_dequantised_product() -> None:
    """fp8_gemm's reference path equals (x8*sx) @ (w8*sw).T computed in float64."""
    torch.manual_seed(2)
    x8, xs = quantise_rowwise(torch.randn(7, 32))
    w8, ws = quantise_weight(torch.randn(16, 32))
    got = fp8_gemm(x8, xs, w8, ws, out_dtype=torch.float32, use_scaled_mm=False)
    want = (x8.double() * xs.double()) @ (w8.double() * ws.double().unsqueeze(1)).t()
    torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-5)


def _scaled_mm_works_on_cpu() -> bool:
    try:
        a = torch.zeros(16, 16, dtype=FP8_DTYPE)
        torch._scaled_mm(a, a.t(), scale_a=torch.ones(16, 1), scale_b=torch.ones(1, 16), out_dtype=torch.bfloat16)
        return True
    except Exception:  # noqa: BLE001  (not implemented on this build)
        return False


@pytest.mark.skipif(not _scaled_mm_works_on_cpu(), reason="torch._scaled_mm has no CPU kernel in this build")
def test_scaled_mm_cpu_matches_reference() -> None:
    """torch._scaled_mm with row-wise scales on the CPU equals the dequantised reference (bf16 out)."""
    torch.manual_seed(3)
    x, w = torch.randn(9, 64, dtype=torch.bfloat16), torch.randn(48, 64) * 0.02
    w8, ws = quantise_weight(w)
    got = fp8_linear(x, w8, ws, use_scaled_mm=True)
    want = fp8_linear_reference(x, w8, ws)
    assert got.dtype == torch.bfloat16
    torch.testing.assert_close(got.float(), want.float(), rtol=1e-2, atol=1e-3)


# -- fp8 linears in the model --------------------------------------------------------------------


def _model(seed: int = 0) -> LlamaModel:
    return LlamaModel(TINY, max_seq_len=256).init_random_(seed=seed).eval()


def _prefill_batch(lengths: list[int], num_pages_each: int = 8) -> tuple[ScheduledBatch, torch.Tensor]:
    seqs = []
    for i, n in enumerate(lengths):
        s = Sequence(seq_id=i, prompt_ids=[(31 * i + 7 * j) % 5000 for j in range(n)], params=SamplingParams(),
                     slot=i, pages=list(range(i * num_pages_each, (i + 1) * num_pages_each)))
        seqs.append(s)
    batch = ScheduledBatch(seqs=seqs, num_new_tokens=list(lengths), is_sampled=[True] * len(seqs), num_decode_seqs=0)
    ids = torch.tensor([t for s in seqs for t in s.prompt_ids])
    return batch, ids


def _spec(dtype: torch.dtype = torch.float32, cache_dtype: torch.dtype | None = None, num_pages: int = 32,
          cfg=TINY) -> KVCacheSpec:  # noqa: ANN001
    return KVCacheSpec(num_layers=cfg.num_hidden_layers, num_pages=num_pages, page_size=PAGE,
                       num_qo_heads=cfg.num_attention_heads, num_kv_heads=cfg.num_key_value_heads,
                       head_dim=cfg.head_dim, dtype=dtype, device=torch.device("cpu"), max_num_seqs=8,
                       cache_dtype=cache_dtype)


def _hidden(fwd, batch: ScheduledBatch, ids: torch.Tensor) -> torch.Tensor:  # noqa: ANN001
    meta = build_attention_metadata(batch, PAGE)
    attn = TorchPagedAttention(_spec(), allocate_kv_caches(_spec()))
    attn.begin_step(meta)
    with torch.no_grad():
        return fwd(ids, meta.positions, attn)


def test_quantised_model_forward_close_to_float_model() -> None:
    """The model with fp8 decoder linears stays within a few % of the fp32 model's hidden states."""
    ref, model = _model(), quantise_decoder_linears_(_model())
    batch, ids = _prefill_batch([9, 17])
    h_ref, h = _hidden(ref, batch, ids), _hidden(model, batch, ids)
    assert float((h - h_ref).norm() / h_ref.norm()) < 0.05


def test_quantise_replaces_every_decoder_linear_and_keeps_embedding() -> None:
    """All seven projections of each layer become Fp8Linear; embedding and head are untouched."""
    model = _model()
    emb = model.model.embed_tokens.weight.clone()
    quantise_decoder_linears_(model)
    for layer in model.model.layers:
        for m in (layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj, layer.self_attn.o_proj,
                  layer.mlp.gate_proj, layer.mlp.up_proj, layer.mlp.down_proj):
            assert isinstance(m, Fp8Linear) and m.weight.dtype == FP8_DTYPE
    assert not any(isinstance(m, torch.nn.Linear) for m in model.model.layers.modules())
    assert torch.equal(model.model.embed_tokens.weight, emb) and model.quantization == "fp8"


def _layer_bytes(model: LlamaModel) -> int:
    tensors = list(model.model.layers.parameters()) + list(model.model.layers.buffers())
    return sum(t.numel() * t.element_size() for t in tensors)


def test_quantised_layers_take_a_quarter_of_fp32_memory() -> None:
    """fp8 weights + fp32 per-row scales: the decoder layers shrink ~4x from fp32 (~2x from bf16)."""
    model = _model()
    before = _layer_bytes(model)
    quantise_decoder_linears_(model)
    assert _layer_bytes(model) < before / 3.5


@pytest.mark.parametrize("compiled", [False, True])
def test_fused_forward_on_fp8_model_equals_its_own_forward(compiled: bool) -> None:
    """FusedLlamaForward over fp8 linears (fused fp8 QKV / gate-up, quantisation fused into the
    norms; eager and torch.compiled) gives the quantised model's own forward, and the modules'
    fp8 weights become views into the fused ones (no copy)."""
    model = quantise_decoder_linears_(_model())
    own = copy.deepcopy(model)
    fused = FusedLlamaForward(model, compile=compiled)
    assert fused.is_fp8
    qkv = fused.layers[0][1]
    q_proj = model.model.layers[0].self_attn.q_proj
    assert q_proj.weight.untyped_storage().data_ptr() == qkv.weight.untyped_storage().data_ptr()
    batch, ids = _prefill_batch([6, 13])
    torch.testing.assert_close(_hidden(fused, batch, ids), _hidden(own, batch, ids), rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(_hidden(model, batch, ids), _hidden(own, batch, ids), rtol=1e-4, atol=1e-4)


def test_quantising_drops_a_stale_fused_forward() -> None:
    """A fused forward built before quantisation is dropped; for_model then builds an fp8 one."""
    model = _model()
    assert not FusedLlamaForward.for_model(model, compile=False).is_fp8
    quantise_decoder_linears_(model)
    assert FusedLlamaForward.for_model(model, compile=False).is_fp8


# -- fp8 KV cache ---------------------------------------------------------------------------------


def test_kv_bytes_per_page_halves_with_fp8() -> None:
    """An fp8 page takes half a bf16 page's bytes (Orpheus-3B: 28 layers x 2 x 16 x 8 x 128)."""
    bf16 = kv_bytes_per_page(ORPHEUS_3B, 16, torch.bfloat16)
    assert bf16 == 28 * 2 * 16 * 8 * 128 * 2
    assert kv_bytes_per_page(ORPHEUS_3B, 16, parse_kv_cache_dtype("fp8", torch.bfloat16)) * 2 == bf16


def test_allocate_kv_caches_uses_the_cache_dtype() -> None:
    """KVCacheSpec.cache_dtype picks the pages' dtype; the model dtype stays the spec's dtype."""
    spec = _spec(torch.bfloat16, FP8_DTYPE)
    assert spec.kv_dtype == FP8_DTYPE and spec.dtype == torch.bfloat16
    assert all(c.dtype == FP8_DTYPE for c in allocate_kv_caches(spec))
    assert _spec(torch.bfloat16).kv_dtype == torch.bfloat16


def test_write_kv_to_fp8_cache_saturates_and_rounds_like_a_cast() -> None:
    """K/V written to an fp8 cache read back as the saturated fp8 cast of the input."""
    cache = allocate_kv_caches(_spec(cache_dtype=FP8_DTYPE, num_pages=4))[0]  # [4, 2, 4, Hkv, D]
    hkv, d = TINY.num_key_value_heads, TINY.head_dim
    k, v = torch.randn(3, hkv, d), torch.randn(3, hkv, d)
    k[0, 0, 0], v[1, 1, 1] = 1000.0, -700.0
    page, offset = torch.tensor([2, 2, 0]), torch.tensor([0, 3, 1])
    write_kv(cache, page, offset, k, v)
    torch.testing.assert_close(cache[page, 0, offset].float(), to_fp8_saturated(k).float(), rtol=0, atol=0)
    torch.testing.assert_close(cache[page, 1, offset].float(), to_fp8_saturated(v).float(), rtol=0, atol=0)
    assert float(cache[2, 0, 0, 0, 0].float()) == 448.0


def _attend_steps(spec: KVCacheSpec, q_dtype: torch.dtype) -> list[torch.Tensor]:
    """Prefill two sequences, then three decode steps; the attention outputs of every step."""
    torch.manual_seed(4)
    attn = TorchPagedAttention(spec, allocate_kv_caches(spec))
    batch, _ = _prefill_batch([11, 5])
    outs = []
    hq, hkv, d = spec.num_qo_heads, spec.num_kv_heads, spec.head_dim
    for step in range(4):
        meta = build_attention_metadata(batch, PAGE)
        t = int(meta.qo_indptr[-1])
        q, k, v = (torch.randn(t, h, d).to(q_dtype) for h in (hq, hkv, hkv))
        attn.begin_step(meta)
        outs.append(attn(0, q, k, v).float())
        for s, n in zip(batch.seqs, batch.num_new_tokens):
            s.num_computed_tokens += n
            s.output_ids.append(1)
        batch = ScheduledBatch(seqs=batch.seqs, num_new_tokens=[1, 1], is_sampled=[True, True], num_decode_seqs=2)
    return outs


def test_fp8_kv_cache_attention_close_to_fp32_attention() -> None:
    """Paged attention over an fp8 cache (bf16 queries, upcast reads) stays within a few % of
    fp32 attention, over prefill and decode steps."""
    ref = _attend_steps(_spec(torch.float32), torch.float32)
    got = _attend_steps(_spec(torch.bfloat16, FP8_DTYPE), torch.bfloat16)
    for r, g in zip(ref, got):
        assert float((g - r).norm() / r.norm()) < 0.05
        assert float((g - r).abs().max()) < 0.25


def test_runner_with_fp8_kv_cache_close_to_fp32_runner() -> None:
    """ModelRunner(kv_cache_dtype=fp8) over prefill + decode: logits within a few % of fp32."""
    model = _model(3)
    runners = [ModelRunner(model, TINY, device="cpu", dtype=torch.float32, num_pages=32, page_size=PAGE,
                           kv_cache_dtype=kv) for kv in (None, FP8_DTYPE)]
    assert runners[1].kv_caches[0].dtype == FP8_DTYPE
    batch, ids = _prefill_batch([10, 3], num_pages_each=8)
    for step in range(3):
        meta = build_attention_metadata(batch, PAGE)
        with torch.no_grad():
            ref, got = (r._forward(ids, meta) for r in runners)
        assert float((got - ref).norm() / ref.norm()) < 0.05
        tokens = ref.argmax(-1).tolist()
        for s, n, t in zip(batch.seqs, batch.num_new_tokens, tokens):
            s.num_computed_tokens += n
            s.output_ids.append(t)
        batch = ScheduledBatch(seqs=batch.seqs, num_new_tokens=[1, 1], is_sampled=[True, True], num_decode_seqs=2)
        ids = torch.tensor(tokens)


# -- FlashInfer backend planning over fp8 pages (CPU stand-in) ----------------------------------


def _fp8_fake_flashinfer(monkeypatch, plans: list[dict]) -> None:  # noqa: ANN001
    """The CPU stand-in of tests/engine/llm/test_flashinfer_attention.py, accepting fp8 pages:
    it records the planned dtypes and attends over an upcast copy of the cache."""
    from tests.engine.llm import test_flashinfer_attention as t

    def make(base):  # noqa: ANN001, ANN202
        class Fp8Fake(base):
            def _plan(self, qo, indptr, indices, last, hq, hkv, d, ps, **kw):  # noqa: ANN001, ANN202
                plans.append(kw)
                if self.graph:
                    ip, ix, lp = self.bufs
                    ip.copy_(indptr), lp.copy_(last), ix[: indices.numel()].copy_(indices)
                else:
                    self.bufs = (indptr.clone(), indices.clone(), last.clone())
                self.qo = qo

            def run(self, q, cache, out=None):  # noqa: ANN001, ANN202
                assert cache.dtype == plans[-1]["kv_data_type"] and q.dtype == plans[-1]["q_data_type"]
                return super().run(q, cache.to(q.dtype), out=out)

        return Fp8Fake

    mod = types.ModuleType("flashinfer")
    mod.BatchDecodeWithPagedKVCacheWrapper = make(t._FakeDecode)
    mod.BatchPrefillWithPagedKVCacheWrapper = make(t._FakePrefill)
    monkeypatch.setitem(sys.modules, "flashinfer", mod)


def test_flashinfer_backend_plans_bf16_queries_over_fp8_pages(monkeypatch) -> None:  # noqa: ANN001
    """FlashInferAttention over fp8 caches plans q bf16 / kv fp8, writes saturated fp8 K/V and
    matches TorchPagedAttention on the same fp8 cache (mixed decode + prefill step)."""
    from engine.llm.flashinfer_attention import FlashInferAttention
    from tests.engine.llm.test_flashinfer_attention import HKV, HQ, PAGE as FPAGE, D, _mixed_batch

    plans: list[dict] = []
    _fp8_fake_flashinfer(monkeypatch, plans)
    spec = KVCacheSpec(num_layers=2, num_pages=32, page_size=FPAGE, num_qo_heads=HQ, num_kv_heads=HKV, head_dim=D,
                       dtype=torch.bfloat16, device=torch.device("cpu"), max_num_seqs=8, cache_dtype=FP8_DTYPE)
    torch.manual_seed(5)
    ref_caches = allocate_kv_caches(spec)
    for c in ref_caches:
        c.copy_(torch.randn(c.shape))
    fi_caches = [c.clone() for c in ref_caches]
    meta = build_attention_metadata(_mixed_batch(), FPAGE)
    t = int(meta.qo_indptr[-1])
    q, k, v = (torch.randn(t, h, D, dtype=torch.bfloat16) for h in (HQ, HKV, HKV))
    ref, fi = TorchPagedAttention(spec, ref_caches), FlashInferAttention(fi_caches, num_q_heads=HQ)
    ref.begin_step(meta)
    fi.begin_step(meta)
    assert {(p["q_data_type"], p["kv_data_type"]) for p in plans} == {(torch.bfloat16, FP8_DTYPE)}
    for layer in (0, 1):
        out = fi(layer, q, k, v)
        assert out.dtype == torch.bfloat16
        torch.testing.assert_close(out.float(), ref(layer, q, k, v).float(), rtol=2e-2, atol=2e-2)
    for a, b in zip(fi_caches, ref_caches):
        assert torch.equal(a.view(torch.uint8), b.view(torch.uint8))


# -- validation ------------------------------------------------------------------------------------


def test_parse_kv_cache_dtype() -> None:
    """'auto' keeps the model dtype, 'fp8' is e4m3, anything else is a ValueError."""
    assert parse_kv_cache_dtype("auto", torch.bfloat16) == torch.bfloat16
    assert parse_kv_cache_dtype("fp8", torch.bfloat16) == FP8_DTYPE
    with pytest.raises(ValueError, match="kv_cache_dtype"):
        parse_kv_cache_dtype("int8", torch.bfloat16)


def test_resolve_fp8_options_off_is_a_no_op_and_cpu_is_refused() -> None:
    """Defaults pass anywhere; either fp8 option on the CPU fails with a clear ValueError."""
    assert resolve_fp8_options("auto", "none", device="cpu", dtype=torch.float32) == (torch.float32, False)
    assert resolve_fp8_options(None, None, device="cpu", dtype=torch.float32) == (torch.float32, False)
    for kv, quant in (("fp8", "none"), ("auto", "fp8")):
        with pytest.raises(ValueError, match="CUDA"):
            resolve_fp8_options(kv, quant, device="cpu", dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="quantization"):
        resolve_fp8_options("auto", "int4", device="cpu", dtype=torch.bfloat16)


@pytest.mark.parametrize("kw, match", [
    (dict(kv_cache_dtype="int8"), "kv_cache_dtype"),
    (dict(quantization="awq"), "quantization"),
    (dict(kv_cache_dtype="fp8", device="cpu"), "CUDA"),
    (dict(quantization="fp8", device="cpu"), "CUDA"),
    (dict(quantization="fp8", dtype="float32"), "bfloat16"),
    (dict(kv_cache_dtype="fp8", dtype="float16"), "bfloat16"),
])
def test_engine_config_rejects_bad_fp8_options(kw: dict, match: str) -> None:
    """EngineConfig validates kv_cache_dtype / quantization with a ValueError naming the problem."""
    from engine.config import EngineConfig

    with pytest.raises(ValueError, match=match):
        EngineConfig(model="orpheus", **kw)


def test_engine_config_accepts_fp8_options_and_defaults_off() -> None:
    """Both options default off; fp8 with device auto/cuda and dtype auto/bf16 is accepted."""
    from engine.config import EngineConfig

    assert (EngineConfig().kv_cache_dtype, EngineConfig().quantization) == ("auto", "none")
    cfg = EngineConfig(model="orpheus", device="cuda", dtype="bfloat16", kv_cache_dtype="fp8", quantization="fp8")
    assert (cfg.kv_cache_dtype, cfg.quantization) == ("fp8", "fp8")


def test_cli_maps_fp8_flags_and_rejects_cpu() -> None:
    """voxgate serve --kv-cache-dtype/--quantization reach EngineConfig; with --device cpu they fail."""
    from gateway.cli import build_parser, configs_from_args

    parser = build_parser()
    _, eng = configs_from_args(parser.parse_args(["serve", "--model", "orpheus", "--kv-cache-dtype", "fp8",
                                                  "--quantization", "fp8"]))
    assert (eng.kv_cache_dtype, eng.quantization) == ("fp8", "fp8")
    with pytest.raises(ValueError, match="CUDA"):
        configs_from_args(parser.parse_args(["serve", "--device", "cpu", "--quantization", "fp8"]))
    with pytest.raises(SystemExit):
        parser.parse_args(["serve", "--kv-cache-dtype", "int8"])


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU refusal")
def test_build_orpheus_backend_refuses_fp8_on_cpu_before_loading() -> None:
    """build_orpheus_backend with an fp8 option on the CPU fails at start-up with a ValueError."""
    from models.orpheus.build import build_orpheus_backend

    for kw in (dict(kv_cache_dtype="fp8"), dict(quantization="fp8")):
        with pytest.raises(ValueError, match="CUDA"):
            build_orpheus_backend("tiny", device="cpu", load_format="dummy", warmup=False, **kw)


# -- GPU ------------------------------------------------------------------------------------------

@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_scaled_mm_gpu_matches_reference() -> None:
    """torch._scaled_mm (row-wise, bf16 out) on the GPU equals the dequantised reference, at
    Orpheus-3B's GEMM shapes and odd token counts."""
    if torch.cuda.get_device_capability() < (8, 9):
        pytest.skip("fp8 GEMMs need compute capability >= 8.9")
    torch.manual_seed(6)
    for m, n, k in ((1, 5120, 3072), (37, 3072, 3072), (256, 16384, 3072), (130, 3072, 8192)):
        x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        w8, ws = quantise_weight(torch.randn(n, k, device="cuda") * 0.02)
        got = fp8_linear(x, w8, ws, use_scaled_mm=True)
        want = fp8_linear_reference(x, w8, ws)
        assert got.dtype == torch.bfloat16 and got.shape == (m, n)
        assert float((got.float() - want.float()).norm() / want.float().norm()) < 1e-2


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_flashinfer_fp8_kv_matches_torch_paged_attention_gpu() -> None:
    """Real FlashInfer decode + prefill over fp8 pages equals TorchPagedAttention on the same pages."""
    pytest.importorskip("flashinfer")
    from engine.llm.flashinfer_attention import FlashInferAttention
    from tests.engine.llm.test_flashinfer_attention import _mixed_batch

    hq, hkv, d, page = 24, 8, 128, 16
    spec = KVCacheSpec(num_layers=2, num_pages=32, page_size=page, num_qo_heads=hq, num_kv_heads=hkv, head_dim=d,
                       dtype=torch.bfloat16, device=torch.device("cuda"), max_num_seqs=8, cache_dtype=FP8_DTYPE)
    ref_caches = allocate_kv_caches(spec)
    for c in ref_caches:
        c.copy_(torch.randn(c.shape, device="cuda"))
    fi_caches = [c.clone() for c in ref_caches]
    meta = build_attention_metadata(_mixed_batch(), page)
    t = int(meta.qo_indptr[-1])
    q, k, v = (torch.randn(t, h, d, device="cuda", dtype=torch.bfloat16) for h in (hq, hkv, hkv))
    ref, fi = TorchPagedAttention(spec, ref_caches), FlashInferAttention(fi_caches, num_q_heads=hq)
    ref.begin_step(meta)
    fi.begin_step(meta)
    for layer in (0, 1):
        torch.testing.assert_close(fi(layer, q, k, v).float(), ref(layer, q, k, v).float(), atol=3e-2, rtol=3e-2)

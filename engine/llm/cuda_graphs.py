"""CUDA graphs for decode steps (``DecodeGraphs``) and for batched functions such as a codec
(``BatchGraphs``), captured at batch-size buckets at start-up; padding rows write a scratch page.

Outputs of ``run`` are views of the graph's static buffers: consume or copy them before the next
replay of the same bucket.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Sequence
from typing import Any

import torch

from engine.llm.attention import AttentionMetadata, KVCacheSpec, build_attention_metadata
from engine.llm.host_copy import start_host_copy
from engine.llm.kernels import check_kernel
from engine.llm.model_runner import LaunchedStep, ModelRunner, _feed_column, host_input_ids
from engine.llm.token_head import RowInputs

__all__ = [
    "DEFAULT_DECODE_BUCKETS",
    "decode_buckets_up_to",
    "DEFAULT_CODEC_BUCKETS",
    "STREAM_CODEC_BUCKETS",
    "bucket_for",
    "pad_decode_metadata",
    "DecodeGraphs",
    "BatchGraphs",
    "CudaGraphModelRunner",
    "flashinfer_attention_factory",
]

# Steps of 32 rows above 64: a step is padded to its bucket, and at 300-500 rows a power-of-two
# bucket would waste up to a third of the GPU's work on padding rows.
DEFAULT_DECODE_BUCKETS: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 48, 64, *range(96, 513, 32))


def decode_buckets_up_to(limit: int) -> tuple[int, ...]:
    """``DEFAULT_DECODE_BUCKETS``, then every 64 rows above 512 up to ``limit`` (a step's most
    decode rows: the decode cap, or every slot without one)."""
    return (*DEFAULT_DECODE_BUCKETS, *range(576, -(-limit // 64) * 64 + 1, 64))
DEFAULT_CODEC_BUCKETS: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64, 128, 256)
# The stateful codec's batches: every stream that completed a frame this step, about one in
# seven of the running streams (73 at 512 streams). Its compiled step costs about linearly in
# rows (1.14 / 2.11 ms at 64 / 128 rows, bf16, H200), so a power-of-two bucket would spend up
# to half a call on padding rows; these keep padding under 8 rows up to 128, 16 up to 256.
STREAM_CODEC_BUCKETS: tuple[int, ...] = (1, 2, 4, *range(8, 129, 8), *range(144, 257, 16), *range(288, 513, 32))

TensorSpec = tuple[tuple[int, ...], torch.dtype]  # trailing shape (after the batch dim), dtype


def bucket_for(n: int, buckets: Sequence[int]) -> int | None:
    """The smallest bucket that holds ``n`` rows, or None when ``n`` exceeds the largest."""
    if n < 1:
        raise ValueError(f"batch size must be >= 1, got {n}")
    for b in sorted(buckets):
        if b >= n:
            return b
    return None


def pad_decode_metadata(meta: Any, batch_size: int, *, scratch_page: int, page_size: int) -> Any:
    """Pad a decode-only ``AttentionMetadata`` to ``batch_size`` rows.

    Each padding row is a one-token sequence living in ``scratch_page``: it writes its K/V
    there and attends to that one token only, so it never touches a real sequence's pages.
    Returns a new metadata object (same class, via ``dataclasses.replace``), tensors on the CPU.
    """
    n = int(meta.kv_last_page_len.numel())
    if int(meta.num_decode_seqs) != n:
        raise ValueError("only decode-only steps can be padded for a CUDA graph")
    if batch_size < n:
        raise ValueError(f"cannot pad {n} rows down to {batch_size}")
    pad = batch_size - n
    cpu = torch.device("cpu")
    kv_indptr = meta.kv_indptr.to(cpu, torch.int32)
    last = int(kv_indptr[-1])
    i32 = dict(dtype=torch.int32)
    return dataclasses.replace(
        meta,
        qo_indptr=torch.arange(batch_size + 1, **i32),
        kv_indptr=torch.cat([kv_indptr, last + torch.arange(1, pad + 1, **i32)]),
        kv_indices=torch.cat([meta.kv_indices.to(cpu, torch.int32), torch.full((pad,), scratch_page, **i32)]),
        kv_last_page_len=torch.cat([meta.kv_last_page_len.to(cpu, torch.int32), torch.ones(pad, **i32)]),
        slot_mapping=torch.cat(
            [meta.slot_mapping.to(cpu, torch.int64), torch.full((pad,), scratch_page * page_size, dtype=torch.int64)]
        ),
        positions=torch.cat([meta.positions.to(cpu, torch.int64), torch.zeros(pad, dtype=torch.int64)]),
        num_decode_seqs=batch_size,
    )


def _progress(items: Sequence[int], desc: str, enabled: bool):
    if not enabled:
        return items
    from tqdm import tqdm

    return tqdm(items, desc=desc, unit="graph")


def _as_tuple(out: Any) -> tuple[torch.Tensor, ...]:
    return out if isinstance(out, tuple) else (out,)


def capture_step(step_fn: Callable[..., Any], args: Sequence[Any], *, pool: Any, device: torch.device,
                 stream: torch.cuda.Stream | None = None) -> tuple[torch.cuda.CUDAGraph, tuple[torch.Tensor, ...]]:
    """Run ``step_fn(*args)`` once eagerly (warm-up: lazy init and autotuning stay out of the
    graph), then capture it into a graph in ``pool`` (on ``stream``, None: PyTorch's default
    capture stream); returns the graph and its static outputs."""
    with torch.inference_mode():
        step_fn(*args)
        torch.cuda.synchronize(device)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g, pool=pool, stream=stream):
            outs = _as_tuple(step_fn(*args))
    return g, outs


class BatchGraphs:
    """``fn(*inputs) -> Tensor | tuple[Tensor, ...]`` captured per batch bucket.

    ``input_specs`` give each input's trailing shape and dtype; rows beyond ``n`` are zeros.
    """

    def __init__(
        self,
        fn: Callable[..., Any],
        input_specs: Sequence[TensorSpec],
        *,
        buckets: Sequence[int] = DEFAULT_CODEC_BUCKETS,
        device: torch.device | str = "cuda",
    ) -> None:
        if not buckets:
            raise ValueError("no buckets")
        self.fn = fn
        self.input_specs = list(input_specs)
        self.buckets = tuple(sorted(set(buckets)))
        self.device = torch.device(device)
        self._graphs: dict[int, tuple[torch.cuda.CUDAGraph, list[torch.Tensor], tuple[torch.Tensor, ...]]] = {}
        self.capture_stream: torch.cuda.Stream | None = None  # set by capture
        self.rows_run = 0  # rows given to ``run`` since start
        self.rows_replayed = 0  # rows the replays computed (the buckets: rows_run + padding)

    @property
    def max_batch_size(self) -> int:
        return self.buckets[-1]

    def capture(self, *, progress: bool = True, desc: str = "codec graphs") -> None:
        """Capture every bucket (largest first, so the smaller ones reuse its memory pool).

        On a capture stream of their own: PyTorch keys cuBLAS workspaces by the capture
        stream, so graphs captured on its default capture stream all embed the same workspace
        address. These graphs replay on the codec's CUDA stream while the LM's graphs (captured
        on the default capture stream) run on another, so a shared workspace would be written by
        two GEMMs at once: the likely cause of engine steps that kept the GPU at 100% SM and 0%
        memory traffic for 40-115 s on the H200 (docs/performance_history.md).
        """
        pool = torch.cuda.graph_pool_handle()
        self.capture_stream = torch.cuda.Stream(self.device)
        for b in _progress(sorted(self.buckets, reverse=True), desc, progress):
            inputs = [torch.zeros((b, *shape), dtype=dt, device=self.device) for shape, dt in self.input_specs]
            g, outs = capture_step(self.fn, inputs, pool=pool, device=self.device, stream=self.capture_stream)
            self._graphs[b] = (g, inputs, outs)
        torch.cuda.synchronize(self.device)

    def run(self, *inputs: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """Replay the smallest bucket holding ``inputs``' rows; outputs sliced to those rows."""
        n = inputs[0].shape[0]
        b = bucket_for(n, self.buckets)
        if b is None or b not in self._graphs:
            raise ValueError(f"no captured graph for batch {n} (buckets {self.buckets})")
        g, static_in, static_out = self._graphs[b]
        self.rows_run += n
        self.rows_replayed += b
        for dst, src in zip(static_in, inputs):
            dst[:n].copy_(src, non_blocking=True)
            if n < b:
                dst[n:].zero_()
        g.replay()
        return tuple(o[:n] for o in static_out)


class DecodeGraphs:
    """Decode steps captured per batch bucket.

    ``step_fn(input_ids[B], positions[B], attn, *extras) -> Tensor | tuple`` is the whole step
    (e.g. forward, logits and sampling). ``extra_specs`` declare per-row extra inputs
    (seeds, temperatures, ...) by trailing shape and dtype; padding rows get zeros.
    ``scratch_page`` is a KV page no sequence ever owns; ``max_pages_per_seq`` bounds the page
    indices each row may bring. ``variants``: the head's cheaper step variants (``TokenHead``,
    "variants"): variant ``i + 1`` is captured for the buckets up to ``variants[i]`` rows, as
    ``step_fn(..., variant=i + 1)``; ``run(..., variant=v)`` replays it where captured, else
    variant 0 (every variant gives the same tokens, so the choice only saves time).
    """

    def __init__(
        self,
        step_fn: Callable[..., Any],
        kv_caches: list[torch.Tensor],
        *,
        num_q_heads: int,
        scratch_page: int,
        max_pages_per_seq: int,
        buckets: Sequence[int] = DEFAULT_DECODE_BUCKETS,
        extra_specs: Sequence[TensorSpec] = (),
        tensor_cores: bool = False,
        variants: Sequence[int] = (),
        decode_kernel: str | None = None,
    ) -> None:
        if not buckets:
            raise ValueError("no buckets")
        num_pages = kv_caches[0].shape[0]
        if not 0 <= scratch_page < num_pages:
            raise ValueError(f"scratch_page {scratch_page} outside the cache's {num_pages} pages")
        self.step_fn = step_fn
        self.kv_caches = kv_caches
        self.num_q_heads = num_q_heads
        self.scratch_page = scratch_page
        self.page_size = int(kv_caches[0].shape[2])
        self.max_pages_per_seq = max_pages_per_seq
        self.buckets = tuple(sorted(set(buckets)))
        self.extra_specs = list(extra_specs)
        # the graphs' decode attention (engine.llm.kernels.DECODE_ATTENTION_KERNELS; None: from tensor_cores)
        self.decode_kernel = decode_kernel or ("tensor-cores" if tensor_cores else "cuda-cores")
        self.tensor_cores = self.decode_kernel == "tensor-cores"  # GraphDecodeAttention's kernel
        self.device = kv_caches[0].device
        self.variants = tuple(int(v) for v in variants)
        self._keys = set(self.keys())
        self._graphs: dict[tuple[int, int], _DecodeGraph] = {}  # (variant, bucket) -> graph

    @property
    def max_batch_size(self) -> int:
        return self.buckets[-1]

    def keys(self) -> list[tuple[int, int]]:
        """(variant, bucket) of every graph to capture: variant 0 at every bucket, each cheaper
        variant at the buckets up to its row limit."""
        keys = [(0, b) for b in self.buckets]
        keys += [(v, b) for v, most in enumerate(self.variants, 1) for b in self.buckets if b <= most]
        return keys

    def resolve(self, n: int, variant: int) -> int:
        """The variant a step of ``n`` rows asked to run as ``variant`` replays: itself where
        captured at its bucket, else 0."""
        b = bucket_for(n, self.buckets)
        return variant if (variant, b) in self._keys else 0

    def decode_attentions(self) -> list[Any]:
        """The captured graphs' ``GraphDecodeAttention`` objects (their plans run per step)."""
        return [g.attn for g in self._graphs.values()]

    def can_run(self, meta: Any) -> bool:
        """True for a decode-only step that fits a captured bucket."""
        n = int(meta.kv_last_page_len.numel())
        return (
            int(meta.num_decode_seqs) == n
            and n <= self.max_batch_size
            and int(meta.kv_indices.numel()) <= n * self.max_pages_per_seq
        )

    def capture(self, *, progress: bool = True) -> None:
        """Capture one graph per (variant, bucket), largest first, sharing one memory pool."""
        pool = torch.cuda.graph_pool_handle()
        workspace = torch.zeros(128 * 1024 * 1024, dtype=torch.uint8, device=self.device)
        keys = sorted(self.keys(), key=lambda k: (-k[1], k[0]))
        for v, b in _progress(keys, "decode graphs", progress):
            attn = graph_decode_attention(
                self.decode_kernel, self.kv_caches, num_q_heads=self.num_q_heads, batch_size=b,
                max_num_pages=b * self.max_pages_per_seq, workspace=workspace,
            )
            ids = torch.zeros(b, dtype=torch.int64, device=self.device)
            pos = torch.zeros(b, dtype=torch.int64, device=self.device)
            extras = [torch.zeros((b, *s), dtype=dt, device=self.device) for s, dt in self.extra_specs]
            attn.begin_step(self._scratch_metadata(b))
            fn = self.step_fn if v == 0 else functools.partial(self.step_fn, variant=v)
            g, outs = capture_step(fn, (ids, pos, attn, *extras), pool=pool, device=self.device)
            self._graphs[(v, b)] = _DecodeGraph(g, attn, ids, pos, extras, outs)
        torch.cuda.synchronize(self.device)

    def run(self, input_ids: torch.Tensor, meta: Any, *extras: torch.Tensor, variant: int = 0
            ) -> tuple[torch.Tensor, ...]:
        """Replay one decode step for ``n`` rows (``input_ids[n]``, decode-only ``meta``), as
        ``variant`` where that was captured at the step's bucket, else as variant 0."""
        n = int(input_ids.shape[0])
        b = bucket_for(n, self.buckets)
        if b is None or (0, b) not in self._graphs or not self.can_run(meta):
            raise ValueError(f"no captured graph for this step (batch {n}, buckets {self.buckets})")
        variant = self.resolve(n, variant)
        gr = self._graphs[(variant, b)]
        padded = meta if int(meta.kv_last_page_len.numel()) == b else pad_decode_metadata(  # (padded already)
            meta, b, scratch_page=self.scratch_page, page_size=self.page_size)
        gr.attn.begin_step(padded)
        gr.ids[:n].copy_(input_ids, non_blocking=True)
        gr.pos.copy_(padded.positions, non_blocking=True)
        if n < b:
            gr.ids[n:].zero_()
        for dst, src in zip(gr.extras, extras):
            dst[:n].copy_(src, non_blocking=True)
            if n < b:
                dst[n:].zero_()
        gr.graph.replay()
        return tuple(o[:n] for o in gr.outs)

    def _scratch_metadata(self, b: int) -> Any:
        """Metadata for ``b`` padding rows only (used to plan the capture)."""
        return scratch_decode_metadata(b, scratch_page=self.scratch_page, page_size=self.page_size)


def graph_decode_attention(kernel: str, kv_caches: list[torch.Tensor], **kw: Any) -> Any:
    """A decode graph's attention for ``kernel`` (``kernels.DECODE_ATTENTION_KERNELS``): FlashInfer's
    ``GraphDecodeAttention`` (its CUDA-core or tensor-core kernel) or the runtime's Triton one
    (``engine.llm.decode_attention_triton.GraphTritonDecodeAttention``), which takes the same calls."""
    check_kernel("decode_attention", kernel, auto=False)
    if kernel == "triton":
        from engine.llm.decode_attention_triton import GraphTritonDecodeAttention

        return GraphTritonDecodeAttention(kv_caches, **kw)
    from engine.llm.flashinfer_attention import GraphDecodeAttention

    return GraphDecodeAttention(kv_caches, tensor_cores=kernel == "tensor-cores", **kw)


def scratch_decode_metadata(b: int, *, scratch_page: int, page_size: int) -> Any:
    """Decode metadata of ``b`` padding rows only, all in the scratch page (to plan a capture)."""
    empty = _EmptyMeta(
        qo_indptr=torch.zeros(1, dtype=torch.int32),
        kv_indptr=torch.zeros(1, dtype=torch.int32),
        kv_indices=torch.zeros(0, dtype=torch.int32),
        kv_last_page_len=torch.zeros(0, dtype=torch.int32),
        slot_mapping=torch.zeros(0, dtype=torch.int64),
        positions=torch.zeros(0, dtype=torch.int64),
        num_decode_seqs=0,
    )
    return pad_decode_metadata(empty, b, scratch_page=scratch_page, page_size=page_size)


@dataclasses.dataclass
class _EmptyMeta:
    """The fields of ``AttentionMetadata`` that padding reads (keeps this module standalone)."""

    qo_indptr: torch.Tensor
    kv_indptr: torch.Tensor
    kv_indices: torch.Tensor
    kv_last_page_len: torch.Tensor
    slot_mapping: torch.Tensor
    positions: torch.Tensor
    num_decode_seqs: int


@dataclasses.dataclass
class _DecodeGraph:
    graph: torch.cuda.CUDAGraph
    attn: Any
    ids: torch.Tensor
    pos: torch.Tensor
    extras: list[torch.Tensor]
    outs: tuple[torch.Tensor, ...]


def _sub_batch(batch: Any, start: int, stop: int) -> Any:
    """Rows ``[start, stop)`` of a ``ScheduledBatch`` (decode rows come first)."""
    nd = max(0, min(batch.num_decode_seqs, stop) - start)
    return dataclasses.replace(
        batch, seqs=batch.seqs[start:stop], num_new_tokens=batch.num_new_tokens[start:stop],
        is_sampled=batch.is_sampled[start:stop], num_decode_seqs=nd,
    )


def flashinfer_attention_factory(spec: KVCacheSpec, kv_caches: list[torch.Tensor]) -> Any:
    """``attention_backend_factory`` for ``ModelRunner``: eager FlashInfer attention."""
    from engine.llm.flashinfer_attention import FlashInferAttention

    return FlashInferAttention(kv_caches, num_q_heads=spec.num_qo_heads)


class CudaGraphModelRunner(ModelRunner):
    """``ModelRunner`` on the GPU: FlashInfer attention, decode steps replayed from CUDA graphs.

    The KV cache gets one page more than ``num_pages``: the scratch page that padding rows use
    (the page allocator must be built with ``num_pages``, so it never hands that page out).
    A graphed decode step is the whole step on the device: forward, head, sampling (with the
    per-slot repetition-penalty state) and the penalty update; the host builds the metadata,
    plans attention, replays and reads the tokens. Fresh whole prompts (up to
    ``prefill_row_buckets[-1]`` of them, alone or after the decode rows of a mixed step) are
    packed into one replay of ``PrefillGraphs`` (``prefill_buckets``: token counts; ``()`` =
    none; default: those of ``DEFAULT_PREFILL_BUCKETS`` up to ``max_model_len``); with ``mixed``,
    a step with both goes through one ``MixedGraphs`` replay where it fits (one pass over the
    weights instead of two). Other steps
    (chunked or continued prefills, more decode rows than the largest bucket) run eagerly. ``max_model_len`` bounds a graphed row's context (it
    sizes the page-index buffers). ``graph_forward``: the program's forward for the graphs (a fused
    one, fewer kernels), else the model's.
    ``async_plan``: the graphs' attention plans send the page ids to the device without waiting
    for the step in flight (``GraphDecodeAttention``; ``set_async_plan`` switches it later).
    ``decode_attention``: "cuda-cores" (default) or "tensor-cores", FlashInfer's decode kernel in
    the decode and mixed graphs (fixed at capture).
    """

    def __init__(
        self,
        model: torch.nn.Module,
        config: Any,
        *,
        num_pages: int,
        max_model_len: int = 4096,
        decode_buckets: Sequence[int] = DEFAULT_DECODE_BUCKETS,
        prefill_buckets: Sequence[int] | None = None,
        prefill_row_buckets: Sequence[int] | None = None,
        capture: bool = True,
        progress: bool = True,
        graph_forward: Callable[..., torch.Tensor] | None = None,
        mixed: bool = False,
        mixed_decode_buckets: Sequence[int] | None = None,
        mixed_token_buckets: Sequence[int] | None = None,
        async_plan: bool = False,
        decode_attention: str = "cuda-cores",
        **kwargs: Any,
    ) -> None:
        check_kernel("decode_attention", decode_attention, auto=False)
        kwargs.setdefault("attention_backend_factory", flashinfer_attention_factory)
        self.async_plan = async_plan
        self.decode_attention = decode_attention
        super().__init__(model, config, num_pages=num_pages + 1, **kwargs)
        self.scratch_page = num_pages
        # The step's forward in the graphs: the program's (e.g. a fused one), else the model's.
        self.forward_fn: Callable[..., torch.Tensor] = graph_forward or model
        buckets = [b for b in decode_buckets if b <= self.max_num_seqs] or [self.max_num_seqs]
        f32, i64 = torch.float32, torch.int64
        self.graphs = DecodeGraphs(
            self._graph_step,
            self.kv_caches,
            num_q_heads=config.num_attention_heads,
            scratch_page=self.scratch_page,
            max_pages_per_seq=-(-max_model_len // self.page_size),
            buckets=buckets,
            # temperature, top_p, repetition penalty, seed, step, slot + 1 (0 = padding), allowed row,
            # keep, top_k
            extra_specs=[((), f32), ((), f32), ((), f32), ((), i64), ((), i64), ((), i64), ((), i64), ((), torch.bool),
                         ((), i64)],
            decode_kernel=decode_attention,
            variants=getattr(self.head, "variants", ()),
        )
        from engine.llm.prefill_graphs import DEFAULT_PREFILL_BUCKETS, DEFAULT_PREFILL_ROW_BUCKETS, PrefillGraphs

        if prefill_buckets is None:
            prefill_buckets = [t for t in DEFAULT_PREFILL_BUCKETS if t <= max_model_len]
        self.prefill_graphs = PrefillGraphs(
            self._prefill_step, self.kv_caches, num_q_heads=config.num_attention_heads,
            scratch_page=self.scratch_page, buckets=prefill_buckets or [max_model_len],
            row_buckets=prefill_row_buckets or DEFAULT_PREFILL_ROW_BUCKETS, extra_specs=self.graphs.extra_specs,
        ) if prefill_buckets != () else None
        # One graph for decode rows and fresh prompts together (engine.llm.mixed_graphs)
        self.mixed_graphs = None
        if mixed and self.prefill_graphs is not None:
            from engine.llm.mixed_graphs import DEFAULT_MIXED_DECODE_BUCKETS, DEFAULT_MIXED_TOKEN_BUCKETS, MixedGraphs

            mixed_buckets = [b for b in (mixed_decode_buckets or DEFAULT_MIXED_DECODE_BUCKETS) if b <= self.max_num_seqs]
            token_buckets = [t for t in (mixed_token_buckets or DEFAULT_MIXED_TOKEN_BUCKETS)
                             if t <= self.prefill_graphs.max_num_tokens] or [self.prefill_graphs.max_num_tokens]
            if mixed_buckets:
                self.mixed_graphs = MixedGraphs(
                    self._mixed_step, self.kv_caches, num_q_heads=config.num_attention_heads,
                    scratch_page=self.scratch_page, max_pages_per_seq=self.graphs.max_pages_per_seq,
                    decode_buckets=mixed_buckets, token_buckets=token_buckets,
                    max_prompts=self.prefill_graphs.max_num_seqs, extra_specs=self.graphs.extra_specs,
                    decode_kernel=decode_attention,
                )
        from engine.llm.decode_inputs import DecodeInputBuilder

        self._inputs = DecodeInputBuilder(max_num_seqs=self.max_num_seqs, max_pages_per_seq=self.graphs.max_pages_per_seq,
                                          page_size=self.page_size, scratch_page=self.scratch_page)
        self.use_graphs = False
        self.num_eager_steps = 0  # steps that could not replay graphs (LMBackend.totals)
        if capture:
            self.capture(progress=progress)

    def capture(self, *, progress: bool = True) -> None:
        """Capture the decode (and single-prompt prefill) graphs; start-up, a few seconds."""
        self.graphs.capture(progress=progress)
        if self.prefill_graphs is not None:
            self.prefill_graphs.capture(progress=progress)
        if self.mixed_graphs is not None:
            self.mixed_graphs.capture(progress=progress)
        self.use_graphs = True
        self.set_async_plan(self.async_plan)

    def set_async_plan(self, on: bool) -> None:
        """Every captured decode attention's ``async_plan`` (the decode graphs' and the mixed
        graphs' decode part)."""
        self.async_plan = on
        attns = self.graphs.decode_attentions()
        if self.mixed_graphs is not None:
            attns += self.mixed_graphs.decode_attentions()
        for attn in attns:
            attn.async_plan = on

    def _graph_step(self, ids: torch.Tensor, pos: torch.Tensor, attn: Any, *extras: torch.Tensor, variant: int = 0
                    ) -> tuple[torch.Tensor, torch.Tensor]:
        r = self._graph_rows(*extras)
        hidden = self._run_forward(self.forward_fn, ids, pos, attn, lambda: r.rows)  # [B, hidden]
        return self.head.sample(hidden, r, variant=variant) if variant else self.head.sample(hidden, r)

    def _prefill_step(self, ids: torch.Tensor, pos: torch.Tensor, attn: Any, last: torch.Tensor,
                      *extras: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        r = self._graph_rows(*extras)
        hidden = self._run_forward(self.forward_fn, ids, pos, attn, lambda: _rows_of_tokens(r.rows, attn.seg))
        self.head.reset(r.rows)  # fresh prompts: their slots' previous state is forgotten
        return self.head.sample(hidden.index_select(0, last), r)  # [R, hidden]

    def _mixed_step(self, ids: torch.Tensor, pos: torch.Tensor, attn: Any, last: torch.Tensor,
                    *extras: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Decode rows then packed prompts (``MixedGraphs``): one forward, one head call over
        the decode rows and each prompt's last token."""
        b = attn.num_decode
        r = self._graph_rows(*extras)

        def token_rows() -> torch.Tensor:
            return torch.cat([r.rows[:b], _rows_of_tokens(r.rows[b:], attn.prefill.seg)])

        hidden = self._run_forward(self.forward_fn, ids, pos, attn, token_rows)  # [b + t, hidden]
        rows = torch.cat([hidden[:b], hidden[b:].index_select(0, last)])  # [b + r, hidden]
        self.head.reset(r.rows[b:])
        return self.head.sample(rows, r)

    def _graph_rows(self, temperature: torch.Tensor, top_p: torch.Tensor, penalty: torch.Tensor, seeds: torch.Tensor,
                    steps: torch.Tensor, slot1: torch.Tensor, allowed_rows: torch.Tensor, keep: torch.Tensor,
                    top_k: torch.Tensor) -> RowInputs:
        """The graphs' per-row extras as the head's inputs (padding rows: slot + 1 = 0 -> the
        head's padding row, ``max_num_seqs``)."""
        return RowInputs(temperature=temperature, top_p=top_p, repetition_penalty=penalty, seeds=seeds, steps=steps,
                         rows=(slot1 - 1).remainder(self.max_num_seqs + 1), allowed_rows=allowed_rows, keep=keep,
                         top_k=top_k)

    def execute(self, batch: Any, feed: torch.Tensor | None = None) -> torch.Tensor:
        return torch.tensor(self.launch(batch, feed)(), dtype=torch.int64)  # the step's only host sync

    @torch.inference_mode()
    def launch(self, batch: Any, feed: torch.Tensor | None = None) -> LaunchedStep:
        """Replay the step and start copying its tokens to pinned host memory; the returned
        call waits for them (eager steps finish before returning). ``feed``: the previous
        launched step's device tokens, which rows with a ``PENDING`` last token take on the
        device (graphs) or through the host (eager steps)."""
        tokens = self._execute_graphs(batch, feed) if self.use_graphs else None
        if tokens is None:
            self.num_eager_steps += 1
            done = self._execute_eager(batch, build_attention_metadata(batch, self.page_size), feed)
            values = done.tolist()
            return LaunchedStep(lambda: values, _feed_column(done))
        wait = start_host_copy(tokens)
        return LaunchedStep(lambda: wait().tolist(), _feed_column(tokens))

    def _execute_graphs(self, batch: Any, feed: torch.Tensor | None = None) -> torch.Tensor | None:
        """Device tokens [B] (or [B, C]) from graph replays, or None when some row cannot be graphed.

        Decode rows replay a decode graph; fresh whole-prompt prefill rows (alone, or after
        the decode rows of a mixed step) replay one packed prefill graph. Rows are sampled
        independently, so splitting a step in two replays changes no token.
        """
        nd = batch.num_decode_seqs
        fresh = [s.slot for s in batch.seqs[:nd] if s.num_computed_tokens == 0]
        if fresh:  # one-token prompts are decode rows, and the decode graphs reset no state rows
            self.head.reset(torch.tensor(fresh, dtype=torch.int64).to(self.device, non_blocking=True))
        if nd > 0 and len(batch.seqs) > nd and self.mixed_graphs is not None:
            tokens = self._execute_mixed(batch, feed)
            if tokens is not None:
                return tokens
        parts = []
        if nd > 0:
            dec = _sub_batch(batch, 0, nd)
            b = bucket_for(nd, self.graphs.buckets)
            if b is None:  # more decode rows than the largest graph
                return None
            parts.append((self.graphs, dec, self._inputs.build(dec.seqs, b, dec.is_sampled)))
        if len(batch.seqs) > nd:
            pre = _sub_batch(batch, nd, len(batch.seqs))
            if self.prefill_graphs is None or not self.prefill_graphs.can_run(pre):
                return None
            parts.append((self.prefill_graphs, pre, None))
        outs = []
        for graphs, sub, inputs in parts:
            if graphs is self.prefill_graphs:
                ids, positions, seg, slots, last, extras = self._prompt_inputs(sub)
                tokens, _ = graphs.run(ids, positions, seg, slots, last, *extras)
            else:
                tokens, _ = graphs.run(*self._decode_args(*inputs, feed=feed), variant=self._variant(inputs, sub.num_seqs))
                tokens = tokens[: sub.num_seqs]
            outs.append(tokens)
        return outs[0] if len(outs) == 1 else torch.cat(outs)  # a copy: the next replay may overwrite

    def _variant(self, inputs: tuple, n: int) -> int:
        """The head's step variant for decode rows whose packed host inputs are ``inputs``
        (``DecodeInputBuilder.build``: column 2 of its ints holds each row's steps), 0 if it
        has none."""
        if not self.graphs.variants:
            return 0
        return int(self.head.variant(inputs[1][:n, 2]))

    def _prompt_inputs(self, pre: Any) -> tuple:
        """Graph inputs of fresh whole prompts: packed (``pack_prefill``) ids, positions,
        sequence index, KV slots and last-token index, and the sampler's per-row extras."""
        from engine.llm.prefill_graphs import pack_prefill

        _, *extras = self.graph_inputs(pre)
        ids, positions, seg, last = pack_prefill([s.prompt_ids for s in pre.seqs])
        slots = build_attention_metadata(pre, self.page_size).slot_mapping
        return ids, positions, seg, slots, last, extras

    def _execute_mixed(self, batch: Any, feed: torch.Tensor | None) -> torch.Tensor | None:
        """A mixed step's tokens from one ``MixedGraphs`` replay, or None when it does not fit
        (then the decode and prefill graphs replay one after the other)."""
        nd = batch.num_decode_seqs
        pre = _sub_batch(batch, nd, len(batch.seqs))
        if not self.prefill_graphs.can_run(pre) or not self.mixed_graphs.can_run(nd, pre.num_new_tokens):
            return None
        dec = _sub_batch(batch, 0, nd)
        b = bucket_for(nd, self.mixed_graphs.decode_buckets)
        ids, meta, *dec_extras = self._decode_args(*self._inputs.build(dec.seqs, b, dec.is_sampled), feed=feed)
        pre_ids, positions, seg, slots, last, pre_extras = self._prompt_inputs(pre)
        dec_tokens, pre_tokens = self.mixed_graphs.run(nd, ids, meta, dec_extras, pre_ids, positions, seg, slots,
                                                       last, pre_extras)
        return torch.cat([dec_tokens, pre_tokens])  # a copy: the next replay may overwrite

    def _decode_args(self, meta: Any, ints: torch.Tensor, floats: torch.Tensor, keep: torch.Tensor, *,
                     feed: torch.Tensor | None = None) -> tuple:
        """``DecodeGraphs.run`` arguments from ``DecodeInputBuilder.build`` (two packed copies);
        rows whose token is pending take it from ``feed`` on the device (column 5: 1 + its row)."""
        dev = self.device
        ints, floats, keep = (t.to(dev, non_blocking=True) for t in (ints, floats, keep))
        ids = ints[:, 0]
        if feed is not None:  # (on the host after an eager step)
            src = ints[:, 5]
            feed = feed.to(dev, non_blocking=True)
            ids = torch.where(src > 0, feed.index_select(0, (src - 1).clamp(min=0)), ids)
        return (ids, meta, floats[:, 0], floats[:, 1], floats[:, 2], ints[:, 1], ints[:, 2], ints[:, 3],
                ints[:, 4], keep, ints[:, 6])

    def graph_inputs(self, batch: Any) -> list[torch.Tensor]:
        """A decode batch's graph inputs on the device: ids, then the sampler's per-row extras."""
        seqs = batch.seqs
        params = [s.params for s in seqs]
        f32, i64 = torch.float32, torch.int64
        host = [
            torch.tensor([s.token_slice(s.num_computed_tokens, s.num_computed_tokens + 1)[0] for s in seqs], dtype=i64),
            torch.tensor([p.temperature for p in params], dtype=f32),
            torch.tensor([p.top_p for p in params], dtype=f32),
            torch.tensor([p.repetition_penalty for p in params], dtype=f32),
            torch.tensor([p.seed for p in params], dtype=i64),
            torch.tensor([s.num_output_tokens for s in seqs], dtype=i64),
            torch.tensor([s.slot + 1 for s in seqs], dtype=i64),
            torch.tensor([getattr(s, "allowed_row", 0) for s in seqs], dtype=i64),
            torch.tensor(batch.is_sampled, dtype=torch.bool),
            torch.tensor([p.top_k for p in params], dtype=i64),
        ]
        return [t.to(self.device, non_blocking=True) for t in host]

    def _execute_eager(self, batch: Any, meta: AttentionMetadata, feed: torch.Tensor | None = None) -> torch.Tensor:
        input_ids = torch.tensor(host_input_ids(batch, feed), dtype=torch.int64)  # [T]
        hidden = self._hidden(input_ids, meta, batch)  # [B, H]
        tokens, _ = self._sample_eager(hidden, batch)
        return tokens.cpu()

    def _hidden(self, input_ids: torch.Tensor, meta: AttentionMetadata, batch: Any = None) -> torch.Tensor:
        """Eager forward (prefill / mixed steps) through ``forward_fn``: hidden [B, H] of each
        row's last token."""
        self.attn.begin_step(meta)
        ids = input_ids.to(self.device, non_blocking=True)
        positions = meta.positions.to(self.device, non_blocking=True)
        hidden = self._run_forward(self.forward_fn, ids, positions, self.attn, lambda: self._token_rows(meta, batch))
        last = (meta.qo_indptr[1:].to(torch.int64) - 1).to(self.device, non_blocking=True)  # [B]
        return hidden.index_select(0, last)


def _rows_of_tokens(rows: torch.Tensor, seg: torch.Tensor) -> torch.Tensor:
    """Packed prompts' per-token state rows [T] from per-prompt rows [R] and each token's prompt
    index [T]; padding tokens (index R or more) read the last row (their output is dropped)."""
    return rows.index_select(0, seg.clamp(max=rows.shape[0] - 1))

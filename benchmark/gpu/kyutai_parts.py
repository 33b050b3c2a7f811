"""Kyutai TTS's step split on a GPU: the temporal transformer (input embedding, 16 layers with the
voice cross-attention), the frame head (text sample, state machine, depth transformer, 24
codebooks sampled) and the Mimi decode, each alone, with how many kernels each launches; and
the head's two cheaper variants that a turn's first 18 steps run (text only, codebook 0 only),
and the head with its compiled pieces uncompiled (the depth transformer's, the noise, the state
machine, the frame's finish: the head's A/B of `kyutai_compile`)
and, on a GPU, with the other depth attention (the A/B of `kyutai_depth_attention`), with the
other top-k draw (of `kyutai_sampling`), the temporal transformer with the other voice
cross-attention (of `kyutai_cross_attention`), and the Mimi decode with the other attention
(of `mimi_attention`); and the head with the depth transformer's input embeddings as the
checkpoint has them, low rank (the A/B of ``KyutaiLM.fold_depformer_emb``), and the temporal
transformer with its pointwise pieces uncompiled (of ``KyutaiLM.compile_backbone``), and the
head with the other depth-transformer matmuls (of ``kyutai_depth_gemm``: torch's, or Triton's
with the norms, silu-mul and residual sums fused in; and ``triton-attend``, the attention in the
queries' kernel too); and the head with ``kyutai_sampling=triton-select``'s draws (the k kept
found by bisection, not a sort), its text draw included.

    python -m benchmark.gpu.kyutai_parts --batch 1,64,128,256 [--kernels 128] [--json F]
    python -m benchmark.gpu.kyutai_parts --model kyutai-tts-tiny --device cpu --batch 2   # a smoke run

Each part is replayed in a CUDA graph (median ms); the kernel count is that of one eager call
under torch.profiler. Self-attention is a dense stand-in over ``--context`` cached frames (the
engine's is FlashInfer's paged decode), the rest is the served model's own code at random
weights. ``--kernels B``: each part's ops with the most device time at B rows. On the CPU (a
smoke run) the parts are timed eagerly and their kernels not counted.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable

from benchmark.gpu.graph_timing import eager_median_ms, graph_median_ms, kernel_table

__all__ = ["main"]


class _DenseAttention:
    """attn(layer, q, k, v) [B, H, D] each: one new frame per row over ``context`` cached ones."""

    def __init__(self, layers: int, b: int, context: int, heads: int, head_dim: int, dtype, device) -> None:  # noqa: ANN001
        import torch

        self.k = [torch.randn(b, heads, context, head_dim, dtype=dtype, device=device) for _ in range(layers)]
        self.v = [torch.randn_like(t) for t in self.k]

    def __call__(self, layer: int, q, k, v):  # noqa: ANN001, ANN204
        import torch.nn.functional as F

        kc, vc = self.k[layer], self.v[layer]
        kc[:, :, -1] = k
        vc[:, :, -1] = v
        return F.scaled_dot_product_attention(q[:, :, None], kc, vc)[:, :, 0]  # [B, H, D]


def _with(obj: object, name: str, value: object, fn: Callable[[], object]) -> object:
    """``fn()`` with ``obj.name`` set to ``value`` (the head's ``fns``: its depth-transformer
    pieces; the voice bank's ``attention``), restored after."""
    kept = getattr(obj, name)
    setattr(obj, name, value)
    try:
        return fn()
    finally:
        setattr(obj, name, kept)


def _uncompiled(head: object, fn: Callable[[], object]) -> object:
    """``fn()`` with every piece the head compiles (``kyutai_compile``) as plain PyTorch: the
    depth transformer's (its attention kept as built), the Gumbel noise, the state machine's step
    and the frame's finish."""
    from engine.llm.sampler import gumbel_noise, gumbel_noise_salts
    from models.kyutai_tts.depformer import PLAIN
    from models.kyutai_tts.head import finish_frame

    return _with(head, "fns", PLAIN._replace(attend=head.fns.attend), lambda: _with(
        head, "_noise", gumbel_noise, lambda: _with(head, "_noise_salts", gumbel_noise_salts, lambda: _with(
            head, "_machine_step", head.machine.step, lambda: _with(head, "_finish", finish_frame, fn)))))


def _unfolded(lm: object, head: object, fn: Callable[[], object]) -> object:
    """``fn()`` with the depth transformer's embeddings unfolded (low rank, as before
    ``fold_depformer_emb``), its compiled pieces free to trace the unfolded sum once."""
    return _with(lm, "depformer_emb_folded", None, lambda: _with(
        lm, "depformer_text_folded", None, lambda: _with(head, "frozen_stance", "default", fn)))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="kyutai-tts", help="a --model name of Kyutai TTS")
    p.add_argument("--batch", default="1,64,128,256", help="rows, comma-separated")
    p.add_argument("--context", type=int, default=200, help="cached frames per row for the self-attention")
    p.add_argument("--steps", type=int, default=100, help="frames each row has generated (past the delays)")
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--kernels", type=int, default=0, help="at this batch size, each part's top ops")
    p.add_argument("--top", type=int, default=12, help="ops listed with --kernels")
    p.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    p.add_argument("--json", help="write the table here")
    args = p.parse_args(argv)
    import torch

    from engine.llm.build import build_lm_backend
    from engine.llm.token_head import RowInputs
    from models.kyutai_tts.attend_triton import attend_codebook
    from models.kyutai_tts.depformer import PLAIN, attend_sdpa
    from models.kyutai_tts.draw_triton import top_k_draw_triton, top_k_select_triton
    from models.kyutai_tts.gemm_triton import DEPTH_GEMMS, DEPTH_GEMMS_ATTEND
    from models.kyutai_tts.lm import PLAIN_BACKBONE
    from models.registry import load_factory, resolve

    on_gpu = args.device == "cuda"
    if on_gpu and not torch.cuda.is_available():
        print("kyutai_parts needs a CUDA GPU (or --device cpu)", file=sys.stderr)
        return 2
    batches = [int(x) for x in args.batch.split(",")]
    resolved = resolve(args.model)
    backend = build_lm_backend(load_factory(resolved.entry), resolved.model_id, device=args.device,
                               load_format="dummy", warmup=False, max_num_seqs=max(batches), num_pages=1024)
    program, head = backend.program, backend.runner.head
    lm, stream = program.lm, program.codec.stream
    c = lm.config.lm
    dev, i64 = torch.device(args.device), torch.int64
    dtype = next(lm.parameters()).dtype
    name = torch.cuda.get_device_name() if on_gpu else "cpu"
    uuid = str(getattr(torch.cuda.get_device_properties(0), "uuid", "")) if on_gpu else ""
    print(f"Kyutai TTS parts on {name} ({uuid}); torch {torch.__version__}; {lm.num_active} codebooks; "
          f"self-attention over {args.context} frames (dense stand-in)", flush=True)
    other_name = "torch's" if head.fns.attend is not attend_sdpa else "Triton"
    triton_draw = head.fns.draw is top_k_draw_triton
    bank = lm.slots.bank
    other_cross = "triton" if bank.attention == "sdpa" else "sdpa"
    other_mimi = "triton" if stream.attention == "sdpa" else "sdpa"  # (mimi_attention's A/B)
    other_gemms = DEPTH_GEMMS if head.fns.gemms is None else None  # (kyutai_depth_gemm's)
    other_gemm = "Triton's fused" if other_gemms is not None else "torch's"
    rows = []
    for b in batches:
        slots = torch.arange(b, dtype=i64, device=dev)
        pos = torch.full((b,), args.steps, dtype=i64, device=dev)
        attn = _DenseAttention(c.num_layers, b, args.context, c.num_heads, c.head_dim, dtype, dev)
        r = RowInputs(temperature=torch.full((b,), 0.6, device=dev), top_p=torch.ones(b, device=dev),
                      repetition_penalty=torch.ones(b, device=dev), seeds=slots.clone(), steps=pos.clone(),
                      rows=slots, allowed_rows=torch.zeros(b, dtype=i64, device=dev),
                      keep=torch.ones(b, dtype=torch.bool, device=dev), top_k=torch.full((b,), 50, dtype=i64, device=dev))
        hidden = torch.randn(b, c.dim, dtype=dtype, device=dev)
        codes = torch.randint(0, c.card, (b, lm.num_active), device=dev)
        parts = {
            "backbone": lambda: lm(pos, pos, attn, slots),  # noqa: B023
            "head": lambda: head.sample(hidden, r),  # noqa: B023
            "mimi": lambda: stream.step(slots, codes),  # noqa: B023
            # the head's cheaper variants, which a turn's first 18 steps run: text only, codebook 0 only
            "head_text": lambda: head.sample(hidden, r, variant=1),  # noqa: B023
            "head_cb0": lambda: head.sample(hidden, r, variant=2),  # noqa: B023
            # the head with its depth-transformer pieces uncompiled, and with the Triton attention
            # (kyutai_depth_attention=triton) or torch's, whichever it was not built with: the A/Bs
            "head_uncompiled": lambda: _uncompiled(head, lambda: head.sample(hidden, r)),  # noqa: B023
        }
        if lm.fns is not PLAIN_BACKBONE:  # (compiled with kyutai_compile)
            parts["backbone_uncompiled"] = lambda: _with(lm, "fns", PLAIN_BACKBONE, lambda: _with(  # noqa: B023
                lm, "frozen_stance", None, lambda: lm(pos, pos, attn, slots)))  # noqa: B023
        if lm.depformer_emb_folded is not None:
            parts["head_unfolded"] = lambda: _unfolded(lm, head, lambda: head.sample(hidden, r))  # noqa: B023
        if on_gpu:
            other = attend_sdpa if head.fns.attend is not attend_sdpa else attend_codebook
            parts["head_other_attention"] = lambda: _with(head, "fns", head.fns._replace(attend=other),  # noqa: B023
                                                              lambda: head.sample(hidden, r))  # noqa: B023
            other_draw = PLAIN.draw if triton_draw else top_k_draw_triton
            parts["head_other_draw"] = lambda: _with(head, "fns", head.fns._replace(draw=other_draw),  # noqa: B023
                                                         lambda: head.sample(hidden, r))  # noqa: B023
            parts["backbone_other_cross"] = lambda: _with(bank, "attention", other_cross,  # noqa: B023
                                                                lambda: lm(pos, pos, attn, slots))  # noqa: B023
            parts["mimi_other_attention"] = lambda: _with(stream, "attention", other_mimi,  # noqa: B023
                                                          lambda: stream.step(slots, codes))  # noqa: B023
            parts["head_other_gemm"] = lambda: _with(head, "fns", head.fns._replace(gemms=other_gemms),  # noqa: B023
                                                     lambda: head.sample(hidden, r))  # noqa: B023
            parts["head_select_draw"] = lambda: _with(head, "fns", head.fns._replace(draw=top_k_select_triton),  # noqa: B023
                                                      lambda: _with(head, "triton_draw", top_k_select_triton,  # noqa: B023
                                                                    lambda: head.sample(hidden, r)))  # noqa: B023
            parts["head_text_select_draw"] = lambda: _with(head, "triton_draw", top_k_select_triton,  # noqa: B023
                                                           lambda: head.sample(hidden, r, variant=1))  # noqa: B023
            parts["head_gemm_attend"] = lambda: _with(head, "fns", head.fns._replace(gemms=DEPTH_GEMMS_ATTEND),  # noqa: B023
                                                      lambda: head.sample(hidden, r))  # noqa: B023
        row: dict = {"rows": b}
        tables = []
        for part, fn in parts.items():
            row[f"{part}_ms"] = graph_median_ms(fn, args.iters) if on_gpu else eager_median_ms(fn, args.iters)
            row[f"{part}_kernels"], table = kernel_table(fn, args.top if b == args.kernels else 0) if on_gpu else (0, "")
            if table:
                tables.append(f"\n{part} at {b} rows, one eager call:\n{table}")
        row["sum_ms"] = row["backbone_ms"] + row["head_ms"] + row["mimi_ms"]
        rows.append(row)
        print(f"{b:5d} rows: backbone {row['backbone_ms']:6.2f} ms ({row['backbone_kernels']} kernels)  "
              f"head {row['head_ms']:6.2f} ms ({row['head_kernels']})  mimi {row['mimi_ms']:6.2f} ms "
              f"({row['mimi_kernels']})  sum {row['sum_ms']:6.2f} ms; head variants: text only "
              f"{row['head_text_ms']:5.2f} ms ({row['head_text_kernels']}), codebook 0 {row['head_cb0_ms']:5.2f} ms "
              f"({row['head_cb0_kernels']}); uncompiled step {row['head_uncompiled_ms']:5.2f} ms "
              f"({row['head_uncompiled_kernels']})"
              + (f"; {other_name} attention {row['head_other_attention_ms']:5.2f} ms ({row['head_other_attention_kernels']})"
                 if "head_other_attention_ms" in row else "")
              + (f"; {'torch' if triton_draw else 'Triton'} draw {row['head_other_draw_ms']:5.2f} ms "
                 f"({row['head_other_draw_kernels']})" if "head_other_draw_ms" in row else "")
              + (f"; backbone with the {other_cross} cross-attention {row['backbone_other_cross_ms']:5.2f} ms "
                 f"({row['backbone_other_cross_kernels']})" if "backbone_other_cross_ms" in row else "")
              + (f"; backbone uncompiled {row['backbone_uncompiled_ms']:5.2f} ms ({row['backbone_uncompiled_kernels']})"
                 if "backbone_uncompiled_ms" in row else "")
              + (f"; low-rank depth embeddings {row['head_unfolded_ms']:5.2f} ms ({row['head_unfolded_kernels']})"
                 if "head_unfolded_ms" in row else "")
              + (f"; mimi with the {other_mimi} attention {row['mimi_other_attention_ms']:5.2f} ms "
                 f"({row['mimi_other_attention_kernels']})" if "mimi_other_attention_ms" in row else "")
              + (f"; head with {other_gemm} depth matmuls {row['head_other_gemm_ms']:5.2f} ms "
                 f"({row['head_other_gemm_kernels']})" if "head_other_gemm_ms" in row else "")
              + (f"; head with the select draw {row['head_select_draw_ms']:5.2f} ms ({row['head_select_draw_kernels']})"
                 if "head_select_draw_ms" in row else "")
              + (f"; text only with it {row['head_text_select_draw_ms']:5.2f} ms ({row['head_text_select_draw_kernels']})"
                 if "head_text_select_draw_ms" in row else "")
              + (f"; head with triton-attend depth matmuls {row['head_gemm_attend_ms']:5.2f} ms "
                 f"({row['head_gemm_attend_kernels']})" if "head_gemm_attend_ms" in row else ""), flush=True)
        for t in tables:
            print(t, flush=True)
        attn = None
        if on_gpu:
            torch.cuda.empty_cache()
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"model": args.model, "gpu": name, "uuid": uuid, "context": args.context,
                       "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Run by tests/models/kyutai_tts/test_gemm_triton.py in the Triton venv with TRITON_INTERPRET=1:
the depth transformer's fused matmuls (``kyutai_depth_gemm=triton``) against the torch ops they
replace, a whole frame decoded with each, and a built head with the setting. Prints one JSON
object."""

from __future__ import annotations

import json
import os

import torch
import torch.nn.functional as F

assert os.environ.get("TRITON_INTERPRET") == "1"
from models.kyutai_tts.config import TINY  # noqa: E402
from models.kyutai_tts.depformer import PLAIN, AudioSampling, decode_frame, silu_mul  # noqa: E402
from models.kyutai_tts.depformer import attend_sdpa  # noqa: E402
from models.kyutai_tts.gemm_triton import (DEPTH_GEMMS, DEPTH_GEMMS_ATTEND, linear_residual, linear_rms,  # noqa: E402
                                           linear_rms_attend, linear_rms_glu)
from models.kyutai_tts.layers import rms_norm  # noqa: E402
from models.kyutai_tts.lm import KyutaiLM  # noqa: E402

out: dict = {"kernels": {}}
g = torch.Generator().manual_seed(0)


def rel(got: torch.Tensor, want: torch.Tensor) -> float:
    return float((got.float() - want.float()).abs().max() / want.float().abs().max())


# Rows below, at and over a block (16, 32, 64), widths that are and are not a multiple of the
# kernel's blocks (32 or 64 columns, 128 of K), inputs of mixed scale (the norm's work).
for dt in (torch.float32, torch.float16):
    worst = {"rms": 0.0, "rms_glu": 0.0, "residual": 0.0}
    for m, n, k in ((1, 96, 64), (5, 40, 200), (33, 64, 130), (70, 160, 32)):
        x = (torch.randn(m, k, generator=g) * torch.rand(m, 1, generator=g) * 4).to(dt)
        alpha = (torch.rand(k, generator=g) + 0.5).to(dt)
        w = (torch.randn(n, k, generator=g) / k ** 0.5).to(dt)
        res = torch.randn(m, n, generator=g).to(dt)
        worst["rms"] = max(worst["rms"], rel(linear_rms(x, w, alpha, 1e-8), F.linear(rms_norm(x, alpha, 1e-8), w)))
        h = F.linear(rms_norm(x, alpha, 1e-8), w)
        got = linear_rms_glu(x, w, alpha, 1e-8)
        worst["rms_glu"] = max(worst["rms_glu"], rel(got, silu_mul(h.view(m, 2, -1))))
        a = torch.randn(m, k, generator=g).to(dt)
        worst["residual"] = max(worst["residual"], rel(linear_residual(a, w, res), res + F.linear(a, w)))
    # the queries, keys and values with the attention (linear_rms_attend) against linear_rms and
    # attend_sdpa, codebook by codebook over one frame's cache: 3 and 21 rows, 4 heads of 16
    worst["rms_attend"], cache_equal = 0.0, True
    for m in (3, 21):
        h, d, n, k = 4, 16, 6, 40
        w = (torch.randn(3 * h * d, k, generator=g) / k ** 0.5).to(dt)
        alpha = (torch.rand(k, generator=g) + 0.5).to(dt)
        cache = torch.randn(m, 2, h, n, d, generator=g).to(dt)  # (positions not yet written hold junk)
        ref = cache.clone()
        for pos in range(n):
            x = (torch.randn(m, k, generator=g) * 3).to(dt)
            want = attend_sdpa(F.linear(rms_norm(x, alpha, 1e-8), w).view(m, 3, h, d), ref, pos).reshape(m, -1)
            got = linear_rms_attend(x, w, alpha, 1e-8, cache, pos)
            cache_equal &= bool(torch.allclose(cache[:, :, :, :pos + 1].float(), ref[:, :, :, :pos + 1].float(),
                                               rtol=1e-5 if dt == torch.float32 else 2e-3, atol=1e-6))
            worst["rms_attend"] = max(worst["rms_attend"], rel(got, want))
    worst["cache_equal"] = cache_equal
    out["kernels"][str(dt)] = worst
refused = []
for call in (lambda: linear_rms(torch.zeros(2, 8), torch.zeros(4, 6), torch.ones(8), 1e-8),
             lambda: linear_rms_glu(torch.zeros(2, 8), torch.zeros(5, 8), torch.ones(8), 1e-8),
             lambda: linear_residual(torch.zeros(2, 8), torch.zeros(4, 8), torch.zeros(2, 5)),
             lambda: linear_rms_attend(torch.zeros(2, 8), torch.zeros(12, 8), torch.ones(8), 1e-8,
                                       torch.zeros(2, 2, 2, 4, 4), 0)):
    try:
        call()
    except ValueError as e:
        refused.append(str(e))
out["refused"] = refused

# A sampled frame of the tiny model's 32 codebooks for 4 rows, float32: the same codes either way.
torch.manual_seed(1)
lm = KyutaiLM(TINY).eval()
with torch.no_grad():
    for p in lm.parameters():
        p.normal_(0.0, 0.2)
    for layer in lm.depformer.layers:  # norms not all ones: the fused norm must apply them
        layer.norm1.alpha.uniform_(0.5, 1.5)
        layer.norm2.alpha.uniform_(0.5, 1.5)
    bsz, n_q = 4, TINY.lm.n_q
    hidden = torch.randn(bsz, TINY.lm.dim, generator=g)
    text = torch.tensor([3, 0, 7, 11])
    noise = -torch.log(-torch.log(torch.rand(n_q, bsz, TINY.lm.card, generator=g)))
    sampling = AudioSampling(25, torch.full((bsz, 1), 0.8), noise, torch.full((bsz, 1), float("inf")))
    torch_codes = decode_frame(lm, hidden, text, sampling, n_q)
    fused_codes = decode_frame(lm, hidden, text, sampling, n_q, PLAIN._replace(gemms=DEPTH_GEMMS))
    attend_codes = decode_frame(lm, hidden, text, sampling, n_q, PLAIN._replace(gemms=DEPTH_GEMMS_ATTEND))
out["frame_equal"] = bool(torch.equal(torch_codes, fused_codes))
out["frame_attend_equal"] = bool(torch.equal(torch_codes, attend_codes))
out["frame_distinct_codes"] = len(set(torch_codes.flatten().tolist()))

# A built head with kyutai_depth_gemm=triton against the same head with torch's matmuls
from engine.llm.token_head import RowInputs  # noqa: E402
from models.kyutai_tts.build import build_kyutai_backend  # noqa: E402

backend = build_kyutai_backend("tiny", device="cpu", max_num_seqs=2, max_model_len=128, warmup=False,
                               load_format="dummy", kyutai_n_q=4, kyutai_depth_gemm="triton-attend")
head = backend.runner.head
b = 2
rows = torch.arange(b)
r = RowInputs(temperature=torch.tensor([0.8, 1.2]), top_p=torch.tensor([1.0, 0.9]), repetition_penalty=torch.ones(b),
              seeds=torch.tensor([5, 9]), steps=torch.full((b,), 40), rows=rows, allowed_rows=torch.zeros(b, dtype=torch.int64),
              keep=torch.zeros(b, dtype=torch.bool))
hidden = torch.randn(b, TINY.lm.dim, generator=g)
with torch.no_grad():
    head.reset(rows)
    with_triton = head.sample(hidden, r)[0]
    gemms, head.fns = head.fns.gemms, head.fns._replace(gemms=None)
    head.reset(rows)
    with_torch = head.sample(hidden, r)[0]
out["head"] = {"gemms": gemms is DEPTH_GEMMS_ATTEND, "equal": bool(torch.equal(with_triton, with_torch)),
               "tokens": with_torch.tolist()}
print(json.dumps(out))

"""Run by tests/models/kyutai_tts/test_attend_triton.py in the Triton venv with TRITON_INTERPRET=1:
the depth transformer's Triton attention against ``attend_sdpa`` on the CPU, a whole frame
decoded with each, and the voice cross-attention's kernel against ``VoiceBank.attend``'s SDPA.
Prints one JSON object."""

from __future__ import annotations

import json
import os

import torch

assert os.environ.get("TRITON_INTERPRET") == "1"
from models.kyutai_tts.attend_triton import attend_codebook  # noqa: E402
from models.kyutai_tts.conditioning import VoiceBank  # noqa: E402
from models.kyutai_tts.config import TINY  # noqa: E402
from models.kyutai_tts.depformer import PLAIN, AudioSampling, attend_sdpa, decode_frame  # noqa: E402
from models.kyutai_tts.draw_triton import top_k_draw_triton  # noqa: E402
from models.kyutai_tts.lm import KyutaiLM  # noqa: E402
from models.kyutai_tts.sampling import top_k_draw  # noqa: E402

out: dict = {"kernel": {}}
g = torch.Generator().manual_seed(0)
for dt in (torch.float32, torch.float16):
    b, h, d, n = 3, 4, 16, 24
    cache = torch.randn(b, 2, h, n, d, generator=g).to(dt)  # (positions not yet written hold junk)
    ref = cache.clone()
    worst, cache_equal = 0.0, True
    for k in range(n):
        qkv = torch.randn(b, 3, h, d, generator=g).to(dt)
        want = attend_sdpa(qkv, ref, k).float()
        got = attend_codebook(qkv, cache, k).float()
        cache_equal &= torch.equal(cache[:, :, :, :k + 1], ref[:, :, :, :k + 1])
        worst = max(worst, float((got - want).abs().max() / want.abs().max()))
    out["kernel"][str(dt)] = {"rel": worst, "cache_equal": bool(cache_equal)}

torch.manual_seed(1)
lm = KyutaiLM(TINY).eval()
with torch.no_grad():
    for p in lm.parameters():
        p.normal_(0.0, 0.2)
    bsz, n_q = 4, TINY.lm.n_q
    hidden = torch.randn(bsz, TINY.lm.dim, generator=g)
    text = torch.tensor([3, 0, 7, 11])
    noise = -torch.log(-torch.log(torch.rand(n_q, bsz, TINY.lm.card, generator=g)))
    sampling = AudioSampling(25, torch.full((bsz, 1), 0.8), noise, torch.full((bsz, 1), float("inf")))
    sdpa = decode_frame(lm, hidden, text, sampling, n_q)
    triton_codes = decode_frame(lm, hidden, text, sampling, n_q, PLAIN._replace(attend=attend_codebook))
    # (the draw's sort is slow in the interpreter: 2 rows, 3 codebooks)
    few = AudioSampling(250, sampling.divisor[:2], noise[:3, :2], sampling.top_p[:2])
    drawn = [decode_frame(lm, hidden[:2], text[:2], few, 3, fns) for fns in (PLAIN, PLAIN._replace(draw=top_k_draw_triton))]
out["frame_equal"] = bool(torch.equal(sdpa, triton_codes))
out["frame_drawn_equal"] = bool(torch.equal(*drawn))

# The top-k draw (kyutai_sampling=triton) against top_k_draw: the audio card with Kyutai's k of
# 250, widths not a power of two, k over the width; a greedy row; top-p off, 0.9 and 0.3.
draws = {}
for b, v, k in ((2, 2048, 250), (3, 100, 25), (1, 37, 64)):  # (2,048-wide sorts take seconds here)
    logits = torch.randn(b, v, generator=g) * 3
    div = torch.rand(b, 1, generator=g) + 0.5
    noise = -torch.log(-torch.log(torch.rand(b, v, generator=g)))
    noise[0], div[0] = 0.0, 1.0  # a greedy row: its largest logit
    for top_p in (float("inf"), 0.9, 0.3):
        tp = torch.full((b, 1), top_p)
        want, got = top_k_draw(logits, k, div, noise, tp), top_k_draw_triton(logits, k, div, noise, tp)
        draws[f"{b}x{v} k={k} top_p={top_p}"] = [want.tolist(), got.tolist()]
out["draws"] = draws

# A built head with kyutai_sampling=triton (its text draw too) against the same head drawing with
# torch, on the same rows (keep off: the state machine unchanged between the two)
from engine.llm.token_head import RowInputs  # noqa: E402
from models.kyutai_tts.build import build_kyutai_backend  # noqa: E402

backend = build_kyutai_backend("tiny", device="cpu", max_num_seqs=2, max_model_len=128, warmup=False,
                               load_format="dummy", kyutai_n_q=2, kyutai_sampling="triton")
head = backend.runner.head
b = 2
rows = torch.arange(b)
head.reset(rows)
r = RowInputs(temperature=torch.tensor([0.8, 1.2]), top_p=torch.tensor([1.0, 0.9]), repetition_penalty=torch.ones(b),
              seeds=torch.tensor([5, 9]), steps=torch.full((b,), 40), rows=rows, allowed_rows=torch.zeros(b, dtype=torch.int64),
              keep=torch.zeros(b, dtype=torch.bool))
hidden = torch.randn(b, TINY.lm.dim, generator=g)
with torch.no_grad():
    with_triton = head.sample(hidden, r)[0]
    triton_draw, head.triton_draw = head.triton_draw, None
    head.fns = head.fns._replace(draw=top_k_draw)
    with_torch = head.sample(hidden, r)[0]
out["head"] = {"triton_draw": triton_draw is top_k_draw_triton, "equal": bool(torch.equal(with_triton, with_torch)),
               "tokens": with_torch.tolist()}
out["frame_distinct_codes"] = len(set(sdpa.flatten().tolist()))
# The voice cross-attention: 3 bank voices of 40 keys (not a multiple of the kernel's 64), tokens
# spread over blocks of 16 and 32 rows, one voice unused; the same bank read by both paths.
out["cross"] = {}
for dt in (torch.float32, torch.float16):
    layers, voices, length, h, d = 2, 3, 40, 4, 16
    sdpa_bank = VoiceBank(layers, voices, length, h, d, device="cpu", dtype=dt)
    triton_bank = VoiceBank(layers, voices, length, h, d, device="cpu", dtype=dt, attention="triton")
    for bank in (sdpa_bank, triton_bank):
        bank.k = torch.randn(layers, voices, length, h, d, generator=torch.Generator().manual_seed(2)).to(dt)
        bank.v = torch.randn(layers, voices, length, h, d, generator=torch.Generator().manual_seed(3)).to(dt)
    worst = 0.0
    for t, used in ((1, (1,)), (13, (0, 2)), (37, (0, 1, 2)), (70, (2,))):
        rows = torch.tensor(used)[torch.randint(0, len(used), (t,), generator=g)]
        for layer in range(layers):
            q = torch.randn(t, h, d, generator=g).to(dt)
            want = sdpa_bank.attend(layer, q, rows).float()
            got = triton_bank.attend(layer, q, rows).float()
            worst = max(worst, float((got - want).abs().max() / want.abs().max()))
    out["cross"][str(dt)] = {"rel": worst}
try:
    VoiceBank(1, 1, 8, 1, 16, device="cpu", dtype=torch.float32, attention="flash")
except ValueError as e:
    out["cross"]["bad_name"] = str(e)
print(json.dumps(out))

"""Run by tests/models/qwen3_tts/test_conv_triton.py in the Triton venv with TRITON_INTERPRET=1:
the Triton convolution against torch's on the CPU, and the channels-last codec step with it
against the same step with gathered taps. Prints one JSON object of the largest relative errors."""

from __future__ import annotations

import json
import os

import torch
import torch.nn.functional as F

assert os.environ.get("TRITON_INTERPRET") == "1"
from models.qwen3_tts.codec import Codec  # noqa: E402
from models.qwen3_tts.codec_nwc import make_codec_stream, snake  # noqa: E402
from models.qwen3_tts.config import TINY  # noqa: E402
from models.qwen3_tts.conv_triton import conv_taps, taps_weight  # noqa: E402


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.float() - b.float()).abs().max() / b.float().abs().max())


out: dict = {"kernel": {}}
g = torch.Generator().manual_seed(0)
# (rows, outputs, C_in, C_out, taps, dilation, bias, dtype): odd channel counts, dilations of
# the decoder's residual units, one tap block spanning two taps (C_in 24 < the block of 32)
for case in [(3, 5, 24, 40, 7, 3, True, torch.float32), (2, 9, 64, 96, 7, 1, False, torch.float32),
             (1, 4, 16, 8, 3, 9, True, torch.float32), (4, 70, 32, 200, 7, 1, True, torch.float32),
             (2, 12, 32, 48, 7, 1, False, torch.float16)]:
    n_rows, n, c_in, c_out, k, d, bias, dt = case
    full = torch.randn(n_rows, (k - 1) * d + n, c_in, generator=g).to(dt)
    w = torch.randn(c_out, c_in, k, generator=g).to(dt)
    b = torch.randn(c_out, generator=g).to(dt) if bias else None
    want = F.conv1d(full.float().transpose(1, 2), w.float(), None if b is None else b.float(), dilation=d).transpose(1, 2)
    got = conv_taps(full, taps_weight(w), b, n, d)
    assert got.dtype == dt and got.shape == want.shape
    out["kernel"][str(case[:7] + (str(dt),))] = rel(got, want)

# The residual sum and the next SnakeBeta in the epilogue (codec_conv=fused), k = 1 and 7, and
# the first inputs read from the rows' states (codec_conv=fused-state)
out["fused"] = {}
for case in [(3, 5, 24, 40, 7, 3, True, torch.float32), (2, 9, 64, 64, 1, 1, True, torch.float32),
             (2, 12, 32, 48, 7, 1, False, torch.float16)]:
    n_rows, n, c_in, c_out, k, d, bias, dt = case
    full = torch.randn(n_rows, (k - 1) * d + n, c_in, generator=g).to(dt)
    w = torch.randn(c_out, c_in, k, generator=g).to(dt)
    b = torch.randn(c_out, generator=g).to(dt) if bias else None
    alpha = torch.rand(c_out, generator=g).add(0.5).to(dt)
    inv_beta = torch.rand(c_out, generator=g).add(0.5).to(dt)
    res = torch.randn(n_rows, n, c_out, generator=g).to(dt)
    conv = F.conv1d(full.float().transpose(1, 2), w.float(), None if b is None else b.float(), dilation=d).transpose(1, 2)
    summed = (conv + res.float()).to(dt)  # (rounded where the unfused step rounds it)
    want = snake(summed.float(), alpha.float(), inv_beta.float())
    got = conv_taps(full, taps_weight(w), b, n, d, res, snake_out=(alpha, inv_beta))
    assert got.dtype == dt and got.shape == want.shape
    out["fused"][str(case[:7] + (str(dt),))] = rel(got, want)
    if k > 1:  # the first (k - 1) * d inputs read from the rows' slots in a state of 5 slots
        ctx = (k - 1) * d
        states = torch.randn(5, ctx, c_in, generator=g).to(dt)
        slots = torch.randperm(5, generator=g)[:n_rows]
        states[slots] = full[:, :ctx]
        from_state = conv_taps(full[:, ctx:].contiguous(), taps_weight(w), b, n, d, res, state=(states, slots),
                               snake_out=(alpha, inv_beta))
        out["fused"][str(case[:7] + (str(dt), "state"))] = rel(from_state, want)

torch.manual_seed(1)
codec = Codec(TINY.codec)
with torch.no_grad():
    for p in codec.parameters():  # (random weights: a codec initialised with zero codebooks is silent)
        p.normal_(0.0, 0.05)
codec.eval()
codes = torch.randint(0, TINY.codec.codebook_size, (12, TINY.codec.num_quantizers), generator=g)
calls = [0]
_taps = conv_taps


def counted(*args: object, **kw: object) -> torch.Tensor:
    calls[0] += 1
    return _taps(*args, **kw)  # type: ignore[arg-type]


import models.qwen3_tts.conv_triton as conv_triton  # noqa: E402

conv_triton.conv_taps = counted
pcm = {}
with torch.no_grad():
    for conv in ("gemm", "triton", "fused", "fused-state"):
        stream = make_codec_stream(codec, 2, layout="nwc", conv=conv)
        slots = torch.tensor([1])
        stream.reset(slots)
        pcm[conv] = torch.cat([stream.step(slots, codes[t:t + 1])[0] for t in range(len(codes))])
out["codec"] = rel(pcm["triton"], pcm["gemm"])
out["codec_fused"] = rel(pcm["fused"], pcm["gemm"])
out["codec_fused_state"] = rel(pcm["fused-state"], pcm["gemm"])
out["codec_peak"] = float(pcm["gemm"].abs().max())
out["codec_finite"] = bool(torch.isfinite(pcm["triton"]).all())
out["codec_std"] = float(pcm["gemm"].std())
out["triton_calls"] = calls[0]
# The code predictor's one-position attention (code_predictor_attention=triton): a frame's 15
# codebooks with the kernel against the cache writes and SDPA, greedy, and every pass's logits
from models.qwen3_tts.attend_triton import attend_position  # noqa: E402
from models.qwen3_tts.talker import Talker  # noqa: E402

torch.manual_seed(2)
talker = Talker(TINY.talker).eval()
with torch.no_grad():
    for p in talker.parameters():
        p.normal_(0.0, 0.3)
    talker.setup_rope()
    talker.code_predictor.fuse_()
    hidden = torch.randn(3, TINY.talker.hidden_size, generator=g)
    code0 = torch.randn(3, TINY.talker.hidden_size, generator=g)
    runs = {}
    for attend in (None, attend_position):
        talker.code_predictor.attend = attend
        seen: list = []

        def greedy(logits: torch.Tensor, salt: int, seen: list = seen) -> torch.Tensor:
            seen.append(logits)
            return logits.argmax(dim=-1)

        runs[attend is None] = (talker.code_predictor.predict(hidden, code0, greedy), torch.stack(seen))
out["predictor_codes_equal"] = bool(torch.equal(runs[True][0], runs[False][0]))
out["predictor_logits"] = rel(runs[False][1], runs[True][1])
out["predictor_distinct_codes"] = len(set(runs[True][0].flatten().tolist()))
# The codec transformer's attention over each slot's window (codec_attention=triton): the kernel
# alone against the ring writes and ``_attend`` (float32 and float16, grouped queries, a window
# that is not a power of two, rows before and after their window filled, slots out of order),
# then the codec step streamed with it against the step without, slots starting apart
from models.qwen3_tts.codec import _attend  # noqa: E402
from models.qwen3_tts.ring_attend_triton import ring_attend  # noqa: E402

out["ring"] = {}
for n_rows, h, hkv, d, w, dt in [(4, 4, 2, 16, 72, torch.float32), (3, 8, 8, 64, 20, torch.float32),
                                 (4, 4, 2, 16, 72, torch.float16)]:
    slots = torch.tensor([5, 0, 3, 1][:n_rows])
    pos = torch.tensor([0, 7, w - 1, 3 * w + 5][:n_rows])
    k_ring, v_ring = (torch.randn(6, w, hkv, d, generator=g).to(dt) for _ in range(2))
    q = torch.randn(n_rows, 1, h, d, generator=g).to(dt)
    k, v = (torch.randn(n_rows, 1, hkv, d, generator=g).to(dt) for _ in range(2))
    kr, vr = k_ring.clone(), v_ring.clone()
    ring = pos % w
    kr[slots, ring], vr[slots, ring] = k[:, 0], v[:, 0]
    j = torch.arange(w)
    keep = ((pos[:, None] - (pos[:, None] - j[None, :]) % w) >= 0)[:, None, None, :]
    want = _attend(q, kr.index_select(0, slots), vr.index_select(0, slots), keep)
    got = ring_attend(q, k, v, k_ring, v_ring, slots, pos)
    assert got.dtype == dt and got.shape == want.shape
    case = str((n_rows, h, hkv, d, w, str(dt)))
    out["ring"][case] = rel(got, want)
    out["ring"][case + " rings"] = max(rel(k_ring, kr), rel(v_ring, vr))  # (the new key and value written)

starts = {1: 0, 3: 3, 0: 5}  # slot -> the step it starts at; 14 steps: every window wraps
seqs = {slot: torch.randint(0, TINY.codec.codebook_size, (14, TINY.codec.num_quantizers), generator=g)
        for slot in starts}
ring_pcm = {}
with torch.no_grad():
    for att in (None, ring_attend):
        stream = make_codec_stream(codec, 4, layout="nwc", conv="gemm")
        stream.attend = att
        stream.reset(torch.tensor(sorted(starts)))
        got_pcm: dict = {slot: [] for slot in starts}
        for t in range(14):
            live = [slot for slot in (3, 1, 0) if starts[slot] <= t]
            step_codes = torch.stack([seqs[slot][t - starts[slot]] for slot in live])
            audio = stream.step(torch.tensor(live), step_codes)
            for i, slot in enumerate(live):
                got_pcm[slot].append(audio[i])
        ring_pcm[att is None] = torch.cat([torch.cat(got_pcm[slot]) for slot in sorted(starts)])
out["codec_ring"] = rel(ring_pcm[False], ring_pcm[True])
out["codec_ring_std"] = float(ring_pcm[True].std())
print(json.dumps(out))

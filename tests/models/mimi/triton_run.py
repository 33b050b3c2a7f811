"""Run by tests/models/mimi/test_attend_triton.py in the Triton venv with TRITON_INTERPRET=1: the
ring kernel of Mimi's decoder transformer (``mimi_attention=triton``) against the ring writes,
``attend_mask`` and ``attend``, then the streamed decode with it against the decode without.
Prints one JSON object of the largest relative errors."""

from __future__ import annotations

import json
import os

import torch

assert os.environ.get("TRITON_INTERPRET") == "1"
from models.mimi.attend_triton import ring_attend_steps  # noqa: E402
from models.mimi.codec import Mimi  # noqa: E402
from models.mimi.config import TINY  # noqa: E402
from models.mimi.modules import attend, attend_mask  # noqa: E402
from models.mimi.stream import MimiDecodeStream  # noqa: E402


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.float() - b.float()).abs().max() / b.float().abs().max())


out: dict = {"kernel": {}}
g = torch.Generator().manual_seed(0)
# (rows, steps, heads, head size, window, dtype): Mimi's 2 steps a frame and its real shape (8
# heads of 64, a window of 250: four blocks, the last partial), one step, three steps; rows before
# their window filled, at its edge and long after it wrapped; slots out of order
for case in [(4, 2, 2, 16, 6, torch.float32), (3, 2, 8, 64, 250, torch.float32), (4, 1, 2, 16, 6, torch.float32),
             (4, 3, 2, 16, 7, torch.float32), (4, 2, 2, 16, 6, torch.float16)]:
    n_rows, n, h, d, w, dt = case
    slots = torch.tensor([5, 0, 3, 1][:n_rows])
    pos = torch.tensor([0, w - 1, 1, 3 * w + 5][:n_rows])
    k_ring, v_ring = (torch.randn(6, w, h, d, generator=g).to(dt) for _ in range(2))
    # q, k and v as the layer makes them: strided views of one projection
    qkv = torch.randn(n_rows, n, 3, h, d, generator=g).to(dt)
    q, k, v = qkv.unbind(2)
    kr, vr = k_ring.clone(), v_ring.clone()
    q_pos = pos[:, None] + torch.arange(n)
    ring = q_pos % w
    last = q_pos[:, -1:]
    k_pos = last - (last - torch.arange(w)[None]) % w
    rows = slots[:, None].expand(-1, n)
    kr[rows, ring], vr[rows, ring] = k, v
    want = attend(q, kr.index_select(0, slots), vr.index_select(0, slots), q_pos, k_pos, w,
                  attend_mask(q_pos, k_pos, w))
    got = ring_attend_steps(q, k, v, k_ring, v_ring, slots, pos)
    assert got.dtype == dt and got.shape == want.shape
    name = str(case[:5] + (str(dt),))
    out["kernel"][name] = rel(got, want)
    out["kernel"][name + " rings"] = max(rel(k_ring, kr), rel(v_ring, vr))  # (the new keys and values written)

# The streamed decode: tiny Mimi with random weights and codebooks (zeros would make it silent),
# three slots starting at different frames, 11 frames: the window (3 frames) wraps several times
torch.manual_seed(1)
mimi = Mimi(TINY).eval()
with torch.no_grad():
    for p in mimi.parameters():
        p.copy_(torch.randn(p.shape) * 0.3)
    for name, b in mimi.named_buffers():
        if b.is_floating_point():
            b.copy_(torch.rand(b.shape) + 0.5 if "usage" in name else torch.randn(b.shape))
starts = {2: 0, 0: 2, 3: 4}  # slot -> the frame it starts at
frames = 11
codes = {slot: torch.randint(0, TINY.quantizer.bins, (frames, TINY.quantizer.n_q), generator=g) for slot in starts}
pcm = {}
with torch.no_grad():
    for attention in ("sdpa", "triton"):
        stream = MimiDecodeStream(mimi, 4, attention=attention)
        stream.reset(torch.tensor(sorted(starts)))
        got_pcm: dict = {slot: [] for slot in starts}
        for t in range(frames + 4):
            live = [slot for slot in (3, 2, 0) if starts[slot] <= t < starts[slot] + frames]
            step_codes = torch.stack([codes[slot][t - starts[slot]] for slot in live])
            audio = stream.step(torch.tensor(live), step_codes)
            for i, slot in enumerate(live):
                got_pcm[slot].append(audio[i])
        pcm[attention] = torch.cat([torch.cat(got_pcm[slot]) for slot in sorted(starts)])
out["stream"] = rel(pcm["triton"], pcm["sdpa"])
out["stream_std"] = float(pcm["sdpa"].std())
out["stream_finite"] = bool(torch.isfinite(pcm["sdpa"]).all())
print(json.dumps(out))

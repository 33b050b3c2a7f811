"""Measure how streaming SNAC windows deviate from whole-sequence decoding (random weights);
the figures in docs/orpheus.md, "Window and lookahead", come from it.

``python -m models.orpheus.measure_streaming [--frames 16] [--seeds 2]``
"""

from __future__ import annotations

import argparse

import torch

from models.orpheus.codec import SnacDecoder
from models.orpheus.loader import load_snac
from models.orpheus.tokens import SAMPLES_PER_FRAME as F

__all__ = ["main"]

_K = (1, 2, 4)


def _slice(codes: list[torch.Tensor], a: int, b: int) -> list[torch.Tensor]:
    return [c[:, a * k:b * k] for c, k in zip(codes, _K)]


def receptive_field(dec: SnacDecoder, codes: list[torch.Tensor], frame: int) -> tuple[int, int]:
    """(left, right) reach in samples of a change to one frame's codes."""
    other = [c.clone() for c in codes]
    for c, k in zip(other, _K):
        c[:, frame * k:(frame + 1) * k] = (c[:, frame * k:(frame + 1) * k] + 1234) % 4096
    changed = ((dec.decode(other) - dec.decode(codes)).abs()[0] > 0).nonzero()[:, 0]
    return frame * F - int(changed.min()), int(changed.max()) + 1 - (frame + 1) * F


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--frames", type=int, default=16)
    p.add_argument("--seeds", type=int, default=2)
    p.add_argument("--window-frames", type=int, default=8)
    args = p.parse_args(argv)
    dec = SnacDecoder(load_snac(load_format="dummy", seed=0))
    n, w = args.frames, args.window_frames
    lookaheads = (0, 1024, 2048, 3072, 4096, 4352, 4608, 4741, 5120)
    contexts = (0, 1024, 2048, 3072, 4096, 4352, 4608, 4749, 5120)
    right = {m: 0.0 for m in lookaheads}
    left = {c: 0.0 for c in contexts}
    for seed in range(args.seeds):
        g = torch.Generator().manual_seed(seed)
        codes = [torch.randint(0, 4096, (1, n * k), generator=g) for k in _K]
        full = dec.decode(codes)[0]
        print(f"seed {seed}: rms {full.pow(2).mean().sqrt():.3f} peak {full.abs().max():.3f}; "
              f"receptive field (left, right) samples {receptive_field(dec, codes, n // 2)}")
        for end in (n - 4, n - 2):  # window [end - w, end) ends at its newest frame
            win = dec.decode_windows(*_slice(codes, end - w, end), torch.tensor([end - w]))[0]
            base = (end - w) * F
            for m in lookaheads:  # the frame of samples that ends m samples before the edge
                a, b = w * F - m - F, w * F - m
                right[m] = max(right[m], float((win[a:b] - full[base + a:base + b]).abs().max()))
        for s in (2, 4):  # window [s, s + w): left edge cut, right side far from the edge
            win = dec.decode_windows(*_slice(codes, s, s + w), torch.tensor([s]))[0]
            for c in contexts:
                ref = full[s * F + c:s * F + c + F]
                left[c] = max(left[c], float((win[c:c + F] - ref).abs().max()))
    for m, e in right.items():
        print(f"right lookahead {m:5d} samples ({m / F:.2f} frames): max abs error {e:.2e}")
    for c, e in left.items():
        print(f"left context    {c:5d} samples ({c / F:.2f} frames): max abs error {e:.2e}")


if __name__ == "__main__":
    main()

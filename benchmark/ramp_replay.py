"""Replay a bench run's streams with another Orpheus fast-start ramp (no GPU needed).

Each stream's chunks keep their measured receipt times; the chunks of its first frames, if they
have the sizes the measured ramp releases, get the sizes another ramp step would release at the
same frames (both reach the same total once the stateful codec takes over); the player of
``voxgate bench`` is then replayed. What it estimates: the share of streams on time and the
playback start with the other ramp, frame times unchanged. An estimate, not a measurement.

    python -m benchmark.ramp_replay bench.json[.gz] --measured-step 1024 --steps 1536 2048
"""

from __future__ import annotations

import argparse
from typing import Any

from benchmark.bench.metrics import percentile, simulate_player
from benchmark.timeline import load_bench_json
from models.orpheus.codec import StreamingDecoder
from models.orpheus.tokens import SAMPLES_PER_FRAME, TOKENS_PER_FRAME

__all__ = ["ramp_chunk_sizes", "replay_level", "main"]

# The stateful decoder's delay for SNAC 24 kHz (StreamingSnac.delay_samples, from the layers'
# geometry: models.orpheus.snac_stream.stream_delay_samples).
CODEC_DELAY_SAMPLES = 4757


def ramp_chunk_sizes(step: int, *, first_lookahead: int = 1024, delay: int = CODEC_DELAY_SAMPLES
                     ) -> list[int]:
    """Samples released at frames 1, 2, ... until the first whole frame, as
    ``models.orpheus.program.OrpheusProgram`` releases them with a stateful codec: the window
    decoder's ramp (``StreamingDecoder``) while it reaches further than the stateful codec's
    exact output (``k * 2048 - delay`` after k frames), then the latter."""
    ramp = StreamingDecoder(None, first_lookahead_samples=first_lookahead, ramp_step_samples=step)
    sizes: list[int] = []
    emitted = 0
    while not sizes or sizes[-1] != SAMPLES_PER_FRAME:
        ramp.push_frame([0] * TOKENS_PER_FRAME)
        exact_upto = ramp.num_frames * SAMPLES_PER_FRAME - delay
        upto = max(emitted, ramp.num_emitted if ramp.num_emitted > exact_upto else exact_upto)
        sizes.append(upto - emitted)
        emitted = upto
    return sizes


def replay_level(level: dict[str, Any], old: list[int], new: list[int], *,
                 start_buffer_s: float = 0.1, sample_rate: int = 24000) -> dict[str, Any]:
    """On-time share and playback start (p50, ms) over a level's streams with ``new`` in place
    of ``old`` at the start of each stream whose first chunks are ``old``."""
    n = len(old)
    on_time = replaced = 0
    starts: list[float] = []
    streams = level["streams"]
    for s in streams:
        sizes = list(s["chunk_samples"])
        if sizes[:n] == old and len(new) == n:
            sizes[:n] = new
            replaced += 1
        kept = [(t, k) for t, k in zip(s["chunk_t"], sizes) if k > 0]
        player = simulate_player([t for t, _ in kept], [k / sample_rate for _, k in kept],
                                 start_buffer_s=start_buffer_s, is_complete=bool(s["is_ok"]))
        on_time += bool(s["is_ok"]) and player.underruns == 0
        if player.t_play_start is not None and s.get("t_first_text") is not None:
            starts.append(player.t_play_start - s["t_first_text"])
    p50 = percentile(starts, 50)
    return {"level": level["level"], "streams": len(streams), "replaced": replaced,
            "on_time": on_time / len(streams) if streams else 0.0,
            "play_start_p50_ms": None if p50 is None else 1e3 * p50}


def _pad(a: list[int], b: list[int]) -> tuple[list[int], list[int]]:
    """Both lists to the same length, filled with whole frames (the sizes after the ramp)."""
    n = max(len(a), len(b))
    return (a + [SAMPLES_PER_FRAME] * (n - len(a)), b + [SAMPLES_PER_FRAME] * (n - len(b)))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmark.ramp_replay", description=__doc__.split("\n")[0])
    p.add_argument("json", help="a voxgate bench --json file (.gz allowed)")
    p.add_argument("--measured-step", type=int, default=1024, help="the ramp step the run was served with")
    p.add_argument("--steps", type=int, nargs="+", default=[1536], help="ramp steps to replay")
    p.add_argument("--start-buffer-ms", type=float, default=100.0)
    args = p.parse_args(argv)
    if args.measured_step < 1 or any(s < 1 for s in args.steps) or args.start_buffer_ms < 0:
        p.error("ramp steps must be >= 1 and the start buffer >= 0")
    data = load_bench_json(args.json)
    rate = int(data.get("target", {}).get("sample_rate") or 24000)
    buffer_s = args.start_buffer_ms / 1e3
    measured = ramp_chunk_sizes(args.measured_step)
    print(f"measured ramp step {args.measured_step}: first chunks {measured}")
    for step in args.steps:
        old, new = _pad(measured, ramp_chunk_sizes(step))
        print(f"ramp step {step}: first chunks {new}")
        for level in data["levels"]:
            base = replay_level(level, old, old, start_buffer_s=buffer_s, sample_rate=rate)
            alt = replay_level(level, old, new, start_buffer_s=buffer_s, sample_rate=rate)
            print(f"  level {level['level']:g}: {level['num_streams']} streams ({alt['replaced']} with the "
                  f"measured ramp), on time {100 * base['on_time']:.1f}% -> {100 * alt['on_time']:.1f}%, "
                  f"playback start p50 {base['play_start_p50_ms']:.0f} -> {alt['play_start_p50_ms']:.0f} ms")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

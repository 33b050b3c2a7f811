"""How long a full garbage collection stops an engine process, before and after
``engine.gc_heap.freeze_startup_heap`` (what ``voxgate serve`` does once the engine is up).

    python -m benchmark.gc_pause --model hibari --runs 5
    python -m benchmark.gc_pause --model orpheus --load-format dummy --device cuda

Builds and warms up the backend in this process as the engine process does
(``engine.backends.build_backend``), then times ``gc.collect()`` (all generations) ``--runs``
times, freezes the start-up heap, and times it again. Prints the median and the largest pause
and the objects the collector tracks. A full collection also runs on its own while serving,
whenever enough new container objects have survived younger collections.
"""

from __future__ import annotations

import argparse
import gc
import platform
import statistics
import time

from benchmark.args import number_type

__all__ = ["time_collections", "main"]


def time_collections(runs: int) -> list[float]:
    """Seconds each of ``runs`` full collections took."""
    out = []
    for _ in range(runs):
        t = time.perf_counter()
        gc.collect()
        out.append(time.perf_counter() - t)
    return out


def _line(label: str, times: list[float], tracked: int) -> str:
    return (f"{label:<22} full collection {1e3 * statistics.median(times):8.2f} ms median, "
            f"{1e3 * max(times):8.2f} ms max ({len(times)} runs); {tracked:,} objects tracked")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmark.gc_pause", description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="hibari", help="hibari | orpheus | synthetic | a checkpoint path (default hibari)")
    ap.add_argument("--load-format", default="auto", help="auto | dummy (orpheus: random weights)")
    ap.add_argument("--device", default="auto", help="auto | cpu | cuda")
    ap.add_argument("--codec-path", default=None, help="SNAC directory or hub id (orpheus; default the hub's)")
    ap.add_argument("--runs", type=number_type(int, lo=1), default=5, help="collections timed each way (default 5)")
    args = ap.parse_args(argv)

    from engine.backends import build_backend
    from engine.config import EngineConfig
    from engine.gc_heap import freeze_startup_heap

    config = EngineConfig(model=args.model, load_format=args.load_format, device=args.device,
                          codec_path=args.codec_path)
    t = time.perf_counter()
    backend = build_backend(config)
    print(f"{args.model}: built and warmed up in {time.perf_counter() - t:.1f} s on {platform.node()} "
          f"({platform.processor() or platform.machine()}), Python {platform.python_version()}")
    before = time_collections(args.runs)
    print(_line("as loaded", before, len(gc.get_objects())))
    frozen = freeze_startup_heap()
    after = time_collections(args.runs)
    print(_line("start-up heap frozen", after, len(gc.get_objects())) + f", {frozen:,} frozen")
    backend.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""The host's cost of handing a Kyutai step's new text entries to the device state machine:
each writing row's entries copied as it comes (``DeviceMachine.write`` per row: here a stage and
a flush a row; run on a checkout before ``stage`` existed, the old write, the figure quoted in the
docs) against all of them staged and copied once (``stage`` per row, one ``flush``, as the
program does since). Milliseconds a step, medians and p90 of ``--repeat``
steps; docs/performance.md, Kyutai section.

    python -m benchmark.kyutai_entries [--rows 64,256,400] [--share 0.25] [--device cpu|cuda]

``--share``: the rows that pop an entry in a step (a word every four frames or so at 12.5 frames
a second). On ``cuda`` the step ends with a synchronize, so the figure is the host's time plus
whatever the copies made it wait for. On a checkout before ``stage`` existed only the per-row
form runs."""

from __future__ import annotations

import argparse
import platform
import statistics
import time

import torch

from benchmark.args import list_type, number_type
from models.kyutai_tts.device_machine import DeviceMachine
from models.kyutai_tts.machine import Entry, MachineParams

__all__ = ["main", "measure"]


def measure(rows: int, share: float, repeat: int, device: str, staged: bool) -> list[float]:
    """Seconds per step of ``repeat`` steps in which ``share`` of ``rows`` write one word each."""
    params = MachineParams(card=8001, second_stream_ahead=2, max_padding=8, initial_padding=2)
    machine = DeviceMachine(params, rows, device)
    writers = max(1, round(rows * share))
    word = [Entry(tokens=(11, 12, 13), padding=0)]
    times, k = [], 0
    for step in range(repeat + 3):  # three steps' warm-up
        t0 = time.perf_counter()
        for i in range(writers):
            slot = (k + i) % rows
            if staged:
                machine.stage(slot, step, step, word, None)
            else:
                machine.write(slot, step, step, word, None)
        if staged:
            machine.flush()
        if device.startswith("cuda"):
            torch.cuda.synchronize()
        if step >= 3:
            times.append(time.perf_counter() - t0)
        k += writers
    return times


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rows", type=list_type(number_type(int, 1)), default=[64, 256, 400])
    p.add_argument("--share", type=number_type(float, 0.0), default=0.25)
    p.add_argument("--repeat", type=number_type(int, 5), default=50)
    p.add_argument("--device", default="cpu")
    args = p.parse_args(argv)
    forms = [("per row", False)] + ([("staged", True)] if hasattr(DeviceMachine, "stage") else [])
    name = torch.cuda.get_device_name() if args.device.startswith("cuda") else platform.processor() or platform.machine()
    print(f"Kyutai entries to the device machine on {args.device} ({name}), torch {torch.__version__}; "
          f"{args.share:.0%} of rows write a word a step; ms a step, median / p90 of {args.repeat}")
    print(f"{'rows':>6} " + " ".join(f"{f:>18}" for f, _ in forms))
    for rows in args.rows:
        cells = []
        for _, staged in forms:
            t = sorted(measure(rows, args.share, args.repeat, args.device, staged))
            cells.append(f"{1e3 * statistics.median(t):8.3f} / {1e3 * t[int(0.9 * (len(t) - 1))]:7.3f}")
        print(f"{rows:6d} " + " ".join(f"{c:>18}" for c in cells), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

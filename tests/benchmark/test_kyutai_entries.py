"""benchmark.kyutai_entries, and the bound it guards: a Kyutai step's new text entries reach the
device in a fixed number of operators however many rows wrote (one copy per row cost the engine
thread half its time at 400 streams on an H100: docs/performance.md, Kyutai section)."""

from __future__ import annotations

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from benchmark.kyutai_entries import main
from models.kyutai_tts.device_machine import DeviceMachine
from models.kyutai_tts.machine import Entry, MachineParams


class _Count(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.ops = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops += 1
        return func(*args, **(kwargs or {}))


def _ops(writers: int) -> int:
    params = MachineParams(card=161, second_stream_ahead=2, max_padding=5, initial_padding=2)
    machine = DeviceMachine(params, max_slots=128, device="cpu")
    with _Count() as count:
        for slot in range(writers):
            machine.stage(slot, 3, 1, [Entry(tokens=(4, 5), padding=0), Entry(tokens=(), padding=2)], (9, 4))
        machine.flush()
    return count.ops


def test_a_steps_entries_cost_the_same_operators_for_one_row_or_a_hundred() -> None:
    assert _ops(1) == _ops(100) <= 32  # (slices and views count: 26 at this writing)


def test_the_benchmark_prints_both_forms(capsys) -> None:
    assert main(["--rows", "4", "--repeat", "5"]) == 0
    out = capsys.readouterr().out
    assert "per row" in out and "staged" in out and out.strip().splitlines()[-1].split()[0] == "4"

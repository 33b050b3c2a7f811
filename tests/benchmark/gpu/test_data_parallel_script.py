"""benchmark/gpu/data_parallel.sh: its cases are servers voxgate accepts with the engine layouts
they name, and it runs each case, compares them and packs the results within the device's
eight returned files (with a stand-in for h200_serving.sh: no GPU here)."""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from gateway import cli

ROOT = Path(__file__).resolve().parents[3]
SCRIPT = ROOT / "benchmark" / "gpu" / "data_parallel.sh"
# the flags h200_serving.sh gives `voxgate serve` before SERVE_ARGS
SERVING_FLAGS = ["--model", "orpheus", "--load-format", "dummy", "--device", "cuda",
                 "--max-num-seqs", "1024", "--port", "8765", "--log-level", "WARNING"]

pytestmark = pytest.mark.skipif(shutil.which("bash") is None, reason="no bash")


def _plans() -> dict[str, dict[str, str]]:
    """PLAN -> {case name: serve flags}, read from the script."""
    plans = {}
    for plan, cases in re.findall(r'^\s+([\w-]+)\)\s+cases="([^"$]*)"', SCRIPT.read_text(), re.M):
        plans[plan] = dict(entry.split(":", 1) for entry in cases.split(";"))
    return plans


def test_script_is_valid_bash() -> None:
    """`bash -n` finds no syntax error."""
    subprocess.run(["bash", "-n", str(SCRIPT)], check=True)


@pytest.mark.parametrize(("plan", "layouts"), [
    ("one-gpu", {"default": ((), 1, 1), "gpus0": (("0",), 1, 1)}),
    ("shared-gpu", {"gpus0": (("0",), 1, 1), "gpus0x2": (("0",), 2, 2)}),
    ("two-gpu", {"gpus0": (("0",), 1, 1), "gpus01": (("0", "1"), 2, 1)}),
    ("codec-gpu", {"default": ((), 1, 1), "codec1": ((), 1, 1)}),
])
def test_each_case_is_a_server_with_the_layout_it_names(
        plan: str, layouts: dict[str, tuple]) -> None:
    """Each case's flags after h200_serving.sh's give valid configs: (gpus, engines, engines
    sharing a GPU) as the case's name says."""
    cases = _plans()[plan]
    assert set(cases) == set(layouts)
    for name, flags in cases.items():
        args = cli.build_parser().parse_args(["serve", *SERVING_FLAGS, *shlex.split(flags)])
        gateway, engine = cli.configs_from_args(args)
        assert (gateway.gpus, gateway.num_engines, engine.gpu_memory_share) == layouts[name], name
        assert engine.device == "cuda"


_STAND_IN = """#!/usr/bin/env bash
# h200_serving.sh's stand-in: records how it was called, leaves what SUMMARY_ONLY=1 leaves
set -eu
mkdir -p "$1"
echo "$(basename "$1")|$SERVE_ARGS|$SKIP_WHEELS|$SUMMARY_ONLY|$2" >> "$CALLS"
echo "summary of $1" > "$1/summary.txt"
python3 - "$1/bench.json.gz" <<'PY'
import gzip, json, sys
level = {"level": 1, "num_streams": 1, "on_time_fraction": 1.0, "ttfa_ms": {"p50": 100.0, "p90": 150.0},
         "goodput_audio_s_per_s": 1.0, "num_refused": 0}
with gzip.open(sys.argv[1], "wt") as f:
    json.dump({"capacity": 1, "levels": [level]}, f)
PY
"""


def test_a_plan_runs_each_case_then_compares_and_packs_them(tmp_path: Path) -> None:
    """ORDER=reverse runs the cases last to first with their flags (wheels installed by the
    first only); compare.txt names both, and the bench JSONs come back in one tarball."""
    stand_in = tmp_path / "serving.sh"
    stand_in.write_text(_STAND_IN)
    calls, out = tmp_path / "calls.txt", tmp_path / "out"
    env = {**os.environ, "SERVING_SCRIPT": str(stand_in), "CALLS": str(calls), "ORDER": "reverse",
           "SERVE_ARGS": "--admission off",
           "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    done = subprocess.run(["bash", str(SCRIPT), str(out), "one-gpu", "1,8"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    assert calls.read_text().splitlines() == ["gpus0|--gpus 0 --admission off|0|1|1,8",
                                              "default| --admission off|1|1|1,8"]
    compare = (out / "compare.txt").read_text()
    assert "capacity gpus0: 1" in compare and "capacity default: 1, x base 1.00" in compare
    files = sorted(str(p.relative_to(out)) for p in out.rglob("*") if p.is_file())
    assert files == ["bench_json.tgz", "compare.txt", "default/summary.txt", "gpus0/summary.txt"]
    with tarfile.open(out / "bench_json.tgz") as tar:
        assert sorted(tar.getnames()) == ["default/bench.json.gz", "gpus0/bench.json.gz"]


def test_an_unknown_plan_is_refused(tmp_path: Path) -> None:
    """A misspelt PLAN exits 2 naming the plans, before any server starts."""
    done = subprocess.run(["bash", str(SCRIPT), str(tmp_path), "two-gpus"], cwd=ROOT,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "PLAN must be one-gpu, shared-gpu, two-gpu, codec-gpu or custom" in done.stdout


def test_the_plans_docs_deploy_names_are_the_script_s() -> None:
    """Every `data_parallel.sh $OUT PLAN` in docs/deploy.md is a plan of the script."""
    doc = (ROOT / "docs" / "deploy.md").read_text()
    named = set(re.findall(r"data_parallel\.sh \$OUT ([\w-]+)", doc))
    assert named and named <= set(_plans())

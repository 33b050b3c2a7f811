"""benchmark/gpu/h200_serving.sh parses, and every Python module it runs exists."""

from __future__ import annotations

import importlib.util
import re
import shutil
import subprocess
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[3] / "benchmark" / "gpu" / "h200_serving.sh"


def test_script_is_valid_bash() -> None:
    """`bash -n` finds no syntax error."""
    if shutil.which("bash") is None:
        pytest.skip("no bash")
    subprocess.run(["bash", "-n", str(SCRIPT)], check=True)


def test_every_module_the_script_runs_exists() -> None:
    """Each `python3 -m MODULE` in the script names an importable module (none moved away)."""
    modules = set(re.findall(r"python3 -m ([\w.]+)", SCRIPT.read_text()))
    assert {"gateway.cli", "benchmark.timeline", "benchmark.gpu.engine_profile"} <= modules
    assert [m for m in sorted(modules) if m != "pip" and importlib.util.find_spec(m) is None] == []

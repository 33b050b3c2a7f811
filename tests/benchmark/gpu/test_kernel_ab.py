"""benchmark/gpu/kernel_ab.sh parses, every Python module it runs exists and the options its
default variants pass are ones engine_profile takes."""

from __future__ import annotations

import importlib.util
import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
SCRIPT = ROOT / "benchmark" / "gpu" / "kernel_ab.sh"


def test_script_is_valid_bash() -> None:
    if shutil.which("bash") is None:
        pytest.skip("no bash")
    subprocess.run(["bash", "-n", str(SCRIPT)], check=True)


def test_its_modules_and_options_exist() -> None:
    text = SCRIPT.read_text()
    modules = set(re.findall(r"python3 -m ([\w.]+)", text))
    assert {"benchmark.gpu.layer_kernels", "benchmark.gpu.engine_profile"} <= modules
    assert [m for m in sorted(modules) if m != "pip" and importlib.util.find_spec(m) is None] == []
    profile = (ROOT / "benchmark" / "gpu" / "engine_profile.py").read_text()
    (variants,) = re.findall(r'variants=\$\{VARIANTS:-"([^"]+)"\}', text)
    options = set(re.findall(r"(--[\w-]+)", variants)) | set(re.findall(r"engine_profile (?:.*?)(--[\w-]+)", text))
    assert {"--setting", "--kv-write"} <= options
    assert [o for o in sorted(options) if f'"{o}"' not in profile] == []
    settings = set(re.findall(r"--setting (\w+)=", variants))
    assert settings == {"orpheus_silu_mul", "orpheus_rope", "orpheus_norm"}
    build = (ROOT / "models" / "orpheus" / "build.py").read_text()
    assert all(f'ctx.setting("{s}"' in build for s in settings)

"""benchmark/gpu/serve_ab.sh parses, runs h200_serving.sh, and the `voxgate serve` options its
default variants pass exist."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from gateway.cli import build_parser

ROOT = Path(__file__).resolve().parents[3]
SCRIPT = ROOT / "benchmark" / "gpu" / "serve_ab.sh"


def test_script_is_valid_bash() -> None:
    if shutil.which("bash") is None:
        pytest.skip("no bash")
    subprocess.run(["bash", "-n", str(SCRIPT)], check=True)


def test_its_variants_are_serve_options() -> None:
    text = SCRIPT.read_text()
    assert "benchmark/gpu/h200_serving.sh" in text
    (variants,) = re.findall(r'variants=\$\{VARIANTS:-"([^"]+)"\}', text)
    names = [entry.split("=", 1)[0] for entry in variants.split(";")]
    assert names == ["default", "no_kernels", "before"]
    parser = build_parser()
    for entry in variants.split(";"):
        args = entry.split("=", 1)[1].split()
        parser.parse_args(["serve", *args])  # (exits on an unknown option or value)

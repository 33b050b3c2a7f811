"""``benchmark.gpu.kyutai_parts`` on the CPU with the tiny random Kyutai TTS: every part of the step
is timed at each batch size and written to the JSON."""

from __future__ import annotations

import json

import pytest

from benchmark.gpu.kyutai_parts import main

pytestmark = pytest.mark.slow


def test_parts_are_timed_for_each_batch(tmp_path) -> None:
    out = tmp_path / "parts.json"
    assert main(["--model", "kyutai-tts-tiny", "--device", "cpu", "--batch", "1,3", "--iters", "2",
                 "--json", str(out)]) == 0
    rows = json.loads(out.read_text())["rows"]
    assert [r["rows"] for r in rows] == [1, 3]
    for r in rows:
        assert min(r["backbone_ms"], r["head_ms"], r["mimi_ms"]) > 0
        assert r["sum_ms"] == pytest.approx(r["backbone_ms"] + r["head_ms"] + r["mimi_ms"])
        assert r["head_text_ms"] > 0 and r["head_cb0_ms"] > 0 and r["head_unfolded_ms"] > 0

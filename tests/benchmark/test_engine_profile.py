"""``benchmark.engine_profile`` on the CPU with the tiny random Orpheus: the phases are timed
and, with ``--prompts-per-step``, every measured step also carries that many fresh prompts."""

from __future__ import annotations

import json

import pytest

from benchmark.engine_profile import main

pytestmark = pytest.mark.slow


def test_profile_keeps_the_batch_and_adds_prompts_each_step(tmp_path, capsys) -> None:
    out = tmp_path / "profile.json"
    assert main(["--model", "tiny", "--device", "cpu", "--batch", "2", "--steps", "5", "--max-tokens", "400",
                 "--prompts-per-step", "2", "--json", str(out)]) == 0
    data = json.loads(out.read_text())
    assert data["prompts_per_step"] == 2 and data["mixed_graphs"] == "off"
    (row,) = data["results"]
    assert row["batch"] == 2 and row["prompts_per_step"] == 2
    assert row["running_median"] == 4  # the 2 decoding jobs and the 2 prompts of the step just launched
    assert row["median_ms"]["total"] > 0 and row["median_ms"]["launch"] > 0
    assert "2 fresh prompts per step" in capsys.readouterr().out


def test_profile_refuses_a_negative_prompt_count() -> None:
    with pytest.raises(SystemExit):
        main(["--prompts-per-step", "-1"])

"""``benchmark.gpu.engine_profile`` on the CPU with the tiny random Orpheus: the phases are timed
and, with ``--prompts-per-step``, every measured step also carries that many fresh prompts."""

from __future__ import annotations

import json

import pytest

from benchmark.gpu.engine_profile import main

pytestmark = pytest.mark.slow


def test_profile_keeps_the_batch_and_adds_prompts_each_step(tmp_path, capsys) -> None:
    out = tmp_path / "profile.json"
    assert main(["--model", "tiny", "--device", "cpu", "--batch", "2", "--steps", "5", "--max-tokens", "400",
                 "--prompts-per-step", "2", "--kernels", "2", "--json", str(out)]) == 0
    data = json.loads(out.read_text())
    assert data["prompts_per_step"] == 2 and data["mixed_graphs"] == "off"
    (row,) = data["results"]
    assert row["mixed_graphs"] is False
    assert row["batch"] == 2 and row["prompts_per_step"] == 2
    assert row["running_median"] == 4  # the 2 decoding jobs and the 2 prompts of the step just launched
    assert row["median_ms"]["total"] > 0 and row["median_ms"]["launch"] > 0
    printed = capsys.readouterr().out
    assert "2 fresh prompts per step" in printed
    assert "20 steps under torch.profiler, by cpu_time_total" in row["kernel_table"]
    assert "aten::" in row["kernel_table"] and row["kernel_table"] in printed  # the ops, printed too


def test_profile_compares_with_and_without_mixed_graphs_on_one_engine(tmp_path) -> None:
    """``--mixed-graphs compare`` measures each batch twice; on the CPU there are no graphs, so
    both rows run without them (and say so)."""
    out = tmp_path / "profile.json"
    assert main(["--model", "tiny", "--device", "cpu", "--batch", "2", "--steps", "5", "--max-tokens", "400",
                 "--mixed-graphs", "compare", "--json", str(out)]) == 0
    rows = json.loads(out.read_text())["results"]
    assert [r["batch"] for r in rows] == [2, 2] and [r["mixed_graphs"] for r in rows] == [False, False]
    assert [r["async_plan"] for r in rows] == [False, False]
    assert main(["--model", "tiny", "--device", "cpu", "--batch", "2", "--steps", "5", "--max-tokens", "400",
                 "--async-plan", "compare", "--json", str(out)]) == 0  # likewise: no graphs, no plans
    data = json.loads(out.read_text())
    assert data["async_plan"] == "compare" and [r["async_plan"] for r in data["results"]] == [False, False]


def test_profile_refuses_a_negative_prompt_count_and_fp8_on_the_cpu() -> None:
    with pytest.raises(SystemExit):
        main(["--prompts-per-step", "-1"])
    with pytest.raises(ValueError, match="CUDA"):  # engine.llm.fp8: CUDA and bf16 only
        main(["--model", "tiny", "--device", "cpu", "--batch", "1", "--quantization", "fp8"])


def test_profile_serves_a_model_that_takes_its_text_while_it_speaks(tmp_path) -> None:
    """Any LM model, not only Orpheus: the tiny Kyutai TTS (input streaming) keeps its batch
    running through the measured steps (each turn gets its whole text and its end at once)."""
    out = tmp_path / "profile.json"
    assert main(["--model", "kyutai-tts-tiny", "--device", "cpu", "--batch", "3", "--steps", "5",
                 "--json", str(out)]) == 0
    data = json.loads(out.read_text())
    assert data["model"] == "kyutai-tts-tiny"
    (row,) = data["results"]
    assert row["batch"] == 3 and row["running_median"] == 3
    assert row["median_ms"]["launch"] > 0 and row["median_ms"]["audio_in"] > 0  # the codec runs: past the delay


def test_profile_refuses_a_model_the_lm_runtime_does_not_serve() -> None:
    with pytest.raises(SystemExit):
        main(["--model", "synthetic", "--device", "cpu", "--batch", "1"])

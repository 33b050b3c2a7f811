"""``benchmark.host_rows``: each part of the host's work on a step's rows runs and is timed."""

from __future__ import annotations

from benchmark.host_rows import main, measure


def test_every_part_is_timed_and_the_total_is_their_sum() -> None:
    r = measure(16, repeat=3)
    parts = ("codec_in", "codec_out", "outputs", "core_step", "encode")
    assert all(r[p] > 0 for p in parts)
    assert abs(r["total"] - sum(r[p] for p in parts)) < 1e-9
    assert "lm_backend" not in r


def test_a_whole_lm_backend_step_of_a_tiny_program_with_the_device_stubbed() -> None:
    """Every row of a frame program decodes a frame each step (the stub never stops one), and the
    step's host work end to end is the backend's with the core's and the encoding's."""
    r = measure(12, repeat=3, program="qwen3-tts-tiny")
    assert r["lm_backend"] > 0 and r["outputs_a_row"] == 1.0
    assert abs(r["all"] - (r["lm_backend"] + r["core_step"] + r["encode"])) < 1e-9


def test_orpheus_makes_a_frame_every_seventh_row_with_the_device_stubbed() -> None:
    """Orpheus (``tiny``): the stub's tokens are valid audio ids at each row's position, so a
    row's frame completes every seventh step and the core's part counts that often."""
    r = measure(14, repeat=7, program="tiny")
    assert r["lm_backend"] > 0 and abs(r["outputs_a_row"] - 1 / 7) < 0.05


def test_main_prints_a_row_per_row_count(capsys) -> None:
    assert main(["--rows", "8,16", "--repeat", "3", "--program", "none"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert [line.split()[0] for line in out[2:]] == ["8", "16"]


def test_kyutai_runs_with_its_state_machine_stubbed_as_the_device_would() -> None:
    """Kyutai (``kyutai-tts-tiny``): the stub's text inputs come from the device state machine on
    the CPU (the host checks each against its own replay, so a wrong stub fails every row), and
    every row, past the model's delay, decodes a frame each step."""
    r = measure(10, repeat=7, program="kyutai-tts-tiny")
    assert r["lm_backend"] > 0 and r["outputs_a_row"] == 1.0

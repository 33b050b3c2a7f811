"""Tests for gateway.cli: the help a newcomer reads, and the one-line errors for a wrong device."""

from __future__ import annotations

import argparse
import re

import pytest

from engine.config import EngineConfig
from gateway import cli


def _serve_parser() -> argparse.ArgumentParser:
    parser = cli.build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return sub.choices["serve"]


def _options() -> list[argparse.Action]:
    return [a for a in _serve_parser()._actions if a.option_strings and a.dest != "help"]


def _help(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    with pytest.raises(SystemExit) as exc:
        cli.main(argv)
    assert exc.value.code == 0
    return capsys.readouterr().out


def _entries(text: str) -> dict[str, str]:
    """Each option's entry in a help text ("--port PORT  port; ... (default: 8000)"), joined
    onto one line, keyed by its first option string."""
    entries: dict[str, str] = {}
    key = None
    for line in text.splitlines():
        m = re.match(r"^  (-\S+)", line)
        if m:
            key = m.group(1).rstrip(",")
            entries[key] = line.strip()
        elif key and line.startswith("    "):
            entries[key] += " " + line.strip()
        else:
            key = None
    return entries


@pytest.fixture
def serve_help(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setenv("COLUMNS", "100")
    return _help(["serve", "--help"], capsys)


def test_every_serve_option_has_a_description() -> None:
    """No `voxgate serve` flag is left without a help text."""
    missing = [a.option_strings[0] for a in _options() if not (a.help or "").strip()]
    assert missing == []


def test_serve_help_shows_every_default(serve_help: str) -> None:
    """Every flag that takes a value shows its default in --help, the port included."""
    entries = _entries(serve_help)
    for action in _options():
        if action.nargs == 0:  # an on/off flag: its help says what it turns on
            continue
        entry = " ".join(entries[action.option_strings[0]].split())
        unset = {"--codec": "hubertsiuzdak/snac_24khz", "--lora": "none"}  # what a None default means
        shown = unset[action.option_strings[0]] if action.default is None else str(action.default)
        assert re.search(r"\(default: " + re.escape(shown) + r"\)", entry), entry
    assert "(default: 8000)" in entries["--port"]


def test_serve_help_puts_basic_groups_first_and_gpu_tuning_last(serve_help: str) -> None:
    """model, network and limits come before the GPU groups, which hold the H200 tuning flags."""
    heads = [line[:-1] for line in serve_help.splitlines() if re.match(r"^\S.*:$", line)]
    assert heads[:4] == ["options", "model", "network", "limits"]
    assert heads[-2:] == ["engine memory and precision (GPU)", "engine tuning (GPU)"]
    tuning = serve_help[serve_help.index("engine tuning (GPU):"):]
    for flag in ("--max-num-decode-seqs", "--decode-horizon-s", "--async-steps", "--decode-attention"):
        assert flag in tuning
    basic = serve_help[:serve_help.index("engine memory and precision (GPU):")]
    for flag in ("--model", "--device", "--host", "--port", "--max-streams"):
        assert flag in basic


def test_top_level_help_is_plain_text_and_names_tiny(capsys: pytest.CaptureFixture[str]) -> None:
    """`voxgate --help` has no RST markup and shows the commands and the tiny model."""
    text = _help(["--help"], capsys)
    assert "``" not in text and ":ref:" not in text
    assert "serve" in text and "bench" in text
    assert "--model tiny --load-format dummy" in text


def test_model_help_documents_tiny(serve_help: str) -> None:
    """--model's help names every built-in model, tiny with the flag it needs."""
    entry = " ".join(_entries(serve_help)["--model"].split())
    for name in ("hibari", "synthetic", "orpheus", "tiny"):
        assert name in entry
    assert "needs --load-format dummy" in entry


@pytest.fixture
def no_serving(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(coro: object) -> int:
        coro.close()  # type: ignore[attr-defined]
        raise AssertionError("the server was started")

    monkeypatch.setattr(cli, "_run", refuse)


@pytest.mark.parametrize("model", ["hibari", "synthetic"])
def test_device_cuda_with_a_cpu_only_model_is_a_one_line_error(
        model: str, no_serving: None, capsys: pytest.CaptureFixture[str]) -> None:
    """`--device cuda` with hibari or synthetic exits 2 with one line naming the model."""
    assert cli.main(["serve", "--model", model, "--device", "cuda"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1
    assert err[0].startswith("voxgate serve: error: --device cuda") and model in err[0]


def test_device_cuda_without_a_gpu_is_a_one_line_error(
        no_serving: None, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """An Orpheus model with `--device cuda` where torch sees no GPU exits 2 before any engine starts."""
    monkeypatch.setattr(cli, "probe_cuda", lambda: "--device cuda: torch sees no CUDA GPU; use --device cpu")
    argv = ["serve", "--model", "tiny", "--load-format", "dummy", "--device", "cuda"]
    assert cli.main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["voxgate serve: error: --device cuda: torch sees no CUDA GPU; use --device cpu"]


def test_check_device_passes_other_devices_and_a_seen_gpu() -> None:
    """auto and cpu never probe; cuda for an Orpheus model passes when the probe sees a GPU."""
    def fail() -> str:
        raise AssertionError("probed")

    assert cli.check_device(EngineConfig(model="hibari", device="auto"), cuda_probe=fail) is None
    assert cli.check_device(EngineConfig(model="orpheus", device="cpu"), cuda_probe=fail) is None
    assert cli.check_device(EngineConfig(model="orpheus", device="cuda"), cuda_probe=lambda: None) is None


def test_probe_cuda_on_this_machine() -> None:
    """The real probe answers None with a GPU, else one line saying why and what to do."""
    torch = pytest.importorskip("torch")
    answer = cli.probe_cuda()
    if torch.cuda.is_available():
        assert answer is None
    else:
        assert answer is not None and "\n" not in answer
        assert answer.startswith("--device cuda: torch") and "--device cpu" in answer


def test_bad_setting_is_a_one_line_error(no_serving: None, capsys: pytest.CaptureFixture[str]) -> None:
    """A value the config rejects exits 2 with one line, not the whole usage."""
    assert cli.main(["serve", "--port", "70000"]) == 2
    assert capsys.readouterr().err.strip().splitlines() == [
        "voxgate serve: error: port must be in [0, 65535], got 70000"]

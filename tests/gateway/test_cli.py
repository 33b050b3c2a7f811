"""Tests for gateway.cli: the help a newcomer reads, the one-line errors for a wrong device or a
port in use, SIGTERM draining and Ctrl-C with no tracebacks."""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import signal
import socket
import subprocess
import sys
import urllib.error
import urllib.request
from typing import Any

import pytest
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed, InvalidStatus

from engine.config import EngineConfig
from gateway import cli
from gateway.client import VoxgateClient
from tests.conftest import ROOT, VoxgateServer


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


# Flags whose default is said in words: an empty value (none), a path resolved at start, a key
# that --help must not print (it may come from VOXGATE_API_KEY), a size in MiB.
_WORDED_DEFAULTS = {"--api-key", "--allowed-origins", "--allowed-hosts", "--ssl-certfile",
                    "--ssl-keyfile", "--data-dir", "--max-voice-upload-bytes", "--gpus", "--lora",
                    "--compat-voice-map", "--codec-device", "--model-setting", "--prefill-token-buckets"}


def test_serve_help_shows_every_default(serve_help: str) -> None:
    """Every flag that takes a value shows its default in --help, the port included."""
    entries = _entries(serve_help)
    for action in _options():
        if action.nargs == 0:  # an on/off flag: its help says what it turns on
            continue
        entry = " ".join(entries[action.option_strings[0]].split())
        if action.option_strings[0] in _WORDED_DEFAULTS:
            assert "(default" in entry, entry
            continue
        shown = "hubertsiuzdak/snac_24khz" if action.default is None else str(action.default)
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


def test_help_never_wraps_a_flag_at_its_hyphen(serve_help: str) -> None:
    """A flag named in a help text stays whole on one line (no "--load-" / "format")."""
    import re

    assert not re.search(r"--[a-z0-9]+(-[a-z0-9]+)*-\n", serve_help)


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
    argv = ["serve", "--model", "orpheus", "--load-format", "dummy", "--device", "cuda"]
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


def test_admission_flags_map_onto_the_engine_config() -> None:
    """--admission and its settings become EngineConfig.admission (default: queue)."""
    args = cli.build_parser().parse_args([
        "serve", "--model", "synthetic", "--admission", "refuse", "--admission-max-queue", "8",
        "--admission-max-wait-s", "0.25", "--admission-headroom", "0.2",
        "--admission-initial-capacity", "3", "--decode-cap-budget", "0.8"])
    _, engine = cli.configs_from_args(args)
    a = engine.admission
    assert (a.policy, a.max_queue, a.max_wait_s, a.headroom, a.initial_capacity) == ("refuse", 8, 0.25, 0.2, 3)
    assert a.decode_cap_budget == 0.8
    _, default = cli.configs_from_args(cli.build_parser().parse_args(["serve", "--model", "synthetic"]))
    assert default.admission.policy == "queue" and default.admission.initial_capacity == 0
    assert default.admission.decode_cap_budget == -1.0  # the model's (off for every model now)


def test_a_bad_admission_setting_is_a_one_line_error(no_serving: None, capsys: pytest.CaptureFixture[str]) -> None:
    """A headroom of 1 (no time left for streams) exits 2 naming the setting."""
    assert cli.main(["serve", "--model", "synthetic", "--admission-headroom", "1"]) == 2
    assert "admission headroom must be in [0, 1)" in capsys.readouterr().err
    assert cli.main(["serve", "--model", "synthetic", "--decode-cap-budget", "1.5"]) == 2
    assert "decode_cap_budget must be in [0, 1]" in capsys.readouterr().err


def test_light_steps_map_onto_the_engine_and_its_scheduler(no_serving: None, capsys: pytest.CaptureFixture[str]) -> None:
    """--light-steps N becomes EngineConfig.light_steps (default -1: the program's, off) and,
    for a head that names its light steps, the scheduler's; a negative one exits 2."""
    from engine.llm.build import _light_steps
    from engine.llm.program import ServingDefaults

    _, engine = cli.configs_from_args(cli.build_parser().parse_args(["serve", "--model", "synthetic", "--light-steps", "4"]))
    assert engine.light_steps == 4
    _, default = cli.configs_from_args(cli.build_parser().parse_args(["serve", "--model", "synthetic"]))
    assert default.light_steps == -1

    class Head:
        light_until_step, variants = 18, (16, 12)

    assert _light_steps(4, Head(), ServingDefaults(), "cuda") == {
        "light_steps_max": 4, "light_until_step": 18, "light_max_rows": 12, "light_slack_s": 0.05}
    assert _light_steps(4, Head(), ServingDefaults(), "cuda", 0.02)["light_slack_s"] == 0.02
    assert _light_steps(-1, Head(), ServingDefaults(), "cuda") == {}  # no program default yet
    assert _light_steps(-1, Head(), ServingDefaults(light_steps=2), "cpu") == {}  # auto: off on the CPU
    assert _light_steps(4, object(), ServingDefaults(), "cuda") == {}  # a head without light steps
    assert cli.main(["serve", "--model", "synthetic", "--light-steps", "-2"]) == 2
    assert "light_steps must be" in capsys.readouterr().err
    _, slack = cli.configs_from_args(cli.build_parser().parse_args(["serve", "--model", "synthetic", "--light-slack-s", "0.1"]))
    assert slack.light_slack_s == 0.1 and default.light_slack_s == 0.05
    assert cli.main(["serve", "--model", "synthetic", "--light-slack-s", "-1"]) == 2
    assert "light_slack_s must be >= 0" in capsys.readouterr().err


def _health(server: VoxgateServer) -> tuple[int, dict[str, Any]]:
    try:
        with urllib.request.urlopen(server.base_url + "health", timeout=10) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


@pytest.mark.slow
def test_a_port_in_use_is_one_line_and_exit_1_before_the_engine_starts() -> None:
    """With the port taken, serve prints one error line naming the address and exits 1, without
    a traceback and without starting the engine."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        proc = subprocess.run(
            [sys.executable, "-m", "gateway.cli", "serve", "--model", "synthetic", "--port",
             str(port)], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1
    out = proc.stdout + proc.stderr
    assert f"voxgate: error: cannot listen on 127.0.0.1:{port}: Address already in use" in out
    assert "Traceback" not in out and "starting the engine" not in out


@pytest.mark.slow
def test_a_setting_the_model_refuses_is_its_message_without_a_traceback() -> None:
    """A start-up error whose message says what to change (here a row longer than the tiny
    VoxCPM2's RoPE table) is logged as that message, the traceback only at DEBUG; exit 1."""
    proc = subprocess.run(
        [sys.executable, "-m", "gateway.cli", "serve", "--model", "voxcpm2-tiny", "--load-format", "dummy",
         "--device", "cpu", "--max-model-len", "4096", "--port", "0"], cwd=ROOT, capture_output=True, text=True,
        timeout=120)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1, out
    assert ("voxgate: error: the model failed to load: ValueError: --max-model-len 4096 exceeds the model's "
            "1024 positions: pass 1024 or less") in out
    assert "Traceback" not in out and "--log-level DEBUG for the traceback" in out


def test_a_hub_id_not_to_be_had_is_model_unavailable_naming_the_fixes(monkeypatch: pytest.MonkeyPatch) -> None:
    import huggingface_hub

    from engine.backend import ModelUnavailable
    from models.orpheus.loader import resolve_dir

    def offline(*args: Any, **kwargs: Any) -> None:
        raise OSError("Name or service not known")

    monkeypatch.setattr(huggingface_hub, "snapshot_download", offline)
    with pytest.raises(ModelUnavailable, match=r"cannot download hub id 'nobody/nothing'.*hf download nobody/nothing"
                                               r".*--load-format dummy"):
        resolve_dir("nobody/nothing", allow_patterns=["*.json"], what="a model")


async def _stream_until_first_audio(client: VoxgateClient, text: str) -> tuple[Any, int]:
    """A stream speaking ``text`` (flushed, not ended) and the samples of its first chunk."""
    stream = await client.start()
    await stream.send_text(text)
    await stream.flush()  # speak it now; the stream stays open until the test ends it
    async for msg in stream.messages():
        if msg["type"] == "audio":
            return stream, len(msg["pcm"]) // 2
    raise AssertionError(f"no audio: {stream.error}")


@pytest.mark.slow
def test_sigterm_drains_streams_in_flight_and_refuses_new_ones(server_factory: Any) -> None:
    """After SIGTERM /health says draining (503), a new connection gets HTTP 503 with
    Retry-After, a new stream on an open connection gets server_shutdown, and the stream in
    flight goes on (its end is sent after these checks) and finishes with all its audio; then
    the server exits 0 with no traceback."""
    server = server_factory("--model", "synthetic", "--drain-timeout-s", "60")

    async def main() -> None:
        async with VoxgateClient.connect(server.ws_url) as client:
            stream, received = await _stream_until_first_audio(client, "A sentence of two seconds.")
            server.process.send_signal(signal.SIGTERM)
            while _health(server)[1]["status"] != "draining":
                await asyncio.sleep(0.05)  # polling a status endpoint
            assert _health(server)[0] == 503
            with pytest.raises(InvalidStatus) as info:
                async with connect(server.ws_url):
                    pass
            assert info.value.response.status_code == 503 and "Retry-After" in info.value.response.headers
            late = await client.start()
            async for _ in late.messages():
                pass
            assert late.error["code"] == "server_shutdown" and late.error["retryable"]
            await stream.end()
            async for msg in stream.messages():
                received += len(msg["pcm"]) // 2 if msg["type"] == "audio" else 0
            assert stream.done is not None and stream.done["reason"] == "end"
            assert received == stream.done["samples"] > 24000

    asyncio.run(main())
    assert server.process.wait(timeout=30) == 0
    assert not [line for line in server.output if "Traceback" in line]


@pytest.mark.slow
@pytest.mark.parametrize("sig,args", [(signal.SIGTERM, ("--drain-timeout-s", "0.3")),
                                      (signal.SIGINT, ())])
def test_streams_left_at_shutdown_get_server_shutdown_and_1001(server_factory: Any, sig: int,
                                                               args: tuple[str, ...]) -> None:
    """Past the drain timeout (SIGTERM) or at once (Ctrl-C), a stream still speaking gets a
    retryable server_shutdown error and its connection closes with 1001; exit 0, no traceback."""
    server = server_factory("--model", "synthetic", *args)

    async def main() -> None:
        async with connect(server.ws_url + "?encoding=json") as ws:
            await ws.recv()
            await ws.send(json.dumps({"type": "start", "stream": "s"}))
            await ws.send(json.dumps({"type": "text", "stream": "s", "text": "word " * 200}))
            while json.loads(await ws.recv())["type"] != "audio":
                pass
            server.process.send_signal(sig)
            frames = []
            with pytest.raises(ConnectionClosed) as info:
                while True:
                    frames.append(json.loads(await asyncio.wait_for(ws.recv(), 30)))
            assert info.value.rcvd is not None and info.value.rcvd.code == 1001
            errors = [f for f in frames if f["type"] == "error"]
            assert [(e["code"], e["stream"], e["retryable"]) for e in errors] == [
                ("server_shutdown", "s", True)]

    asyncio.run(main())
    assert server.process.wait(timeout=30) == 0
    assert not [line for line in server.output if "Traceback" in line]

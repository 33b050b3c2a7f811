"""Shared fixtures: the real ``voxgate serve`` on port 0, started as a client would find it."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
_URL = re.compile(r"serving on (http://[\d.]+:(\d+)/)")
_START_TIMEOUT_S = 180.0


@dataclass
class VoxgateServer:
    """A running ``voxgate serve`` subprocess."""

    process: subprocess.Popen[str]
    base_url: str
    port: int
    output: list[str] = field(default_factory=list, repr=False)

    @property
    def ws_url(self) -> str:
        return f"ws://127.0.0.1:{self.port}/v1/stream"

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


def start_server(*args: str) -> VoxgateServer:
    """Start ``voxgate serve --port 0 ARGS`` and wait until it prints its URL."""
    cmd = [sys.executable, "-m", "gateway.cli", "serve", "--host", "127.0.0.1", "--port", "0",
           "--log-level", "WARNING", *args]
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    output: list[str] = []
    found = threading.Event()
    url: list[tuple[str, int]] = []

    def pump() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            output.append(line)
            match = _URL.search(line)
            if match and not found.is_set():
                url.append((match.group(1), int(match.group(2))))
                found.set()
        found.set()

    threading.Thread(target=pump, daemon=True).start()
    if not found.wait(_START_TIMEOUT_S) or not url:
        proc.kill()
        raise RuntimeError("voxgate serve did not start:\n" + "".join(output))
    return VoxgateServer(proc, url[0][0], url[0][1], output)


def assert_no_exception_logged(server: VoxgateServer) -> None:
    """Nothing in a stopped server's whole log is an exception or an error."""
    log = "".join(server.output)
    assert "Traceback" not in log and " ERROR " not in log, log[-4000:]


@pytest.fixture(scope="session")
def voxgate_server() -> Iterator[VoxgateServer]:
    """The real server with the embedded default voice, shared by the session's tests."""
    server = start_server()
    yield server
    server.stop()


@pytest.fixture
def server_factory() -> Iterator[Callable[..., VoxgateServer]]:
    """Start extra servers with other arguments; each is stopped after the test."""
    started: list[VoxgateServer] = []

    def factory(*args: str) -> VoxgateServer:
        server = start_server(*args)
        started.append(server)
        return server

    yield factory
    for server in started:
        server.stop()

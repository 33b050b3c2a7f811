"""``voxgate serve`` started by a benchmark in its own process on a free port (port 0), its
output kept, its WebSocket URL read from the line it prints once it serves."""

from __future__ import annotations

import contextlib
import os
import re
import shlex
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

__all__ = ["ServeProcess", "served"]

ROOT = Path(__file__).resolve().parent.parent
_URL = re.compile(r"serving on http://([\d.]+):(\d+)/")


class ServeProcess:
    """``voxgate serve --host 127.0.0.1 --port 0 --log-level WARNING ARGS``; ``url`` is its
    WebSocket endpoint, ``output`` every line it printed. Raises RuntimeError (with the output)
    when it does not serve within ``start_timeout_s``."""

    def __init__(self, args: list[str], start_timeout_s: float, *, stop_timeout_s: float = 30.0) -> None:
        cmd = [sys.executable, "-m", "gateway.cli", "serve", "--host", "127.0.0.1", "--port", "0",
               "--log-level", "WARNING", *args]
        self.stop_timeout_s = stop_timeout_s
        self.proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                     text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})
        self.output: list[str] = []
        found = threading.Event()
        port: list[int] = []

        def pump() -> None:
            assert self.proc.stdout is not None
            for line in self.proc.stdout:
                self.output.append(line)
                if (m := _URL.search(line)) and not port:
                    port.append(int(m.group(2)))
                    found.set()
            found.set()

        threading.Thread(target=pump, daemon=True).start()
        if not found.wait(start_timeout_s) or not port:
            self.stop()
            raise RuntimeError("voxgate serve did not start:\n" + "".join(self.output))
        self.url = f"ws://127.0.0.1:{port[0]}/v1/stream"

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=self.stop_timeout_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


@contextlib.contextmanager
def served(url: str | None, serve_args: str, *, connections: int, start_timeout_s: float,
           gateway_pid: int | None = None) -> Iterator[tuple[str, int | None]]:
    """A tool's server: ``url`` as given (a running one, ``gateway_pid`` its gateway's), or
    ``voxgate serve SERVE_ARGS`` started for the run with room for ``connections`` (stopped
    after). Yields the WebSocket URL and the gateway's pid."""
    if url is not None:
        yield url, gateway_pid
        return
    server = ServeProcess(shlex.split(serve_args) + ["--max-connections", str(connections + 16)], start_timeout_s)
    try:
        yield server.url, server.proc.pid
    finally:
        server.stop()

"""A real HAProxy (Debian's ``haproxy``) on loopback, its configuration generated from
``deploy/haproxy/haproxy.cfg``: the tests' fixture, not part of the server."""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from tests.conftest import ROOT

__all__ = ["TEMPLATE", "Haproxy", "free_port", "render_config", "haproxy_binary", "wait_until"]

TEMPLATE = ROOT / "deploy" / "haproxy" / "haproxy.cfg"
_SERVERS = re.compile(r"^(\s*)# BEGIN servers.*?^\s*# END servers[^\n]*$", re.M | re.S)


def haproxy_binary() -> str | None:
    return shutil.which("haproxy") or next(
        (p for p in ("/usr/sbin/haproxy", "/usr/local/sbin/haproxy") if os.access(p, os.X_OK)), None)


def free_port() -> int:
    """A TCP port free on 127.0.0.1 now (the kernel's pick for port 0)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def render_config(template: str, *, port: int, servers: dict[str, int], socket_path: Path,
                  check_interval: str = "200ms") -> str:
    """The template with its frontend on ``127.0.0.1:port``, the runtime API on
    ``socket_path``, the server lines replaced by ``servers`` (name -> loopback port), a short
    health-check interval (so that a test waits less; the checks are the same) and a maxconn
    that any open-file limit allows."""
    out, n = re.subn(r"^(\s*)bind :8080$", rf"\g<1>bind 127.0.0.1:{port}", template, flags=re.M)
    assert n == 1, "the template's bind line moved"
    out, n = re.subn(r"stats socket \S+", f"stats socket {socket_path}", out)
    assert n == 1, "the template's stats socket moved"
    out, n = re.subn(r"\binter \S+", f"inter {check_interval}", out)
    assert n == 1, "the template's check interval moved"
    out = re.sub(r"^(\s*)maxconn \d+$", r"\g<1>maxconn 1000", out, flags=re.M)
    lines = "\n".join(f"    server {name} 127.0.0.1:{p}" for name, p in servers.items())
    out, n = _SERVERS.subn(lambda m: lines, out)
    assert n == 1, "the template's server block moved"
    return out


@dataclass
class Haproxy:
    """``haproxy -W -db`` (master-worker, foreground) on a generated configuration."""

    process: subprocess.Popen[bytes]
    port: int
    socket_path: Path
    log_path: Path

    @classmethod
    def start(cls, folder: Path, servers: dict[str, int]) -> Haproxy:
        binary = haproxy_binary()
        assert binary is not None
        port = free_port()
        sock = folder / "haproxy.sock"
        cfg = folder / "haproxy.cfg"
        cfg.write_text(render_config(TEMPLATE.read_text(), port=port, servers=servers, socket_path=sock))
        check = subprocess.run([binary, "-c", "-f", str(cfg)], capture_output=True, text=True)
        assert check.returncode == 0, check.stdout + check.stderr
        log = folder / "haproxy.log"
        with log.open("wb") as out:
            proc = subprocess.Popen([binary, "-W", "-db", "-f", str(cfg)], stdout=out,
                                    stderr=subprocess.STDOUT)
        return cls(proc, port, sock, log)

    @property
    def ws_url(self) -> str:
        return f"ws://127.0.0.1:{self.port}/v1/stream"

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def server_states(self) -> dict[str, str]:
        """Each backend server's status from the runtime API (``show stat``): UP, DOWN, ...;
        empty while the socket does not answer yet."""
        try:
            with socket.socket(socket.AF_UNIX) as s:
                s.settimeout(5)
                s.connect(str(self.socket_path))
                s.sendall(b"show stat\n")
                data = b""
                while chunk := s.recv(65536):
                    data += chunk
        except OSError:
            return {}
        lines = data.decode().splitlines()
        if not lines or not lines[0].startswith("# "):
            return {}
        head = lines[0][2:].split(",")
        states = {}
        for line in lines[1:]:
            row = dict(zip(head, line.split(",")))
            if row.get("pxname") == "voxgate" and row.get("svname") not in ("FRONTEND", "BACKEND"):
                states[row["svname"]] = row["status"]
        return states

    def reload(self) -> None:
        """A reload (what `systemctl reload haproxy` does): a new worker takes new connections,
        the old one keeps those it has until they close."""
        self.process.send_signal(signal.SIGUSR2)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


def wait_until(predicate, timeout_s: float = 60.0) -> None:  # noqa: ANN001
    """Poll ``predicate`` every 50 ms (a status, not a synchronising sleep)."""
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, "the condition was not reached in time"
        time.sleep(0.05)

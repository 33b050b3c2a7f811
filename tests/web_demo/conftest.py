"""Headless Chromium through Playwright for the demo page tests (skipped when either is missing)."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]
ARTIFACTS = REPO / "artifacts"

# Flags for Debian's chromium running as root in a container, with no audio device: the
# autoplay policy lets the AudioContext run without a user gesture; audio output then goes to
# Chromium's fake (null) sink and the AudioWorklet still runs on the audio clock.
CHROMIUM_FLAGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
    "--autoplay-policy=no-user-gesture-required",
]


def _chromium_path() -> str | None:
    env = os.environ.get("VOXGATE_CHROMIUM")
    if env:
        return env
    for name in ("chromium", "chromium-browser"):
        found = shutil.which(name)
        if found:
            return found
    return None


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    """One headless Chromium per test module: playwright's sync API runs an event loop on the
    main thread while it is open, and tests that run after it and call ``asyncio.run`` (the
    HAProxy tests, in another order) would find that loop running."""
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        pytest.skip("playwright is not installed (pip install playwright; no browser download needed)")
    path = _chromium_path()
    if path is None:
        pytest.skip("chromium is not installed (apt-get install -y chromium)")
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=path, args=CHROMIUM_FLAGS, headless=True)
        yield browser
        browser.close()


class DemoPage:
    """The demo page in a fresh browser context, with what it logged and requested."""

    def __init__(self, page: Any, base_url: str) -> None:
        self.page = page
        self.base_url = base_url
        self.errors: list[str] = []
        self.requests: list[str] = []
        page.on("pageerror", lambda exc: self.errors.append(str(exc)))
        page.on("console", lambda msg: self.errors.append(msg.text) if msg.type == "error" else None)
        page.on("request", lambda req: self.requests.append(req.url))
        page.on("websocket", lambda ws: self.requests.append(ws.url))

    def open(self) -> DemoPage:
        self.page.goto(self.base_url)
        self.wait("window.voxgateDemo && window.voxgateDemo.stats().ready")
        return self

    def stats(self) -> dict[str, Any]:
        return self.page.evaluate("window.voxgateDemo.stats()")

    def wait(self, js_condition: str, timeout_s: float = 60.0) -> None:
        """Wait until a JavaScript expression is truthy (polled on animation frames)."""
        self.page.wait_for_function(js_condition, timeout=timeout_s * 1000)

    def wait_for_stats_reports(self, n: int) -> None:
        """Wait until the worklet has posted n more stats messages (about 32 ms of audio clock each)."""
        target = self.stats()["statsReports"] + n
        self.wait(f"window.voxgateDemo.stats().statsReports >= {target}")

    def screenshot(self, name: str, *, full_page: bool = False) -> Path:
        """Save a screenshot under artifacts/ (gitignored; CI keeps it as a test artefact)."""
        ARTIFACTS.mkdir(exist_ok=True)
        path = ARTIFACTS / name
        self.page.screenshot(path=str(path), full_page=full_page)
        return path


@pytest.fixture
def demo_factory(browser: Any) -> Iterator[Any]:
    """Open the demo page of a server: demo_factory(base_url, viewport=...) -> DemoPage."""
    contexts: list[Any] = []

    def factory(base_url: str, *, width: int = 1280, height: int = 860) -> DemoPage:
        context = browser.new_context(viewport={"width": width, "height": height}, accept_downloads=True)
        contexts.append(context)
        return DemoPage(context.new_page(), base_url)

    yield factory
    for context in contexts:
        context.close()


@pytest.fixture
def demo(demo_factory: Any, voxgate_server: Any) -> DemoPage:
    """The demo page of the shared real server, connected and with audio ready."""
    return demo_factory(voxgate_server.base_url).open()

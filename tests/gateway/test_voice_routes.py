"""/v1/voices on the real server (synthetic engine, cloning on): register, list, get, use, delete,
restart; refused uploads name their limit and leave nothing behind."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

from gateway.client import StreamFailed, VoxgateClient
from gateway.protocol import output_sample_rates as hello_rates
from tests.conftest import VoxgateServer, start_server
from tests.gateway.audio_files import make_audio, tone

pytestmark = pytest.mark.slow

SAMPLE = make_audio("flac", tone(2.0, 44100, channels=2), 44100)


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("voices-data")


@pytest.fixture(scope="module")
def cloning(data_dir: Path) -> Iterator[VoxgateServer]:
    server = start_server("--model", "synthetic", "--synthetic-cloning", "--data-dir", str(data_dir),
                          "--max-voice-upload-bytes", "600000", "--max-voice-duration-s", "5",
                          "--max-voice-transcript-chars", "40")
    yield server
    server.stop()


def _http(server: VoxgateServer) -> httpx.Client:
    return httpx.Client(base_url=server.base_url.rstrip("/"), timeout=30)


def _register(server: VoxgateServer, name: str = "Alice", data: bytes = SAMPLE,
              **fields: str) -> httpx.Response:
    with _http(server) as http:
        return http.post("/v1/voices", data={"name": name, **fields},
                         files={"file": ("sample.flac", data, "audio/flac")})


def _on_disk(data_dir: Path) -> set[str]:
    folder = data_dir / "voices"
    return {p.name for p in folder.iterdir() if not p.name.startswith("index.sqlite3")} if folder.exists() else set()


async def _speak(url: str, voice: str) -> tuple[dict[str, Any] | None, Any]:
    async with VoxgateClient.connect(url) as client:
        stream = await client.start(voice=voice)
        await stream.send_text("Hello there, this is my own voice. ")
        await stream.end()
        try:
            audio = await stream.collect()
        except StreamFailed as exc:  # the first error (later text gets unknown_stream)
            return exc.error, (stream.ready, None, client.hello)
        return stream.error, (stream.ready, audio, client.hello)


def test_register_list_get_use_and_delete(cloning: VoxgateServer, data_dir: Path) -> None:
    """A FLAC sample registers (201, its fields), is listed and fetched, streams by id and by
    name, and once deleted is gone from the list, the disk and the voices a start can name."""
    response = _register(cloning, transcript="Hello, this is me.")
    assert response.status_code == 201, response.text
    voice = response.json()
    assert response.headers["Location"] == f"/v1/voices/{voice['id']}"
    assert voice["name"] == "Alice" and voice["sample_rate"] == 44100 and voice["has_transcript"]
    assert abs(voice["duration_s"] - 2.0) < 0.05 and voice["transcript"] == "Hello, this is me."
    with _http(cloning) as http:
        listing = http.get("/v1/voices").json()
        assert listing["supports_cloning"] is True and listing["voices"] == ["tone", "noise"]
        assert {"model", "default_voice", "sample_rate", "options"} <= listing.keys()
        assert listing["output_sample_rates"] == hello_rates(listing["sample_rate"])
        summary = {k: voice[k] for k in ("id", "name", "duration_s", "sample_rate",
                                         "has_transcript", "created_at")}
        assert summary in listing["registered"]
        assert http.get(f"/v1/voices/{voice['id']}").json() == voice
    assert f"{voice['id']}.wav" in _on_disk(data_dir)

    for name in (voice["id"], "Alice"):
        error, (ready, audio, hello) = asyncio.run(_speak(cloning.ws_url, name))
        assert error is None and ready["voice"] == voice["id"] and len(audio) > 24000
        assert hello["supports_cloning"] is True
    # the registered voice speaks in its own pitch: not the built-in tone's audio
    _, (_, builtin, _) = asyncio.run(_speak(cloning.ws_url, "tone"))
    assert len(builtin) == len(audio) and not np.array_equal(builtin, audio)

    with _http(cloning) as http:
        assert http.delete(f"/v1/voices/{voice['id']}").status_code == 204
        assert http.get(f"/v1/voices/{voice['id']}").status_code == 404
        assert http.delete(f"/v1/voices/{voice['id']}").json()["error"]["code"] == "unknown_voice"
        assert http.get("/v1/voices").json()["registered"] == []
    assert _on_disk(data_dir) == set()
    error, _ = asyncio.run(_speak(cloning.ws_url, voice["id"]))
    assert error is not None and error["code"] == "unknown_voice"


def _wav(seconds: float, rate: int = 16000, amplitude: float = 0.3) -> bytes:
    return make_audio("wav", tone(seconds, rate, amplitude=amplitude), rate)


def _chunked(data: bytes) -> Iterator[bytes]:
    for start in range(0, len(data), 65536):
        yield data[start:start + 65536]


def _multipart(name: str, data: bytes) -> tuple[bytes, str]:
    request = httpx.Request("POST", "http://x/", data={"name": name},
                            files={"file": ("a.wav", data, "audio/wav")})
    return request.read(), request.headers["Content-Type"]


def test_refused_uploads_name_their_limit_and_leave_nothing(cloning: VoxgateServer,
                                                            data_dir: Path) -> None:
    """Not audio, too short, too long, silent, too large (by Content-Length and while streamed),
    bad name, long transcript, no file, not multipart: each a 4xx naming its limit; afterwards
    no voice is listed and no file is on disk."""
    body, ctype = _multipart("Big", b"\x00" * 700_000)
    cases: list[tuple[int, str, Callable[[httpx.Client], httpx.Response]]] = [
        (415, "not_audio", lambda h: _register(cloning, data=b"this is a text file, not audio")),
        (422, "audio_too_short", lambda h: _register(cloning, data=_wav(0.4))),
        (422, "audio_too_long", lambda h: _register(cloning, data=_wav(6.0, 8000))),
        (422, "audio_silent", lambda h: _register(cloning, data=_wav(2.0, amplitude=0.0))),
        (413, "upload_too_large", lambda h: h.post("/v1/voices", content=body,
                                                   headers={"Content-Type": ctype})),
        (413, "upload_too_large", lambda h: h.post("/v1/voices", content=_chunked(body),
                                                   headers={"Content-Type": ctype})),
        (400, "invalid_name", lambda h: _register(cloning, name="")),
        (400, "invalid_name", lambda h: _register(cloning, name="x" * 65)),
        (400, "invalid_name", lambda h: _register(cloning, name="<script>")),
        (400, "transcript_too_long", lambda h: _register(cloning, transcript="word " * 20)),
        (400, "missing_file", lambda h: h.post("/v1/voices", data={"name": "NoFile"},
                                               files={"other": ("x", b"1")})),
        (415, "unsupported_media_type", lambda h: h.post("/v1/voices", json={"name": "J"})),
    ]
    for status, code, send in cases:
        with _http(cloning) as http:
            response = send(http)
        assert response.status_code == status, (code, response.text)
        error = response.json()["error"]
        assert error["code"] == code and error["retryable"] is False and error["message"]
    with _http(cloning) as http:
        assert http.get("/v1/voices").json()["registered"] == []
    assert _on_disk(data_dir) == set()
    assert not [line for line in cloning.output if "Traceback" in line]


def test_voices_survive_a_restart_and_the_limit_on_their_number(
        server_factory: Callable[..., VoxgateServer], tmp_path: Path) -> None:
    """A voice registered on one server is listed and spoken by a new server on the same data
    dir; with --max-voices 1 a second registration gets 409 too_many_voices."""
    args = ("--model", "synthetic", "--synthetic-cloning", "--data-dir", str(tmp_path),
            "--max-voices", "1")
    first = server_factory(*args)
    voice = _register(first, name="Bob").json()
    first.stop()
    second = server_factory(*args)
    with _http(second) as http:
        assert [v["id"] for v in http.get("/v1/voices").json()["registered"]] == [voice["id"]]
    error, (ready, audio, _) = asyncio.run(_speak(second.ws_url, "Bob"))
    assert error is None and ready["voice"] == voice["id"] and len(audio) > 0
    refused = _register(second, name="Carol")
    assert refused.status_code == 409 and refused.json()["error"]["code"] == "too_many_voices"
    assert len(_on_disk(tmp_path)) == 1


def test_a_model_that_cannot_clone_refuses_registration_and_registered_voices(
        server_factory: Callable[..., VoxgateServer], tmp_path: Path) -> None:
    """Without cloning, POST /v1/voices is 409 cloning_unsupported naming the built-in voices;
    a voice registered earlier (by a model that could) fails its stream with the same code."""
    voice = _register(server_factory("--model", "synthetic", "--synthetic-cloning",
                                     "--data-dir", str(tmp_path)), name="Dana").json()
    plain = server_factory("--model", "synthetic", "--data-dir", str(tmp_path))
    refused = _register(plain, name="Eve")
    assert refused.status_code == 409
    assert refused.json()["error"] == {
        "code": "cloning_unsupported", "retryable": False,
        "message": "model synthetic cannot clone voices; use one of its built-in voices: tone, noise"}
    with _http(plain) as http:
        listing = http.get("/v1/voices").json()
    assert listing["supports_cloning"] is False and listing["registered"][0]["id"] == voice["id"]
    error, _ = asyncio.run(_speak(plain.ws_url, voice["id"]))
    assert error is not None and error["code"] == "cloning_unsupported" and not error["retryable"]

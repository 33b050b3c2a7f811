"""/v1/voices under Hypothesis against the real server (synthetic engine, cloning on): hostile
form fields, files that are or are not audio, any id: a documented 4xx, or a voice registered
(201); never a server error, no exception in the log, and nothing left on disk but the voices
registered."""

from __future__ import annotations

import urllib.parse
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.conftest import VoxgateServer, assert_no_exception_logged, start_server
from tests.gateway.audio_files import make_audio, tone
from tests.gateway.test_voice_routes import _on_disk

pytestmark = pytest.mark.slow

_SETTINGS = settings(max_examples=80, deadline=None, database=None,
                     suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                            HealthCheck.function_scoped_fixture])
_SURROGATES = ("\ud800", "\udfff")
_AUDIO = [make_audio(fmt, tone(1.5, 16000), 16000) for fmt in ("wav", "flac", "mp3", "ogg")]
_registered: list[str] = []


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("voices-fuzz")


@pytest.fixture(scope="module")
def server(data_dir: Path) -> Iterator[VoxgateServer]:
    """A server of its own, so that its whole log can be read once it has stopped."""
    server = start_server("--model", "synthetic", "--synthetic-cloning", "--data-dir", str(data_dir),
                          "--max-voice-upload-bytes", "400000", "--max-voice-duration-s", "5",
                          "--max-voices", "1000")
    yield server
    server.stop()
    assert_no_exception_logged(server)
    assert len(_on_disk(data_dir)) == len(set(_registered)), (sorted(_on_disk(data_dir)), _registered)


def _mangle(data: bytes, how: int, noise: bytes) -> bytes:
    """Audio cut short, with bytes flipped, or bytes alone."""
    if how == 0:
        return data
    if how == 1:
        return data[: max(1, len(data) * len(noise) // 64)]
    if how == 2:
        out = bytearray(data)
        for i, b in enumerate(noise):
            out[(i * 7919 + 44) % len(out)] = b
        return bytes(out)
    return noise


_text = st.one_of(st.text(max_size=70), st.sampled_from(["Alice", "", " ", "x" * 65, "<b>", "a/b"]),
                  st.builds(lambda a, s: a + s, st.text(max_size=4), st.sampled_from(_SURROGATES)))
_files = st.builds(_mangle, st.sampled_from(_AUDIO), st.integers(0, 3), st.binary(max_size=64))


def _form_value(value: str) -> str:
    return value.encode("utf-8", "surrogatepass").decode("utf-8", "replace")


@_SETTINGS
@given(fields=st.fixed_dictionaries({"name": st.one_of(st.sampled_from(["Alice", "Bob 2"]), _text)},
                                    optional={"transcript": _text, "language": _text, "extra": _text}),
       file=st.one_of(st.none(), _files), part=st.sampled_from(["file", "audio", "file"]),
       ctype=st.sampled_from(["audio/wav", "audio/flac", "application/octet-stream", "text/plain", ""]))
def test_registration_answers_any_form(server: VoxgateServer, fields: dict[str, str], file: bytes | None,
                                       part: str, ctype: str) -> None:
    """Any form: 201 with the voice, or a 4xx with a code, a message and ``retryable``."""
    files = {part: ("sample", file, ctype)} if file is not None else None
    data = {k: _form_value(v) for k, v in fields.items()}
    with httpx.Client(base_url=server.base_url.rstrip("/"), timeout=30) as http:
        response = http.post("/v1/voices", data=data, files=files)
    _check(response)
    if response.status_code == 201:
        _registered.append(response.json()["id"])


@_SETTINGS
@given(voice_id=_text, method=st.sampled_from(["GET", "DELETE"]))
def test_any_voice_id_gets_an_answer(server: VoxgateServer, voice_id: str, method: str) -> None:
    """GET and DELETE of any id (quoted into the path): 200/204 for a registered one, else a 4xx."""
    path = "/v1/voices/" + urllib.parse.quote(_form_value(voice_id), safe="")
    with httpx.Client(base_url=server.base_url.rstrip("/"), timeout=30) as http:
        response = http.request(method, path)
    _check(response)
    if method == "DELETE" and response.status_code < 300:
        _registered.remove(urllib.parse.unquote(path.rsplit("/", 1)[1]))


def _check(response: httpx.Response) -> None:
    assert response.status_code < 500, (response.status_code, response.text[:300])
    if response.status_code >= 400:
        error: Any = response.json()["error"]
        assert isinstance(error["code"], str) and error["message"] and isinstance(error["retryable"], bool), error
    else:
        assert response.status_code in (200, 201, 204), response.status_code


"""``/v1/voices``: the model's voices, and registering voices to clone (docs/protocol.md); each
limit is checked before the next step costs more, and a refusal leaves nothing on disk.
"""

from __future__ import annotations

import asyncio
import logging
import re
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from aiohttp import BodyPartReader, web

from gateway import protocol as p
from gateway.audio_decode import ACCEPTED_FORMATS, AudioRejected, check_audio, decode_audio
from gateway.config import GatewayConfig
from gateway.engine_pool import EnginePool
from gateway.http_routes import error_response
from gateway.voice_store import VoiceStore, VoiceStoreFull

__all__ = ["VoiceRoutes"]

log = logging.getLogger("voxgate.voices")

_MAX_UPLOADS = 4
_READ_CHUNK_BYTES = 64 * 1024
# Letters and digits of any script, spaces and a few marks; starts with a letter or digit.
_NAME = re.compile(r"[^\W_][\w .'()-]*")


class _Refused(Exception):
    def __init__(self, response: web.Response) -> None:
        self.response = response


class VoiceRoutes:
    """The handlers of ``/v1/voices`` over one store and the engine's handshake."""

    def __init__(self, config: GatewayConfig, engine: EnginePool,
                 store: VoiceStore | None) -> None:
        self.config = config
        self.engine = engine
        self.store = store  # None: it could not be opened (the log says why)
        self._executor = ThreadPoolExecutor(max_workers=2, thread_name_prefix="voxgate-voices")
        self._uploads = asyncio.Semaphore(_MAX_UPLOADS)

    def add_to(self, router: web.UrlDispatcher) -> None:
        router.add_get("/v1/voices", self.list_voices)
        router.add_post("/v1/voices", self.register)
        router.add_get("/v1/voices/{id}", self.get_voice)
        router.add_delete("/v1/voices/{id}", self.delete_voice)

    def close(self) -> None:
        self._executor.shutdown(wait=True)

    async def _run(self, fn: Any, *args: Any) -> Any:
        return await asyncio.get_running_loop().run_in_executor(self._executor, fn, *args)

    # --- reads -----------------------------------------------------------------------------

    async def list_voices(self, request: web.Request) -> web.Response:
        hello = self.engine.hello
        if hello is None:
            return _engine_unavailable()
        registered = [rec.summary() for rec in self.store.list()] if self.store else []
        return web.json_response({
            "model": hello.model, "voices": hello.voices, "default_voice": hello.default_voice,
            "sample_rate": hello.sample_rate, "options": hello.options,
            "formats": list(p.FORMATS), "output_sample_rates": p.output_sample_rates(hello.sample_rate),
            "supports_cloning": hello.supports_cloning,
            "registered": registered})

    async def get_voice(self, request: web.Request) -> web.Response:
        rec = self.store.get(request.match_info["id"]) if self.store else None
        if rec is None:
            return _unknown(request.match_info["id"])
        return web.json_response(rec.details())

    async def delete_voice(self, request: web.Request) -> web.Response:
        voice_id = request.match_info["id"]
        if self.store is None or not await self._run(self.store.delete, voice_id):
            return _unknown(voice_id)
        log.info("deleted voice %s", voice_id)
        return web.Response(status=204)

    # --- POST ------------------------------------------------------------------------------

    async def register(self, request: web.Request) -> web.Response:
        try:
            self._check_request(request)
            if self._uploads.locked():
                raise _Refused(error_response(
                    429, "too_many_uploads", f"{_MAX_UPLOADS} uploads are being processed; "
                    "retry shortly", retryable=True, headers={"Retry-After": "1"}))
            async with self._uploads:
                return await self._register(request)
        except _Refused as refused:
            if refused.response.status == 413:
                refused.response.force_close()  # the rest of the body is not read
            return refused.response

    def _check_request(self, request: web.Request) -> None:
        """What can be refused before the body is read."""
        cfg = self.config
        if self.store is None:
            raise _Refused(error_response(503, "voice_store_unavailable",
                                          "the voice store could not be opened; see the server log"))
        hello = self.engine.hello
        if hello is None:
            raise _Refused(_engine_unavailable())
        if not hello.supports_cloning:
            raise _Refused(error_response(
                409, "cloning_unsupported", f"model {hello.model} cannot clone voices; use one "
                f"of its built-in voices: {', '.join(hello.voices)}"))
        length = request.content_length
        if length is not None and length > cfg.max_voice_upload_bytes:
            raise _Refused(_too_large(cfg.max_voice_upload_bytes))
        if request.content_type != "multipart/form-data":
            raise _Refused(error_response(
                415, "unsupported_media_type", "send multipart/form-data with the fields "
                "'name', 'file' and optionally 'transcript'"))
        if len(self.store) >= cfg.max_voices:
            raise _Refused(_too_many(cfg.max_voices))

    async def _register(self, request: web.Request) -> web.Response:
        cfg = self.config
        fields = await self._read_form(request)
        name = _check_name(fields.get("name"), cfg.max_voice_name_chars)
        transcript = _check_transcript(fields.get("transcript"), cfg.max_voice_transcript_chars)
        data = fields.get("file")
        if not isinstance(data, bytes) or not data:
            raise _Refused(error_response(400, "missing_file", "the form has no 'file' field: "
                                          f"a voice sample ({', '.join(ACCEPTED_FORMATS.values())})"))
        try:
            audio = await self._run(_decode_and_check, data, cfg)
        except AudioRejected as exc:
            status = 415 if exc.code in ("not_audio", "unsupported_audio_format") else 422
            raise _Refused(error_response(status, exc.code, exc.message)) from None
        try:
            rec = await self._run(self.store.add, name, audio.samples, audio.sample_rate,  # type: ignore[union-attr]
                                  transcript)
        except VoiceStoreFull:
            raise _Refused(_too_many(cfg.max_voices)) from None
        except Exception:
            log.exception("storing a voice failed")
            raise _Refused(error_response(500, "internal", "storing the voice failed; see the "
                                          "server log", retryable=True)) from None
        log.info("registered voice %s (%r, %.2f s at %d Hz)", rec.id, rec.name, rec.duration_s,
                 rec.sample_rate)
        return web.json_response(rec.details(), status=201,
                                 headers={"Location": f"/v1/voices/{rec.id}"})

    async def _read_form(self, request: web.Request) -> dict[str, bytes | str]:
        """The form's fields, counting every byte read against the upload limit."""
        limit = self.config.max_voice_upload_bytes
        total = 0
        fields: dict[str, bytes | str] = {}
        try:
            reader = await request.multipart()
            while (part := await reader.next()) is not None:
                if not isinstance(part, BodyPartReader):  # a nested multipart: not ours
                    raise _Refused(error_response(400, "bad_form", "nested multipart is not accepted"))
                chunks: list[bytes] = []
                while chunk := await part.read_chunk(_READ_CHUNK_BYTES):
                    total += len(chunk)
                    if total > limit:
                        raise _Refused(_too_large(limit))
                    chunks.append(chunk)
                value = b"".join(chunks)
                if part.name == "file":
                    fields["file"] = value
                elif part.name in ("name", "transcript"):
                    try:
                        fields[part.name] = value.decode(part.get_charset(default="utf-8"))
                    except (UnicodeDecodeError, LookupError):
                        raise _Refused(error_response(
                            400, "bad_form", f"the field {part.name!r} is not UTF-8 text")) from None
                # other fields are read (and counted) but ignored
        except ValueError as exc:  # aiohttp: a malformed multipart body
            raise _Refused(error_response(400, "bad_form", f"the form cannot be read: {exc}")) from None
        return fields


def _decode_and_check(data: bytes, cfg: GatewayConfig) -> Any:
    audio = decode_audio(data, max_duration_s=cfg.max_voice_duration_s)
    check_audio(audio, min_duration_s=cfg.min_voice_duration_s,
                min_rms_dbfs=cfg.min_voice_rms_dbfs)
    return audio


def _check_name(name: object, max_chars: int) -> str:
    if not isinstance(name, str) or not name.strip():
        raise _Refused(error_response(400, "invalid_name", "the form needs a 'name' field"))
    name = name.strip()
    if len(name) > max_chars:
        raise _Refused(error_response(400, "invalid_name", f"the name has {len(name)} characters; "
                                      f"at most {max_chars} (--max-voice-name-chars)"))
    if not _NAME.fullmatch(name):
        raise _Refused(error_response(400, "invalid_name", "a name is letters, digits, spaces "
                                      "and - _ . ' ( ), starting with a letter or digit"))
    return name


def _check_transcript(text: object, max_chars: int) -> str | None:
    if not isinstance(text, str):  # absent (the form has only str fields of this name)
        return None
    text = text.strip()
    if len(text) > max_chars:
        raise _Refused(error_response(400, "transcript_too_long", f"the transcript has "
                                      f"{len(text)} characters; at most {max_chars} "
                                      "(--max-voice-transcript-chars)"))
    return text or None


def _too_large(limit: int) -> web.Response:
    return error_response(413, "upload_too_large", f"the upload is larger than {limit} bytes "
                          "(--max-voice-upload-bytes)")


def _too_many(limit: int) -> web.Response:
    return error_response(409, "too_many_voices", f"the server keeps at most {limit} voices "
                          "(--max-voices); delete one first")


def _unknown(voice_id: str) -> web.Response:
    return error_response(404, "unknown_voice", f"no registered voice has the id {voice_id!r}")


def _engine_unavailable() -> web.Response:
    return error_response(503, "engine_unavailable", "the engine is starting or restarting",
                          retryable=True)

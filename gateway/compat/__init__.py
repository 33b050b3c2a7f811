"""The APIs voice agents already speak, on the gateway's port: OpenAI's ``/v1/audio/speech``,
ElevenLabs' and Cartesia's WebSockets and Deepgram's ``/v1/speak``, each an adapter over the
native ``Session`` (docs/compat.md).

``add_to(app, gateway)`` registers their routes, an error middleware that answers refusals on
OpenAI's path in OpenAI's form, and the encoder threads (shut down with the app).
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

from aiohttp import web

from gateway.compat import openai

if TYPE_CHECKING:
    from gateway.server import Gateway

__all__ = ["add_to"]

_ENCODER_THREADS = 2  # MP3/Opus/AAC chunks (PyAV releases the GIL while FFmpeg encodes)


def add_to(app: web.Application, gateway: Gateway) -> None:
    """Register the vendor protocols' routes on ``app`` (call before it starts)."""
    executor = ThreadPoolExecutor(max_workers=_ENCODER_THREADS, thread_name_prefix="voxgate-enc")

    async def shut_down(_: web.Application) -> None:
        executor.shutdown(wait=False, cancel_futures=True)

    app.on_cleanup.append(shut_down)
    app.middlewares.insert(0, _openai_errors)
    speech = openai.SpeechRoute(gateway, executor)
    app.router.add_post(openai.PATH, speech.handle)
    from gateway.compat import cartesia, deepgram, elevenlabs

    elevenlabs.add_routes(app.router, gateway, executor)
    cartesia.add_routes(app.router, gateway, executor)
    deepgram.add_routes(app.router, gateway, executor)


@web.middleware
async def _openai_errors(request: web.Request, handler: Any) -> web.StreamResponse:
    """Refusals on OpenAI's path (API key, Origin, Host, admission, 404/405/413) in its form."""
    if request.path != openai.PATH:
        return await handler(request)
    try:
        response = await handler(request)
    except web.HTTPException as exc:
        return openai.rewrite_error(web.Response(status=exc.status, text=exc.text or exc.reason,
                                                 headers=exc.headers))
    return openai.rewrite_error(response)

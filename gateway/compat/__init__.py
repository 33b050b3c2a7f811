"""The APIs voice agents already speak (OpenAI, ElevenLabs, Cartesia, Deepgram), each an adapter
over the native ``Session`` (docs/compat.md). ``add_to(app, gateway)`` registers their
routes, an error middleware that answers refusals in each vendor's form, and the encoder
threads (shut down with the app).
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any, Callable

from aiohttp import web

from gateway.compat import cartesia, deepgram, elevenlabs, openai

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
    app.middlewares.insert(0, _vendor_errors)
    speech = openai.SpeechRoute(gateway, executor)
    app.router.add_post(openai.PATH, speech.handle)
    elevenlabs.add_routes(app.router, gateway, executor)
    cartesia.add_routes(app.router, gateway, executor)
    deepgram.add_routes(app.router, gateway, executor)


def _rewriter(path: str) -> Callable[[web.StreamResponse], web.StreamResponse] | None:
    """The error form of the vendor whose path this is (``None``: not a vendor's)."""
    if path == openai.PATH:
        return openai.rewrite_error
    if path == deepgram.PATH:
        return deepgram.rewrite_error
    if path in cartesia.PATHS:
        return cartesia.rewrite_error
    if path.startswith(elevenlabs.PREFIX):
        return elevenlabs.rewrite_error
    return None


@web.middleware
async def _vendor_errors(request: web.Request, handler: Any) -> web.StreamResponse:
    """Refusals on a vendor's paths (API key, Origin, Host, admission, 404/405/413) in its
    form."""
    rewrite = _rewriter(request.path)
    if rewrite is None:
        return await handler(request)
    try:
        response = await handler(request)
    except web.HTTPException as exc:
        return rewrite(web.Response(status=exc.status, text=exc.text or exc.reason,
                                    headers=exc.headers))
    return rewrite(response)

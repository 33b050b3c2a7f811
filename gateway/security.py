"""Who may talk to the gateway: Host, Origin and API-key checks, as one aiohttp middleware.
The rules, flags and status codes are in docs/security.md, "Defences".
"""

from __future__ import annotations

import hmac
import ipaddress
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from urllib.parse import urlsplit

from aiohttp import hdrs, web

from gateway.http_routes import error_response

__all__ = ["SecurityPolicy", "security_middleware", "api_key_of", "is_loopback"]

_UNSAFE_METHODS = frozenset({"POST", "PUT", "PATCH", "DELETE"})
_KEY_HEADERS = ("xi-api-key", "x-api-key")

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def is_loopback(host: str) -> bool:
    """``host`` (a bind address or a name) is this machine only."""
    name = host.strip("[]").lower()
    if name == "localhost" or name.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


@dataclass(frozen=True)
class SecurityPolicy:
    api_key: str = ""  # "": no key needed
    allowed_origins: tuple[str, ...] = ()  # besides the server's own; "*": any
    allowed_hosts: tuple[str, ...] = ()  # Host names accepted (lower case)
    allow_loopback_hosts: bool = False  # also any loopback name or address
    metrics_public: bool = False
    stream_path: str = "/v1/stream"
    # paths that need the key (the native API and the vendor protocols: /tts/ is Cartesia's)
    protected_prefixes: tuple[str, ...] = ("/v1/", "/tts/")

    @classmethod
    def for_bind(cls, bind_host: str, *, api_key: str, allowed_origins: tuple[str, ...],
                 allowed_hosts: tuple[str, ...], metrics_public: bool) -> SecurityPolicy:
        """Host checked when bound to loopback (loopback names and ``allowed_hosts``), or when
        ``allowed_hosts`` is given (those and the bind address); else not at all."""
        hosts = tuple(h.strip("[]").lower() for h in allowed_hosts)
        if hosts and bind_host not in ("", "0.0.0.0", "::"):
            hosts = (*hosts, bind_host.strip("[]").lower())
        return cls(api_key=api_key, allowed_origins=tuple(o.rstrip("/") for o in allowed_origins),
                   allowed_hosts=hosts, allow_loopback_hosts=is_loopback(bind_host) if bind_host else False,
                   metrics_public=metrics_public)

    @property
    def checks_host(self) -> bool:
        return self.allow_loopback_hosts or bool(self.allowed_hosts)

    def needs_key(self, path: str) -> bool:
        if not self.api_key:
            return False
        return path.startswith(self.protected_prefixes) or (
            path == "/metrics" and not self.metrics_public)


def api_key_of(request: web.Request) -> str | None:
    """The key a client sent, by whichever convention its SDK uses; ``None`` if none."""
    auth = request.headers.get(hdrs.AUTHORIZATION, "")
    scheme, _, value = auth.partition(" ")
    if scheme.lower() in ("bearer", "token") and value.strip():
        return value.strip()
    for name in _KEY_HEADERS:
        if value := request.headers.get(name, "").strip():
            return value
    return request.query.get("api_key") or None


def _host_allowed(policy: SecurityPolicy, request: web.Request) -> bool:
    host = request.headers.get(hdrs.HOST)
    if not policy.checks_host or host is None:
        return True  # HTTP/1.0 without Host: not a browser, which always sends one
    try:
        name = urlsplit("//" + host).hostname or ""
    except ValueError:
        return False
    return name in policy.allowed_hosts or (policy.allow_loopback_hosts and is_loopback(name))


def _origin_allowed(policy: SecurityPolicy, request: web.Request) -> bool:
    origin = request.headers.get(hdrs.ORIGIN)
    if origin is None:
        return True
    origin = origin.rstrip("/")
    if "*" in policy.allowed_origins or origin in policy.allowed_origins:
        return True
    # The server's own page: the Origin's host and port are the request's Host. The scheme is
    # not compared: behind a TLS proxy the page is https and the request to us plain http.
    own = _without_default_port(request.headers.get(hdrs.HOST, request.host))
    return _without_default_port(origin.partition("://")[2]) == own


def _without_default_port(netloc: str) -> str:
    netloc = netloc.lower()
    for port in (":80", ":443"):
        if netloc.endswith(port):
            return netloc[:-len(port)]
    return netloc


def security_middleware(policy: SecurityPolicy) -> Callable[..., Awaitable[web.StreamResponse]]:
    key = policy.api_key.encode()

    @web.middleware
    async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        if not _host_allowed(policy, request):
            return error_response(403, "host_not_allowed", "this server does not answer to "
                                  "that Host name (--allowed-hosts)")
        path = request.path
        is_upgrade = request.headers.get(hdrs.UPGRADE, "").lower() == "websocket"
        if (path == policy.stream_path or is_upgrade or request.method in _UNSAFE_METHODS) and \
                not _origin_allowed(policy, request):
            return error_response(403, "origin_not_allowed", "requests from the web page at "
                                  f"{request.headers[hdrs.ORIGIN]} are not allowed (--allowed-origins)")
        if policy.needs_key(path):
            given = api_key_of(request)
            if given is None:
                return error_response(401, "unauthorized", "an API key is needed: "
                                      "'Authorization: Bearer <key>', 'X-API-Key', 'xi-api-key' "
                                      "or ?api_key=", headers={"WWW-Authenticate": "Bearer"})
            if not hmac.compare_digest(given.encode(), key):
                return error_response(403, "forbidden", "the API key is not valid")
        return await handler(request)

    return middleware

"""The open-file limit: every connection holds a descriptor, so it bounds the connections. At
start the gateway raises its soft limit to the hard one and lowers ``max_connections`` to what
it leaves after a reserve (docs/security.md).
"""

from __future__ import annotations

import resource

__all__ = ["RESERVED_FDS", "raise_open_file_limit", "connections_allowed"]

RESERVED_FDS = 64
_MAX_SOFT_LIMIT = 1 << 20  # when the hard limit is unlimited


def raise_open_file_limit() -> int:
    """Raise the soft RLIMIT_NOFILE to the hard limit where allowed; return the soft limit."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = _MAX_SOFT_LIMIT if hard == resource.RLIM_INFINITY else hard
    if soft != resource.RLIM_INFINITY and soft < target:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
        except (ValueError, OSError):  # e.g. a hard limit above the kernel's nr_open
            pass
    return _MAX_SOFT_LIMIT if soft == resource.RLIM_INFINITY else soft


def connections_allowed(soft_limit: int) -> int:
    """WebSocket connections that fit beside the reserve (at least one)."""
    return max(1, soft_limit - RESERVED_FDS)

"""Device-to-host copies that do not block: start now, wait when the result is needed."""

from __future__ import annotations

from collections.abc import Callable

import torch

__all__ = ["start_host_copy"]


def start_host_copy(t: torch.Tensor) -> Callable[[], torch.Tensor]:
    """Start copying ``t`` to pinned host memory on the current stream; the returned call waits
    for the copy and gives the host tensor. A tensor not on a CUDA device is returned as is.

    The copy is queued right behind the work that wrote ``t``, so ``t`` may be a view of a
    CUDA graph's output buffer that a later replay overwrites.
    """
    if t.device.type != "cuda":
        return lambda: t
    buf = torch.empty(t.shape, dtype=t.dtype, pin_memory=True)
    buf.copy_(t, non_blocking=True)
    event = torch.cuda.Event()
    event.record()

    def wait() -> torch.Tensor:
        event.synchronize()
        return buf

    return wait

"""Catch, on the CPU, the writes that block the host on CUDA: a value made on the host (a Python
number stored with ``t[i] = v``, or ``torch.tensor(...)``) copied into a tensor with a plain
``copy_``. On a CUDA tensor that is a blocking copy from pageable memory: the host waits for the
step in flight (``t[i] = v`` on a 0-dim view is such a copy; ``t[i].fill_(v)`` launches a fill
kernel and returns). On the CPU both run, so the dispatched operators tell them apart."""

from __future__ import annotations

import weakref
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

__all__ = ["HostCopies"]


class HostCopies(TorchDispatchMode):
    """Within the block, ``found`` lists the destination shapes of blocking copies of host-made values."""

    def __init__(self) -> None:
        super().__init__()
        self._fresh: dict[int, weakref.ref] = {}  # id -> tensor lifted from a host value (ids are reused: check it)
        self.found: list[tuple[int, ...]] = []

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        if func is torch.ops.aten.lift_fresh.default:
            self._fresh[id(out)] = weakref.ref(out)
        elif func is torch.ops.aten.copy_.default and self._is_fresh(args[1]):
            if not (args[2] if len(args) > 2 else kwargs.get("non_blocking", False)):
                self.found.append(tuple(args[0].shape))
        return out

    def _is_fresh(self, t: torch.Tensor) -> bool:
        ref = self._fresh.get(id(t))
        return ref is not None and ref() is t

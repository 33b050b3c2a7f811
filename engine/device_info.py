"""What the engine computes on, in one line, for the ``hello`` frame (and every ``voxgate bench``
JSON): the GPU with its ``nvidia-smi -L`` UUID when this process has used CUDA, else the CPU.
It never initialises CUDA itself.
"""

from __future__ import annotations

import os
import platform
import sys

__all__ = ["describe_device", "cpu_model"]


def cpu_model(cpuinfo: str = "/proc/cpuinfo") -> str:
    """The CPU's model name (Linux's /proc/cpuinfo), else what ``platform`` knows."""
    try:
        with open(cpuinfo, encoding="utf-8", errors="replace") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key.strip() == "model name" and value.strip():
                    return value.strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown CPU"


def _gpu(torch) -> str | None:  # noqa: ANN001
    try:
        if not (torch.cuda.is_available() and torch.cuda.is_initialized()):
            return None
        props = torch.cuda.get_device_properties(torch.cuda.current_device())
    except Exception:  # a broken driver: describe the CPU instead
        return None
    parts = [str(props.name), f"{props.total_memory / 2**30:.0f} GiB"]
    uuid = getattr(props, "uuid", None)
    if uuid:
        parts.append(f"GPU-{uuid}")
    cuda = getattr(torch.version, "cuda", None)
    parts.append(f"torch {torch.__version__}" + (f", CUDA {cuda}" if cuda else ""))
    return ", ".join(parts)


def describe_device() -> str:
    """"NVIDIA H200, 140 GiB, GPU-…, torch 2.11.0, CUDA 13.0" or "cpu: <model>, N cores"."""
    torch = sys.modules.get("torch")  # not imported: this engine has no torch model
    gpu = _gpu(torch) if torch is not None else None
    if gpu is not None:
        return gpu
    return f"cpu: {cpu_model()}, {os.cpu_count()} cores"

"""engine.device_info: the engine's device in one line (hello, bench JSON)."""

from __future__ import annotations

import sys
import types

from engine import device_info


def test_cpu_model_from_cpuinfo_and_fallback(tmp_path) -> None:  # noqa: ANN001
    info = tmp_path / "cpuinfo"
    info.write_text("processor\t: 0\nvendor_id\t: GenuineIntel\nmodel name\t: Intel(R) Xeon(R) Gold 6430\n")
    assert device_info.cpu_model(str(info)) == "Intel(R) Xeon(R) Gold 6430"
    assert device_info.cpu_model(str(tmp_path / "missing"))  # platform's answer, never empty


def _fake_torch(initialized: bool, uuid: str | None = "58a1-c0de") -> types.ModuleType:
    props = types.SimpleNamespace(name="NVIDIA H200", total_memory=140 * 2**30, uuid=uuid)
    cuda = types.SimpleNamespace(is_available=lambda: True, is_initialized=lambda: initialized,
                                 current_device=lambda: 0, get_device_properties=lambda i: props)
    return types.SimpleNamespace(cuda=cuda, version=types.SimpleNamespace(cuda="13.0"), __version__="2.11.0")


def test_gpu_named_only_once_this_process_used_cuda(monkeypatch) -> None:  # noqa: ANN001
    """A process that initialised CUDA names the GPU and its UUID; one that did not (hibari,
    synthetic, a CPU Orpheus) names the CPU, without initialising CUDA."""
    monkeypatch.setitem(sys.modules, "torch", _fake_torch(initialized=True))
    assert device_info.describe_device() == "NVIDIA H200, 140 GiB, GPU-58a1-c0de, torch 2.11.0, CUDA 13.0"
    monkeypatch.setitem(sys.modules, "torch", _fake_torch(initialized=True, uuid=None))
    assert device_info.describe_device() == "NVIDIA H200, 140 GiB, torch 2.11.0, CUDA 13.0"
    monkeypatch.setitem(sys.modules, "torch", _fake_torch(initialized=False))
    assert device_info.describe_device().startswith("cpu: ")
    monkeypatch.delitem(sys.modules, "torch")
    assert device_info.describe_device().endswith(" cores")

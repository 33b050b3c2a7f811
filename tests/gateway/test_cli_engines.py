"""Tests for `voxgate serve --gpus / --engines`: how the flags map onto the configs and the engines
the pool starts, and the one-line errors for layouts that cannot work."""

from __future__ import annotations

import pytest

from gateway import cli
from gateway.engine_pool import engine_specs


def _configs(*argv: str) -> tuple:
    return cli.configs_from_args(cli.build_parser().parse_args(["serve", *argv]))


@pytest.fixture
def no_serving(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(coro: object) -> int:
        coro.close()  # type: ignore[attr-defined]
        raise AssertionError("the server was started")

    monkeypatch.setattr(cli, "_run", refuse)


def test_no_flag_is_one_engine_as_before() -> None:
    """Neither flag: one engine, no GPU pinned, no engine index, the GPU to itself."""
    gateway, engine = _configs("--model", "synthetic")
    assert (gateway.gpus, gateway.num_engines, engine.gpu_memory_share) == ((), 1, 1)
    assert engine.device == "auto"
    assert [(s.gpu, s.env) for s in engine_specs(gateway)] == [("", {})]


def test_gpus_0_is_one_engine_on_gpu_0() -> None:
    """--gpus 0: the one-engine server, pinned to GPU 0, with the GPU to itself."""
    gateway, engine = _configs("--model", "orpheus", "--gpus", "0")
    assert (gateway.gpus, gateway.num_engines, engine.gpu_memory_share) == (("0",), 1, 1)
    assert engine.device == "cuda"
    assert [(s.gpu, s.env) for s in engine_specs(gateway)] == [("0", {"CUDA_VISIBLE_DEVICES": "0"})]


def test_one_engine_per_gpu_listed() -> None:
    """--gpus 0,1: two engines, each seeing only its GPU and named by its index."""
    gateway, engine = _configs("--model", "orpheus", "--gpus", "0, 1")
    assert (gateway.num_engines, engine.gpu_memory_share) == (2, 1)
    assert [s.env for s in engine_specs(gateway)] == [
        {"CUDA_VISIBLE_DEVICES": "0", "VOXGATE_ENGINE_INDEX": "0"},
        {"CUDA_VISIBLE_DEVICES": "1", "VOXGATE_ENGINE_INDEX": "1"}]


def test_several_engines_share_a_gpu_and_split_its_memory() -> None:
    """--gpus 0 --engines 2: both engines on GPU 0, each sizing its cache to half of
    --gpu-memory-utilization."""
    gateway, engine = _configs("--model", "orpheus", "--gpus", "0", "--engines", "2",
                               "--gpu-memory-utilization", "0.8")
    assert (gateway.num_engines, gateway.num_engines_per_gpu) == (2, 2)
    assert (engine.gpu_memory_utilization, engine.gpu_memory_share) == (0.8, 2)
    assert [s.gpu for s in engine_specs(gateway)] == ["0", "0"]


def test_engines_go_round_the_gpus() -> None:
    """--gpus 0,1 --engines 4: engine i on GPU i % 2, so consecutive engines differ."""
    gateway, engine = _configs("--model", "orpheus", "--gpus", "0,1", "--engines", "4")
    assert [s.gpu for s in engine_specs(gateway)] == ["0", "1", "0", "1"]
    assert engine.gpu_memory_share == 2


def test_engines_without_gpus_are_cpu_engines() -> None:
    """--engines 3: three CPU engines (--device cpu), none pinned to a GPU."""
    gateway, engine = _configs("--model", "synthetic", "--engines", "3")
    assert (gateway.num_engines, engine.device, engine.gpu_memory_share) == (3, "cpu", 1)
    assert [s.gpu for s in engine_specs(gateway)] == ["", "", ""]


@pytest.mark.parametrize(("argv", "message"), [
    (["--model", "orpheus", "--gpus", "0", "--device", "cpu"],
     "--gpus runs engines on GPUs; it does not go with --device cpu"),
    (["--model", "orpheus", "--gpus", "0,1,0"],
     "--gpus 0,1,0 lists GPU 0 more than once; for several engines on one GPU use --gpus 0 "
     "--engines N"),
    (["--model", "orpheus", "--gpus", "0,1", "--engines", "3"],
     "--engines 3 with --gpus 0,1: every GPU gets as many engines, so --engines must be a "
     "multiple of 2"),
    (["--model", "orpheus", "--gpus", "0,1", "--engines", "1"], "must be a multiple of 2"),
    (["--model", "orpheus", "--engines", "2", "--device", "cuda"],
     "--engines 2 without --gpus runs CPU engines; on a GPU use --gpus 0 --engines 2"),
    (["--model", "synthetic", "--engines", "-1"], "--engines must be 0"),
    (["--model", "synthetic", "--engines", "65"], "--engines 65: at most 64 engines per server"),
    (["--model", "orpheus", "--gpus", "cuda:0"], "gpus: 'cuda:0' is not a GPU index"),
    (["--model", "hibari", "--gpus", "0"],
     "--gpus runs engines on GPUs, and --model hibari runs on the CPU only"),
    (["--gpus", "0"], "--model hibari runs on the CPU only"),  # the default model
])
def test_a_layout_that_cannot_work_is_a_one_line_error(
        argv: list[str], message: str, no_serving: None,
        capsys: pytest.CaptureFixture[str]) -> None:
    """Each impossible --gpus / --engines / --device combination exits 2 with one line naming
    the flags, before anything starts."""
    assert cli.main(["serve", *argv]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("voxgate serve: error: ")
    assert message in err[0]


def test_gpus_the_probe_cannot_see_are_a_one_line_error(
        no_serving: None, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    """--gpus is probed as listed (each GPU once) and the probe's answer is the error."""
    asked: list[tuple[str, ...]] = []

    def probe(*, gpus: tuple[str, ...] = ()) -> str:
        asked.append(gpus)
        return "torch sees 1 of the 2 GPUs of --gpus 0,1 (nvidia-smi -L lists them)"

    monkeypatch.setattr(cli, "probe_cuda", probe)
    assert cli.main(["serve", "--model", "orpheus", "--gpus", "0,1", "--engines", "4"]) == 2
    assert asked == [("0", "1")]
    assert capsys.readouterr().err.strip() == (
        "voxgate serve: error: torch sees 1 of the 2 GPUs of --gpus 0,1 (nvidia-smi -L lists them)")


def test_engines_help_says_how_they_share_gpus(capsys: pytest.CaptureFixture[str],
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """--help explains --gpus 0 --engines 2 and the split of --gpu-memory-utilization."""
    monkeypatch.setenv("COLUMNS", "100")
    with pytest.raises(SystemExit):
        cli.main(["serve", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "--gpus 0 --engines 2: two engines sharing GPU 0" in text
    assert "engines sharing a GPU (--gpus 0 --engines 2) split it evenly" in text

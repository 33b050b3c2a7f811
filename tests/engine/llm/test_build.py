"""build_orpheus_backend: loads a local HF checkpoint + SNAC dir, warms up, and serves a job."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from engine.backend import OptionError
from tests.engine.llm.conftest import drain


@pytest.fixture(scope="module")
def small_snac_dir(tmp_path_factory):
    """A random narrow SNAC 24 kHz in the snac package's directory format."""
    import snac

    from models.orpheus.loader import SNAC_24KHZ_CONFIG

    d = tmp_path_factory.mktemp("snac_small")
    cfg = {**SNAC_24KHZ_CONFIG, "decoder_dim": 64, "encoder_dim": 8}
    torch.manual_seed(0)
    torch.save(snac.SNAC(**cfg).state_dict(), d / "pytorch_model.bin")
    (d / "config.json").write_text(json.dumps(cfg))
    return d


def test_build_serve_and_validate_on_cpu(llm_tiny_dir, small_snac_dir):
    """The built backend announces Orpheus' voices, rejects bad options, and streams audio."""
    from models.orpheus.build import build_orpheus_backend

    backend = build_orpheus_backend(
        str(llm_tiny_dir), device="cpu", codec_path=str(small_snac_dir), max_num_seqs=2, max_model_len=128,
    )
    assert backend.info.sample_rate == 24000 and "tara" in backend.info.voices
    assert backend.runner.scratch_page == backend.scheduler.allocator.num_pages
    assert backend.scheduler.config.hold_undue_prompts is False  # off unless asked
    assert backend.default_decode_cap_budget == 0.0  # no measured cap on the CPU
    with pytest.raises(OptionError, match="voices"):
        backend.validate("nobody", {})
    with pytest.raises(OptionError, match="top_p"):
        backend.validate("tara", {"top_p": 3})
    voice, opts = backend.validate("leo", {"max_tokens": 28, "seed": 1})
    backend.add_job(1, "hello world", voice, opts)
    outs = drain(backend)
    assert outs[-1].is_finished and not any(o.error for o in outs)
    pcm = np.concatenate([o.pcm for o in outs if o.pcm is not None])
    assert pcm.dtype == np.float32 and pcm.size % 2048 == 0 and pcm.size > 0
    backend.close()
    assert not backend.has_work()


def test_ramp_settings_resolve_per_device():
    """ramp_step_samples 0 (auto): 1024, plus the loaded 1536 on CUDA only; a given step is fixed."""
    from models.orpheus.build import _ramp_steps

    assert _ramp_steps(0, "cuda") == {"ramp_step_samples": 1024, "loaded_ramp_step_samples": 1536}
    assert _ramp_steps(0, "cpu") == {"ramp_step_samples": 1024, "loaded_ramp_step_samples": None}
    assert _ramp_steps(2048, "cuda") == {"ramp_step_samples": 2048, "loaded_ramp_step_samples": None}


def test_async_steps_resolve_auto_to_the_graph_runner_only():
    """async_steps "auto": on when the runner replays CUDA graphs, off otherwise; on/off and
    booleans as given; anything else is refused (also by EngineConfig)."""
    from types import SimpleNamespace

    import pytest

    from engine.config import EngineConfig
    from engine.llm.build import _resolve_async

    graphs, plain = SimpleNamespace(use_graphs=True), SimpleNamespace()
    assert _resolve_async("auto", graphs) is True and _resolve_async("auto", plain) is False
    assert _resolve_async("on", plain) is True and _resolve_async("off", graphs) is False
    assert _resolve_async(True, plain) is True and _resolve_async(False, graphs) is False
    with pytest.raises(ValueError):
        _resolve_async("yes", plain)
    with pytest.raises(ValueError):
        EngineConfig(async_steps="yes")


def test_prefill_batching_resolves_auto_by_the_runner_s_graphs():
    """Prompts wait for company only when each has a replay of its own (prefill graphs without
    mixed graphs); explicit values are kept."""
    from types import SimpleNamespace

    from engine.llm.build import _prefill_batching
    from models.orpheus.build import AUTO_PREFILL_BATCH_CUDA, AUTO_PREFILL_WAIT_S_CUDA, ORPHEUS_DEFAULTS

    separate = SimpleNamespace(prefill_graphs=object(), mixed_graphs=None)
    mixed = SimpleNamespace(prefill_graphs=object(), mixed_graphs=object())
    plain = SimpleNamespace()
    assert _prefill_batching(-1.0, -1, separate, ORPHEUS_DEFAULTS) == (AUTO_PREFILL_WAIT_S_CUDA, AUTO_PREFILL_BATCH_CUDA)
    assert _prefill_batching(-1.0, -1, mixed) == (0.0, 0)
    assert _prefill_batching(-1.0, -1, plain) == (0.0, 0)
    assert _prefill_batching(0.01, 3, mixed) == (0.01, 3)


@pytest.mark.parametrize("flag, name, default", [("--hold-undue-prompts", "hold_undue_prompts", "off"),
                                                  ("--async-plan", "async_plan", "on")])
def test_cli_on_off_switches_reach_the_engine_config(flag, name, default):
    """voxgate serve --hold-undue-prompts (off by default) / --async-plan (on by default)
    on|off reach EngineConfig; other values are refused by the parser and the config."""
    from engine.config import EngineConfig
    from gateway.cli import build_parser, configs_from_args

    parser = build_parser()
    _, eng = configs_from_args(parser.parse_args(["serve", "--model", "orpheus"]))
    assert getattr(eng, name) == default
    other = "off" if default == "on" else "on"
    _, eng = configs_from_args(parser.parse_args(["serve", "--model", "orpheus", flag, other]))
    assert getattr(eng, name) == other
    with pytest.raises(SystemExit):
        parser.parse_args(["serve", flag, "auto"])
    with pytest.raises(ValueError, match=name):
        EngineConfig(**{name: "yes"})


@pytest.mark.parametrize("flag, name, default, others, bad, refusal", [
    ("--decode-attention", "decode_attention", "auto", ("cuda-cores", "tensor-cores", "triton"), "tensor",
     "decode_attention must be one of auto, cuda-cores, tensor-cores, triton"),
    ("--sampler-kernel", "sampler_kernel", "auto", ("torch", "triton"), "cuda",
     "sampler_kernel must be auto, torch or triton"),
    ("--kv-write", "kv_write", "auto", ("index", "triton"), "scatter", "kv_write must be one of auto, index, triton"),
])
def test_cli_choices_reach_the_engine_config(flag, name, default, others, bad, refusal):
    """voxgate serve --decode-attention auto (default) | cuda-cores | tensor-cores | triton,
    --sampler-kernel auto (default) | torch | triton and --kv-write auto (default) | index | triton
    reach EngineConfig; other values are refused by the parser and the config."""
    from engine.config import EngineConfig
    from gateway.cli import build_parser, configs_from_args

    parser = build_parser()
    _, eng = configs_from_args(parser.parse_args(["serve", "--model", "orpheus"]))
    assert getattr(eng, name) == default
    for value in others:
        _, eng = configs_from_args(parser.parse_args(["serve", "--model", "orpheus", flag, value]))
        assert getattr(eng, name) == value
    with pytest.raises(SystemExit):
        parser.parse_args(["serve", flag, bad])
    with pytest.raises(ValueError, match=refusal):
        EngineConfig(**{name: bad})


def test_prefill_token_buckets_reach_the_engine_config_and_bad_ones_are_refused():
    """voxgate serve --prefill-token-buckets 32,64,192 reaches EngineConfig (default (): the
    runner's own); counts not increasing, below 1 or not numbers are refused by the parser and
    the config; the build keeps those within max_model_len and refuses a list with none."""
    from engine.config import EngineConfig
    from engine.llm.build import _prefill_buckets
    from gateway.cli import build_parser, configs_from_args

    parser = build_parser()
    _, eng = configs_from_args(parser.parse_args(["serve", "--model", "orpheus"]))
    assert eng.prefill_token_buckets == ()
    _, eng = configs_from_args(parser.parse_args(["serve", "--model", "orpheus",
                                                  "--prefill-token-buckets", "32,64,192,256"]))
    assert eng.prefill_token_buckets == (32, 64, 192, 256)
    for bad in ("64,32", "0,32", "32,32", "32,x", ""):
        with pytest.raises(SystemExit):
            parser.parse_args(["serve", "--prefill-token-buckets", bad])
    for bad in ((64, 32), (0, 32), (32, 32)):
        with pytest.raises(ValueError, match="prefill_token_buckets must be token counts"):
            EngineConfig(prefill_token_buckets=bad)
    assert _prefill_buckets((), 2048) is None
    assert _prefill_buckets((32, 96, 192, 512), 256) == [32, 96, 192]
    assert _prefill_buckets((), 256, (32, 48, 512)) == [32, 48]  # the program's, for ()
    assert _prefill_buckets((64,), 256, (32, 48, 512)) == [64]  # the setting's over it
    with pytest.raises(ValueError, match="none is within max_model_len=128"):
        _prefill_buckets((192, 256), 128)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_prefill_token_buckets_reach_the_prefill_graphs_and_serve(llm_fi_dir, small_snac_dir):
    """On CUDA the setting is the prefill graphs' token counts (those within max_model_len; by
    default the program's own: Orpheus's finer counts), and a prompt is served with either."""
    from engine.config import EngineConfig
    from models.orpheus.build import build_orpheus_backend

    for asked, expected in (((), (32, 64, 96, 128, 192, 256)), ((32, 48, 96, 512), (32, 48, 96))):
        backend = build_orpheus_backend(str(llm_fi_dir), config=EngineConfig(prefill_token_buckets=asked),
                                        device="cuda", codec_path=str(small_snac_dir), max_num_seqs=4,
                                        max_model_len=256)
        assert backend.runner.prefill_graphs.buckets == expected
        voice, opts = backend.validate("leo", {"max_tokens": 14, "seed": 1})
        backend.add_job(1, "a prompt served through the prefill graphs", voice, opts)
        assert not any(o.error for o in drain(backend))
        backend.close()


def test_hold_undue_prompts_reaches_the_scheduler(llm_tiny_dir, small_snac_dir):
    """EngineConfig(hold_undue_prompts="on") reaches the built scheduler. (--async-plan reaches
    the CUDA-graph runner, on a GPU only: tests/engine/llm/test_gpu.py.)"""
    from engine.config import EngineConfig
    from models.orpheus.build import build_orpheus_backend

    backend = build_orpheus_backend(str(llm_tiny_dir), config=EngineConfig(hold_undue_prompts="on"), device="cpu",
                                    codec_path=str(small_snac_dir), max_num_seqs=2, max_model_len=128, warmup=False)
    assert backend.scheduler.config.hold_undue_prompts is True
    backend.close()



def test_on_the_cpu_auto_keeps_the_torch_kv_write_for_a_program_that_prefers_triton(llm_tiny_dir, small_snac_dir) -> None:
    """Orpheus names the Triton KV write; a CPU backend built with the defaults writes with
    index_put (the process-wide choice ``attention._kv_write``), and with the config's "auto"."""
    from engine.config import EngineConfig
    from engine.llm import attention
    from models.orpheus.build import build_orpheus_backend

    attention.set_kv_write("index")
    backend = build_orpheus_backend(str(llm_tiny_dir), config=EngineConfig(), device="cpu",
                                    codec_path=str(small_snac_dir), max_num_seqs=2, max_model_len=128, warmup=False)
    try:
        assert attention._kv_write == "index"
    finally:
        backend.close()


def test_auto_decode_cap_by_device_and_weights() -> None:
    """-1 picks the program's cap: Orpheus's ceiling of 512 on CUDA (under its measured-cap
    budget), 448 with fp8 weights, none on the CPU; a given cap (0 = none) is kept."""
    from engine.llm.build import auto_decode_cap
    from models.orpheus.build import AUTO_DECODE_CAP_CUDA, AUTO_DECODE_CAP_CUDA_FP8, ORPHEUS_DEFAULTS

    assert (AUTO_DECODE_CAP_CUDA, AUTO_DECODE_CAP_CUDA_FP8) == (512, 448)
    assert auto_decode_cap(-1, "cuda", False, ORPHEUS_DEFAULTS) == 512
    assert auto_decode_cap(-1, "cuda", True, ORPHEUS_DEFAULTS) == 448
    assert auto_decode_cap(-1, "cpu", False, ORPHEUS_DEFAULTS) == 0
    assert auto_decode_cap(0, "cuda", True) == 0 and auto_decode_cap(200, "cuda", True) == 200


def test_auto_decode_cap_budget_is_the_programs_on_cuda_only() -> None:
    """The backend's ``default_decode_cap_budget`` (the engine core's for decode_cap_budget -1):
    the program's fraction on CUDA, its fp8 one with fp8 weights, off on the CPU; Orpheus's
    0.85 with bf16 weights, off with fp8 (its constant cap of 448 stands)."""
    from engine.llm.build import auto_decode_cap_budget
    from engine.llm.program import ServingDefaults
    from models.orpheus.build import ORPHEUS_DEFAULTS

    d = ServingDefaults(decode_cap_budget=0.85, decode_cap_budget_fp8=0.9)
    assert auto_decode_cap_budget("cuda", False, d) == 0.85 and auto_decode_cap_budget("cuda", True, d) == 0.9
    assert auto_decode_cap_budget("cpu", False, d) == 0.0
    assert auto_decode_cap_budget("cuda", False, ORPHEUS_DEFAULTS) == 0.85
    assert auto_decode_cap_budget("cuda", True, ORPHEUS_DEFAULTS) == 0.0
    assert auto_decode_cap_budget("cpu", False, ORPHEUS_DEFAULTS) == 0.0
    with pytest.raises(ValueError, match="ServingDefaults.decode_cap_budget_fp8 must be in"):
        ServingDefaults(decode_cap_budget_fp8=-1.0)
    with pytest.raises(ValueError, match="prefill_token_buckets must be token counts"):
        ServingDefaults(prefill_token_buckets=(64, 32))


def test_the_codec_device_setting_places_orpheus_codec_and_is_refused_where_not_honoured(llm_tiny_dir, small_snac_dir):
    """--codec-device: Orpheus builds its codec where asked (here the CPU, as the LM: a no-op
    that must still serve); a program that keeps its codec on the LM's device refuses another
    device at start-up; a GPU that torch does not see is refused by Orpheus itself."""
    from engine.llm.build import check_codec_device
    from models.orpheus.build import build_orpheus_backend, codec_device_for

    backend = build_orpheus_backend(str(llm_tiny_dir), device="cpu", codec_path=str(small_snac_dir), max_num_seqs=2,
                                    max_model_len=128, codec_device="cpu")
    assert backend.program.codec.noise_table_0.device.type == "cpu"
    voice, opts = backend.validate("leo", {"max_tokens": 14, "seed": 1})
    backend.add_job(1, "hello", voice, opts)
    assert not any(o.error for o in drain(backend))
    backend.close()

    check_codec_device(None, "cuda", None, "m")  # not asked
    check_codec_device("cuda:0", "cuda", None, "m")  # the LM's own device: nothing to move
    check_codec_device("cuda:1", "cuda", "cuda:1", "orpheus")  # honoured
    with pytest.raises(ValueError, match=r"--codec-device cuda:1: model kyutai-tts runs its codec on the LM's device"):
        check_codec_device("cuda:1", "cuda", None, "kyutai-tts")
    if torch.cuda.device_count() < 8:
        with pytest.raises(ValueError, match=r"--codec-device cuda:7: torch sees \d+ CUDA GPU"):
            codec_device_for("cuda:7", "cuda")


def test_cli_codec_device_reaches_the_engine_config_and_bad_values_are_refused():
    from engine.config import EngineConfig
    from gateway import cli

    args = cli.build_parser().parse_args(["serve", "--model", "synthetic", "--codec-device", "cuda:1"])
    assert cli.configs_from_args(args)[1].codec_device == "cuda:1"
    assert EngineConfig(model="synthetic").codec_device is None
    with pytest.raises(ValueError, match="codec_device must be cpu, cuda or cuda:N"):
        EngineConfig(model="synthetic", codec_device="gpu1")
    with pytest.raises(ValueError, match="needs the LM on a GPU"):
        EngineConfig(model="synthetic", device="cpu", codec_device="cuda:1")


@pytest.mark.gpu
@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two CUDA GPUs")
def test_orpheus_codec_on_a_second_gpu_gives_the_audio_of_the_codec_beside_the_lm(llm_fi_dir, small_snac_dir):
    """The LM on cuda:0, the codec on cuda:1: the same greedy tokens give the same audio as with
    the codec on cuda:0 (bf16 codec: within its rounding)."""
    from models.orpheus.build import build_orpheus_backend

    audio = []
    for codec_device in (None, "cuda:1"):
        backend = build_orpheus_backend(str(llm_fi_dir), device="cuda", codec_path=str(small_snac_dir),
                                        max_num_seqs=4, max_model_len=256, codec_device=codec_device)
        voice, opts = backend.validate("leo", {"max_tokens": 70, "seed": 3, "temperature": 0})
        backend.add_job(1, "the codec may run elsewhere", voice, opts)
        outs = drain(backend)
        assert not any(o.error for o in outs)
        audio.append(np.concatenate([o.pcm for o in outs if o.pcm is not None]))
        backend.close()
    assert audio[0].shape == audio[1].shape and audio[0].size > 0
    np.testing.assert_allclose(audio[1], audio[0], atol=2e-2)


def test_a_model_setting_text_takes_its_defaults_type() -> None:
    """``--model-setting`` values arrive as text: an int, float or bool default makes them one
    (a wrong one is refused naming the setting), a None default a number where the text is one."""
    from engine.llm.build import model_setting_value as v

    assert v("n", "3", 4) == 3 and isinstance(v("n", "3", 4), int)
    assert v("x", "0.5", 1.0) == 0.5 and v("x", "2", 1.0) == 2.0
    assert [v("b", t, True) for t in ("on", "TRUE", "1", "yes", "off", "false", "0", "no")] == [True] * 4 + [False] * 4
    assert v("s", "bfloat16", "auto") == "bfloat16"
    assert v("k", "8", None) == 8 and v("a", "0.25", None) == 0.25 and v("d", "/voices", None) == "/voices"
    with pytest.raises(ValueError, match="n=three: expects an integer"):
        v("n", "three", 4)
    with pytest.raises(ValueError, match="b=maybe: expects true or false"):
        v("b", "maybe", False)


def test_the_build_checks_the_sampler_kernel(monkeypatch):
    """The build's ``Sampler.kernel`` (set for the process before the heads make their samplers;
    the CLI's part: test_cli_choices_reach_the_engine_config): "triton" refused where Triton does
    not import, another name refused, "auto" torch until the program is loaded."""
    from engine.llm import build as build_mod
    from engine.llm import sample_triton
    from engine.llm.sampler import Sampler

    monkeypatch.setattr(Sampler, "kernel", "torch")
    monkeypatch.setattr(sample_triton, "triton", object())
    assert build_mod._sampler_kernel("triton") == "triton"
    monkeypatch.setattr(sample_triton, "triton", None)
    with pytest.raises(ValueError, match="needs Triton"):
        build_mod._sampler_kernel("triton")
    with pytest.raises(ValueError, match="torch or triton"):
        build_mod._sampler_kernel("radix")
    assert build_mod._sampler_kernel("auto") == "torch"  # (until the program is loaded)


def test_sampler_kernel_auto_is_the_programs_default_on_cuda_where_triton_imports(monkeypatch):
    """``--sampler-kernel auto`` once the program is loaded: its ``ServingDefaults.sampler_kernel``
    on CUDA (Qwen3-TTS's "triton"), torch on the CPU, on CUDA without Triton and for programs that
    keep torch's draw (Orpheus)."""
    from engine.llm import build as build_mod
    from engine.llm import sample_triton
    from engine.llm.program import ServingDefaults
    from models.orpheus.build import ORPHEUS_DEFAULTS
    from models.qwen3_tts.build import QWEN3_DEFAULTS

    assert QWEN3_DEFAULTS.sampler_kernel == "triton" and ORPHEUS_DEFAULTS.sampler_kernel == "torch"
    monkeypatch.setattr(sample_triton, "triton", object())
    assert build_mod._auto_sampler_kernel(QWEN3_DEFAULTS, "cuda") == "triton"
    assert build_mod._auto_sampler_kernel(QWEN3_DEFAULTS, "cuda:0") == "triton"
    assert build_mod._auto_sampler_kernel(QWEN3_DEFAULTS, "cpu") == "torch"
    assert build_mod._auto_sampler_kernel(ORPHEUS_DEFAULTS, "cuda") == "torch"
    with pytest.raises(ValueError, match="torch or triton"):
        build_mod._auto_sampler_kernel(ServingDefaults(sampler_kernel="radix"), "cuda")
    monkeypatch.setattr(sample_triton, "triton", None)
    assert build_mod._auto_sampler_kernel(QWEN3_DEFAULTS, "cuda") == "torch"


def test_a_head_size_flashinfer_lacks_is_refused_naming_the_cpu() -> None:
    """On CUDA with FlashInfer, head_dim 16 (the tiny models') is refused at once, naming --device
    cpu; FlashInfer's sizes pass, and so does any size where FlashInfer does not serve."""
    from engine.llm.build import check_flashinfer_head_dim

    with pytest.raises(ValueError, match=r"kyutai-tts-tiny: head_dim 16, and FlashInfer's attention \(CUDA\) "
                                         r"takes 64, 128, 256, 512: serve it with --device cpu"):
        check_flashinfer_head_dim("kyutai-tts-tiny", 16, True)
    for head_dim in (64, 128):
        check_flashinfer_head_dim("m", head_dim, True)
    check_flashinfer_head_dim("m", 16, False)

"""Loading VoxCPM2 for the runtime: the registry's names, --lora from the command line to the folded
weights (warm-up included), the VAE decoder's own dtype, settings refused at load."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from engine.config import EngineConfig
from models.registry import resolve


def test_registry_names_hub_ids_and_local_folders(tmp_path: Path) -> None:
    """--model voxcpm2 is openbmb/VoxCPM2, voxcpm2-tiny the tiny preset, openbmb/voxcpm* hub ids
    and a folder whose config.json says architecture voxcpm2 resolve to the program."""
    assert (resolve("voxcpm2").entry.name, resolve("voxcpm2").model_id) == ("voxcpm2", "openbmb/VoxCPM2")
    assert resolve("voxcpm2-tiny").model_id == "tiny"
    assert resolve("openbmb/VoxCPM2").entry.factory == "models.voxcpm2.build:load"
    (tmp_path / "config.json").write_text(json.dumps({"architecture": "voxcpm2"}))
    assert resolve(str(tmp_path)).entry.name == "voxcpm2"


def test_lora_flag_reaches_the_folded_weights(tmp_path: Path) -> None:
    """`--lora PATH` (EngineConfig.lora) is folded into the served weights at load: W + (alpha/r) B A;
    the engine warms up (its warm-up job runs to the end)."""
    from gateway.cli import build_parser, configs_from_args

    from engine.backends import build_backend
    from models.voxcpm2.loader import load_voxcpm2
    from safetensors.torch import save_file

    g = torch.Generator().manual_seed(0)
    a, b = torch.randn(2, 64, generator=g), torch.randn(64, 2, generator=g)  # rank 2 on the tiny q_proj, 64 -> 64
    name = "base_lm.layers.0.self_attn.q_proj"
    save_file({f"{name}.lora_A": a, f"{name}.lora_B": b}, str(tmp_path / "lora_weights.safetensors"))
    (tmp_path / "lora_config.json").write_text(json.dumps({"alpha": 4.0}))
    args = build_parser().parse_args(["serve", "--model", "voxcpm2-tiny", "--load-format", "dummy", "--device", "cpu",
                                      "--lora", str(tmp_path), "--max-num-seqs", "2", "--max-model-len", "256"])
    _, config = configs_from_args(args)
    assert config.lora == str(tmp_path)
    served = build_backend(config)
    base = load_voxcpm2("tiny", load_format="dummy", dtype=torch.float32)
    w = served.program.model.get_submodule(name).weight
    torch.testing.assert_close(w, base.model.get_submodule(name).weight + 2.0 * b @ a)
    assert served.info.sample_rate == 48000 and served.info.weights == "random"


def test_the_vae_decoder_dtype_is_its_own() -> None:
    """vae_decoder_dtype casts the decoder only: the encoder stays float32, the LM its dtype."""
    from tests.models.voxcpm2.voxcpm2_serving import backend

    b = backend(vae_decoder_dtype="bfloat16", max_num_seqs=1)
    vae = b.program.vae
    assert vae.decoder.model[-2].weight.dtype == torch.bfloat16 and vae.encoder.fc_mu.weight.dtype == torch.float32
    assert b.program.model.stop_head.weight.dtype == torch.float32
    with pytest.raises(ValueError, match="vae_decoder_dtype"):
        backend(vae_decoder_dtype="float16", max_num_seqs=1)


def test_settings_refused_at_load() -> None:
    """A row asked longer than the RoPE table, a zero chunk size or step count: refused naming them."""
    from tests.models.voxcpm2.voxcpm2_serving import backend

    with pytest.raises(ValueError, match="--max-model-len 2048 exceeds the model's 1024 positions: pass 1024 or less"):
        backend(max_model_len=2048, max_num_seqs=1)
    for name in ("stream_chunk_patches", "max_flow_steps"):
        with pytest.raises(ValueError, match=name):
            backend(max_num_seqs=1, **{name: 0})
    assert EngineConfig(model="voxcpm2-tiny").lora is None


def test_a_model_setting_flag_reaches_the_program_and_a_wrong_one_is_named() -> None:
    """`--model-setting stream_chunk_patches=2` sets the served decoder's chunk (the text taken
    as the default's type); a name the model does not read, or a value of the wrong type, stops
    the build with a message naming it (and the model's settings); a flag without `=` is a usage error."""
    from gateway.cli import build_parser, configs_from_args

    from engine.backends import build_backend

    base = ["serve", "--model", "voxcpm2-tiny", "--load-format", "dummy", "--device", "cpu",
            "--max-num-seqs", "2", "--max-model-len", "256"]

    def config(*settings: str) -> EngineConfig:
        argv = base + [x for s in settings for x in ("--model-setting", s)]
        return configs_from_args(build_parser().parse_args(argv))[1]

    assert config().model_settings == ()
    c = config("stream_chunk_patches=2", "max_flow_steps = 4")
    assert c.model_settings == (("stream_chunk_patches", "2"), ("max_flow_steps", "4"))
    served = build_backend(c)
    assert served.program.decoder.chunk == 2
    with pytest.raises(ValueError, match=r"--model-setting stream_chunk_patchs: not a setting of .*stream_chunk_patches"):
        build_backend(config("stream_chunk_patchs=2"))
    with pytest.raises(ValueError, match=r"stream_chunk_patches=two: expects an integer"):
        build_backend(config("stream_chunk_patches=two"))
    with pytest.raises(SystemExit):
        build_parser().parse_args(base + ["--model-setting", "stream_chunk_patches"])


def test_max_model_len_auto_serves_the_rope_table() -> None:
    """With --max-model-len auto (-1, the default) the tiny model's 1,024-position table sets the
    rows: the runtime's scheduler and the program's too_long check both hold 1,024, not 2,048."""
    from tests.models.voxcpm2.voxcpm2_serving import backend

    b = backend(max_model_len=-1, max_num_seqs=1)
    assert b.scheduler.config.max_model_len == 1024 and b.program.max_model_len == 1024
    assert EngineConfig().max_model_len == -1

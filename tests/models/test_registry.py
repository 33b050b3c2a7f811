"""models.registry: what --model resolves to, and the errors a newcomer sees for a bad one."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from models import registry
from models.registry import check_requirements, resolve


@pytest.mark.parametrize("value, name, model_id", [
    ("orpheus", "orpheus", "canopylabs/orpheus-3b-0.1-ft"),
    ("ORPHEUS", "orpheus", "canopylabs/orpheus-3b-0.1-ft"),
    ("tiny", "orpheus", "tiny"),
    ("canopylabs/orpheus-3b-0.1-ft", "orpheus", "canopylabs/orpheus-3b-0.1-ft"),
    ("someone/orpheus-3b-finetune", "orpheus", "someone/orpheus-3b-finetune"),
    ("qwen3-tts", "qwen3-tts", "Qwen/Qwen3-TTS-12Hz-1.7B-CustomVoice"),
    ("qwen3-tts-tiny", "qwen3-tts", "tiny"),
    ("Qwen/Qwen3-TTS-12Hz-0.6B-Base", "qwen3-tts", "Qwen/Qwen3-TTS-12Hz-0.6B-Base"),
    ("hibari", "hibari", "hibari"),
])
def test_names_aliases_and_hub_ids_pick_their_program(value: str, name: str, model_id: str) -> None:
    """Short names, aliases (case-insensitive) and hub ids resolve to the program and the id it loads."""
    r = resolve(value)
    assert (r.entry.name, r.model_id) == (name, model_id)


def test_a_local_folder_is_resolved_by_its_config_architecture(tmp_path) -> None:
    """A checkpoint folder's config.json names the architecture: Llama -> orpheus, qwen3_tts -> qwen3-tts."""
    llama, qwen = tmp_path / "llama", tmp_path / "qwen"
    llama.mkdir()
    qwen.mkdir()
    (llama / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"]}))
    (qwen / "config.json").write_text(json.dumps({"model_type": "qwen3_tts"}))
    assert resolve(str(llama)).entry.name == "orpheus" and resolve(str(llama)).model_id == str(llama)
    assert resolve(str(qwen)).entry.name == "qwen3-tts"


@pytest.mark.parametrize("value", ["hibary", "foo/bar", "/no/such/dir", "orpheus-4b-typo"])
def test_a_misspelt_model_lists_what_is_served(value: str) -> None:
    """An unknown name, a hub id of no served family or a missing path is refused with the served names."""
    with pytest.raises(ValueError) as e:
        resolve(value)
    msg = str(e.value)
    assert repr(value) in msg and "hibari" in msg and "orpheus" in msg and "qwen3-tts" in msg


def test_a_folder_without_a_served_architecture_is_refused(tmp_path) -> None:
    """config.json naming an unknown architecture: a clear error, not a load failure later."""
    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["BertModel"]}))
    with pytest.raises(ValueError, match="names no served architecture"):
        resolve(str(tmp_path))


def test_missing_packages_name_the_extra_to_install(monkeypatch) -> None:
    """A program whose packages are not installed says which and the pip command (torch: the CPU hint)."""
    entry = replace(registry.ENTRIES[2], requires=("torch", "no_such_package_xyz"), extra="orpheus")
    with pytest.raises(ValueError) as e:
        check_requirements(registry.Resolved(entry, "x"))
    msg = str(e.value)
    assert "no_such_package_xyz" in msg and 'pip install -e ".[orpheus]"' in msg


def test_engine_config_refuses_a_bad_model_and_cuda_for_a_cpu_model() -> None:
    """EngineConfig validates --model at once (the CLI turns it into one line and exit 2)."""
    from engine.config import EngineConfig

    with pytest.raises(ValueError, match="unknown model 'hibary'"):
        EngineConfig(model="hibary")
    with pytest.raises(ValueError, match="--device cuda does not apply to --model hibari"):
        EngineConfig(model="hibari", device="cuda")


@pytest.mark.parametrize("model", ["tiny", "qwen3-tts-tiny", "qwen3-tts-tiny-base", "kyutai-tts-tiny", "csm-tiny",
                                   "voxcpm2-tiny"])
def test_a_tiny_test_model_runs_on_the_cpu(model: str) -> None:
    """The tiny presets (head size 16, which FlashInfer does not take): --device auto serves
    them on the CPU, --device cuda is refused in one line; the full models keep auto."""
    from engine.config import EngineConfig

    assert EngineConfig(model=model).device == "cpu"
    with pytest.raises(ValueError, match=rf"--device cuda does not apply to --model {model}: it runs on the "
                                         r"CPU only \(a tiny test model"):
        EngineConfig(model=model, device="cuda")
    assert EngineConfig(model="orpheus").device == "auto" and EngineConfig().device == "auto"


def test_describe_lists_every_entry() -> None:
    """The help text's list has one line per served model."""
    text = registry.describe()
    assert all(e.name in text for e in registry.ENTRIES)

"""Which program serves a ``--model`` value: short names, hub id prefixes, local checkpoints.

The one place models are registered (``resolve``, ``check_requirements``; the match order is in
docs/adding_a_model.md, "Registering"). Nothing here imports torch.
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["ENTRIES", "ModelEntry", "Resolved", "check_requirements", "describe", "load_factory", "resolve"]


@dataclass(frozen=True)
class ModelEntry:
    """A servable model family.

    ``factory``: ``"module:attr"``. For ``kind == "lm"`` it is the program's ``load``
    (``engine.llm.program.LoadContext`` -> ``ProgramModel``), served by ``engine.llm``; for
    ``kind == "backend"`` a callable ``(EngineConfig) -> Backend``.
    """

    name: str
    kind: str  # "lm" | "backend"
    factory: str
    description: str
    device: str  # where it runs: "cpu", "gpu" (or cpu, slowly)
    default_id: str | None = None  # the hub id the short name stands for
    aliases: dict[str, str] | None = None  # other names -> the model id they stand for
    hub_prefixes: tuple[str, ...] = ()  # lower case "owner/name" prefixes
    architectures: tuple[str, ...] = ()  # config.json "architectures" entries / "model_type"
    requires: tuple[str, ...] = ()  # importable modules the program needs
    extra: str | None = None  # the pip extra that installs them
    # Model ids (presets) that run on the CPU only: the tiny test models, whose head size (16)
    # FlashInfer's kernels do not take; --device auto serves them on the CPU.
    cpu_ids: tuple[str, ...] = ()


ENTRIES: tuple[ModelEntry, ...] = (
    ModelEntry("hibari", "backend", "engine.backends:hibari_backend",
               "the embedded English voice of hibari-tts, 24 kHz (the default; no downloads)", "cpu",
               requires=("hibari",)),
    ModelEntry("synthetic", "backend", "engine.backends:synthetic_backend",
               "tones paced at real time, for tests and gateway benchmarks", "cpu"),
    ModelEntry("orpheus", "lm", "models.orpheus.build:load",
               "Orpheus 3B (Llama-3.2-3B + SNAC 24 kHz); 'tiny' is a tiny random Orpheus-shaped model "
               "(--load-format dummy) for tests and CPU runs", "gpu",
               default_id="canopylabs/orpheus-3b-0.1-ft", aliases={"tiny": "tiny", "orpheus-3b": "orpheus-3b"},
               hub_prefixes=("canopylabs/orpheus",), architectures=("LlamaForCausalLM",),
               requires=("torch", "transformers", "snac", "safetensors", "tokenizers"), extra="orpheus",
               cpu_ids=("tiny",)),
    ModelEntry("qwen3-tts", "lm", "models.qwen3_tts.build:load",
               "Qwen3-TTS 12 Hz (1.7B / 0.6B; CustomVoice speakers, Base for cloned voices), text taken "
               "word by word while it speaks; 'qwen3-tts-tiny' is a tiny random one (--load-format dummy)", "gpu",
               default_id="Qwen/Qwen3-TTS-12Hz-1.7B-CustomVoice",
               aliases={"qwen3-tts-tiny": "tiny", "qwen3-tts-tiny-base": "tiny-base",
                        "qwen3-tts-1.7b": "Qwen/Qwen3-TTS-12Hz-1.7B-CustomVoice",
                        "qwen3-tts-1.7b-base": "Qwen/Qwen3-TTS-12Hz-1.7B-Base",
                        "qwen3-tts-0.6b": "Qwen/Qwen3-TTS-12Hz-0.6B-CustomVoice",
                        "qwen3-tts-0.6b-base": "Qwen/Qwen3-TTS-12Hz-0.6B-Base"},
               hub_prefixes=("qwen/qwen3-tts",), architectures=("Qwen3TTSForConditionalGeneration", "qwen3_tts"),
               requires=("torch", "safetensors", "tokenizers"), extra="qwen3-tts", cpu_ids=("tiny", "tiny-base")),
    ModelEntry("kyutai-tts", "lm", "models.kyutai_tts.build:load",
               "Kyutai TTS 1.6B en/fr (delayed streams + Mimi), takes each word when it asks for it; needs "
               "voice_dir (kyutai/tts-voices); 'kyutai-tts-tiny' is a tiny random one (--load-format dummy)", "gpu",
               default_id="kyutai/tts-1.6b-en_fr", aliases={"kyutai-tts-tiny": "tiny"},
               hub_prefixes=("kyutai/tts",), architectures=("tts",),
               requires=("torch", "safetensors", "sentencepiece"), extra="kyutai-tts", cpu_ids=("tiny",)),
    ModelEntry("csm", "lm", "models.csm.build:load",
               "Sesame CSM-1B (Llama-3.2-1B backbone + depth decoder, 32 Mimi codebooks), speakers 0-9, "
               "registered voices and earlier turns as context; 'csm-tiny' is a tiny random one "
               "(--load-format dummy)", "gpu",
               default_id="sesame/csm-1b", aliases={"csm-tiny": "tiny", "csm-1b": "sesame/csm-1b"},
               hub_prefixes=("sesame/csm",), architectures=("CsmForConditionalGeneration", "csm"),
               requires=("torch", "safetensors", "tokenizers"), extra="csm", cpu_ids=("tiny",)),
    ModelEntry("voxcpm2", "lm", "models.voxcpm2.build:load",
               "VoxCPM2 (MiniCPM4 + flow-matching patches, AudioVAE 48 kHz; zero-shot and cloned voices, "
               "--lora folded at load); 'voxcpm2-tiny' is a tiny random one (--load-format dummy)", "gpu",
               default_id="openbmb/VoxCPM2", aliases={"voxcpm2-tiny": "tiny"},
               hub_prefixes=("openbmb/voxcpm",), architectures=("voxcpm2",),
               requires=("torch", "safetensors", "tokenizers"), extra="voxcpm2", cpu_ids=("tiny",)),
)


@dataclass(frozen=True)
class Resolved:
    entry: ModelEntry
    model_id: str  # what the program loads: a hub id, a preset name or a local path

    @property
    def is_cpu_only(self) -> bool:
        """It runs on the CPU only (a CPU backend, or a tiny test model of a GPU program)."""
        return self.entry.device == "cpu" or self.model_id in self.entry.cpu_ids


def _names() -> list[str]:
    out: list[str] = []
    for e in ENTRIES:
        out.append(e.name)
        out.extend((e.aliases or {}).keys())
    return out


def describe() -> str:
    """One line per served model, for help texts and errors."""
    return "\n".join(f"  {e.name:<12} {e.description} [{e.device}]" for e in ENTRIES)


def _unknown(value: str, why: str) -> ValueError:
    return ValueError(f"unknown model {value!r} ({why}); served: {', '.join(_names())}, a hub id starting with "
                      f"{', '.join(p for e in ENTRIES for p in e.hub_prefixes)}, or a local checkpoint directory "
                      "whose config.json names a served architecture")


def _from_config(path: Path) -> ModelEntry | None:
    try:
        cfg: dict[str, Any] = json.loads((path / "config.json").read_text())
    except (OSError, ValueError):
        return None
    names = set(cfg.get("architectures") or []) | {str(cfg.get("model_type", "")), str(cfg.get("architecture", ""))}
    for e in ENTRIES:
        if names & set(e.architectures):
            return e
    return None


def resolve(value: str) -> Resolved:
    """The program that serves ``value``; raises ``ValueError`` listing what is served."""
    key = value.strip().lower()
    for e in ENTRIES:
        if key == e.name:
            return Resolved(e, e.default_id or e.name)
        for alias, model_id in (e.aliases or {}).items():
            if key == alias:
                return Resolved(e, model_id)
    path = Path(os.path.expanduser(value))
    if path.is_dir():
        entry = _from_config(path)
        if entry is None:
            raise _unknown(value, "its config.json is missing or names no served architecture")
        return Resolved(entry, str(path))
    if value.count("/") == 1 and not value.startswith((".", "/", "~")):
        for e in ENTRIES:  # a known prefix, or the family's name in the repository's name
            if any(key.startswith(p) for p in e.hub_prefixes) or (e.kind == "lm" and e.name in key.split("/")[1]):
                return Resolved(e, value)
        raise _unknown(value, "not a hub id of a served family")
    raise _unknown(value, "not a name, a hub id or a directory")


def check_requirements(resolved: Resolved) -> None:
    """Raise ``ValueError`` naming the extra to install when the program's packages are missing."""
    missing = [m for m in resolved.entry.requires if importlib.util.find_spec(m) is None]
    if not missing:
        return
    hint = f'pip install -e ".[{resolved.entry.extra}]"' if resolved.entry.extra else f"pip install {' '.join(missing)}"
    torch_hint = (" (on a machine without a GPU, first pip install torch==2.13.0, the CPU build)"
                  if "torch" in missing else "")
    raise ValueError(f"--model {resolved.entry.name} needs {', '.join(missing)}: {hint}{torch_hint}")


def load_factory(entry: ModelEntry) -> Any:
    """Import the entry's ``module:attr``."""
    module, _, attr = entry.factory.partition(":")
    return getattr(importlib.import_module(module), attr)

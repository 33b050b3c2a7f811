"""Load Orpheus (Llama backbone + tokenizer) and the SNAC codec from a local directory, the hub,
or nothing (``load_format="dummy"``: random weights, ``PieceTokenizer`` when there is no
tokenizer); sources and errors: docs/orpheus.md, "Loading".
"""

from __future__ import annotations

import json
import os
import re
import zlib
from pathlib import Path
from typing import Any

import torch

from engine.backend import ModelUnavailable
from models.orpheus.config import PRESETS, LlamaConfig
from models.orpheus.llama import LlamaModel

__all__ = [
    "PieceTokenizer", "SNAC_24KHZ_CONFIG", "SNAC_HUB_ID", "DEFAULT_HUB_ID", "load_orpheus",
    "load_llama", "load_tokenizer", "load_snac", "resolve_dir",
]

DEFAULT_HUB_ID = "canopylabs/orpheus-3b-0.1-ft"
SNAC_HUB_ID = "hubertsiuzdak/snac_24khz"
# The config.json of hubertsiuzdak/snac_24khz (no local attention: a pure conv decoder).
SNAC_24KHZ_CONFIG: dict[str, Any] = {
    "sampling_rate": 24000,
    "encoder_dim": 48,
    "encoder_rates": [2, 4, 8, 8],
    "decoder_dim": 1024,
    "decoder_rates": [8, 8, 4, 2],
    "attn_window_size": None,
    "codebook_size": 4096,
    "codebook_dim": 8,
    "vq_strides": [4, 2, 1],
    "noise": True,
    "depthwise": True,
}
_LLAMA_PATTERNS = ["config.json", "*.safetensors", "model.safetensors.index.json", "tokenizer*",
                   "special_tokens_map.json", "generation_config.json"]
_SNAC_PATTERNS = ["config.json", "pytorch_model.bin"]
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")


class PieceTokenizer:
    """Stand-in tokenizer for ``--load-format dummy`` without tokenizer files, with prompt
    lengths close to Llama 3's.

    Text is split the way Llama 3's pre-tokenizer splits it (a word with the space or mark
    before it, a contraction, numbers in groups of up to three digits, a run of punctuation,
    whitespace), and each piece becomes one id, a stable hash into the 128,000 text ids. Llama
    3's BPE never merges across these pieces, so its count is at least this one's, and it keeps
    most English pieces whole (rare words split into a few), so for English it is close. The byte tokenizer it replaces (one id per byte, up to
    the H200 runs 10-17) made the benchmark's prompts about three times longer, and so each
    prompt cost more than it would with Orpheus' own tokenizer. Not invertible (no ``decode``): a
    dummy model speaks noise anyway.
    """

    bos_token_id = 128000
    eos_token_id = 128009
    num_text_ids = 128000
    # Llama 3's split pattern, with \p{L} as [^\W\d_] and \p{N} as \d (Python's re)
    _PIECES = re.compile(r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\w]?[^\W\d_]+|\d{1,3}| ?[^\s\w]+[\r\n]*"
                         r"|\s*[\r\n]+|\s+(?!\S)|\s+")

    def pieces(self, text: str) -> list[str]:
        return self._PIECES.findall(text)

    def encode(self, text: str) -> list[int]:
        return [self.bos_token_id, *(zlib.crc32(p.encode("utf-8")) % self.num_text_ids for p in self.pieces(text))]


def _is_hub_id(s: str) -> bool:
    return bool(_HUB_ID.match(s)) and not s.startswith((".", "/", "~"))


def resolve_dir(path_or_hub_id: str | os.PathLike, *, allow_patterns: list[str], what: str,
                cache_dir: str | None = None) -> Path:
    """A local directory, or the snapshot directory of a hub id (cached, else downloaded)."""
    p = Path(os.path.expanduser(str(path_or_hub_id)))
    if p.is_dir():
        return p
    s = str(path_or_hub_id)
    if not _is_hub_id(s):
        raise FileNotFoundError(f"{what}: directory {s!r} does not exist (pass a local directory "
                                "in Hugging Face layout or a hub id like owner/name)")
    from huggingface_hub import snapshot_download

    try:
        return Path(snapshot_download(s, allow_patterns=allow_patterns, cache_dir=cache_dir,
                                      local_files_only=True))
    except Exception:  # not in the cache: try the network below
        pass
    try:
        return Path(snapshot_download(s, allow_patterns=allow_patterns, cache_dir=cache_dir))
    except Exception as e:
        raise ModelUnavailable(
            f"{what}: cannot download hub id {s!r} and it is not in the local hub cache "
            f"({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}). Fix: go online, "
            f"or download it elsewhere (hf download {s}) and pass the local "
            "directory, or use --load-format dummy for random weights"
        ) from e


def _read_config(d: Path) -> LlamaConfig:
    f = d / "config.json"
    if not f.is_file():
        raise FileNotFoundError(f"model directory {str(d)!r} has no config.json")
    return LlamaConfig.from_hf_dict(json.loads(f.read_text()))


def _weight_files(d: Path) -> list[Path]:
    index = d / "model.safetensors.index.json"
    if index.is_file():
        names = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        missing = [n for n in names if not (d / n).is_file()]
        if missing:
            raise FileNotFoundError(
                f"model directory {str(d)!r}: shards listed in model.safetensors.index.json "
                f"are missing: {', '.join(missing)}"
            )
        return [d / n for n in names]
    files = sorted(d.glob("*.safetensors"))
    if not files:
        others = [f.name for f in d.glob("*.bin")] + [f.name for f in d.glob("*.pt*")]
        hint = f" (found {', '.join(others)}: convert to safetensors)" if others else ""
        raise FileNotFoundError(f"model directory {str(d)!r} has no *.safetensors weights{hint}")
    return files


def load_llama(d: Path, config: LlamaConfig, *, device: torch.device | str, dtype: torch.dtype,
               max_seq_len: int | None = None) -> LlamaModel:
    """Build on meta, read the safetensors shards straight to ``device``, assign, set up RoPE."""
    from safetensors import safe_open

    with torch.device("meta"):
        model = LlamaModel(config, max_seq_len=max_seq_len)
    state: dict[str, torch.Tensor] = {}
    for f in _weight_files(d):
        with safe_open(str(f), framework="pt", device=str(device)) as sf:
            for k in sf.keys():
                state[k] = sf.get_tensor(k).to(dtype)
    if config.tie_word_embeddings:
        state.pop("lm_head.weight", None)  # some tied checkpoints store a copy
    expected = set(model.state_dict())
    missing, unexpected = sorted(expected - set(state)), sorted(set(state) - expected)
    if missing or unexpected:
        raise ValueError(f"checkpoint in {str(d)!r} does not match the config: "
                         f"missing {missing[:5]}, unexpected {unexpected[:5]}")
    model.load_state_dict(state, assign=True, strict=True)
    model.setup_rope(device)
    return model.eval().requires_grad_(False)


def load_tokenizer(d: Path) -> Any:
    """The directory's tokenizer via ``transformers.AutoTokenizer`` (local files only)."""
    if not any((d / n).is_file() for n in ("tokenizer.json", "tokenizer.model", "tokenizer_config.json")):
        raise FileNotFoundError(f"model directory {str(d)!r} has no tokenizer files "
                                "(tokenizer.json / tokenizer_config.json)")
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(d), local_files_only=True)


def load_orpheus(path_or_hub_id: str | os.PathLike = DEFAULT_HUB_ID, *,
                 device: torch.device | str = "cpu", dtype: torch.dtype = torch.bfloat16,
                 load_format: str = "auto", max_seq_len: int | None = None, seed: int = 0,
                 cache_dir: str | None = None) -> tuple[LlamaModel, Any, LlamaConfig]:
    """Return ``(model, tokenizer, config)``; ``model`` is eval, on ``device`` in ``dtype``.

    ``load_format="dummy"``: ``path_or_hub_id`` may be a preset name (``PRESETS``), a local
    directory (its config.json and tokenizer are used, weights are not read) or anything else
    (the ``orpheus-3b`` preset); weights are random (``LlamaModel.init_random_``).
    """
    if load_format not in ("auto", "dummy"):
        raise ValueError(f"load_format must be 'auto' or 'dummy', got {load_format!r}")
    if load_format == "dummy":
        return _load_dummy(str(path_or_hub_id), device=device, dtype=dtype,
                           max_seq_len=max_seq_len, seed=seed)
    d = resolve_dir(path_or_hub_id, allow_patterns=_LLAMA_PATTERNS, what="Orpheus model",
                    cache_dir=cache_dir)
    config = _read_config(d)
    tokenizer = load_tokenizer(d)
    model = load_llama(d, config, device=device, dtype=dtype, max_seq_len=max_seq_len)
    return model, tokenizer, config


def _load_dummy(name: str, *, device: torch.device | str, dtype: torch.dtype,
                max_seq_len: int | None, seed: int) -> tuple[LlamaModel, Any, LlamaConfig]:
    d = Path(os.path.expanduser(name))
    tokenizer: Any = PieceTokenizer()
    if name in PRESETS:
        config = PRESETS[name]
    elif (d / "config.json").is_file():
        config = _read_config(d)
        try:
            tokenizer = load_tokenizer(d)
        except FileNotFoundError:
            pass
    else:
        config = PRESETS["orpheus-3b"]
    with torch.device(device):
        model = LlamaModel(config, max_seq_len=max_seq_len)
    model.init_random_(seed=seed).to(dtype)
    model.setup_rope(device)
    return model.eval().requires_grad_(False), tokenizer, config


def load_snac(path_or_hub_id: str | os.PathLike = SNAC_HUB_ID, *, device: torch.device | str = "cpu",
              load_format: str = "auto", seed: int = 0, cache_dir: str | None = None) -> Any:
    """A ``snac.SNAC`` model in eval mode (float32) on ``device``.

    Local directory or hub id in the snac package's format (config.json + pytorch_model.bin);
    ``load_format="dummy"``: ``SNAC(**SNAC_24KHZ_CONFIG)`` with random weights (seeded).
    """
    import snac

    if load_format not in ("auto", "dummy"):
        raise ValueError(f"load_format must be 'auto' or 'dummy', got {load_format!r}")
    if load_format == "dummy":
        with torch.random.fork_rng(devices=[]):  # seeded without touching the caller's RNG
            torch.manual_seed(seed)
            model = snac.SNAC(**SNAC_24KHZ_CONFIG)
        return model.to(device).eval().requires_grad_(False)
    d = resolve_dir(path_or_hub_id, allow_patterns=_SNAC_PATTERNS, what="SNAC codec", cache_dir=cache_dir)
    missing = [n for n in _SNAC_PATTERNS if not (d / n).is_file()]
    if missing:
        raise FileNotFoundError(f"SNAC directory {str(d)!r} is missing {', '.join(missing)} "
                                "(the snac package format: config.json + pytorch_model.bin)")
    model = snac.SNAC.from_config(str(d / "config.json"))
    state = torch.load(d / "pytorch_model.bin", map_location="cpu", weights_only=True)
    model.load_state_dict(state)
    return model.to(device).eval().requires_grad_(False)

"""Runs the reference package moshi 0.2.13 (in its own venv) for the Kyutai TTS parity tests.

    python reference_run.py build OUT_DIR SPEC.json   # a tiny checkpoint in the real layout
    python reference_run.py run CKPT_DIR JOBS.json OUT.pt

``build`` writes ``config.json`` (the spec's, plus ``mimi_config.json`` for the tiny codec), the
LM built by moshi's own ``loaders.get_moshi_lm`` from that config with weights that make greedy
decoding meaningful (normal(0, 0.1); the text head's NEW_WORD and PAD rows large and opposite, so
the model itself chooses between words and pauses), saved in moshi's legacy attention layout (one
stacked ``in_proj_weight`` / ``out_proj.weight`` per attention, the published file's layout,
which moshi's load hook splits back), a tiny Mimi (``tests/models/mimi/reference_run.py``), a
SentencePiece model trained here on a small ASCII corpus with the special ids of Kyutai's
(unk 0, bos 1, eos 2, pad 3), and random voice embeddings (``speaker_wavs`` files).

``run`` loads them with ``CheckpointInfo`` + ``TTSModel.from_checkpoint_info`` and runs greedy
``TTSModel.generate`` for each job: the whole text at once, or revealed just in time (the
machine only ever sees the next 3 entries, as Kyutai's streaming scripts keep them), with the
frames, the (sampled, fed) text tokens, end steps, consumption times, and the audio decoded as
``simple_generate`` decodes it (``mimi.streaming()`` from ``delay_steps``, 2 frames dropped,
cut at ``end_step``). Nothing here is imported by the project.
"""

from __future__ import annotations

import json
import sys
from collections import deque
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent


def _mimi_reference():
    """tests/models/mimi/reference_run.py (the tiny Mimi's builder), imported by path."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("mimi_reference_run", HERE.parent / "mimi" / "reference_run.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module

CORPUS = [
    "hello world this is a small test of speech made from text",
    "the quick brown fox jumps over the lazy dog and runs away",
    "streaming voices read words one at a time as they arrive",
    "kyutai models speak english and french with many voices",
    "a model that listens and talks needs to wait for the words",
    "numbers like one two three four five six seven eight nine ten",
    "bonjour le monde ceci est un petit test de la parole",
    "we keep the audio behind the text by a fixed delay",
]


def train_tokenizer(path: Path, vocab_size: int) -> None:
    import sentencepiece as spm

    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(CORPUS * 4), model_prefix=str(path.with_suffix("")), vocab_size=vocab_size,
        model_type="unigram", unk_id=0, bos_id=1, eos_id=2, pad_id=3, character_coverage=1.0,
        hard_vocab_limit=False, minloglevel=2)


def _legacy_attention_layout(state: dict) -> dict:
    """``in_projs.<i>.weight`` -> one stacked ``in_proj_weight`` (``out_projs`` -> ``out_proj.weight``)."""
    out, groups = {}, {}
    for k, v in state.items():
        for part, target in (("in_projs.", "in_proj_weight"), ("out_projs.", "out_proj.weight")):
            if f".{part}" in k and k.endswith(".weight"):
                prefix, rest = k.split(part, 1)
                groups.setdefault(prefix + target, {})[int(rest.split(".")[0])] = v
                break
        else:
            out[k] = v
    for k, parts in groups.items():
        out[k] = torch.cat([parts[i] for i in sorted(parts)], dim=0)
    return out


def build(out: Path, spec: dict) -> None:
    from moshi.models import loaders
    from safetensors.torch import save_file

    torch.manual_seed(spec["seed"])
    gen = torch.Generator().manual_seed(spec["seed"])
    out.mkdir(parents=True, exist_ok=True)
    cfg = dict(spec["config"])
    cfg["mimi_config_name"] = "mimi_config.json"
    (out / "config.json").write_text(json.dumps(cfg, indent=2))
    (out / "mimi_config.json").write_text(json.dumps(spec["mimi_config"]))
    lm_kwargs = {k: v for k, v in cfg.items() if k not in (
        "moshi_name", "mimi_name", "tokenizer_name", "mimi_config_name", "model_type", "lm_gen_config",
        "tts_config", "stt_config", "model_id", "lora_name")}
    lm = loaders.get_moshi_lm(None, lm_kwargs=lm_kwargs, device="cpu", dtype=torch.float32)
    with torch.no_grad():
        for name, p in lm.named_parameters():
            if name.endswith("alpha") or ("norm" in name and name.endswith("weight")):
                p.copy_(1.0 + 0.1 * torch.randn(p.shape, generator=gen))
            elif name.endswith("bias"):
                p.copy_(0.02 * torch.randn(p.shape, generator=gen))
            else:
                p.copy_(0.1 * torch.randn(p.shape, generator=gen))
        lm.text_linear.weight[0] *= 6.0  # NEW_WORD and PAD opposite and large: one of them usually wins
        lm.text_linear.weight[3] = -lm.text_linear.weight[0]
    save_file({k: v.contiguous() for k, v in _legacy_attention_layout(lm.state_dict()).items()},
              str(out / cfg["moshi_name"]))
    mimi_ref = _mimi_reference()
    mimi_ref.save_mimi(mimi_ref.build_mimi(spec["mimi_config"], spec["seed"] + 1), out / cfg["mimi_name"])
    train_tokenizer(out / cfg["tokenizer_name"], spec["vocab_size"])
    (out / "voices").mkdir(exist_ok=True)
    suffix = f".{cfg['model_id']['sig']}@{cfg['model_id']['epoch']}.safetensors"
    for name, (dim, frames) in spec["voices"].items():
        save_file({"speaker_wavs": torch.randn(1, dim, frames, generator=gen)}, str(out / "voices" / (name + suffix)))


def _load(root: Path, n_q: int):
    from moshi.models import loaders
    from moshi.models.tts import TTSModel

    cfg = json.loads((root / "config.json").read_text())
    info = loaders.CheckpointInfo.from_hf_repo(
        "voxgate/tiny-kyutai-tts", moshi_weights=root / cfg["moshi_name"], mimi_weights=root / cfg["mimi_name"],
        tokenizer=root / cfg["tokenizer_name"], config_path=root / "config.json",
        mimi_config_path=root / "mimi_config.json")
    tts = TTSModel.from_checkpoint_info(info, n_q=n_q, temp=0.6, device="cpu", dtype=torch.float32)
    tts.max_gen_length = 400
    return tts


def _voice(tts, root: Path, name: str) -> Path:
    return root / "voices" / (name + tts.voice_suffix)


def _generate(tts, root: Path, job: dict) -> dict:
    entries = tts.prepare_script([job["text"]], padding_between=1)
    attrs = tts.make_condition_attributes([_voice(tts, root, job["voice"])], cfg_coef=job["cfg"])
    states: list = []
    rest: deque = deque()
    if job["mode"] == "reveal":  # the machine sees 3 entries at a time, topped up after each step
        rest.extend(entries[3:])
        entries = entries[:3]
        new_state = tts.machine.new_state

        def spy(initial):
            st = new_state(initial)
            states.append(st)
            return st

        tts.machine.new_state = spy
    revealed: list[int] = []

    def on_frame(_frame):
        for st in states:
            while len(st.entries) < 3 and rest:
                st.entries.append(rest.popleft())
        revealed.append(len(rest))

    try:
        result = tts.generate([entries], [attrs], on_frame=on_frame, use_sampling=False)
    finally:
        if job["mode"] == "reveal":
            tts.machine.new_state = new_state
    frames = torch.cat(result.frames, dim=-1)[0]  # [1 + n_q, T]
    with tts.mimi.streaming(1), torch.no_grad():
        pcm = [torch.clip(tts.mimi.decode(f[:, 1:, :]), -1, 1) for f in result.frames[tts.delay_steps:]]
    pcm = pcm[2:]
    end = result.end_steps[0]
    audio = torch.cat([p[0, 0] for p in pcm[:end]]) if end is not None and pcm else torch.zeros(0)
    return {"frames": frames, "logged": torch.tensor(result.logged_text_tokens[0]), "end_step": end,
            "consumption": result.all_consumption_times[0], "transcript": result.all_transcripts[0],
            "entries": [(list(e.tokens), e.padding) for e in tts.prepare_script([job["text"]], padding_between=1)],
            "audio": audio, "delay_steps": tts.delay_steps}


def _conditions(tts, root: Path, job: dict) -> dict:
    """The condition tensors moshi computes: the sum vector and the cross-attention source."""
    attrs = tts.make_condition_attributes([_voice(tts, root, v) for v in job["voices"]], cfg_coef=job["cfg"])
    ct = tts.lm.condition_provider.prepare_and_provide([attrs])
    return {"sum": tts.lm.fuser.get_sum(ct)[0, 0], "cross": tts.lm.fuser.get_cross(ct)[0]}


def run(root: Path, jobs: dict, out: Path) -> None:
    torch.set_num_threads(1)
    results: dict = {}
    for key, job in jobs.items():
        tts = _load(root, job.get("n_q", 32))
        results[key] = _conditions(tts, root, job) if job["kind"] == "conditions" else _generate(tts, root, job)
    torch.save(results, out)


if __name__ == "__main__":
    cmd = sys.argv[1]
    if cmd == "build":
        build(Path(sys.argv[2]), json.loads(Path(sys.argv[3]).read_text()))
    elif cmd == "run":
        run(Path(sys.argv[2]), json.loads(Path(sys.argv[3]).read_text()), Path(sys.argv[4]))
    else:
        raise SystemExit(f"usage: {sys.argv[0]} build|run ...")

"""Runs the reference package qwen-tts 0.1.1 (in its own venv) for the parity tests.

    python reference_run.py build OUT_DIR SPEC.json   # tiny checkpoints in the real layout
    python reference_run.py run CKPT_ROOT JOBS.json OUT.pt

``build`` writes ``OUT_DIR/custom`` (CustomVoice) and ``OUT_DIR/base`` (Base, with a speaker
encoder) with the reference's own ``save_pretrained``: config.json, model.safetensors,
generation_config.json, the tokenizer, speech_tokenizer/ (config.json, model.safetensors,
preprocessor_config.json). ``run`` loads them with ``Qwen3TTSModel.from_pretrained`` and
writes what the jobs ask for (prompt embeddings, greedy codes, waveforms, x-vectors) to a
torch file the test reads. Nothing here is imported by the project.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from tiny_tokenizer import build as build_tokenizer  # noqa: E402


def _stub_torchaudio() -> None:
    """qwen_tts imports torchaudio.compliance.kaldi for its 25 Hz tokenizer only; the PyPI
    torchaudio is a CUDA build whose native library does not load beside CPU torch, and nothing
    on the 12 Hz path uses it. A stub module lets the package import."""
    import importlib.machinery
    import types

    ta = types.ModuleType("torchaudio")
    ta.__spec__ = importlib.machinery.ModuleSpec("torchaudio", None)
    ta.compliance = types.ModuleType("torchaudio.compliance")
    ta.compliance.kaldi = types.ModuleType("torchaudio.compliance.kaldi")
    sys.modules.update({"torchaudio": ta, "torchaudio.compliance": ta.compliance,
                        "torchaudio.compliance.kaldi": ta.compliance.kaldi})


_stub_torchaudio()


def _randomize_lm(module: torch.nn.Module, gen: torch.Generator) -> None:
    """Weights with decisive logits: normal(0, 0.1); norm weights around 1; small biases."""
    with torch.no_grad():
        for name, p in module.named_parameters():
            if "norm" in name:
                p.copy_(1.0 + 0.1 * torch.randn(p.shape, generator=gen))
            elif name.endswith("bias"):
                p.copy_(0.02 * torch.randn(p.shape, generator=gen))
            else:
                p.copy_(0.1 * torch.randn(p.shape, generator=gen))


def _randomize_codec(decoder: torch.nn.Module, gen: torch.Generator) -> None:
    """Non-silent codec: PyTorch's own init for convs/linears/norms, random codebooks, snakes, scales."""
    torch.manual_seed(int(torch.randint(0, 2**31 - 1, (1,), generator=gen)))
    with torch.no_grad():
        for m in decoder.modules():
            if isinstance(m, (torch.nn.Conv1d, torch.nn.ConvTranspose1d, torch.nn.Linear, torch.nn.LayerNorm)):
                m.reset_parameters()
        for name, p in decoder.named_parameters():
            if name.endswith("embedding_sum"):
                p.copy_(torch.randn(p.shape, generator=gen))
            elif name.endswith("cluster_usage"):
                p.copy_(0.5 + torch.rand(p.shape, generator=gen))
            elif name.endswith(("alpha", "beta")):
                p.copy_(0.3 * torch.randn(p.shape, generator=gen))
            elif name.endswith(("layer_scale.scale", "gamma")):
                p.copy_(0.5 + 0.1 * torch.randn(p.shape, generator=gen))
            elif "norm" in name and name.endswith("weight"):
                p.copy_(1.0 + 0.1 * torch.randn(p.shape, generator=gen))


def _save_tokenizer(d: Path) -> None:
    from transformers import Qwen2TokenizerFast

    from qwen_tts.core.models.processing_qwen3_tts import Qwen3TTSProcessor

    fast = Qwen2TokenizerFast(tokenizer_object=build_tokenizer(), eos_token="<|im_end|>", pad_token="<|endoftext|>",
                              unk_token=None, bos_token=None)
    Qwen3TTSProcessor(tokenizer=fast).save_pretrained(str(d))


def build(out: Path, spec: dict) -> None:
    from transformers import EncodecFeatureExtractor

    from qwen_tts.core.models.configuration_qwen3_tts import Qwen3TTSConfig, Qwen3TTSSpeakerEncoderConfig
    from qwen_tts.core.models.modeling_qwen3_tts import Qwen3TTSForConditionalGeneration
    from qwen_tts.core.tokenizer_12hz.configuration_qwen3_tts_tokenizer_v2 import Qwen3TTSTokenizerV2Config
    from qwen_tts.core.tokenizer_12hz.modeling_qwen3_tts_tokenizer_v2 import Qwen3TTSTokenizerV2Model

    gen = torch.Generator().manual_seed(spec.get("seed", 0))
    st_cfg = Qwen3TTSTokenizerV2Config(**spec["speech_tokenizer"])
    st = Qwen3TTSTokenizerV2Model(st_cfg).eval()
    _randomize_codec(st.decoder, gen)
    se_args = set(Qwen3TTSSpeakerEncoderConfig.__init__.__code__.co_varnames) - {"self"}
    for name, cfg in spec["checkpoints"].items():
        d = out / name
        model = Qwen3TTSForConditionalGeneration(Qwen3TTSConfig(**cfg)).eval()
        _randomize_lm(model.talker, gen)
        if model.speaker_encoder is not None:
            torch.manual_seed(int(torch.randint(0, 2**31 - 1, (1,), generator=gen)))
            with torch.no_grad():
                for m in model.speaker_encoder.modules():
                    if isinstance(m, torch.nn.Conv1d):
                        m.reset_parameters()
        model.save_pretrained(str(d))
        # save_pretrained writes PretrainedConfig keys its own loader rejects in
        # speaker_encoder_config: keep only that class's arguments.
        c = json.loads((d / "config.json").read_text())
        c["speaker_encoder_config"] = {k: v for k, v in c["speaker_encoder_config"].items() if k in se_args}
        (d / "config.json").write_text(json.dumps(c, indent=2))
        (d / "generation_config.json").write_text(json.dumps({
            "do_sample": True, "top_k": 50, "top_p": 1.0, "temperature": 0.9, "repetition_penalty": 1.05,
            "subtalker_dosample": True, "subtalker_top_k": 50, "subtalker_top_p": 1.0,
            "subtalker_temperature": 0.9, "max_new_tokens": 2048}))
        _save_tokenizer(d)
        st.save_pretrained(str(d / "speech_tokenizer"))
        EncodecFeatureExtractor(feature_size=1, sampling_rate=24000).save_pretrained(str(d / "speech_tokenizer"))


def _load(root: Path, name: str):
    from qwen_tts import Qwen3TTSModel

    return Qwen3TTSModel.from_pretrained(str(root / name), dtype=torch.float32, attn_implementation="sdpa",
                                         local_files_only=True)


def _generate(tts, job: dict) -> dict:
    """One generation job; captures the talker's inputs and the codes of every frame."""
    captured: dict = {}
    talker = tts.model.talker
    orig = talker.generate

    def spy(*args, **kw):
        captured["inputs_embeds"] = kw["inputs_embeds"][0].clone()
        captured["trailing_text_hidden"] = kw["trailing_text_hidden"][0].clone()
        captured["tts_pad_embed"] = kw["tts_pad_embed"].reshape(-1).clone()
        return orig(*args, **kw)

    talker.generate = spy
    if job.get("eos_scale"):
        with torch.no_grad():
            talker.codec_head.weight[talker.config.codec_eos_token_id] *= job["eos_scale"]
    orig_gen = tts.model.generate

    def gen_spy(*args, **kw):
        out = orig_gen(*args, **kw)
        captured["codes"] = out[0][0].clone()
        return out

    tts.model.generate = gen_spy
    common = dict(non_streaming_mode=job["non_streaming"], do_sample=False, subtalker_dosample=False,
                  repetition_penalty=job.get("repetition_penalty", 1.05), max_new_tokens=job["max_new_tokens"])
    try:
        if job["mode"] == "clone":
            wav = np.asarray(job["ref_wav"], dtype=np.float32)
            xvec = tts.model.extract_speaker_embedding(wav, 24000)
            prompt = {"ref_code": [None], "ref_spk_embedding": [xvec], "x_vector_only_mode": [True],
                      "icl_mode": [False]}
            wavs, sr = tts.generate_voice_clone(job["text"], language=job["language"], voice_clone_prompt=prompt,
                                                **common)
            captured["xvector"] = xvec.clone()
        else:
            wavs, sr = tts.generate_custom_voice(job["text"], speaker=job["speaker"], language=job["language"],
                                                 instruct=job.get("instruct"), **common)
    finally:
        talker.generate = orig
        tts.model.generate = orig_gen
        if job.get("eos_scale"):
            with torch.no_grad():
                talker.codec_head.weight[talker.config.codec_eos_token_id] /= job["eos_scale"]
    captured["input_ids"] = tts._tokenize_texts([tts._build_assistant_text(job["text"])])[0][0].clone()
    if job.get("instruct"):
        captured["instruct_ids"] = tts._tokenize_texts([tts._build_instruct_text(job["instruct"])])[0][0].clone()
    captured["wav"] = torch.from_numpy(np.asarray(wavs[0]))
    return captured


def _mrope(tts, positions: list[int]) -> dict:
    """The talker's multimodal RoPE on equal position streams, applied to fixed q/k."""
    from qwen_tts.core.models.modeling_qwen3_tts import apply_multimodal_rotary_pos_emb

    talker = tts.model.talker
    cfg = talker.config
    g = torch.Generator().manual_seed(5)
    q = torch.randn(1, cfg.num_attention_heads, len(positions), cfg.head_dim, generator=g)
    k = torch.randn(1, cfg.num_key_value_heads, len(positions), cfg.head_dim, generator=g)
    pos = torch.tensor(positions)[None, None].expand(3, 1, -1)
    cos, sin = talker.model.rotary_emb(q, pos)
    qe, ke = apply_multimodal_rotary_pos_emb(q, k, cos, sin, cfg.rope_scaling["mrope_section"],
                                             cfg.rope_scaling["interleaved"])
    return {"q": q[0], "k": k[0], "q_rot": qe[0], "k_rot": ke[0]}


def run(root: Path, jobs: dict, out: Path) -> None:
    torch.set_num_threads(1)
    results: dict = {}
    models: dict = {}
    for key, job in jobs.items():
        ckpt = job["checkpoint"]
        tts = models.get(ckpt) or models.setdefault(ckpt, _load(root, ckpt))
        kind = job["kind"]
        if kind == "generate":
            results[key] = _generate(tts, job)
        elif kind == "codec":
            codes = torch.tensor(job["codes"], dtype=torch.long)  # [T, G]
            dec = tts.model.speech_tokenizer.model.decoder
            with torch.no_grad():
                whole = dec(codes.T[None])[0, 0]
                prefix = dec(codes[: job["prefix"]].T[None])[0, 0]
            results[key] = {"whole": whole, "prefix": prefix}
        elif kind == "xvector":
            wav = np.asarray(job["wav"], dtype=np.float32)
            results[key] = {"xvector": tts.model.extract_speaker_embedding(wav, 24000).clone()}
        elif kind == "mrope":
            results[key] = _mrope(tts, job["positions"])
        else:
            raise ValueError(f"unknown job kind {kind!r}")
    torch.save(results, out)


if __name__ == "__main__":
    cmd = sys.argv[1]
    if cmd == "build":
        build(Path(sys.argv[2]), json.loads(Path(sys.argv[3]).read_text()))
    elif cmd == "run":
        run(Path(sys.argv[2]), json.loads(Path(sys.argv[3]).read_text()), Path(sys.argv[4]))
    else:
        raise SystemExit(f"usage: {sys.argv[0]} build|run ...")

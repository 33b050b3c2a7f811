"""Runs the CSM reference (transformers 5.24: ``CsmForConditionalGeneration``, ``CsmProcessor``,
``MimiModel``, in its own venv) for the parity tests.

    python reference_run.py build OUT_DIR SPEC.json   # tiny checkpoints in the real layout
    python reference_run.py run CKPT_ROOT JOBS.json OUT.pt
    python reference_run.py build-run OUT_DIR SPEC.json JOBS.json OUT.pt   # both, one import

``build`` writes one folder per checkpoint of the spec with the reference's own
``save_pretrained`` (config.json, model.safetensors with ``codec_model.*``,
generation_config.json) and the tiny Llama 3 tokenizer (``tiny_tokenizer.py``). ``run`` loads
them with ``from_pretrained`` and writes what the jobs ask for (prompt ids and embeddings, the
context's codes, greedy frames, codec outputs) to a torch file the tests read. Nothing here is
imported by the project.
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

# The checkpoint's conversation format (``sesame/csm-1b``'s chat template, without its input
# checks): per turn bos, "[speaker]", the text, eos, and for a turn with audio the audio
# placeholder (expanded by the processor to one <|AUDIO|> per frame) and <|audio_eos|>.
TEMPLATE = ("{%- for m in messages -%}{{ bos_token }}[{{ m['role'] }}]{{ m['content'][0]['text'] }}{{ eos_token }}"
            "{%- if m['content'] | length > 1 -%}<|AUDIO|><|audio_eos|>{%- endif -%}{%- endfor -%}")


def _stop_soon(model: torch.nn.Module, gen: torch.Generator, lm_scale: float) -> None:
    """Weights that end speech after a few frames: code 0 of every codebook embeds as one large
    vector E, which then dominates the depth decoder's residual stream, and each codebook head's
    column 0 points along the depth decoder's output for it, so a frame whose codebook 0 is 0
    comes out all zeros (the stop frame); ``lm_head`` row 0 scaled by ``lm_scale`` makes
    codebook 0 pick 0 now and then."""
    cfg = model.config
    v, n = cfg.vocab_size, cfg.num_codebooks
    dm = model.depth_decoder.model
    e = 30.0 * torch.randn(cfg.hidden_size, generator=gen)
    for k in range(n):
        dm.embed_tokens.weight[k * v] = e
    x = dm.inputs_embeds_projector.weight @ e
    h = dm.norm.weight * x / torch.sqrt(x.pow(2).mean() + cfg.depth_decoder_config.rms_norm_eps)
    model.depth_decoder.codebooks_head.weight[:, :, 0] = 50.0 * h / h.pow(2).sum()
    model.lm_head.weight[0] *= lm_scale


def _randomize(model: torch.nn.Module, gen: torch.Generator, stop_scale: float | None) -> None:
    """Decisive LM weights (normal(0, 0.1), norms near 1); an audible codec (PyTorch's own init
    for its convolutions, linears and norms, random codebooks: zero ones decode to silence)."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.startswith("codec_model."):
                continue
            if "norm" in name:
                p.copy_(1.0 + 0.1 * torch.randn(p.shape, generator=gen))
            else:
                p.copy_(0.1 * torch.randn(p.shape, generator=gen))
        if stop_scale:
            _stop_soon(model, gen, stop_scale)
        codec = model.codec_model
        torch.manual_seed(int(torch.randint(0, 2**31 - 1, (1,), generator=gen)))
        for m in codec.modules():
            if isinstance(m, (torch.nn.Conv1d, torch.nn.ConvTranspose1d, torch.nn.Linear, torch.nn.LayerNorm)):
                m.reset_parameters()
        for name, b in codec.named_buffers():
            if name.endswith("embed_sum"):
                b.copy_(torch.randn(b.shape, generator=gen))
            elif name.endswith("cluster_usage"):
                b.copy_(0.5 + torch.rand(b.shape, generator=gen))
            elif name.endswith("initialized"):
                b.fill_(1.0)
        for name, p in codec.named_parameters():
            if name.endswith("layer_scale.scale"):
                p.copy_(0.5 + 0.1 * torch.randn(p.shape, generator=gen))


def _save_tokenizer(d: Path) -> None:
    from transformers import PreTrainedTokenizerFast

    tok = PreTrainedTokenizerFast(tokenizer_object=build_tokenizer(), bos_token="<|begin_of_text|>",
                                  eos_token="<|end_of_text|>", pad_token="<|end_of_text|>")
    tok.save_pretrained(str(d))


def build(out: Path, spec: dict) -> None:
    from transformers import CsmConfig, CsmForConditionalGeneration

    for name, ck in spec["checkpoints"].items():
        gen = torch.Generator().manual_seed(int(spec["seed"]))
        torch.manual_seed(int(spec["seed"]))
        model = CsmForConditionalGeneration(CsmConfig(**ck["config"])).eval()
        _randomize(model, gen, ck.get("stop_scale"))
        d = out / name
        model.save_pretrained(str(d))
        _save_tokenizer(d)


def _processor(d: Path):
    from transformers import AutoTokenizer, CsmProcessor, EncodecFeatureExtractor

    tok = AutoTokenizer.from_pretrained(str(d))
    fe = EncodecFeatureExtractor(feature_size=1, sampling_rate=24000)
    return CsmProcessor(feature_extractor=fe, tokenizer=tok, chat_template=TEMPLATE)


def _prompt(model, processor, job: dict) -> dict:
    """The processor's ids for the conversation, the model's merged embeddings and the codes of
    each context turn's audio."""
    conv, audio = [], []
    for turn in job["turns"]:
        content = [{"type": "text", "text": turn["text"]}]
        if turn.get("wav") is not None:
            content.append({"type": "audio", "path": "unused"})
            audio.append(np.asarray(turn["wav"], dtype=np.float32))
        conv.append({"role": str(turn["speaker"]), "content": content})
    text = processor.apply_chat_template(conv, tokenize=False)
    inputs = processor(text=text, audio=audio or None, return_tensors="pt")
    with torch.no_grad():
        merged = model._merge_input_ids_with_input_values(inputs["input_ids"], inputs.get("input_values"),
                                                          inputs.get("input_values_cutoffs"))
        codes = [model.codec_model.encode(torch.from_numpy(a)[None, None]).audio_codes[0].T for a in audio]
    return {"text": text, "inputs": dict(inputs), "input_ids": inputs["input_ids"][0],
            "embeds": merged["inputs_embeds"][0], "codes": codes}


def run(root: Path, jobs: dict, out: Path) -> None:
    from transformers import CsmForConditionalGeneration

    results: dict = {}
    models: dict = {}
    for name, job in jobs.items():
        ck = job["checkpoint"]
        if ck not in models:
            models[ck] = (CsmForConditionalGeneration.from_pretrained(str(root / ck)).eval(), _processor(root / ck))
        model, processor = models[ck]
        if job["kind"] == "generate":
            p = _prompt(model, processor, job)
            kw = {k: v for k, v in p["inputs"].items() if k != "padding_mask"}
            with torch.no_grad():
                seq = model.generate(**kw, do_sample=False, depth_decoder_do_sample=False,
                                     max_new_tokens=job["max_new_tokens"])
            results[name] = {"input_ids": p["input_ids"], "embeds": p["embeds"], "codes": p["codes"],
                             "text": p["text"], "frames": seq[0]}
        elif job["kind"] == "codec":
            codec = model.codec_model
            with torch.no_grad():
                wav = codec.decode(torch.tensor(job["codes"])).audio_values  # [B, 1, S]
                enc = [codec.encode(torch.tensor(w, dtype=torch.float32)[None, None]).audio_codes[0]
                       for w in job["wavs"]]
            results[name] = {"decode": wav, "encode": enc}
        else:
            raise ValueError(f"unknown job kind {job['kind']!r}")
    torch.save(results, out)


def main() -> None:
    torch.set_num_threads(1)  # tiny tensors (see conftest.one_thread)
    cmd = sys.argv[1]
    if cmd == "build":
        build(Path(sys.argv[2]), json.loads(Path(sys.argv[3]).read_text()))
    elif cmd == "build-run":  # transformers' import is most of a run's time: pay it once
        build(Path(sys.argv[2]), json.loads(Path(sys.argv[3]).read_text()))
        run(Path(sys.argv[2]), json.loads(Path(sys.argv[4]).read_text()), Path(sys.argv[5]))
    elif cmd == "run":
        run(Path(sys.argv[2]), json.loads(Path(sys.argv[3]).read_text()), Path(sys.argv[4]))
    else:
        raise SystemExit(f"unknown command {cmd!r}")


if __name__ == "__main__":
    main()

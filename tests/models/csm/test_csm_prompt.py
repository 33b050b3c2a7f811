"""CSM prompts against transformers' CsmProcessor and CsmForConditionalGeneration: the ids, the
context frames and the input embeddings, with and without context turns."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from tests.models.csm.csm_fixtures import GEN_JOBS


@pytest.fixture(scope="module")
def program(ckpt_root, voice_refs) -> Any:
    from models.csm.build import build_csm_backend

    backend = build_csm_backend(str(ckpt_root / "main"), device="cpu", max_num_seqs=2, max_model_len=512,
                                warmup=False)
    for ref in voice_refs.values():
        backend.program.prepare_voice(ref)
    return backend.program


def _ids(program: Any, name: str) -> list[int]:
    *context, (speaker, text, _) = GEN_JOBS[name]["turns"]
    if len(context) == 1 and context[0][0] == 0 and speaker == 0:
        voice, options = program.validate(context[0][2], {})
    else:
        voice, options = program.validate(str(speaker), {"context": ",".join(f"{v}:{s}" for s, _, v in context)})
    return program.build_prompt(text, voice, options)


@pytest.mark.parametrize("name", ["plain", "context", "clone", "two_turns"])
def test_prompt_ids_and_context_frames_equal_the_reference(program, reference, name: str) -> None:
    """Text positions carry the processor's ids; each audio position the reference's <|AUDIO|> (its
    frame: the reference's Mimi codes of that turn's audio, in order) or <|audio_eos|> (the
    all-zero frame)."""
    from models.csm.model import unpack

    ref = reference[name]
    kind, low = unpack(torch.tensor(_ids(program, name)))
    ref_ids = ref["input_ids"]
    assert kind.shape == ref_ids.shape
    cfg = program.config
    assert low[kind == 0].equal(ref_ids[kind == 0])
    audio = kind == 1
    frames = program.slots.pool.index_select(0, low[audio].cpu())  # [N, 32]
    is_eos = (ref_ids == cfg.audio_eos_token_id)
    assert (ref_ids[audio] == cfg.audio_token_id).logical_or(is_eos[audio]).all()
    assert (frames[is_eos[audio]] == 0).all()
    codes = [c for c in ref["codes"]]  # [frames, 32] per context turn
    assert frames[~is_eos[audio]].equal(torch.cat(codes)) if codes else not audio.any()


@pytest.mark.parametrize("name", ["plain", "context", "two_turns"])
def test_prompt_embeddings_equal_the_reference(program, reference, name: str) -> None:
    """The backbone's input rows (text embeddings, summed codebook embeddings with the reference's
    offsets, the eos frame) equal the reference's merged inputs_embeds."""
    ids = torch.tensor(_ids(program, name))
    last = torch.zeros(ids.numel(), 32, dtype=torch.int64)
    with torch.no_grad():
        ours = program.model.embed(ids, program.slots.pool, last)
    torch.testing.assert_close(ours, reference[name]["embeds"], rtol=1e-5, atol=1e-6)


def test_speaker_and_text_are_tokenized_as_one_string(program) -> None:
    """A turn is "[speaker]text" tokenized as one string (Llama 3's split joins "]" and the first
    word, as the reference's template does), between <|begin_of_text|> and <|end_of_text|>."""
    from models.csm.prompt import Turn, build_prompt

    cfg = program.config
    ids = build_prompt(program.tokenizer, cfg, [Turn(1, "Hello")])
    assert ids == [cfg.bos_token_id, *program.tokenizer.ids("[1]Hello"), cfg.eos_token_id]


def test_the_stand_in_tokenizer_is_deterministic_and_below_the_special_ids() -> None:
    """Dummy mode without tokenizer files: one id per Llama 3 piece, stable, under 128,000."""
    from models.csm.prompt import StandInTokenizer

    tok = StandInTokenizer()
    a = tok.ids("[0]Hello there, it's 2026!")
    assert a == StandInTokenizer().ids("[0]Hello there, it's 2026!")
    assert len(a) >= 6 and all(0 <= i < 128_000 for i in a)

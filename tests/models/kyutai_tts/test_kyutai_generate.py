"""Greedy generation parity with moshi 0.2.13's TTSModel.generate: every codebook, the text/action
stream, the stop, at once and word by word with pauses, several streams batched."""

from __future__ import annotations

import pytest
import torch
from tests.models.kyutai_tts.kyutai_fixtures import GEN_JOBS, Driver, cfg_value, frames_of, load_ours, voice_file

from models.kyutai_tts.loader import load_voice
from models.kyutai_tts.text import script_to_entries


def _ours(root, job: dict, *, arrive_every: int | None = None):
    loaded = load_ours(root, n_q=job["n_q"])
    drv = Driver(loaded)
    drv.load_voice(1, [load_voice(voice_file(root, job["voice"]))])
    entries = script_to_entries(loaded.tokenizer, job["text"])
    arrive = None if arrive_every is None else [3 + i * arrive_every for i in range(len(entries))]
    stream = drv.add(0, entries, voice_row=1, cfg=cfg_value(job["cfg"]), arrive_at=arrive)
    drv.run()
    return loaded, stream


def test_reference_exercises_words_and_pauses(tts_reference):
    """The tiny reference model chooses words and pads itself (not only forced): the parity below
    covers the model's text stream, not just the machine's defaults."""
    logged = tts_reference["once32"]["logged"]
    sampled = logged[:, 0].tolist()
    assert sampled.count(0) >= 3 and sampled.count(3) >= 3
    assert tts_reference["once32"]["end_step"] is not None


def test_entries_equal_reference(tts_ckpt, tts_reference):
    """Our text -> entries (cleaning, speaker token, padding, breaks, <unk>) equals prepare_script's."""
    tok = load_ours(tts_ckpt).tokenizer
    for key, job in GEN_JOBS.items():
        ours = [(list(e.tokens), e.padding) for e in script_to_entries(tok, job["text"])]
        assert ours == [tuple(x) for x in tts_reference[key]["entries"]], key


@pytest.mark.parametrize("key", sorted(GEN_JOBS))
def test_greedy_generation_equals_reference(tts_ckpt, tts_reference, key):
    """Frames (text stream + all generated codebooks), the sampled and fed text tokens, the end
    step and the stop equal the reference's greedy TTSModel.generate."""
    job, ref = GEN_JOBS[key], tts_reference[key]
    _, s = _ours(tts_ckpt, job)
    rows = torch.tensor(s.rows)
    assert rows[:, :2].tolist() == ref["logged"].tolist()  # (sampled, fed) per step
    assert frames_of(s.rows, job["n_q"]).tolist() == ref["frames"].tolist()
    assert s.host.end_step == ref["end_step"]
    assert s.host.consumption_times == ref["consumption"]


def test_word_by_word_with_pauses_equals_reference(tts_ckpt, tts_reference):
    """Words arriving slowly (one every 7 frames: the sequence pauses when the model would pop a
    word whose look-ahead is missing) give exactly the tokens of the whole text at once."""
    ref = tts_reference["once32"]
    _, s = _ours(tts_ckpt, GEN_JOBS["once32"], arrive_every=7)
    assert s.pauses > 0
    assert torch.tensor(s.rows)[:, :2].tolist() == ref["logged"].tolist()
    assert frames_of(s.rows, 32).tolist() == ref["frames"].tolist()


def test_reference_streaming_equals_reference_at_once(tts_reference):
    """A reference fact the program relies on: moshi fed 3 entries at a time gives the tokens of
    the whole text at once."""
    a, b = tts_reference["once32"], tts_reference["reveal32"]
    assert a["logged"].tolist() == b["logged"].tolist() and a["frames"].tolist() == b["frames"].tolist()


def test_batched_streams_equal_each_alone(tts_ckpt, tts_reference):
    """Two streams with different voices, cfg and texts, one joining later and pausing for its
    words, batched in the same steps, each equal their own reference generation."""
    loaded = load_ours(tts_ckpt, n_q=8)
    drv = Driver(loaded, max_slots=3, bank_rows=2)
    drv.load_voice(0, [load_voice(voice_file(tts_ckpt, "voice_b"))])
    drv.load_voice(1, [load_voice(voice_file(tts_ckpt, "voice_a"))])
    job_b, job_a = GEN_JOBS["once8_nocfg"], GEN_JOBS["once8_a"]
    eb = script_to_entries(loaded.tokenizer, job_b["text"])
    s_b = drv.add(2, eb, voice_row=0, cfg=None, arrive_at=[5 + 6 * i for i in range(len(eb))])
    s_a = drv.add(0, script_to_entries(loaded.tokenizer, job_a["text"]), voice_row=1, cfg="2.0")
    drv.run()
    assert s_b.pauses > 0
    for s, key in ((s_a, "once8_a"), (s_b, "once8_nocfg")):
        ref = tts_reference[key]
        assert torch.tensor(s.rows)[:, :2].tolist() == ref["logged"].tolist(), key
        assert frames_of(s.rows, 8).tolist() == ref["frames"].tolist(), key


def test_audio_equals_reference(tts_ckpt, tts_reference):
    """Our frames through MimiDecodeStream, cut as simple_generate cuts them (from delay_steps, 2
    frames dropped, up to end_step), equal the reference's audio within 1e-5 relative."""
    from models.mimi.stream import MimiDecodeStream

    job, ref = GEN_JOBS["once16_break"], tts_reference["once16_break"]
    loaded, s = _ours(tts_ckpt, job)
    frames = frames_of(s.rows, job["n_q"])  # [1 + n_q, T]
    stream = MimiDecodeStream(loaded.mimi, 1, num_codebooks=job["n_q"])
    slot = torch.tensor([0])
    stream.reset(slot)
    d = loaded.config.delay_steps
    pcm = [stream.step(slot, frames[1:, t][None])[0].clamp(-1, 1) for t in range(d, frames.shape[1])]
    ours = torch.cat(pcm[2:][: s.host.end_step])
    assert ours.shape == ref["audio"].shape and ours.numel() > 0
    assert float((ours - ref["audio"]).abs().max() / ref["audio"].abs().max()) < 1e-5

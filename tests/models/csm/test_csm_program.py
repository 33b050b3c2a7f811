"""The CSM program served by the runtime (LMBackend): greedy frames equal transformers' CSM over
all 32 codebooks (with and without context turns, a cloned voice, the stop frame), batch
invariance, the CUDA-graph path emulated on the CPU, bad input refused."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch

from engine.backend import OptionError
from tests.models.csm.csm_fixtures import GEN_JOBS
from tests.models.program_harness import add_job as _add, audio_of as _audio, drain as _drain, record_rows as _record

SAMPLED = {"temperature": 0.9, "top_k": 50, "top_p": 0.95, "max_tokens": 8}


def _backend(model: str = "tiny", **kw: Any) -> Any:
    from models.csm.build import build_csm_backend

    kw.setdefault("load_format", "dummy")
    kw.setdefault("max_model_len", 512)
    return build_csm_backend(model, device="cpu", max_num_seqs=8, warmup=False, **kw)


@pytest.fixture(scope="module")
def tiny() -> Any:
    return _backend()


@pytest.fixture(scope="module")
def served(ckpt_root, voice_refs) -> dict:
    """The reference's checkpoints served by the runtime, the test voices registered."""
    out = {name: _backend(str(ckpt_root / name), load_format="auto") for name in ("main", "stop")}
    for ref in voice_refs.values():
        out["main"].program.prepare_voice(ref)
    return out


def _run(backend: Any, text: str, options: dict[str, Any], *, job: int = 1, voice: str | None = None):
    frames = _record(backend)
    _add(backend, job, text, options, voice)
    outs = _drain(backend)
    assert not [o.error for o in outs if o.error is not None]
    return outs, frames.get(job, [])


def _request(name: str) -> tuple[str, str, dict[str, Any]]:
    """A reference job as a request: (text, voice, context option)."""
    *context, (speaker, text, _) = GEN_JOBS[name]["turns"]
    if len(context) == 1 and context[0][0] == 0 and speaker == 0:  # a registered voice speaking again
        return text, context[0][2], {}
    turns = ",".join(f"{v}:{s}" for s, _, v in context)
    return text, str(speaker), ({"context": turns} if turns else {})


@pytest.mark.parametrize("name", ["plain", "context", "clone", "two_turns"])
def test_served_greedy_frames_equal_the_reference(served, reference, name: str) -> None:
    """Greedy through the runtime (paged attention, the backbone and the depth decoder in the step,
    the context frames from the pool) gives the reference's frames, all 32 codebooks."""
    text, voice, extra = _request(name)
    backend = served["main"]
    _, frames = _run(backend, text, {"temperature": 0.0, "max_tokens": GEN_JOBS[name]["max_new_tokens"], **extra},
                     voice=voice)
    ref = reference[name]["frames"]
    assert len(frames) == ref.shape[0]
    assert torch.tensor([f[1:] for f in frames]).equal(ref)


def test_the_all_zero_frame_stops_a_stream_as_the_reference_does(served, reference) -> None:
    """On a checkpoint that ends speech soon, each stream stops at the reference's stop frame
    (codebooks 0..30 all zero): its frames before it are the reference's, it is not audio, and the
    stream finishes before max_tokens; two streams stop at their own frames in one batch."""
    backend = served["stop"]
    frames = _record(backend)
    opts = {"temperature": 0.0, "max_tokens": 20}
    for job, name in enumerate(("stop_long", "stop_short")):
        _add(backend, job, GEN_JOBS[name]["turns"][0][1], opts)
    outs = _drain(backend)
    for job, name in enumerate(("stop_long", "stop_short")):
        ref = reference[name]["frames"]
        assert (ref[-1, :31] == 0).all() and ref.shape[0] < 20  # the reference stopped
        assert torch.tensor([f[1:] for f in frames[job]]).equal(ref[:-1])
        assert _audio(outs, job).size == (ref.shape[0] - 1) * 1920
        assert [o.is_finished for o in outs if o.job_id == job][-1]


def test_a_stream_alone_equals_the_same_stream_among_others(tiny) -> None:
    """Batch invariance: a stream's sampled frames alone equal those beside 2 and 5 others that
    join at different steps, and its audio too (to float32 rounding)."""
    text = "A stream that must not depend on its neighbours."
    opts = dict(SAMPLED, seed=5)
    outs, alone = _run(tiny, text, opts, job=1)
    solo_audio = _audio(outs, 1)
    assert len(alone) == SAMPLED["max_tokens"]
    for others in (2, 5):
        frames = _record(tiny)
        _add(tiny, 100, text, opts)
        outs = []
        for k in range(others):
            for _ in range(k + 1):
                outs.extend(tiny.step())
            _add(tiny, 200 + k, f"Neighbour {k} says something else.", dict(SAMPLED, seed=100 + k), voice=str(k % 3))
        _drain(tiny, outs)
        assert frames[100] == alone, f"with {others} others"
        np.testing.assert_allclose(_audio(outs, 100), solo_audio, rtol=0, atol=2e-6)


def test_seeds_and_speakers_change_the_frames(tiny) -> None:
    """Another seed or another speaker id gives other frames; the same seed the same ones."""
    text = "Same words each time."
    opts = dict(SAMPLED, max_tokens=3)
    _, a = _run(tiny, text, dict(opts, seed=1), job=1)
    _, b = _run(tiny, text, dict(opts, seed=1), job=2)
    _, c = _run(tiny, text, dict(opts, seed=2), job=3)
    _, d = _run(tiny, text, dict(opts, seed=1), job=4, voice="3")
    assert a == b and a != c and a != d


@pytest.mark.parametrize("async_steps", [False, True], ids=["sync", "async-steps"])
def test_the_cuda_graph_path_gives_the_eager_frames(async_steps: bool) -> None:
    """``CudaGraphModelRunner``'s path emulated on the CPU (packed prompts with per-token slot
    rows, decode rows fed ``LAST_FRAME``, the head with its depth loop in the step function) gives
    the eager runner's frames, with and without asynchronous steps."""
    from tests.engine.llm.graph_emulation import emulated_graph_runner

    counts = {"eager": 0}
    factory = emulated_graph_runner(counts=counts)

    texts = ["Graphs must not change a thing.", "Nor for this one, which joins later.", "Short."]
    runs = []
    for backend in (_backend(), _backend(runner_factory=factory, async_steps=async_steps)):
        frames = _record(backend)
        outs: list = []
        for i, text in enumerate(texts):
            _add(backend, i, text, dict(SAMPLED, seed=20 + i, max_tokens=4 + 2 * i), voice=str(i))
            outs.extend(backend.step())
        _drain(backend, outs)
        assert not [o.error for o in outs if o.error is not None]
        runs.append(frames)
    assert counts["eager"] == 0
    assert runs[0] == runs[1]


def test_info_declares_the_frames_it_makes_per_second_of_audio(tiny) -> None:
    """Admission's rate is CSM's own: one decode row per Mimi frame, 12.5 per second of audio."""
    from models.csm.model import STOP

    rate = tiny.info.tokens_per_audio_second
    assert rate == 12.5 and tiny.info.supports_cloning
    outs, frames = _run(tiny, "Admission counts frames.", {"temperature": 0.0, "max_tokens": 6}, job=77)
    spoken = sum(1 for f in frames if f[0] != STOP)
    assert spoken and _audio(outs, 77).size == spoken * tiny.info.sample_rate / rate


def test_unknown_speakers_and_voices_are_refused_naming_what_is_served(tiny) -> None:
    """An unknown speaker id or voice is refused naming the speaker ids; so is an unknown option."""
    for voice in ("10", "nobody", "-1"):
        with pytest.raises(OptionError) as e:
            tiny.validate(voice, {})
        assert e.value.code == "unknown_voice" and "0, 1, 2" in str(e.value)
    with pytest.raises(OptionError) as e:
        tiny.validate("0", {"language": "english"})
    assert e.value.code == "invalid_option" and "context" in str(e.value)


@pytest.mark.parametrize("context, needle", [
    (["v-a"], "must be a string"),
    (",".join(["v-a"] * 9), "at most 8 turns"),
    ("v-a:" + "0" * 600, "at most 512 characters"),
    ("v-a:10", "speaker must be an integer in [0, 9]"),
    ("v-a:x", "speaker must be an integer"),
    ("v-a,,v-b", "turn 2 names no voice"),
])
def test_malformed_or_oversized_context_is_refused(served, context: Any, needle: str) -> None:
    """The context option is bounded (8 turns, 512 characters, speaker ids 0-9) and checked entry by
    entry; what is wrong is named."""
    with pytest.raises(OptionError) as e:
        served["main"].validate("1", {"context": context})
    assert e.value.code == "invalid_option" and needle in str(e.value)


def test_context_is_normalised_to_voice_speaker_pairs(served) -> None:
    """Spaces and default speakers are normalised (the stream's ready message echoes it); an empty
    context is none."""
    _, opts = served["main"].validate("1", {"context": " v-a , v-b:1"})
    assert opts["context"] == "v-a:0,v-b:1"
    assert served["main"].validate("1", {"context": ""})[1]["context"] is None


def test_context_voices_must_be_registered(served) -> None:
    """A context turn naming a voice the server has not prepared is refused with unknown_voice."""
    with pytest.raises(OptionError) as e:
        served["main"].validate("1", {"context": "v-a,v-unheard:1"})
    assert e.value.code == "unknown_voice" and "v-unheard" in str(e.value)


def test_a_conversation_longer_than_a_row_fails_that_job_only(ckpt_root, voice_refs) -> None:
    """Context that fills more than max_model_len fails its job with too_long (naming the frames);
    a job beside it is unaffected."""
    short = _backend(str(ckpt_root / "main"), load_format="auto", max_model_len=96)
    short.program.prepare_voice(voice_refs["v-a"])  # 9 frames
    turns = ",".join(f"v-a:{i % 2}" for i in range(8))  # 8 turns of ~22 positions
    _add(short, 1, "Too much context before this.", {"max_tokens": 4, "context": turns}, voice="1")
    _add(short, 2, "Fine.", {"max_tokens": 3, "temperature": 0.0})
    outs = _drain(short)
    errors = [o for o in outs if o.error is not None]
    assert [o.job_id for o in errors] == [1] and errors[0].error.code == "too_long"
    assert "context audio frames" in errors[0].error.message
    assert _audio(outs, 2).size == 3 * 1920


def test_a_voice_without_a_transcript_or_too_long_is_refused(tiny, tmp_path, voice_refs) -> None:
    """prepare_voice refuses a recording with no transcript (CSM needs its words), one over 30 s,
    and a file that is not a WAV; each with voice_unavailable naming the voice."""
    from types import SimpleNamespace

    ref = voice_refs["v-a"]
    with pytest.raises(OptionError) as e:
        tiny.program.prepare_voice(SimpleNamespace(**{**vars(ref), "transcript": None}))
    assert e.value.code == "voice_unavailable" and "transcript" in str(e.value)
    import wave

    long_wav = tmp_path / "long.wav"
    with wave.open(str(long_wav), "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(8000)
        w.writeframes(b"\0\0" * 8000 * 31)
    with pytest.raises(OptionError) as e:
        tiny.program.prepare_voice(SimpleNamespace(**{**vars(ref), "voice_id": "v-long", "path": str(long_wav),
                                                      "sample_rate": 8000}))
    assert e.value.code == "voice_unavailable" and "31.0 s" in str(e.value)
    bad = tmp_path / "bad.wav"
    bad.write_bytes(b"not a wav")
    with pytest.raises(OptionError) as e:
        tiny.program.prepare_voice(SimpleNamespace(**{**vars(ref), "voice_id": "v-bad", "path": str(bad)}))
    assert e.value.code == "voice_unavailable" and "v-bad" in str(e.value)


def test_a_registered_voice_is_encoded_once_and_again_when_its_file_changes(tiny, voice_refs) -> None:
    """prepare_voice encodes a voice once; the same sha256 reuses it, a new one encodes it again."""
    from types import SimpleNamespace

    program = tiny.program
    before = program.totals()["voices_encoded"]
    ref = voice_refs["v-b"]
    assert program.prepare_voice(ref) == "v-b"
    assert program.prepare_voice(ref) == "v-b"
    assert program.totals()["voices_encoded"] == before + 1
    program.prepare_voice(SimpleNamespace(**{**vars(ref), "sha256": "changed"}))
    assert program.totals()["voices_encoded"] == before + 2
    v, opts = tiny.validate("v-b", {"max_tokens": 3})
    assert v == "v-b" and opts["context"] is None

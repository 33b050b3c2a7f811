"""The Qwen3-TTS program served by the runtime (LMBackend): reference parity through the runtime,
input streaming (word by word, pauses), batch invariance, bad input."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch

from engine.backend import OptionError
from tests.models.qwen3_tts.qwen3_fixtures import GEN_JOBS
from tests.models.program_harness import add_job as _add, audio_of as _audio, drain as _drain, record_rows as _record

SAMPLED = {"temperature": 0.9, "top_k": 50, "top_p": 0.95, "max_tokens": 24}


def _backend(model: str = "tiny", **kw: Any) -> Any:
    from models.qwen3_tts.build import build_qwen3_backend

    kw.setdefault("load_format", "dummy")
    return build_qwen3_backend(model, device="cpu", max_num_seqs=8, max_model_len=512, warmup=False, **kw)


@pytest.fixture(scope="module")
def tiny() -> Any:
    return _backend()


def _run(backend: Any, pieces: list[str], options: dict[str, Any], *, job: int = 1, steps_between: int = 0,
         voice: str | None = None) -> tuple[list, list[list[int]]]:
    frames = _record(backend)
    _add(backend, job, pieces[0], options, voice)
    outs: list = []
    for p in pieces[1:]:
        for _ in range(steps_between):
            outs.extend(backend.step())
        backend.push_text(job, p)
    backend.push_text(job, "", final=True)
    _drain(backend, outs)
    assert not [o.error for o in outs if o.error is not None]
    return outs, frames.get(job, [])


def test_served_greedy_frames_equal_the_reference(ckpt_root, reference) -> None:
    """Greedy through the runtime (paged attention, the head in the step, the text track fed as
    next inputs) gives the reference's 16 codebooks frame for frame, text at once and word by word."""
    job = GEN_JOBS["cv_dual"]
    backend = _backend(str(ckpt_root / "custom"), load_format="auto")
    opts = {"temperature": 0.0, "repetition_penalty": 1.05, "language": job["language"].lower(),
            "max_tokens": job["max_new_tokens"] - 1}
    ref = reference["cv_dual"]["codes"].tolist()
    _, at_once = _run(backend, [job["text"]], opts, voice=job["speaker"])
    words = job["text"].split(" ")
    _, by_word = _run(backend, [words[0]] + [" " + w for w in words[1:]], opts, job=2, steps_between=2,
                      voice=job["speaker"])
    assert at_once == ref
    assert by_word == ref


def test_text_word_by_word_gives_the_tokens_of_text_at_once(tiny) -> None:
    """Sampled with a seed: the same frames and audio whether the text came at once or a word at a time."""
    text = "Hello there, this is streamed text: 3 words at a time, or one."
    opts = dict(SAMPLED, seed=7)
    outs_a, a = _run(tiny, [text], opts, job=1)
    words = text.split(" ")
    outs_b, b = _run(tiny, [words[0]] + [" " + w for w in words[1:]], opts, job=2)
    assert a == b and len(a) == SAMPLED["max_tokens"]
    np.testing.assert_array_equal(_audio(outs_a, 1), _audio(outs_b, 2))


def test_a_paused_sequence_resumes_with_identical_output(tiny) -> None:
    """Text that runs out mid-turn pauses the sequence (no decode rows, no work); more text resumes
    it, and the frames are those of the whole text at once."""
    opts = dict(SAMPLED, seed=11, max_tokens=20)
    _, whole = _run(tiny, ["One two three four five six seven."], opts, job=1)
    frames = _record(tiny)
    _add(tiny, 2, "One two", opts)
    outs: list = []
    paused_seen = False
    for piece in (" three", " four", " five", " six", " seven."):
        for _ in range(40):  # runs until the text track is used up: the sequence pauses
            outs.extend(tiny.step())
            seq = next((s for s in tiny.scheduler.running if s.seq_id == 2), None)
            if seq is not None and seq.is_paused:
                paused_seen = True
                assert not tiny.has_work()  # a paused turn is no work for the engine loop
                break
        tiny.push_text(2, piece)
    tiny.push_text(2, "", final=True)
    _drain(tiny, outs)
    assert paused_seen
    assert frames[2] == whole


def test_a_stream_alone_equals_the_same_stream_among_others(tiny) -> None:
    """Batch invariance: a stream's frames alone equal those beside 1, 3 and 7 others that join at
    different steps, and its audio too (to float32 rounding)."""
    text = "A stream that must not depend on its neighbours."
    opts = dict(SAMPLED, seed=5)
    outs, alone = _run(tiny, [text], opts, job=1)
    solo_audio = _audio(outs, 1)
    for others in (1, 3, 7):
        frames = _record(tiny)
        _add(tiny, 100, text, opts)
        tiny.push_text(100, "", final=True)
        outs = []
        for k in range(others):
            for _ in range(k + 1):
                outs.extend(tiny.step())
            _add(tiny, 200 + k, f"Neighbour {k} says something else entirely.", dict(SAMPLED, seed=100 + k))
            tiny.push_text(200 + k, "", final=True)
        _drain(tiny, outs)
        assert frames[100] == alone, f"with {others} others"
        # (float32 codec GEMMs of other batch sizes round differently: equal to rounding error)
        np.testing.assert_allclose(_audio(outs, 100), solo_audio, rtol=0, atol=2e-6)


def test_the_channels_last_codec_serves_the_same_audio(tiny, monkeypatch) -> None:
    """``codec_layout="nwc"`` (``--model-setting codec_layout=nwc``) runs the channels-last codec
    step: the same frames, the same audio to float32 rounding, with ``codec_compile`` and with
    ``codec_conv="cudnn"`` too; an unknown layout is refused at load naming the layouts,
    ``codec_compile`` without the channels-last layout too."""
    from models.qwen3_tts.codec_nwc import CodecStreamNWC

    text = "The same words through either codec layout."
    opts = dict(SAMPLED, seed=3)
    outs, frames = _run(tiny, [text], opts, job=1)
    nwc = _backend(codec_layout="nwc")
    assert isinstance(nwc.program.codec.stream, CodecStreamNWC)
    outs_nwc, frames_nwc = _run(nwc, [text], opts, job=1)
    ref = _audio(outs, 1)
    assert frames_nwc == frames and np.abs(ref).max() > 1e-3
    np.testing.assert_allclose(_audio(outs_nwc, 1), ref, rtol=0, atol=2e-6)
    with pytest.raises(ValueError, match="ncw, nwc"):
        _backend(codec_layout="nhwc")
    # its SnakeBeta compiled: the same audio again (traced with torch.compile's aot_eager backend,
    # the same graph without code generation: inductor's C++ build is not a CI dependency)
    import functools

    from models.qwen3_tts import codec_nwc

    monkeypatch.setattr(codec_nwc, "make_codec_stream",
                        functools.partial(codec_nwc.make_codec_stream, compile_backend="aot_eager"))
    compiled = _backend(codec_layout="nwc", codec_compile=True)
    assert compiled.program.codec.stream._last_snake.fn is not codec_nwc.snake
    outs_c, frames_c = _run(compiled, [text], opts, job=1)
    assert frames_c == frames
    np.testing.assert_allclose(_audio(outs_c, 1), ref, rtol=0, atol=2e-6)
    cudnn = _backend(codec_layout="nwc", codec_conv="cudnn")
    outs_d, frames_d = _run(cudnn, [text], opts, job=1)
    assert frames_d == frames
    np.testing.assert_allclose(_audio(outs_d, 1), ref, rtol=0, atol=2e-6)
    with pytest.raises(ValueError, match="need codec_layout=nwc"):
        _backend(codec_compile=True)


def test_unknown_speaker_and_language_list_what_is_served(tiny) -> None:
    """An unknown voice or language is refused naming the served ones."""
    with pytest.raises(OptionError) as e:
        tiny.validate("nobody", {})
    assert e.value.code == "unknown_voice" and "ryan" in str(e.value)
    with pytest.raises(OptionError) as e:
        tiny.validate(None, {"language": "klingon"})
    assert e.value.code == "invalid_option" and "english" in str(e.value)


def test_text_in_an_unsupported_script_fails_that_stream_only(tiny) -> None:
    """Arabic text fails its own turn with model_error; a turn beside it is unaffected."""
    opts = dict(SAMPLED, seed=3, max_tokens=6)
    _add(tiny, 1, "Hello there my friend", opts)
    _add(tiny, 2, "Fine words here.", opts)
    tiny.push_text(2, "", final=True)
    tiny.push_text(1, " مرحبا")
    outs = _drain(tiny, [])
    errors = [o for o in outs if o.error is not None]
    assert [o.job_id for o in errors] == [1] and errors[0].error.code == "model_error"
    assert "Arabic" in errors[0].error.message
    assert [o.job_id for o in outs if o.is_finished] == [2] and _audio(outs, 2).size == 6 * 1920


def test_a_turn_that_ends_without_text_finishes_silent(tiny) -> None:
    """end with no text at all: the job finishes with no audio and no error."""
    opts = dict(SAMPLED, seed=1)
    _add(tiny, 9, "", opts)
    tiny.push_text(9, "", final=True)
    outs = _drain(tiny, [])
    assert [(o.job_id, o.is_finished, o.error) for o in outs] == [(9, True, None)]


def test_slot_state_is_per_sequence_on_the_cpu_graph_path() -> None:
    """The head writes each row's frame into its own slot of ``last_codes`` (padding: the last row)."""
    backend = _backend()
    slots = backend.program.slots
    assert slots.last_codes.shape == (9, 16) and slots.xvectors.shape[0] == 9
    torch.testing.assert_close(slots.last_codes, torch.zeros_like(slots.last_codes))


@pytest.mark.parametrize("async_steps", [False, True], ids=["sync", "async-steps"])
def test_the_cuda_graph_path_gives_the_eager_frames(async_steps: bool) -> None:
    """``CudaGraphModelRunner``'s path emulated on the CPU (decode input tables with the program's
    next inputs, packed prompts with per-token slot rows, the head in the step function) gives the
    eager runner's frames, with and without asynchronous steps."""
    from tests.engine.llm.graph_emulation import emulated_graph_runner

    counts = {"eager": 0}
    factory = emulated_graph_runner(counts=counts)

    texts = ["Graphs must not change a thing.", "Nor for this one, which joins later on.", "Short."]
    runs = []
    for backend in (_backend(), _backend(runner_factory=factory, async_steps=async_steps)):
        frames = _record(backend)
        outs: list = []
        for i, text in enumerate(texts):
            words = text.split(" ")
            _add(backend, i, words[0], dict(SAMPLED, seed=20 + i, max_tokens=12 + 3 * i))
            for w in words[1:]:
                outs.extend(backend.step())
                backend.push_text(i, " " + w)
            backend.push_text(i, "", final=True)
        _drain(backend, outs)
        assert not [o.error for o in outs if o.error is not None]
        runs.append(frames)
    assert counts["eager"] == 0
    assert runs[0] == runs[1]


def _voice_wav(path, seconds: float = 1.5, rate: int = 16000) -> Any:
    """A 16-bit mono WAV as the voice store writes it, and its VoiceRef."""
    import hashlib
    import wave

    from engine.messages import VoiceRef

    t = np.arange(int(rate * seconds)) / rate
    pcm = (0.3 * np.sin(2 * np.pi * 180 * t) + 0.1 * np.sin(2 * np.pi * 1100 * t)) * 32767
    with wave.open(str(path), "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(rate)
        w.writeframes(pcm.astype("<i2").tobytes())
    return VoiceRef("v-test", str(path), rate, hashlib.sha256(path.read_bytes()).hexdigest(), None)


def test_a_registered_voice_clones_through_the_speaker_encoder(ckpt_root, tmp_path) -> None:
    """Base checkpoint: prepare_voice turns the stored WAV into an x-vector (resampled to 24 kHz,
    once per file), and the served greedy frames equal our reference-checked generation loop with
    that x-vector in the prompt."""
    from engine.voice_audio import read_voice
    from tests.models.qwen3_tts.qwen3_fixtures import greedy_generate, load_ours

    backend = _backend(str(ckpt_root / "base"), load_format="auto")
    assert backend.info.supports_cloning
    ref = _voice_wav(tmp_path / "v.wav")
    name = backend.prepare_voice(ref)
    assert backend.prepare_voice(ref) == name  # cached by sha256
    loaded = load_ours(ckpt_root, "base")
    xv = loaded.model.speaker_encoder.embed(torch.from_numpy(read_voice(ref, 24000)))
    torch.testing.assert_close(backend.program._voices[name][1], xv)
    text = "Really? Yes, really."
    _, served = _run(backend, [text], {"temperature": 0.0, "language": "english", "max_tokens": 9}, voice=name)
    from models.qwen3_tts.prompt import build_prompt

    tok = loaded.tokenizer
    p = build_prompt(loaded.config, tok.text_ids(text), role_ids=tok.role_ids, language="english", xvector=True)
    packed = torch.tensor(p.packed, dtype=torch.int64)
    xvs = torch.zeros(len(p.packed), loaded.config.talker.hidden_size)
    xvs[p.xvector_rows] = xv
    with torch.no_grad():
        embeds = loaded.model.talker.embed_prompt(packed, xvs)
    ours = greedy_generate(loaded, p, embeds, 9)
    assert served == ours.tolist()


def test_cloning_is_refused_on_a_checkpoint_without_a_speaker_encoder(tiny, tmp_path) -> None:
    """CustomVoice has no speaker encoder: it does not offer cloning and prepare_voice says so."""
    assert not tiny.info.supports_cloning
    with pytest.raises(OptionError) as e:
        tiny.prepare_voice(_voice_wav(tmp_path / "v.wav"))
    assert e.value.code == "cloning_unsupported" and "Base" in str(e.value)


def test_a_voice_file_that_changed_is_unavailable(ckpt_root, tmp_path) -> None:
    """A stored file whose sha256 no longer matches its record is refused (voice_unavailable)."""
    backend = _backend(str(ckpt_root / "base"), load_format="auto")
    ref = _voice_wav(tmp_path / "v.wav")
    (tmp_path / "v.wav").write_bytes((tmp_path / "v.wav").read_bytes()[:-2] + b"\x01\x02")
    with pytest.raises(OptionError) as e:
        backend.prepare_voice(ref)
    assert e.value.code == "voice_unavailable"


def test_compatibility_letters_are_judged_as_their_plain_letters(tiny) -> None:
    """'ª', 'ﬁ' and full-width Latin are Latin letters (NFKC), not scripts of their own: the turn
    speaks; its refusal at the turn's first text (add_job) is ``model_error`` as later text's is."""
    opts = dict(SAMPLED, seed=3, max_tokens=6)
    _add(tiny, 1, "1ª ﬁne ｗｏｒｄ", opts)
    tiny.push_text(1, "", final=True)
    _add(tiny, 2, "Ελληνικά", opts)
    outs = _drain(tiny, [])
    errors = [o for o in outs if o.error is not None]
    assert [(o.job_id, o.error.code) for o in errors] == [(2, "model_error")] and "Greek" in errors[0].error.message
    assert [o.job_id for o in outs if o.is_finished] == [1] and _audio(outs, 1).size == 6 * 1920

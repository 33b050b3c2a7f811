"""The Kyutai TTS program served by the runtime (LMBackend): reference parity through the runtime
(at once and word by word), pauses, batch invariance, the graph path, bad input."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import torch
from tests.models.kyutai_tts.kyutai_fixtures import GEN_JOBS, frames_of

from engine.backend import OptionError
from tests.models.program_harness import add_job as _add, audio_of as _audio, drain as _drain, record_rows as _record

SAMPLED = {"temperature": 0.8, "top_p": 0.95, "max_tokens": 40}


@pytest.fixture(autouse=True)
def one_thread():
    """Tiny tensors: one thread avoids thread-pool overheads on a loaded 2-core machine."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def _backend(model: str = "tiny", **kw: Any) -> Any:
    from models.kyutai_tts.build import build_kyutai_backend

    kw.setdefault("load_format", "dummy")
    return build_kyutai_backend(model, device="cpu", max_num_seqs=8, max_model_len=512, warmup=False, **kw)


@pytest.fixture(scope="module")
def tiny() -> Any:
    return _backend(kyutai_n_q=8)


def _run(backend: Any, pieces: list[str], options: dict[str, Any], *, job: int = 1, steps_between: int = 0,
         voice: str | None = None) -> tuple[list, list[list[int]]]:
    rows = _record(backend)
    _add(backend, job, pieces[0], options, voice)
    outs: list = []
    for p in pieces[1:]:
        for _ in range(steps_between):
            outs.extend(backend.step())
        backend.push_text(job, p)
    backend.push_text(job, "", final=True)
    _drain(backend, outs)
    assert not [o.error for o in outs if o.error is not None]
    return outs, rows.get(job, [])


def _alone_then_joined(backend: Any, on_join: Callable[[], None] = lambda: None) -> dict:
    """Stream 1 alone for 25 steps, then stream 2 joins (``on_join`` called first); both run to
    their end: the rows each made."""
    rows = _record(backend)
    outs: list = []
    _add(backend, 1, "Alone at first, then with company.", dict(SAMPLED, seed=41, max_tokens=40))
    backend.push_text(1, "", final=True)
    for _ in range(25):
        outs.extend(backend.step())
    on_join()
    _add(backend, 2, "The second one joins.", dict(SAMPLED, seed=42, max_tokens=30))
    backend.push_text(2, "", final=True)
    _drain(backend, outs)
    assert not [o.error for o in outs if o.error is not None]
    return rows


def _words(text: str) -> list[str]:
    words = text.split(" ")
    return [words[0]] + [" " + w for w in words[1:]]


@pytest.mark.parametrize("key", ["once32", "once16_break"])
def test_served_greedy_tokens_equal_the_reference(tts_ckpt, tts_reference, key) -> None:
    """Greedy through the runtime (paged attention, the machine and the depth transformer in the
    step, words fed as the model asks): the reference's text stream, every codebook, the stop and
    the audio, text at once and word by word (the turn pausing for its words)."""
    job, ref = GEN_JOBS[key], tts_reference[key]
    backend = _backend(str(tts_ckpt), load_format="auto", kyutai_n_q=job["n_q"])
    opts = {"temperature": 0.0, "cfg": job["cfg"], "max_tokens": 400}
    outs, at_once = _run(backend, [job["text"]], opts, voice=job["voice"])
    _, by_word = _run(backend, _words(job["text"]), opts, job=2, steps_between=4, voice=job["voice"])
    for rows in (at_once, by_word):
        assert torch.tensor(rows)[:, :2].tolist() == ref["logged"].tolist()
        assert frames_of(rows, job["n_q"]).tolist() == ref["frames"].tolist()
    audio = _audio(outs, 1)
    assert audio.shape == tuple(ref["audio"].shape) and audio.size > 0
    assert float(np.abs(audio - ref["audio"].numpy()).max() / np.abs(ref["audio"].numpy()).max()) < 1e-5
    assert [o.is_finished for o in outs if o.job_id == 1][-1]


def test_text_word_by_word_gives_the_tokens_of_text_at_once(tiny) -> None:
    """Sampled with a seed: the same tokens and audio whether the text came at once or a word at a time."""
    text = "Hello there, this is streamed text: three words at a time, or one."
    opts = dict(SAMPLED, seed=7, max_tokens=60)
    outs_a, a = _run(tiny, [text], opts, job=1)
    outs_b, b = _run(tiny, _words(text), opts, job=2, steps_between=3)
    assert a == b and len(a) == 60
    np.testing.assert_array_equal(_audio(outs_a, 1), _audio(outs_b, 2))


def test_a_paused_sequence_resumes_with_identical_output(tiny) -> None:
    """A turn whose next words have not come pauses when the model may ask for one (no decode
    rows, no work); more text resumes it, and the tokens are those of the whole text at once."""
    opts = dict(SAMPLED, seed=11, max_tokens=50)
    _, whole = _run(tiny, ["One two three four five six seven."], opts, job=1)
    rows = _record(tiny)
    _add(tiny, 2, "One two three ", opts)
    outs: list = []
    paused = 0
    for piece in ("four ", "five ", "six ", "seven."):
        for _ in range(60):
            outs.extend(tiny.step())
            seq = next((s for s in tiny.scheduler.running if s.seq_id == 2), None)
            if seq is not None and seq.is_paused:
                paused += 1
                assert not tiny.has_work()  # a paused turn is no work for the engine loop
                break
        tiny.push_text(2, piece)
    tiny.push_text(2, "", final=True)
    _drain(tiny, outs)
    assert paused >= 2
    assert rows[2] == whole


def test_a_stream_alone_equals_the_same_stream_among_others(tiny) -> None:
    """Batch invariance: a stream's tokens alone equal those beside 1 and 3 others that join at
    different steps (other voices, cfg), and its audio too (to float32 rounding)."""
    text = "A stream that must not depend on its neighbours."
    opts = dict(SAMPLED, seed=5)
    outs, alone = _run(tiny, [text], opts, job=1)
    solo_audio = _audio(outs, 1)
    for others in (1, 3):
        rows = _record(tiny)
        _add(tiny, 100, text, opts)
        tiny.push_text(100, "", final=True)
        outs = []
        for k in range(others):
            for _ in range(k + 1):
                outs.extend(tiny.step())
            _add(tiny, 200 + k, f"Neighbour {k} says something else entirely.",
                 dict(SAMPLED, seed=100 + k, cfg=["1.0", None, "4.0"][k % 3]), voice=f"random-{1 + k % 3}")
            tiny.push_text(200 + k, "", final=True)
        _drain(tiny, outs)
        assert rows[100] == alone, f"with {others} others"
        np.testing.assert_allclose(_audio(outs, 100), solo_audio, rtol=0, atol=2e-6)


def test_unknown_voice_and_bad_options_are_refused(tiny) -> None:
    """An unknown voice is refused naming the served ones; bad options name their range."""
    with pytest.raises(OptionError) as e:
        tiny.validate("nobody", {})
    assert e.value.code == "unknown_voice" and "random-0" in str(e.value)
    with pytest.raises(OptionError) as e:
        tiny.validate(None, {"cfg": 9.0})
    assert e.value.code == "invalid_option" and "2.0" in str(e.value)
    assert tiny.validate(None, {"cfg": 3})[1]["cfg"] == "3.0"


def test_text_in_an_unsupported_script_fails_that_stream_only(tts_ckpt) -> None:
    """Words the tokenizer cannot write fail their own turn with model_error; a turn beside it is unaffected."""
    backend = _backend(str(tts_ckpt), load_format="auto", kyutai_n_q=8)
    opts = dict(SAMPLED, seed=3, max_tokens=30)
    _add(backend, 1, "Hello there my friend", opts, voice="voice_a")
    _add(backend, 2, "Fine words here.", opts, voice="voice_b")
    backend.push_text(2, "", final=True)
    backend.push_text(1, " 你好世界 ")
    outs = _drain(backend, [])
    errors = [o for o in outs if o.error is not None]
    assert [o.job_id for o in errors] == [1] and errors[0].error.code == "model_error"
    assert "unsupported" in errors[0].error.message
    assert [o.job_id for o in outs if o.is_finished] == [2]


def test_a_turn_that_ends_without_text_finishes_silent(tiny) -> None:
    """end with no text at all: the job finishes with no audio and no error."""
    _add(tiny, 9, "", dict(SAMPLED, seed=1))
    tiny.push_text(9, "", final=True)
    outs = _drain(tiny, [])
    assert [(o.job_id, o.is_finished, o.error) for o in outs] == [(9, True, None)]


def test_voice_bank_rows_are_reused_and_bounded() -> None:
    """More distinct voices than bank rows at once: the extra turn is refused (capacity,
    retryable); once a turn ends its row serves another voice."""
    backend = _backend(kyutai_n_q=4, voice_bank_size=2)
    opts = dict(SAMPLED, seed=2, max_tokens=8)
    for job, voice in ((1, "random-0"), (2, "random-1"), (3, "random-2")):
        _add(backend, job, "Some words here now.", opts, voice=voice)
        backend.push_text(job, "", final=True)
    outs = _drain(backend, [])
    errors = {o.job_id: o.error for o in outs if o.error is not None}
    assert list(errors) == [3] and errors[3].code == "capacity" and errors[3].retryable
    _add(backend, 4, "Some words here now.", opts, voice="random-2")
    backend.push_text(4, "", final=True)
    outs = _drain(backend, [])
    assert [o.job_id for o in outs if o.is_finished] == [4] and not [o for o in outs if o.error]


@pytest.mark.parametrize("async_steps", [False, True], ids=["sync", "async-steps"])
def test_the_cuda_graph_path_gives_the_eager_tokens(async_steps: bool) -> None:
    """``CudaGraphModelRunner``'s path emulated on the CPU (decode inputs from next_input, packed
    prompts with per-token slot rows, the head in the step function) gives the eager runner's
    tokens, with and without asynchronous steps (the host one or two steps behind the device)."""
    from tests.engine.llm.graph_emulation import emulated_graph_runner

    counts = {"eager": 0}
    factory = emulated_graph_runner(counts=counts)

    texts = ["Graphs must not change a thing at all.", "Nor for this one, which joins later on.", "Short."]
    runs = []
    for backend in (_backend(kyutai_n_q=4), _backend(kyutai_n_q=4, runner_factory=factory, async_steps=async_steps)):
        rows = _record(backend)
        outs: list = []
        for i, text in enumerate(texts):
            words = _words(text)
            _add(backend, i, words[0], dict(SAMPLED, seed=20 + i, max_tokens=30 + 3 * i))
            for w in words[1:]:
                outs.extend(backend.step())
                backend.push_text(i, w)
            backend.push_text(i, "", final=True)
        _drain(backend, outs)
        assert not [o.error for o in outs if o.error is not None]
        runs.append(rows)
    assert counts["eager"] == 0
    assert runs[0] == runs[1]


@pytest.mark.parametrize("async_steps", [False, True], ids=["sync", "async-steps"])
def test_turns_reusing_a_slot_on_the_cuda_graph_path_give_the_eager_tokens(async_steps: bool) -> None:
    """Turns one after another take the slot their predecessor left: the one-position prompt runs
    as a decode row, and the graph path must still reset the slot's machine and frame first
    (on the H200 every turn after the first went out of sync before it did)."""
    from tests.engine.llm.graph_emulation import emulated_graph_runner

    factory = emulated_graph_runner()

    texts = ["First in the slot.", "Second takes it over.", "Third one now."]
    runs = []
    for backend in (_backend(kyutai_n_q=4), _backend(kyutai_n_q=4, runner_factory=factory, async_steps=async_steps)):
        rows = _record(backend)
        for i, text in enumerate(texts):
            outs: list = []
            _add(backend, i, text + " ", dict(SAMPLED, seed=30 + i, max_tokens=24))
            backend.push_text(i, "", final=True)
            _drain(backend, outs)
            assert not [o.error for o in outs if o.error is not None]
        runs.append(rows)
    assert len(runs[1]) == len(texts)
    assert runs[0] == runs[1]


@pytest.mark.parametrize("async_steps", [False, True], ids=["sync", "async-steps"])
def test_the_text_only_variant_runs_the_silent_steps_and_changes_no_token(async_steps: bool) -> None:
    """On the graph path, the steps before the first audio frame (every codebook still delayed)
    replay the head's text-only variant (no depth transformer), those that make codebook 0 alone
    the codebook-0 variant; after them, and for a batch where any row makes more, the full step. The tokens equal the eager runner's,
    alone and with a second stream joining while the first makes audio."""
    from tests.engine.llm.graph_emulation import emulated_graph_runner

    record: list[str] = []
    runners: list = []
    factory = emulated_graph_runner(record=record, runners=runners)

    runs = []
    for backend in (_backend(kyutai_n_q=4), _backend(kyutai_n_q=4, runner_factory=factory, async_steps=async_steps)):
        runs.append(_alone_then_joined(backend))
    assert runs[0] == runs[1]
    head = runners[0].head
    silent, acoustic = head.first_audio_step, head.first_acoustic_step
    assert 2 <= silent < acoustic and runners[0].graphs.variants == head.variants == (16, 16)
    decodes = [r for r in record if r.startswith("decode")]
    # the first stream alone: its steps 1 .. silent - 1 (step 0 came from its prompt) text only,
    # then codebook 0 only up to the first acoustic step, then whole frames
    first = decodes.index("decode:2")
    assert first in (silent - 1, silent) and set(decodes[:first]) == {"decode:1"}
    assert decodes[first:first + acoustic - silent] == ["decode:2"] * (acoustic - silent)
    assert decodes[first + acoustic - silent] == "decode"
    # steps where the second stream is silent but the first makes audio run the full step
    assert decodes[first + acoustic - silent:][:30] == ["decode"] * 30


@pytest.mark.parametrize("async_steps", [False, True], ids=["sync", "async-steps"])
def test_light_steps_run_a_new_turn_in_its_cheap_variants_beside_a_speaking_one(async_steps: bool) -> None:
    """``light_steps``: while one stream makes audio (full steps), a second stream's first steps
    (text only, then codebook 0) run in steps of their own, replaying the head's cheaper
    variants, at most 3 in a row between full steps; the tokens equal the eager runner's."""
    from tests.engine.llm.graph_emulation import emulated_graph_runner

    record: list[str] = []
    runners: list = []
    runs = []
    marks: list[int] = []
    for backend in (_backend(kyutai_n_q=4),
                    _backend(kyutai_n_q=4, runner_factory=emulated_graph_runner(record=record, runners=runners),
                             async_steps=async_steps, light_steps=3)):
        runs.append(_alone_then_joined(backend, on_join=lambda: marks.append(len(record))))  # noqa: B023
    assert runs[0] == runs[1]
    head = runners[0].head
    assert backend.scheduler.config.light_until_step == head.light_until_step == head.first_acoustic_step
    after = [r for r in record[marks[-1]:] if r.startswith("decode")][: head.first_acoustic_step + 10]
    light = [r for r in after if r in ("decode:1", "decode:2")]
    assert len(light) >= head.first_acoustic_step - 4  # the second stream's first steps, nearly all light
    run = 0
    for r in after:  # never more than 3 light steps in a row
        run = run + 1 if r in ("decode:1", "decode:2") else 0
        assert run <= 3
    assert backend.scheduler.num_light_steps >= len(light)
    totals = backend.totals()
    assert totals["light_steps"] == backend.scheduler.num_light_steps and totals["light_rows"] >= totals["light_steps"]
    assert totals["light_busy_s"] > 0 and totals["loaded_busy_s"] > 0  # each kind's step calls timed apart
    # admission's step samples leave the light rows out (a light step alone is no sample)
    assert backend.step_counts()[0] == totals["decode_rows"] - totals["light_rows"]


def test_the_compiled_depth_step_gives_the_eager_tokens_and_compiles_only_at_load() -> None:
    """``kyutai_compile`` (here traced by a counting backend, no code generation): the served
    tokens on the emulated graph path equal the eager runner's, with streams sampling and
    greedy; the depth transformer's pieces and the temporal transformer's are compiled at load
    and never while serving (an eager step of greedy rows runs them uncompiled)."""
    from torch._dynamo.testing import CompileCounter

    from tests.engine.llm.graph_emulation import emulated_graph_runner

    torch._dynamo.reset()
    counter = CompileCounter()
    runs = []
    for backend in (_backend(kyutai_n_q=4),
                    _backend(kyutai_n_q=4, runner_factory=emulated_graph_runner(), kyutai_compile=counter)):
        if len(runs):
            traced = counter.frame_count
            assert traced >= 6
            backend.runner.head.frozen_stance = "fail_on_recompile"  # (serving never compiles again)
            assert backend.program.lm.frozen_stance is not None
            backend.program.lm.frozen_stance = "fail_on_recompile"
        rows = _record(backend)
        outs: list = []
        _add(backend, 1, "Compiled or not, the same.", dict(SAMPLED, seed=7, max_tokens=30))
        _add(backend, 2, "Greedy too.", {"temperature": 0.0, "max_tokens": 24})
        _add(backend, 3, "And a third.", dict(SAMPLED, seed=9, max_tokens=20))
        for job in (1, 2):
            backend.push_text(job, "", final=True)
        _drain(backend, outs)
        assert not [o.error for o in outs if o.error is not None]
        runs.append(rows)
    assert counter.frame_count == traced
    assert runs[0] == runs[1] and len(runs[0]) == 3
    torch._dynamo.reset()


def test_the_registry_serves_kyutai_tts(tts_ckpt) -> None:
    """--model kyutai-tts, kyutai-tts-tiny, kyutai/tts-* hub ids and a local checkpoint folder
    (config.json's model_type "tts") resolve to this program."""
    from models.registry import resolve

    assert resolve("kyutai-tts").model_id == "kyutai/tts-1.6b-en_fr"
    assert resolve("kyutai-tts-tiny").model_id == "tiny"
    assert resolve("kyutai/tts-0.75b-en-public").entry.name == "kyutai-tts"
    local = resolve(str(tts_ckpt))
    assert local.entry.name == "kyutai-tts" and local.model_id == str(tts_ckpt)

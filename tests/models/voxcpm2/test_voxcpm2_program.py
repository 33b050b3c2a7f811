"""The VoxCPM2 program served by the runtime on a tiny random model: batch invariance at equal
seeds, a slot's last patch read before the slot is reused, the oversize refusal, the streamed
audio equal to the whole decode, the CUDA-graph path, bad settings."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch
from tests.models.voxcpm2.voxcpm2_serving import add, audio, backend, drain, record, run, whole_decode

from engine.backend import OptionError

# min_len = max_tokens - 1: the random stop head cannot stop early, so a job makes exactly max_tokens patches
FIXED = {"max_tokens": 7, "min_len": 6, "inference_timesteps": 4}
TEXT = "A stream that must not depend on its neighbours."


@pytest.fixture(scope="module")
def tiny() -> Any:
    return backend(stream_chunk_patches=3)


@pytest.fixture(scope="module")
def voice_wav() -> np.ndarray:
    t = np.arange(int(24000 * 0.8)) / 24000
    return (0.3 * np.sin(2 * np.pi * 180 * t) + 0.05 * np.sin(2 * np.pi * 2300 * t)).astype(np.float32)


def test_streamed_audio_equals_the_whole_decode_of_its_patches(tiny) -> None:
    """Chunks of 3 patches through the streaming VAE (7 patches: the last chunk padded and cut)
    concatenate to the whole decode of the sequence's patches; 7,680 samples a patch at 48 kHz."""
    patches, wav = run(tiny, TEXT, dict(FIXED, seed=4))
    assert patches.shape[0] == 7 and wav.size == 7 * 7680 and tiny.info.sample_rate == 48000
    np.testing.assert_allclose(wav, whole_decode(tiny, patches), rtol=0, atol=1e-5)
    assert float(np.abs(wav).max()) > 1e-3


def test_it_declares_the_patches_a_row_makes_per_audio_second(tiny) -> None:
    """Admission's rate is the true one: a decode row makes one patch a step, so the patches of a
    job per second of its audio (6.25 at 48 kHz) are what the engine core's admission is given;
    registered voices reach the program (supports_cloning)."""
    from engine.core import EngineCore

    patches, wav = run(tiny, TEXT, dict(FIXED, seed=3))
    rate = patches.shape[0] * tiny.info.sample_rate / wav.size
    assert tiny.info.tokens_per_audio_second == pytest.approx(rate) and rate == 6.25
    assert EngineCore(tiny).admission.tokens_per_audio_second == tiny.info.tokens_per_audio_second
    assert tiny.info.supports_cloning


def test_a_continuation_voice_warms_the_decoder_and_cuts_its_context(tiny, voice_wav) -> None:
    """A voice with a transcript (24 kHz audio, resampled): the first patch is conditioned on its
    last prompt patch, the decoder warmed with its last 3 patches, whose audio is not sent; chunks
    of 3 patches with 3 of context take their rounds."""
    v = tiny.program.add_voice("warm", sample_rate=24000, prompt_wav=voice_wav, prompt_text="Hello there.")
    patches, wav = run(tiny, "And on it goes.", dict(FIXED, seed=2), voice="warm")
    assert wav.size == 7 * 7680
    np.testing.assert_allclose(wav, whole_decode(tiny, patches, v.context), rtol=0, atol=1e-5)
    zero_shot, _ = run(tiny, "And on it goes.", dict(FIXED, seed=2))
    assert not torch.allclose(patches, zero_shot)


def test_a_stream_alone_equals_the_same_stream_among_others(tiny, voice_wav) -> None:
    """Batch invariance: a job's patches and audio alone equal those beside 1, 3 and 7 others
    (zero-shot and cloned, other settings and seeds) that join at different steps."""
    tiny.program.add_voice("other", sample_rate=24000, ref_wav=voice_wav)
    opts = dict(FIXED, seed=5, cfg_value=1.5)
    alone, solo_audio = run(tiny, TEXT, opts)
    for others in (1, 3, 7):
        patches = record(tiny)
        add(tiny, 100, TEXT, opts)
        outs: list = []
        for k in range(others):
            for _ in range(k % 3 + 1):
                outs.extend(tiny.step())
            add(tiny, 200 + k, f"Neighbour {k} says something else.", dict(seed=100 + k, max_tokens=4 + k, min_len=0,
                                                                             inference_timesteps=2 + k % 3),
                voice="other" if k % 2 else None)
        drain(tiny, outs)
        assert not [o.error for o in outs if o.error is not None]
        got = torch.stack(patches[100])
        assert got.shape == alone.shape, f"with {others} others"
        torch.testing.assert_close(got, alone, atol=1e-5, rtol=1e-5)
        np.testing.assert_allclose(audio(outs, 100), solo_audio, rtol=0, atol=1e-5)


@pytest.mark.parametrize("async_steps", [False, True], ids=["sync", "async-steps"])
def test_a_slot_is_read_to_its_stop_patch_before_the_next_sequence_takes_it(async_steps: bool) -> None:
    """One slot, chunks of 2 (a ring of 8 patches): a job of 9 patches ends with a chunk of its
    stop patch alone, in the ring entry the queued job's first patch takes. The runtime launches
    that job's first step before it hands the program the stop (without asynchronous steps), or
    before it collects the first job's audio (with them); the first job's audio still equals
    its own, alone, and the whole decode of its patches."""
    b = backend(max_num_seqs=1, stream_chunk_patches=2, async_steps=async_steps)
    assert b.program.head.ring.shape[1] == 8
    nine = dict(FIXED, seed=8, max_tokens=9, min_len=8)
    alone, alone_audio = run(b, TEXT, nine)
    patches = record(b)
    add(b, 1, TEXT, nine)
    add(b, 2, "The next one, at once.", dict(FIXED, seed=9))
    outs = drain(b)
    assert [o.job_id for o in outs if o.is_finished] == [1, 2]
    torch.testing.assert_close(torch.stack(patches[1]), alone, atol=0, rtol=0)
    np.testing.assert_array_equal(audio(outs, 1), alone_audio)
    np.testing.assert_allclose(audio(outs, 1), whole_decode(b, alone), rtol=0, atol=1e-5)
    np.testing.assert_allclose(audio(outs, 2), whole_decode(b, torch.stack(patches[2])), rtol=0, atol=1e-5)


@pytest.mark.parametrize("first", [1, 2])
@pytest.mark.parametrize("async_steps", [False, True], ids=["sync", "async-steps"])
def test_an_early_first_chunk_gives_the_same_audio_sooner(first: int, async_steps: bool) -> None:
    """first_chunk_patches: each fresh sequence's first audio leaves after ``first`` patches (the
    step that made patch ``first`` returns it), not after a whole chunk of 3; every job's audio
    is still the whole decode of its patches and equals its audio without the early chunk. Jobs
    join at different steps, one shorter than a chunk (its last chunk after the early one)."""
    def served(first_chunk: int) -> tuple[dict[int, np.ndarray], dict[int, torch.Tensor], dict[int, int]]:
        b = backend(max_num_seqs=4, stream_chunk_patches=3, first_chunk_patches=first_chunk, async_steps=async_steps)
        patches = record(b)
        jobs = {1: dict(FIXED, seed=11), 2: dict(FIXED, seed=12, max_tokens=2, min_len=1), 3: dict(FIXED, seed=13)}
        outs, first_audio, audio_at = [], {}, {}
        for n in range(2000):
            if n in (0, 2, 3):
                job = {0: 1, 2: 2, 3: 3}[n]
                add(b, job, TEXT, jobs[job])
            if not b.has_work():
                break
            got = b.step()
            outs.extend(got)
            for o in got:
                if o.pcm is not None and o.pcm.size:
                    made = len(patches.get(o.job_id, []))  # patches read by then
                    first_audio.setdefault(o.job_id, made)
                    audio_at.setdefault(o.job_id, []).append((made, o.pcm.size))
        assert sorted(o.job_id for o in outs if o.is_finished) == [1, 2, 3]
        return ({j: audio(outs, j) for j in jobs}, {j: torch.stack(patches[j]) for j in jobs}, first_audio,
                audio_at), b

    (wav0, p0, first0, _), _ = served(0)
    (wav, p, first_at, audio_at), b = served(first)
    for j in (1, 2, 3):
        torch.testing.assert_close(p[j], p0[j], atol=0, rtol=0)
        np.testing.assert_allclose(wav[j], whole_decode(b, p[j]), rtol=0, atol=1e-5)
        np.testing.assert_allclose(wav[j], wav0[j], rtol=0, atol=1e-5)
        assert wav[j].size == p[j].shape[0] * 7680
    # the early chunk: audio once `first` patches are made, not 3 (a step later with asynchronous
    # steps: the head has made one more by then); job 2 makes only 2
    lag = int(async_steps)
    assert first_at[1] == first_at[3] == first + lag and first0[1] == first0[3] == 3 + lag
    assert first_at[2] == min(first + lag, 2)
    # and then a patch's audio every step up to the first whole chunk (no wait of a chunk after
    # the early audio), the whole chunks as before after it
    for j in (1, 3):
        early: dict[int, int] = {}  # patches made -> samples out by then (a step's audio comes in frames)
        for made, n in audio_at[j]:
            if made <= 3 + lag:
                early[made] = early.get(made, 0) + n
        assert early == {first + lag: first * 7680, **{k + lag: 7680 for k in range(first + 1, 4)}}
    with pytest.raises(ValueError, match="first_chunk_patches must be 0"):
        backend(max_num_seqs=1, stream_chunk_patches=3, first_chunk_patches=3)
    # on by default (1), off where a chunk is one patch already
    assert backend(max_num_seqs=1, stream_chunk_patches=3).program.decoder.first == 1
    assert backend(max_num_seqs=1, stream_chunk_patches=1).program.decoder.first == 0


class _ReplayStepFn:
    """A captured VAE graph stand-in (CPU): replay runs the decoder's ``step_fn`` on the static
    inputs, padding rows and all, as a replay of its capture would."""

    def __init__(self, fn: Any, static_in: list[torch.Tensor], out: torch.Tensor) -> None:
        self.fn, self.static_in, self.out = fn, static_in, out

    def replay(self) -> None:
        with torch.inference_mode():
            self.out.copy_(self.fn(*self.static_in))


@pytest.mark.parametrize("first", [0, 1])
def test_the_vae_graph_path_with_early_first_chunks_gives_the_eager_audio(first: int, monkeypatch) -> None:
    """The VAE through BatchGraphs' padded buckets (replays emulated on the CPU: zero rows on the
    ring's padding row and the VAE's scratch slot, early chunks beside whole ones in one call)
    gives the eager audio, with first_chunk_patches off and on."""
    from engine.llm import host_copy
    from engine.llm.cuda_graphs import BatchGraphs

    # a replay's output buffer is the next replay's: copied out at once, as on a GPU
    monkeypatch.setattr(host_copy, "start_host_copy", lambda t: (lambda c=t.clone(): c))

    def served(graphs: bool) -> dict[int, np.ndarray]:
        b = backend(max_num_seqs=4, stream_chunk_patches=3, first_chunk_patches=first)
        dec = b.program.decoder
        if graphs:
            c, i64 = dec.chunk, torch.int64
            g = BatchGraphs(dec.step_fn, [((), i64), ((c,), i64), ((c,), i64), ((c,), i64), ((), i64)],
                            buckets=(2, 4), device="cpu")
            for n in g.buckets:
                static_in = [torch.zeros(n, dtype=i64)] + [torch.zeros(n, c, dtype=i64) for _ in range(3)] \
                    + [torch.zeros(n, dtype=i64)]
                out = torch.zeros(n, c * dec.patch_samples)
                g._graphs[n] = (_ReplayStepFn(dec.step_fn, static_in, out), static_in, (out,))
            dec.graphs = g
        outs: list = []
        for n, job in ((0, 1), (1, 2), (1, 3)):  # jobs 2 and 3 start together: two early chunks in one call
            add(b, job, TEXT, dict(FIXED, seed=30 + job))
            if n:
                continue
            outs.extend(b.step())
        drain(b, outs)
        assert not [o.error for o in outs if o.error is not None]
        if graphs:
            assert dec.graphs.rows_replayed > dec.graphs.rows_run  # padding rows were replayed
        return {j: audio(outs, j) for j in (1, 2, 3)}

    eager, replayed = served(False), served(True)
    for j in (1, 2, 3):
        assert eager[j].size == 7 * 7680
        np.testing.assert_allclose(replayed[j], eager[j], rtol=0, atol=1e-5)


def test_a_segment_that_needs_more_positions_than_a_row_is_refused(tiny) -> None:
    """A prompt with the patches its text may take beyond max_model_len fails at add_job with
    too_long naming both counts (never queued, truncated or run); the same text with a lower
    max_tokens fits, and a job beside it is unaffected."""
    text = " ".join(["word"] * 70)  # 70 ids + audio start, up to 430 patches: 501 > 300
    b = backend(max_model_len=300, max_num_seqs=2)
    add(b, 1, text, dict(FIXED, seed=1, max_tokens=4096, min_len=2))
    add(b, 2, "Short.", dict(FIXED, seed=2))
    outs = drain(b)
    err = [o.error for o in outs if o.job_id == 1]
    assert len(err) == 1 and err[0].code == "too_long" and not err[0].retryable
    assert "501 positions" in err[0].message and "holds 300" in err[0].message
    assert [o.job_id for o in outs if o.is_finished] == [2] and audio(outs, 2).size == 7 * 7680
    _, wav = run(b, text, dict(FIXED, seed=1, max_tokens=7), job=3)
    assert wav.size == 7 * 7680


def test_the_patch_cap_follows_the_text(tiny) -> None:
    """Without a stop, a segment takes min(6 * text tokens + 10, max_tokens) patches."""
    patches, _ = run(tiny, "Hi", dict(max_tokens=4096, min_len=4096, inference_timesteps=1, seed=1))
    assert patches.shape[0] == 6 * 1 + 10


def test_temperature_zero_makes_the_seed_irrelevant(tiny) -> None:
    """temperature scales the flow's starting noise: at 0 two seeds give the same patches."""
    a, _ = run(tiny, TEXT, dict(FIXED, seed=1, temperature=0.0))
    b, _ = run(tiny, TEXT, dict(FIXED, seed=2, temperature=0.0))
    c, _ = run(tiny, TEXT, dict(FIXED, seed=2))
    torch.testing.assert_close(a, b, atol=0, rtol=0)
    assert not torch.allclose(b, c)


@pytest.mark.parametrize("async_steps", [False, True], ids=["sync", "async-steps"])
def test_the_cuda_graph_path_gives_the_eager_audio(async_steps: bool) -> None:
    """``CudaGraphModelRunner``'s path emulated on the CPU (decode graphs with the head in the
    step, packed prompts with per-token slot rows) gives the eager runner's patches and audio."""
    from tests.engine.llm.graph_emulation import emulated_graph_runner

    counts = {"eager": 0}
    factory = emulated_graph_runner(counts=counts)

    texts = ["Graphs must not change a thing.", "Nor for this one, joining later.", "Short."]
    runs = []
    for b in (backend(max_num_seqs=4), backend(max_num_seqs=4, runner_factory=factory, async_steps=async_steps)):
        patches = record(b)
        outs: list = []
        for i, text in enumerate(texts):
            add(b, i, text, dict(seed=20 + i, max_tokens=5 + 2 * i, min_len=4 + 2 * i, inference_timesteps=3))
            outs.extend(b.step())
        drain(b, outs)
        assert not [o.error for o in outs if o.error is not None]
        runs.append(({k: torch.stack(v) for k, v in patches.items()}, {i: audio(outs, i) for i in range(3)}))
    assert counts["eager"] == 0
    for i in range(3):
        torch.testing.assert_close(runs[1][0][i], runs[0][0][i], atol=1e-5, rtol=1e-5)
        np.testing.assert_allclose(runs[1][1][i], runs[0][1][i], rtol=0, atol=1e-5)


@pytest.mark.parametrize("options, field", [
    ({"inference_timesteps": 0}, "inference_timesteps must be an integer in [1, 10]"),
    ({"inference_timesteps": 11}, "[1, 10]"), ({"inference_timesteps": 2.5}, "an integer"),
    ({"cfg_value": -0.5}, "cfg_value must be a number in [0.0, 10.0]"), ({"cfg_value": float("nan")}, "cfg_value"),
    ({"min_len": -1}, "min_len"), ({"max_tokens": 0}, "max_tokens must be an integer in [1, 4096]"),
    ({"max_tokens": 5000}, "[1, 4096]"), ({"temperature": 3.0}, "temperature"), ({"seed": -1}, "seed"),
    ({"seed": True}, "seed"), ({"cfg_value": "2"}, "cfg_value"), ({"top_p": 0.5}, "unknown option 'top_p'"),
])
def test_bad_settings_are_refused_naming_the_range(tiny, options, field) -> None:
    """Each out-of-range, mistyped or unknown option is an invalid_option naming it and its range."""
    with pytest.raises(OptionError) as e:
        tiny.validate(None, options)
    assert e.value.code == "invalid_option" and field in str(e.value)


def test_voices_default_and_unknown(tiny) -> None:
    """No voice is zero-shot ("default"); an unknown voice is refused naming what is served."""
    assert tiny.validate(None, {})[0] == "default" and tiny.validate("", {})[0] == "default"
    voice, opts = tiny.validate(None, {})
    assert opts == {"inference_timesteps": 10, "cfg_value": 2.0, "min_len": 2, "max_tokens": 4096,
                    "temperature": 1.0, "seed": None}
    with pytest.raises(OptionError) as e:
        tiny.validate("nobody", {})
    assert e.value.code == "unknown_voice" and "default" in str(e.value)


def test_max_flow_steps_bounds_the_steps_a_request_may_ask_for() -> None:
    """The solver's static loop is sized at load (max_flow_steps): requests may ask up to it."""
    b = backend(max_flow_steps=3, max_num_seqs=1)
    assert b.validate(None, {"inference_timesteps": 3})[1]["inference_timesteps"] == 3
    assert b.validate(None, {})[1]["inference_timesteps"] == 3
    with pytest.raises(OptionError, match=r"\[1, 3\]"):
        b.validate(None, {"inference_timesteps": 4})

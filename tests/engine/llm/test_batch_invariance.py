"""Batch invariance: a stream's tokens (and, within 1e-5, its audio) do not depend on who shares its
batch or when they join."""

from __future__ import annotations

import numpy as np
import pytest

from tests.engine.llm.conftest import make_backend, make_orpheus_program

GREEDY = dict(temperature=0.0, top_p=1.0, repetition_penalty=1.0)
SAMPLED = dict(temperature=0.9, top_p=0.9, repetition_penalty=1.3)


def _run(backend, target: tuple[str, str, dict], others: list[tuple[str, str, dict]]):
    """Target joins at step 0, other i at step 1 + 2i; returns the target's audio.

    Once the target has finished the others are aborted (their tail cannot matter)."""
    joins = {0: [(0, target)]}
    for i, job in enumerate(others):
        joins.setdefault(1 + 2 * i, []).append((i + 1, job))
    pcm: list[np.ndarray] = []
    step = 0
    done = False
    while not done:
        for job_id, (text, voice, opts) in joins.get(step, []):
            backend.add_job(job_id, text, voice, opts)
        for out in backend.step():
            assert out.error is None, out.error
            if out.job_id == 0 and out.pcm is not None:
                pcm.append(out.pcm)
            done |= out.job_id == 0 and out.is_finished
        step += 1
        assert step < 2000
    for job_id in range(1, len(others) + 1):
        backend.abort_job(job_id)
    assert not backend.has_work() and backend.scheduler.allocator.num_used_pages == 0
    return np.concatenate(pcm) if pcm else np.zeros(0, np.float32)


def _token_jobs(mode: dict, n_others: int):
    target = (" ".join(str(5000 + i) for i in range(9)), "v", dict(tag=0, seed=11, max_tokens=16, **mode))
    others = [
        (" ".join(str(7000 + 31 * i + j) for j in range(3 + 7 * i)), "v",
         dict(tag=i + 1, seed=100 + i, max_tokens=10 + i, **mode))
        for i in range(n_others)
    ]
    return target, others


@pytest.mark.parametrize("mode", ["greedy", "sampled"])
def test_tokens_identical_alone_and_beside_1_3_7_others(llm_model, mode):
    """The target's tokens are the same alone and with 1, 3 or 7 neighbours joining later."""
    import models.orpheus.tokens as tokens

    params = GREEDY if mode == "greedy" else SAMPLED
    # Sampled runs use the audio-restricted head (as Orpheus does): the CPU sort is cheaper.
    vocab = None if mode == "greedy" else tokens.audio_token_ids()
    results = []
    for n in (0, 1, 3, 7):
        from tests.engine.llm.conftest import TokenProgram

        program = TokenProgram(vocab_ids=vocab)
        backend = make_backend(
            llm_model, program, runner_kw=dict(num_pages=256, max_num_seqs=8),
            sched_kw=dict(max_num_batched_tokens=12),
        )
        _run(backend, *_token_jobs(params, n))
        results.append(program.tokens[0])
    assert len(results[0]) == 16
    assert all(r == results[0] for r in results[1:]), results


@pytest.mark.parametrize("mode", ["greedy", "sampled"])
def test_orpheus_tokens_and_audio_identical_beside_others(llm_model, small_codec, mode):
    """Orpheus path: the target's tokens are identical and its audio equal (1e-5) with 0/1/3/7
    neighbours."""
    params = GREEDY if mode == "greedy" else SAMPLED
    target = ("hello world", "tara", dict(tag=0, seed=5, max_tokens=28, **params))
    voices = ["leah", "jess", "leo", "dan", "mia", "zac", "zoe"]
    texts = ["the quick brown fox", "hello", "world !", "fox , the quick", "brown", "hello hello", "."]
    results = []
    for n in (0, 1, 3, 7):
        others = [(texts[i], voices[i], dict(tag=i + 1, seed=i, max_tokens=14 + 7 * i, **SAMPLED)) for i in range(n)]
        program = make_orpheus_program(small_codec)
        backend = make_backend(
            llm_model, program, runner_kw=dict(num_pages=256, max_num_seqs=8),
            sched_kw=dict(max_num_batched_tokens=12),
        )
        pcm = _run(backend, target, others)
        results.append((program.tokens[0], pcm))
    tokens0, pcm0 = results[0]
    assert pcm0.size == len(tokens0) // 7 * 2048 > 0
    for toks, pcm in results[1:]:
        assert toks == tokens0
        # not exact: the codec decodes all streams' windows in one batched call, whose float
        # rounding may differ in the last bits
        np.testing.assert_allclose(pcm, pcm0, atol=1e-5)

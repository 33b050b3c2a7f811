"""``MixedGraphs``: decode rows and fresh prompts packed into one (CPU-emulated) replay give the
tokens of two separate replays."""

from __future__ import annotations

import copy

import pytest
import torch

from tests.engine.llm.conftest import TokenProgram, drain

SAMPLED = dict(temperature=0.9, top_p=0.95, repetition_penalty=1.1)


def _runner(model, *, mixed: bool, record: list[str]):
    from engine.llm.attention import torch_paged_attention_factory
    from engine.llm.cuda_graphs import CudaGraphModelRunner
    from models.orpheus.fused_forward import FusedLlamaForward
    from tests.engine.llm.graph_emulation import emulate_mixed, emulate_replays

    runner = CudaGraphModelRunner(copy.deepcopy(model), model.config, device="cpu", dtype=torch.float32,
                                  num_pages=96, page_size=4, max_num_seqs=8, capture=False, prefill_buckets=(32,),
                                  attention_backend_factory=torch_paged_attention_factory, mixed=mixed,
                                  mixed_decode_buckets=(4, 8), mixed_token_buckets=(16, 32))
    runner.forward_fn = FusedLlamaForward(runner.model, compile=False)
    emulate_replays(runner, num_tokens=32, record=record)
    if mixed:
        emulate_mixed(runner, record=record)
    real_eager = runner._execute_eager

    def no_eager(*a, **kw):  # noqa: ANN002, ANN003, ANN202
        record.append("eager")
        return real_eager(*a, **kw)

    runner._execute_eager = no_eager
    return runner


def _serve(model, jobs, *, mixed: bool, async_steps: bool):
    from engine.llm.backend import LMBackend
    from engine.llm.page_allocator import PageAllocator
    from engine.llm.scheduler import Scheduler, SchedulerConfig

    record: list[str] = []
    runner = _runner(model, mixed=mixed, record=record)
    sched = Scheduler(SchedulerConfig(max_num_seqs=8, max_num_batched_tokens=40, max_model_len=64, max_waiting=16,
                                      max_num_prefill_seqs=4, max_num_prefill_tokens=32, whole_prompts=True),
                      PageAllocator(runner.scratch_page, 4))
    program = TokenProgram(stop_ids=frozenset(range(0, 156_940, 60)))
    backend = LMBackend(program, runner, sched, async_steps=async_steps)
    for job_id, text, opts in jobs:
        backend.add_job(job_id, text, "v", dict(opts, tag=job_id))
    outs = drain(backend)
    assert not any(o.error for o in outs)
    assert sched.allocator.num_free_pages == sched.allocator.num_pages
    return program.tokens, record


@pytest.mark.parametrize("async_steps", [False, True])
def test_mixed_steps_give_the_tokens_of_two_replays(llm_model, async_steps):
    """Jobs arriving in waves (more jobs than slots): steps with decode rows and fresh prompts
    go through one mixed replay, and every job's tokens are those of the separate replays
    (greedy, so a rounding difference between a [b + t]-row and a [b]-row GEMM could only show
    as a tie; with asynchronous steps the decode rows' pending tokens come from the feed)."""
    jobs = [(i, " ".join(str(10 + (i * 3 + k) % 40) for k in range(3 + i % 4)),
             dict(temperature=0.0, max_tokens=4 + (i * 5) % 13)) for i in range(12)]
    ref, ref_record = _serve(llm_model, jobs, mixed=False, async_steps=async_steps)
    got, record = _serve(llm_model, jobs, mixed=True, async_steps=async_steps)
    assert got == ref
    assert "eager" not in record and "eager" not in ref_record
    assert record.count("mixed") >= 2  # steps that carried both went through one replay
    assert "mixed" not in ref_record and ref_record.count("prefill") > record.count("prefill")


def test_a_mixed_step_samples_like_separate_replays(llm_model):
    """One step, inspected directly: 3 decode rows (padded to the smallest bucket, 4) and 2 fresh
    prompts (padded to 16 tokens, 16 prompt rows): the sampled rows' logits match those of a decode replay plus a
    prefill replay, and the penalty rows of the fresh prompts' slots are reset."""
    from engine.llm.backend import LMBackend
    from engine.llm.page_allocator import PageAllocator
    from engine.llm.scheduler import Scheduler, SchedulerConfig

    logits = {}
    for mixed in (False, True):
        record: list[str] = []
        runner = _runner(llm_model, mixed=mixed, record=record)
        sched = Scheduler(SchedulerConfig(max_num_seqs=8, max_num_batched_tokens=40, max_model_len=64,
                                          max_waiting=16, max_num_prefill_seqs=4, max_num_prefill_tokens=32,
                                          whole_prompts=True), PageAllocator(runner.scratch_page, 4))
        backend = LMBackend(TokenProgram(), runner, sched)
        for i in range(3):
            backend.add_job(i, f"{11 + i} {12 + i}", "v", dict(SAMPLED, seed=i, max_tokens=9))
        for _ in range(3):
            backend.step()
        runner.seen[3:5] = True  # the slots the next two jobs take: stale penalty state
        for i in (3, 4):
            backend.add_job(i, f"{21 + i} {22 + i} {23 + i}", "v", dict(SAMPLED, seed=i, max_tokens=9))
        captured = []
        real = runner.head.sample

        def spy(hidden, r, _real=real):  # noqa: ANN001, ANN202
            out = _real(hidden, r)
            captured.append((out[1], r.rows + 1))  # logits, slot + 1 (padding: max_num_seqs + 1)
            return out

        runner.head.sample = spy
        backend.step()
        assert record[-1] == ("mixed" if mixed else "prefill")
        rows = {}
        for lg, slot1 in captured:
            for row, s in zip(lg, slot1.tolist()):
                if 0 < s <= runner.max_num_seqs:
                    rows[s - 1] = row
        logits[mixed] = rows
        assert not runner.seen[3:5].any() or runner.seen[3:5].sum() <= 2  # reset, then one token each
    assert logits[True].keys() == logits[False].keys() == set(range(5))
    for s in range(5):
        torch.testing.assert_close(logits[True][s], logits[False][s], rtol=1e-4, atol=1e-4)


def test_cli_maps_mixed_graphs_and_config_refuses_other_values() -> None:
    """voxgate serve --mixed-graphs on|off reaches EngineConfig (off by default); anything
    else is refused by the parser and by the config."""
    from engine.config import EngineConfig
    from gateway.cli import build_parser, configs_from_args

    parser = build_parser()
    _, eng = configs_from_args(parser.parse_args(["serve", "--model", "orpheus", "--mixed-graphs", "on"]))
    assert eng.mixed_graphs == "on"
    _, eng = configs_from_args(parser.parse_args(["serve", "--model", "orpheus"]))
    assert eng.mixed_graphs == "off"
    with pytest.raises(SystemExit):
        parser.parse_args(["serve", "--mixed-graphs", "auto"])
    with pytest.raises(ValueError, match="mixed_graphs"):
        EngineConfig(mixed_graphs="yes")


def test_mixed_graphs_refuse_a_step_they_do_not_hold(llm_model) -> None:
    """``can_run``: no prompts, more prompts than rows, more decode rows than the largest
    bucket or more prompt tokens than the largest token bucket all fall back (False);
    ``run`` refuses such a step with a ValueError rather than replaying a wrong graph."""
    record: list[str] = []
    runner = _runner(llm_model, mixed=True, record=record)
    mixed = runner.mixed_graphs
    assert mixed.can_run(3, [5, 6]) and mixed.can_run(1, [32])
    assert not mixed.can_run(3, [])
    assert not mixed.can_run(9, [5])  # decode buckets (4, 8)
    assert not mixed.can_run(0, [5])
    assert not mixed.can_run(3, [20, 13])  # 33 tokens > 32
    assert not mixed.can_run(3, [1] * (mixed.max_prompts + 1))
    with pytest.raises(ValueError, match="no mixed graph"):
        mixed.run(9, torch.zeros(9, dtype=torch.int64), None, [], torch.zeros(5, dtype=torch.int64),
                  torch.zeros(5, dtype=torch.int64), torch.zeros(5, dtype=torch.int64),
                  torch.zeros(5, dtype=torch.int64), torch.zeros(1, dtype=torch.int64), [])


def test_mixed_decode_buckets_reach_the_decode_cap() -> None:
    from engine.llm.mixed_graphs import DEFAULT_MIXED_DECODE_BUCKETS, mixed_decode_buckets

    assert mixed_decode_buckets(0) == DEFAULT_MIXED_DECODE_BUCKETS  # no cap: up to 320
    assert mixed_decode_buckets(384)[-1] == 384 and mixed_decode_buckets(512)[-1] == 512
    assert mixed_decode_buckets(500)[-1] == 512  # a step of 500 rows has a bucket
    assert mixed_decode_buckets(16) == (64,)
    assert all(b - a == 32 for a, b in zip(mixed_decode_buckets(512), mixed_decode_buckets(512)[1:]))

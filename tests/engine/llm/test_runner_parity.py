"""Runner + TorchPagedAttention against transformers' LlamaForCausalLM on the same weights (fp32,
atol and rtol 1e-4)."""

from __future__ import annotations

import torch
from transformers import GenerationConfig

from engine.llm.page_allocator import PageAllocator
from engine.llm.scheduler import Scheduler, SchedulerConfig
from engine.llm.sequence import SamplingParams, Sequence
from tests.engine.llm.conftest import drain, make_backend, make_runner

GREEDY = dict(temperature=0.0, top_p=1.0, repetition_penalty=1.0)


def _prompt(n: int, offset: int) -> list[int]:
    g = torch.Generator().manual_seed(offset)
    return torch.randint(0, 156940, (n,), generator=g).tolist()


def test_mixed_chunked_batch_logits_match_transformers(llm_model, llm_hf_model):
    """Every row's last-token logits, over chunked prefills mixed with decodes, equal HF's."""
    recorded: list[tuple[Sequence, int, torch.Tensor]] = []
    runner = make_runner(llm_model, num_pages=96, page_size=4)
    logits_of = runner.head.logits
    captured: dict[str, torch.Tensor] = {}

    def spy(hidden):
        captured["logits"] = logits_of(hidden)
        return captured["logits"]

    runner.head.logits = spy

    scheduler = Scheduler(
        SchedulerConfig(max_num_seqs=4, max_num_batched_tokens=16, max_model_len=96, max_waiting=4),
        PageAllocator(96, 4),
    )
    seqs = [
        Sequence(i, _prompt(n, i), SamplingParams(**GREEDY, max_tokens=6))
        for i, n in enumerate((5, 37, 11, 2))
    ]
    for s in seqs:
        scheduler.add(s)
    saw_mixed = False
    while scheduler.running:
        batch = scheduler.schedule()
        saw_mixed |= 0 < batch.num_decode_seqs < batch.num_seqs
        positions = [s.num_computed_tokens + n - 1 for s, n in zip(batch.seqs, batch.num_new_tokens)]
        tokens = runner.execute(batch).tolist()
        for row, (s, pos) in enumerate(zip(batch.seqs, positions)):
            recorded.append((s, pos, captured["logits"][row]))
        for s, _ in scheduler.update(batch, tokens):
            if s.num_output_tokens >= s.params.max_tokens:
                scheduler.finish(s)
    assert saw_mixed, "the schedule never mixed decodes with a prefill chunk"
    with torch.no_grad():
        ref = {s.seq_id: llm_hf_model(torch.tensor([s.prompt_ids + s.output_ids])).logits[0] for s in seqs}
    assert len(recorded) > 20
    for s, pos, logits in recorded:
        torch.testing.assert_close(logits, ref[s.seq_id][pos].float(), atol=1e-4, rtol=1e-4)


def test_greedy_generation_matches_transformers_generate(llm_model, llm_hf_model):
    """Greedy tokens through LMBackend equal HF greedy generate, token for token, per prompt."""
    prompts = [_prompt(n, 100 + n) for n in (3, 19, 8)]
    backend = make_backend(llm_model, sched_kw=dict(max_num_batched_tokens=8))
    for i, p in enumerate(prompts):
        backend.add_job(i, " ".join(map(str, p)), "v", dict(tag=i, max_tokens=24, **GREEDY))
    outs = drain(backend)
    assert all(o.error is None for o in outs)
    cfg = GenerationConfig(max_new_tokens=24, do_sample=False, eos_token_id=None, pad_token_id=0)
    for i, p in enumerate(prompts):
        with torch.no_grad():
            ref = llm_hf_model.generate(torch.tensor([p]), generation_config=cfg)[0, len(p):].tolist()
        assert backend.program.tokens[i] == ref

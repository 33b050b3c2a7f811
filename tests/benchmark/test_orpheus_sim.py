"""``benchmark.orpheus_sim``: the engine's own core, backend and scheduler on a modelled GPU. A GPU
fast enough keeps every stream on time; one too slow underruns them all without admission, and
with it (the default policy) refuses the streams past its measured capacity and keeps those it
admitted on time; the step model adds its terms; the command line runs."""

from __future__ import annotations

from dataclasses import replace

import pytest

from benchmark.orpheus_sim import GPUS, GpuSteps, main, simulate

FAST = GpuSteps("fast", ((1, 2.0), (256, 5.0)), jitter=0.0)
SLOW = GpuSteps("slow", ((1, 8.0), (64, 16.0), (256, 40.0)), jitter=0.0)  # 96 streams need 7.9k rows/s: ~4.8k here


def test_a_fast_gpu_keeps_every_stream_on_time() -> None:
    r = simulate(96, gpu=FAST, ramp_s=2.0, duration_s=6.0)
    assert r.streams > 96  # each client started its next stream as the last ended
    assert r.refused == 0 and r.underran == 0
    assert r.pct(0.9) < 150
    assert r.steps > 0 and r.rows > 0


def test_a_slow_gpu_underruns_without_admission_and_refuses_with_it() -> None:
    off = simulate(96, gpu=SLOW, policy="off", ramp_s=8.0, duration_s=12.0)
    assert off.refused == 0
    assert off.underran >= 0.9 * off.streams
    queued = simulate(96, gpu=SLOW, policy="queue", ramp_s=8.0, duration_s=12.0)
    assert queued.refused > 0
    assert queued.admitted < 60 and queued.underran == 0  # what it admitted stayed on time
    assert all(c is not None and c < 30 for _, c in queued.capacity[2:])  # the measured estimate


def test_the_step_model_adds_prompts_and_codec_frames() -> None:
    g = GpuSteps("g", ((1, 2.0), (101, 12.0)), prefill_ms=3.0, prefill_token_ms=0.01, codec_frame_ms=0.5)
    assert g.device_ms(51, 0, 0) == pytest.approx(7.0)  # halfway between the points
    assert g.device_ms(201, 0, 0) == pytest.approx(22.0)  # past the last, on its slope
    assert g.device_ms(51, 100, 4) == pytest.approx(7.0 + 3.0 + 1.0 + 2.0)
    assert g.device_ms(0, 10, 0) == pytest.approx(3.1)  # a prefill-only step


def test_a_prefill_pass_runs_padded_to_its_graphs_token_count() -> None:
    """With ``prefill_buckets`` a pass costs the next count up (as the prefill graphs run it);
    past the last, or without buckets (the fitted terms), its own tokens."""
    g = GpuSteps("g", ((1, 2.0), (101, 12.0)), prefill_ms=3.0, prefill_token_ms=0.01, codec_frame_ms=0.0,
                 prefill_buckets=(32, 64, 512))
    assert [g.padded(t) for t in (1, 32, 33, 65, 512, 600)] == [32, 32, 64, 512, 512, 600]
    assert g.device_ms(0, 33, 0) == pytest.approx(3.0 + 0.64)
    assert GpuSteps("u", ((1, 2.0),)).padded(33) == 33
    mid = GpuSteps("mid", ((1, 3.0), (256, 12.0)), prefill_ms=1.0, prefill_token_ms=0.02, jitter=0.0)
    coarse, fine = (simulate(96, gpu=replace(mid, prefill_buckets=b), ramp_s=4.0, duration_s=8.0)
                    for b in ((512,), (16, 32, 64, 512)))

    def prompt_step_ms(r):
        ms = [m for *_, tokens, m in r.step_log if tokens]
        return sum(ms) / len(ms)

    assert prompt_step_ms(fine) < 0.8 * prompt_step_ms(coarse)
    assert fine.refused < coarse.refused and fine.goodput > 1.2 * coarse.goodput  # admission sees the cheaper steps
    assert fine.underran == coarse.underran == 0


def test_the_job_slots_bound_what_a_fast_gpu_serves() -> None:
    """``slots`` is the scheduler's max_num_seqs: with fewer jobs at once than 96 streams hold
    (two a speaking stream), the same GPU serves less audio, and the admission refuses the
    streams past the slots (one each) rather than let them wait for one."""
    few = simulate(96, gpu=FAST, ramp_s=2.0, duration_s=6.0, slots=64)
    many = simulate(96, gpu=FAST, ramp_s=2.0, duration_s=6.0, slots=1024)
    assert few.goodput < 0.8 * many.goodput
    assert few.refused > 0 and many.refused == 0 and few.underran == many.underran == 0


def test_goodput_is_the_on_time_streams_audio_over_the_run() -> None:
    r = simulate(32, gpu=FAST, ramp_s=1.0, duration_s=3.0, max_tokens=70)
    assert r.underran == 0 and r.refused == 0
    frames = r.on_time_audio_s * 24000 / 2048  # whole frames, every segment's 10 (70 tokens)
    assert frames == pytest.approx(round(frames)) and round(frames) % 10 == 0 and frames >= 10 * r.streams
    assert r.goodput == pytest.approx(r.on_time_audio_s / r.wall_s) and r.wall_s > 3.0


def test_the_command_line(capsys) -> None:
    assert main(["--streams", "24", "--ramp-s", "1", "--duration-s", "2", "--set", "jitter=0"]) == 0
    out = capsys.readouterr().out
    assert GPUS["h100-f904384"].source in out and "jitter 0.0" in out
    row = out.strip().splitlines()[-1].split()
    assert row[:3] == ["24", "1024", "384"]  # offered, slots, cap
    with pytest.raises(SystemExit):
        main(["--set", "nonsense=1"])
    assert "not a GpuSteps number" in capsys.readouterr().err
    assert main(["--streams", "24", "--ramp-s", "1", "--duration-s", "2",
                 "--prefill-token-buckets", "none", "default", "32,96"]) == 0
    rows = capsys.readouterr().out.strip().splitlines()[-3:]
    assert [r.split()[-1] for r in rows] == ["none", "default", "32,96"] and "goodput" in out
    for bad in ("3,2", "some"):
        with pytest.raises(SystemExit):
            main(["--prefill-token-buckets", bad])
        assert "--prefill-token-buckets" in capsys.readouterr().err


def test_the_timeline_has_a_line_a_second() -> None:
    from benchmark.orpheus_sim import timeline

    r = simulate(32, gpu=FAST, ramp_s=1.0, duration_s=3.0)
    lines = timeline(r)
    assert lines[0].split()[:3] == ["t", "s", "steps"]
    assert [int(x.split()[0]) for x in lines[1:]][:3] == [0, 1, 2]

"""benchmark.soak: the sample accounting from the server's counters and the clients' tally."""

from __future__ import annotations

import asyncio

import msgpack
import pytest

from benchmark import soak
from benchmark.soak import ClientTally, Counters, account, read_counters

EXPOSITION = """\
# TYPE voxgate_engine_totals gauge
voxgate_engine_totals{name="samples_made"} 1000.0
voxgate_engine_totals{name="samples_sent"} 900.0
voxgate_engine_totals{name="samples_dropped_cancelled"} 80.0
voxgate_engine_totals{name="samples_dropped_failed"} 20.0
voxgate_engine_totals{name="steps"} 7.0
# TYPE voxgate_audio_samples_sent counter
voxgate_audio_samples_sent_total 850.0
# TYPE voxgate_audio_samples_dropped counter
voxgate_audio_samples_dropped_total{reason="cancelled"} 50.0
# TYPE voxgate_engine_restarts counter
voxgate_engine_restarts_total 0.0
"""


def test_counters_are_read_from_the_exposition() -> None:
    """The engine's totals and the gateway's sample counters are picked out by name."""
    c = read_counters(EXPOSITION)
    assert (c.engine_made, c.engine_sent, c.gateway_sent) == (1000, 900, 850)
    assert c.engine_dropped == {"cancelled": 80, "failed": 20}
    assert c.gateway_dropped == {"cancelled": 50} and c.engine_restarts == 0


def test_a_run_where_every_sample_is_received_or_dropped_balances() -> None:
    """Growth of the counters over the run, less what clients received and every reported
    drop, leaves nothing unaccounted."""
    start = Counters(100, 100, {"cancelled": 0}, 100, {}, 0)
    end = read_counters(EXPOSITION)
    clients = ClientTally(streams=3, ended=2, cancelled=1, samples_received=740, samples_done=750,
                          barge_in_dropped=10)
    acc = account(start, end, clients)
    assert (acc.engine_made, acc.engine_balance, acc.gateway_balance, acc.client_balance) == (900, 0, 0, 0)
    assert acc.unaccounted == 0 and acc.is_balanced


def test_a_lost_sample_or_a_restart_is_not_balanced() -> None:
    """A sample that reached no client and no drop counter, or an engine restart (its counters
    start again), fails the run."""
    end = read_counters(EXPOSITION)
    lost = account(Counters(), end, ClientTally(samples_received=849, samples_done=850))
    assert lost.unaccounted == 1 and not lost.is_balanced
    restarted = account(Counters(), Counters(**{**end.__dict__, "engine_restarts": 1}),
                        ClientTally(samples_received=850, samples_done=850))
    assert restarted.unaccounted == 0 and not restarted.is_balanced


@pytest.mark.slow
def test_a_short_soak_against_the_synthetic_server_accounts_for_every_sample(
        capsys: pytest.CaptureFixture[str]) -> None:
    """Four streams for three seconds (a quarter cancelled at their first audio) against a
    real server: the run exits 0 and says every sample is accounted for."""
    assert soak.main(["--streams", "4", "--minutes", "0.05", "--cancel-fraction", "0.25",
                      "--rss-every-s", "1"]) == 0
    out = capsys.readouterr().out
    assert "OK: every sample accounted for" in out and "cancelled 0," not in out


class _RefusingServer:
    """A connection whose every stream is refused with ``capacity`` and a retry hint."""

    def __init__(self, retry_after_s: float | None, retryable: bool = True) -> None:
        self.sent: list[dict] = []
        self.reply = {"type": "error", "code": "capacity", "retryable": retryable}
        if retry_after_s is not None:
            self.reply["retry_after_s"] = retry_after_s

    async def send(self, data: bytes) -> None:
        msg = msgpack.unpackb(data)
        self.sent.append(msg)
        if msg["type"] == "start":
            self.stream = msg["stream"]

    async def recv(self) -> bytes:
        return msgpack.packb({**self.reply, "stream": self.stream})


@pytest.mark.parametrize(("retry_after_s", "retryable", "wait"), [(0.7, True, 0.7), (None, True, 0.0),
                                                                  (3.0, False, 0.0)])
def test_a_refused_stream_reports_the_wait_its_client_owes(retry_after_s, retryable, wait) -> None:
    ws = _RefusingServer(retry_after_s, retryable)
    tally, retry_after = asyncio.run(soak._speak_one(ws, "s1", "pcm_s16le", cancel=False))
    assert tally.errors == {"capacity": 1} and tally.streams == 1 and tally.samples_received == 0
    assert retry_after == wait

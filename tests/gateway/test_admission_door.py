"""gateway.admission_door: refusals at the gateway, and retry hints sized to the crowd of
refused clients, on a fake clock (no sleeps)."""

from __future__ import annotations

import pytest

from gateway.admission_door import AdmissionDoor


class FakeClock:
    def __init__(self) -> None:
        self.t = 50.0

    def __call__(self) -> float:
        return self.t


class Count:
    def __init__(self) -> None:
        self.n = 0.0

    def inc(self, amount: float = 1) -> None:
        self.n += amount


def test_the_door_refuses_only_when_the_engines_are_full() -> None:
    """``check`` sends a stream on while some engine has room (None) and refuses it with a hint
    of at least the engine's own once none has, counting each refusal."""
    state: dict[str, float | None] = {"hint": None}
    count = Count()
    door = AdmissionDoor(lambda: state["hint"], clock=FakeClock(), refused_counter=count)
    assert door.check() is None and count.n == 0
    state["hint"] = 0.4
    assert door.check() == 0.4 and count.n == 1 and door.num_refused_here == 1
    state["hint"] = 0.01
    assert door.check() == 0.1  # never below 0.1 s


def _settle(door: AdmissionDoor, clock: FakeClock, *, crowd: int, leave_per_s: float,
            seconds: float = 60.0, client_max_s: float = 1e9) -> float:
    """``crowd`` clients that retry after the hint they got (at most ``client_max_s``), every
    retry refused; streams leave at ``leave_per_s``. The mean hint given over the last 10 s."""
    dt = 0.01
    next_retry = [clock.t + i * 0.001 for i in range(crowd)]  # every client refused at once
    leave_every = 1.0 / leave_per_s
    next_leave = clock.t
    hints: list[float] = []
    end = clock.t + seconds
    while clock.t < end:
        clock.t += dt
        while next_leave <= clock.t:
            door.stream_left()
            next_leave += leave_every
        for i, t in enumerate(next_retry):
            if t <= clock.t:
                hint = door.refused(0.1)
                next_retry[i] = clock.t + min(hint, client_max_s)
                if clock.t > end - 10.0:
                    hints.append(hint)
    return sum(hints) / len(hints)


def test_the_hint_spreads_the_crowds_retries_over_the_places_that_free() -> None:
    """400 clients refused at once, 40 streams leaving a second: within seconds the hint
    settles where the crowd retries about twice per freed place (400 / (2 x 40) = 5 s), not at
    the engine's 0.1 s (4,000 refusals a second); a small crowd gets the engine's hint."""
    clock = FakeClock()
    door = AdmissionDoor(lambda: 0.1, clock=clock)
    assert _settle(door, clock, crowd=400, leave_per_s=40, seconds=12) == pytest.approx(5.0, rel=0.05)
    assert door.crowd() == 400
    clock2 = FakeClock()
    small = AdmissionDoor(lambda: 0.1, clock=clock2)
    assert _settle(small, clock2, crowd=2, leave_per_s=40) == pytest.approx(0.1)


def test_clients_that_retry_sooner_than_told_get_longer_hints_up_to_the_cap() -> None:
    """Clients capped at 2 s whatever they are told look like a larger crowd: the hint grows
    to the 30 s cap but no further (their retries still come every 2 s)."""
    clock = FakeClock()
    door = AdmissionDoor(lambda: 0.1, clock=clock)
    hint = _settle(door, clock, crowd=400, leave_per_s=40, seconds=120, client_max_s=2.0)
    assert 20.0 < hint <= 30.0


def test_before_any_stream_has_left_the_engines_hint_is_given() -> None:
    """No departure seen yet (nothing to size a crowd by): the engine's hint, or 1 s without
    one."""
    door = AdmissionDoor(lambda: None, clock=FakeClock())
    assert door.refused(0.3) == 0.3 and door.refused(None) == 1.0

"""gateway.placement: a new stream goes to the serving engine with the most headroom."""

from __future__ import annotations

from gateway.placement import EngineLoad, choose_engine, is_full


def _load(index: int, *, ready: bool = True, open_: int = 0, capacity: int | None = None,
          demand: int = 0, open_at_report: int | None = None) -> EngineLoad:
    return EngineLoad(index=index, is_ready=ready, num_open=open_, capacity=capacity,
                      demand=demand, num_open_at_report=open_ if open_at_report is None else open_at_report)


def test_the_most_headroom_wins_not_the_fewest_streams() -> None:
    """With capacities known, capacity minus demand decides: a bigger engine with more streams
    can have more room than a smaller one with fewer."""
    engines = [_load(0, open_=100, capacity=480, demand=100), _load(1, open_=50, capacity=120, demand=50)]
    assert choose_engine(engines) == 0  # 380 free against 70


def test_without_a_capacity_known_the_fewest_streams_win() -> None:
    """Before an engine is measured (no limit known) placement counts open streams."""
    engines = [_load(0, open_=3), _load(1, open_=1, capacity=10), _load(2, open_=2)]
    assert choose_engine(engines) == 1


def test_an_engine_not_serving_never_gets_a_stream() -> None:
    """Starting, restarting or failed engines are skipped however idle; none serving: None."""
    engines = [_load(0, ready=False), _load(1, open_=9, capacity=10, demand=9)]
    assert choose_engine(engines) == 1
    assert choose_engine([_load(0, ready=False), _load(1, ready=False)]) is None
    assert choose_engine([]) is None


def test_streams_placed_since_the_last_report_count_as_demand() -> None:
    """A burst between two reports spreads: each stream placed on an engine lowers its headroom
    at once, and streams closed since the report raise it."""
    loads = {0: 0, 1: 0}
    placed = []
    for _ in range(6):  # both reported demand 10 of capacity 20 with 10 streams open
        engines = [_load(i, open_=10 + loads[i], capacity=20, demand=10, open_at_report=10)
                   for i in (0, 1)]
        choice = choose_engine(engines)
        assert choice is not None
        loads[choice] += 1
        placed.append(choice)
    assert loads == {0: 3, 1: 3} and placed[:2] == [0, 1]
    closed = _load(0, open_=4, capacity=20, demand=10, open_at_report=10)  # 6 ended since
    assert closed.demand_now == 4 and closed.headroom == 16


def test_ties_go_to_fewer_streams_then_the_lower_index() -> None:
    """Equal headroom: the engine with fewer open streams, then the first."""
    assert choose_engine([_load(0, open_=5, capacity=10, demand=2, open_at_report=5),
                          _load(1, open_=2, capacity=10, demand=2)]) == 1
    assert choose_engine([_load(0, capacity=10), _load(1, capacity=10)]) == 0


def test_an_engine_past_capacity_is_still_chosen_when_all_are() -> None:
    """Every engine full: the least overloaded takes the stream (its admission queues or refuses)."""
    assert choose_engine([_load(0, capacity=10, demand=14, open_=14),
                          _load(1, capacity=10, demand=12, open_=12)]) == 1


def _roomy(index: int, *, room: int | None, open_: int = 0, open_at_report: int = 0,
           ready: bool = True) -> EngineLoad:
    return EngineLoad(index=index, is_ready=ready, num_open=open_, capacity=10, demand=10,
                      num_open_at_report=open_at_report, room=room)


def test_full_only_when_every_serving_engine_has_used_its_room() -> None:
    """An engine's reported room less the streams sent to it since: full at 0 or below, room
    again as streams end (open falls below the report's); an engine not serving does not count,
    one with no limit known is never full, and with none serving the pool is not `full` (that
    is the engine-unavailable error)."""
    assert not is_full([_roomy(0, room=2, open_=11, open_at_report=10)])  # one place left
    assert is_full([_roomy(0, room=2, open_=12, open_at_report=10)])
    assert not is_full([_roomy(0, room=0, open_=8, open_at_report=10)])  # two streams ended
    assert _roomy(0, room=0, open_=8, open_at_report=10).room_now == 2
    assert not is_full([_roomy(0, room=0), _roomy(1, room=1)])
    assert is_full([_roomy(0, room=0), _roomy(1, room=5, ready=False)])
    assert not is_full([_roomy(0, room=0), _roomy(1, room=None)])
    assert not is_full([_roomy(0, room=0, ready=False)]) and not is_full([])

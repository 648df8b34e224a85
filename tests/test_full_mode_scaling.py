"""Full mode at scale (issue 28 part 5): what the engine keeps per rank is bounded, its fast paths change
no number, and the fluid network's completion times equal an independent max-min reference."""

from __future__ import annotations

import gc
import importlib
import math
from typing import Any

import pytest
import simpy
from hypothesis import given, settings
from hypothesis import strategies as st
from test_symmetric_full import _cfg

from simtrain.engine.done import PROCESSED, DoneEvents, either
from simtrain.engine.network import FlowNetwork
from simtrain.engine.records import Ledger, PointTimeline
from simtrain.studies.simulate import simulate

simulate_module = importlib.import_module("simtrain.studies.simulate")
DERANDOMISED = settings(deadline=None, derandomize=True, database=None, max_examples=60)

# TP4 x PP2 x DP2 on two nodes, interleaved: TP collectives run in line, sends cross stages, DP reduces
CASE = _cfg(dict(n_nodes=2, layout=dict(tp=4, pp=2, vpp=2, dp=2, zero_stage=1, sequence_parallel=True), seqs=8))


def _engines(monkeypatch: pytest.MonkeyPatch, **kw: Any) -> list[Any]:
    """Patch simulate's Engine to record its instances (with ``kw`` passed on); returns the list."""
    made: list[Any] = []
    engine = simulate_module.Engine

    def make(*args: Any, **kwargs: Any) -> Any:
        e = engine(*args, **{**kwargs, **kw})
        made.append(e)
        return e

    monkeypatch.setattr(simulate_module, "Engine", make)
    return made


@pytest.mark.parametrize("merge", [False, True])
def test_full_mode_keeps_no_done_event_after_the_step(monkeypatch: pytest.MonkeyPatch, merge: bool) -> None:
    """Every awaited op's done event is dropped once simpy has processed it, so memory holds the events
    in flight, not one per op of every rank (the old engine made all of them up front and kept them).
    By classes (``simtrain.engine.merge``) the unperturbed run simulates one rank per stage."""
    made = _engines(monkeypatch, merge=merge)
    res = simulate(CASE, mode="full")
    (engine,) = made
    fired = [v for r in engine.ranks for v in engine.done[r].values()]
    assert fired and all(v is PROCESSED for v in fired)
    assert res.n_gpus == 16 and len(engine.ranks) == (2 if merge else 16)
    # start times are kept only for the sends a receiver reads, never for other ops
    assert engine.started and all(idx in engine._tables[engine.stage[r]].sent for r, idx in engine.started)


@pytest.mark.parametrize("slowdown", [0.0, 0.25])
def test_full_mode_fast_paths_change_nothing(monkeypatch: pytest.MonkeyPatch, slowdown: float) -> None:
    """Full mode runs blocking TP collectives in line on the compute stream (still meeting their group)
    and re-times compute with a light either-event: the same numbers, bit for bit, as every op on its
    own stream, including a comm stream's in-situ stretch (GpuSpec.comm_in_situ_slowdown)."""
    results = []
    for fast in (True, False):
        made = _engines(monkeypatch, fast_paths=fast)
        orig = simulate_module.cluster_of

        def cluster(run: Any, orig: Any = orig) -> Any:
            c = orig(run)
            gpu = c.gpu.model_copy(update={"comm_in_situ_slowdown": slowdown})
            return c.model_copy(update={"node": c.node.model_copy(update={"gpu": gpu})})

        monkeypatch.setattr(simulate_module, "cluster_of", cluster)
        results.append(simulate(CASE, mode="full").to_dict(timeline=True))
        assert made and all(e.fast_paths is fast and e.gpu.comm_in_situ_slowdown == slowdown for e in made)
        if fast:
            assert any(e._inline[r] for e in made for r in e.ranks)  # something ran in line
        monkeypatch.undo()
    assert results[0] == results[1]


def test_gc_is_restored_after_the_run() -> None:
    """The collector is off only while a step is lowered and simulated (``gc_paused``)."""
    assert gc.isenabled()
    simulate(CASE, mode="full")
    assert gc.isenabled()
    gc.disable()
    try:
        simulate(CASE, mode="full")
        assert not gc.isenabled()
    finally:
        gc.enable()


def test_point_timeline_reads_back_exactly() -> None:
    pts = [(0, 1.5), (1e-300, 2.0**60 + 1), (0.1 + 0.2, -3.25), (math.pi, 7e22)]
    tl = PointTimeline(pts)
    assert len(tl) == 4 and tl == pts and list(tl) == [(float(t), float(v)) for t, v in pts]
    assert tl[-1] == pts[-1] and tl[1:3] == pts[1:3] and tl[2][0] == 0.1 + 0.2
    tl.append((5.0, 1.0))
    assert tl[-1] == (5.0, 1.0) and tl != pts
    led = Ledger()
    led.apply(0.5, (("weights", 3.0), ("grads", 1.0)))
    assert isinstance(led.timeline, PointTimeline) and list(led.timeline) == [(0.5, 4.0)]


def test_done_events_fire_in_order_and_either_wakes_once() -> None:
    env = simpy.Environment()
    done = DoneEvents(env)
    log: list[tuple[str, float]] = []

    def waiter(name: str, idx: int):  # type: ignore[no-untyped-def]
        ev = done[idx]
        if not ev.processed:
            yield ev
        log.append((name, env.now))

    def firer():  # type: ignore[no-untyped-def]
        yield env.timeout(2.0)
        done.fire(7)
        yield env.timeout(1.0)
        log.append(("late", env.now))
        assert done[7] is PROCESSED  # dropped: a later waiter goes on at once
        yield from waiter("after", 7)

    def racer():  # type: ignore[no-untyped-def]
        a, b = env.timeout(5.0), env.event()
        env.process(trigger(b))
        yield either(env, a, b)
        log.append(("either", env.now))
        yield a  # the slower one fires later without waking anything twice
        log.append(("a", env.now))

    def trigger(b: simpy.Event):  # type: ignore[no-untyped-def]
        yield env.timeout(4.0)
        b.succeed()

    env.process(waiter("w1", 7))
    env.process(firer())
    env.process(racer())
    env.run()
    assert log == [("w1", 2.0), ("late", 3.0), ("after", 3.0), ("either", 4.0), ("a", 5.0)]


# -- the fluid network against an independent max-min reference --------------------------------------

EDGES = [("a", "b"), ("b", "c"), ("c", "d"), ("b", "d"), ("d", "e")]


def _reference(caps: dict[Any, float], flows: list[tuple[tuple[Any, ...], float, float, float]]) -> list[float]:
    """Completion times of flows ``(edges, bytes, start s, rate cap)`` under max-min fair sharing, by
    brute force: at every arrival or completion, water-fill from zero (the least loaded bottleneck edge
    or cap first), then advance to the next event."""
    n = len(flows)
    left = [b for _, b, _, _ in flows]
    end = [math.nan] * n
    t = 0.0
    while any(math.isnan(x) for x in end):
        live = [i for i in range(n) if math.isnan(end[i]) and flows[i][2] <= t + 1e-15]
        rate = dict.fromkeys(live, 0.0)
        frozen: set[int] = set()
        cap_left = {e: caps[e] for e in caps}
        while len(frozen) < len(live):
            active = [i for i in live if i not in frozen]
            count = {e: sum(1 for i in active if e in flows[i][0]) for e in caps}
            step = min([cap_left[e] / c for e, c in count.items() if c] + [flows[i][3] - rate[i] for i in active])
            for i in active:
                rate[i] += step
            for e, c in count.items():
                cap_left[e] -= step * c
            for i in active:
                if flows[i][3] - rate[i] <= 1e-12 * rate[i] or any(cap_left[e] <= 1e-12 * caps[e] for e in flows[i][0]):
                    frozen.add(i)
        arrivals = [flows[i][2] for i in range(n) if flows[i][2] > t + 1e-15]
        finish = [(left[i] / rate[i], i) for i in live if rate[i] > 0]
        dt = min([f for f, _ in finish] + [a - t for a in arrivals])
        for i in live:
            left[i] -= rate[i] * dt
        t += dt
        for _, i in finish:
            if left[i] <= 1e-9 * flows[i][1]:
                end[i] = t
    return end


@DERANDOMISED
@given(st.lists(st.tuples(st.lists(st.sampled_from(EDGES), min_size=1, max_size=3, unique=True),
                          st.floats(1.0, 100.0), st.sampled_from([0.0, 0.0, 0.5, 1.3]),
                          st.sampled_from([math.inf, math.inf, 7.0])), min_size=1, max_size=6),
       st.lists(st.floats(2.0, 50.0), min_size=len(EDGES), max_size=len(EDGES)))
def test_flow_network_matches_brute_force_max_min(raw: list[Any], capacities: list[float]) -> None:
    caps = dict(zip(EDGES, capacities, strict=True))
    flows = [(tuple(edges), nbytes, start, cap) for edges, nbytes, start, cap in raw]
    env = simpy.Environment()
    net = FlowNetwork(env, caps.__getitem__)
    got = [math.nan] * len(flows)

    def run(i: int):  # type: ignore[no-untyped-def]
        path, nbytes, start, cap = flows[i]
        yield env.timeout(start)
        yield net.transfer([(path, (1.0,) * len(path), nbytes, cap)])
        got[i] = env.now

    for i in range(len(flows)):
        env.process(run(i))
    env.run()
    want = _reference(caps, flows)
    assert got == pytest.approx(want, rel=1e-9)


def test_reference_closed_form() -> None:
    """The reference itself: two flows on one edge of 10 B/s, 10 and 30 bytes: the first ends at 2 s
    (5 B/s each), the second has 20 bytes left at 10 B/s: 4 s."""
    assert _reference({("a", "b"): 10.0}, [((("a", "b"),), 10.0, 0.0, math.inf),
                                           ((("a", "b"),), 30.0, 0.0, math.inf)]) == pytest.approx([2.0, 4.0])

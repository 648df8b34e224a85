"""The engine's fast paths (private blocking collectives run in line on the compute stream, a quiet
rank's compute stream running ahead of the simpy clock) change the work, never the answer."""

from __future__ import annotations

import functools
import importlib

import pytest
from test_symmetric_full import CASES, _cfg

from simtrain.inline import Window, inline_plan, time_bounds
from simtrain.ops import OpKind, Program, Stream
from simtrain.simulate import simulate

simulate_module = importlib.import_module("simtrain.simulate")

EXTRA = {
    # TP inside a node with nothing else on NVLink: every TP collective is private and runs in line
    "2n-tp8-pp2-full-recompute": dict(n_nodes=2, layout=dict(tp=8, pp=2, recompute="full"), seqs=16),
    "2n-tp8-pp2-vpp2-zero3": dict(n_nodes=4, layout=dict(tp=8, pp=2, vpp=2, dp=2, zero_stage=3), seqs=16),
    "tp4-overlap": dict(n_nodes=1, layout=dict(tp=4, dp=2, tp_comm_overlap=True), seqs=8),
}


def _slow(monkeypatch: pytest.MonkeyPatch, cfg: dict, mode: str):  # type: ignore[no-untyped-def]
    engine = simulate_module.Engine
    monkeypatch.setattr(simulate_module, "Engine", functools.partial(engine, fast_paths=False))
    try:
        return simulate(cfg, mode=mode)
    finally:
        monkeypatch.setattr(simulate_module, "Engine", engine)


@pytest.mark.parametrize("name", [*CASES, *EXTRA])
def test_fast_paths_give_the_same_step(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = _cfg({**CASES, **EXTRA}[name])
    for mode in ("symmetric", "full") if name in ("tp8", "2n-tp8-pp2-full-recompute") else ("symmetric",):
        fast = simulate(cfg, mode=mode)
        slow = _slow(monkeypatch, cfg, mode)
        assert fast.step_time_s == pytest.approx(slow.step_time_s, rel=1e-12)
        assert fast.ops_executed == slow.ops_executed
        for key in ("compute", "bubble", "optimizer"):
            assert fast.breakdown_s[key] == pytest.approx(slow.breakdown_s[key], rel=1e-9, abs=1e-12)
        for axis, v in slow.breakdown_s["exposed_comm"].items():
            assert fast.breakdown_s["exposed_comm"][axis] == pytest.approx(v, rel=1e-9, abs=1e-12)
        for a, b in zip(fast.memory, slow.memory, strict=True):
            assert a.peak_bytes == pytest.approx(b.peak_bytes, rel=1e-12)


def test_private_tp_collectives_are_inlined_and_exposed_as_tp() -> None:
    """TP8 in one node, one stage per node: every TP collective is private and blocking, so the critical
    rank's exposed TP time is exactly the time its TP collectives took (the trace still shows them)."""
    cfg = _cfg(EXTRA["2n-tp8-pp2-full-recompute"])
    r = simulate(cfg, trace=True)
    critical = max(r.stage_of, key=lambda rank: (max(e.end_s for e in r.trace if e.rank == rank), -rank))
    tp_s = sum(e.end_s - e.start_s for e in r.trace if e.rank == critical and e.stream == "tp")
    assert tp_s > 0
    assert r.breakdown_s["exposed_comm"]["tp"] == pytest.approx(tp_s, rel=1e-9)


def _prog(spec: list[tuple[str, Stream, tuple[int, ...]]]) -> Program:
    prog = Program(0)
    for name, stream, deps in spec:
        kind = OpKind.COMPUTE if stream == Stream.COMPUTE else OpKind.COLLECTIVE
        prog.add(kind, stream, name, deps=deps)
    return prog


def test_inline_plan_takes_a_blocking_chain_only() -> None:
    C, T = Stream.COMPUTE, Stream.TP
    prog = _prog([("x", C, ()), ("ag", T, (0,)), ("rs", T, (0, 1)), ("z", C, (2,)),  # blocking chain
                  ("w", C, ()), ("ar", T, (4,)), ("v", C, ()), ("u", C, (5,))])          # overlapped: u is not next
    plan = inline_plan(prog.ops, [None if op.kind == OpKind.COMPUTE else 1e-3 for op in prog.ops])
    assert list(plan) == [3]
    assert [op.name for op in plan[3][0]] == ["ag", "rs"] and plan[3][1] == ()
    # not private: nothing runs in line
    assert inline_plan(prog.ops, [None] * len(prog.ops)) == {}


def test_time_bounds_and_window_bracket_a_gradient_bucket() -> None:
    """A DP bucket issued after compute op 2 and awaited by compute op 5 may be in flight in the gaps
    (2,3), (3,4), (4,5) only; a TP collective there must stay on the network, elsewhere it may run in line."""
    C, T, D = Stream.COMPUTE, Stream.TP, Stream.DP
    prog = _prog([("c0", C, ()), ("c1", C, ()), ("c2", C, ()), ("bucket", D, (2,)), ("c3", C, ()),
                  ("c4", C, ()), ("c5", C, (3,)), ("tp", T, (6,)), ("c6", C, (7,))])
    lo, hi = time_bounds(prog.ops)
    assert (lo[3], hi[3]) == (2, 5)
    assert lo[7] == 5  # the TP op starts after compute position 5 (c5) ends
    w = Window.of([(lo[3], hi[3])])
    assert [k for k in range(1, 8) if not w.clear(k)] == [3, 4, 5]
    priv = [None if op.kind == OpKind.COMPUTE else 1e-3 for op in prog.ops]
    plan = inline_plan(prog.ops, priv, [w if op.stream == T else None for op in prog.ops])
    assert [op.name for pre, _ in plan.values() for op in pre] == ["tp"]  # gap (5, 6): clear
    moved = _prog([("c0", C, ()), ("c1", C, ()), ("c2", C, ()), ("bucket", D, (2,)), ("c3", C, ()),
                   ("tp", T, (4,)), ("c4", C, (5,)), ("c5", C, (3,))])
    lo, hi = time_bounds(moved.ops)
    w = Window.of([(lo[3], hi[3])])
    priv = [None if op.kind == OpKind.COMPUTE else 1e-3 for op in moved.ops]
    assert inline_plan(moved.ops, priv, [w if op.stream == T else None for op in moved.ops]) == {}

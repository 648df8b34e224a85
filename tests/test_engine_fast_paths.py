"""The engine's fast paths (private blocking collectives run in line on the compute stream, a quiet
rank's compute stream running ahead of the simpy clock) change the work, never the answer."""

from __future__ import annotations

import functools
import importlib

import pytest
from test_symmetric_full import CASES, _cfg

from simtrain.engine.inline import Guard, inline_plan, time_bounds
from simtrain.lower.ops import OpKind, Program, Stream
from simtrain.studies.simulate import simulate

simulate_module = importlib.import_module("simtrain.studies.simulate")

EXTRA = {
    # TP inside a node with nothing else on NVLink: every TP collective is private and runs in line
    "2n-tp8-pp2-full-recompute": dict(n_nodes=2, layout=dict(tp=8, pp=2, recompute="full"), seqs=16),
    "2n-tp8-pp2-vpp2-zero3": dict(n_nodes=4, layout=dict(tp=8, pp=2, vpp=2, dp=2, zero_stage=3), seqs=16),
    "tp4-overlap": dict(n_nodes=1, layout=dict(tp=4, dp=2, tp_comm_overlap=True), seqs=8),
    # TP and DP share NVLink ports: TP skips the network only while no gradient bucket can be in flight
    "tp4-dp2-zero1-accumulate": dict(n_nodes=1, layout=dict(tp=4, dp=2, zero_stage=1, overlap_grad_reduce=True),
                                     seqs=16),
    "tp4-dp2-zero2-accumulate": dict(n_nodes=1, layout=dict(tp=4, dp=2, zero_stage=2), seqs=16),
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
    """TP8 in one node, one stage per node: every TP collective is private and blocking (a stack that
    all-reduces the input gradients after the layer's backward, not beside the wgrad GEMM as Megatron
    does), so the critical rank's exposed TP time is exactly the time its TP collectives took (the trace
    still shows them)."""
    cfg = _cfg(EXTRA["2n-tp8-pp2-full-recompute"])
    cfg["train"]["stack"] = "deepspeed"
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
    plan = inline_plan(prog.ops)
    assert list(plan) == [3]
    assert [op.name for op in plan[3][0]] == ["ag", "rs"] and plan[3][1] == ()


def test_time_bounds_and_guard_of_a_gradient_bucket() -> None:
    """A DP bucket that depends on compute op 2 (and its stream predecessor) may be in flight at any gap
    after it until the DP stream has finished it; the guard reads how many ops the stream has run."""
    C, T, D = Stream.COMPUTE, Stream.TP, Stream.DP
    prog = _prog([("c0", C, ()), ("b0", D, (0,)), ("c1", C, ()), ("c2", C, ()), ("b1", D, (3,)),
                  ("c3", C, ()), ("tp", T, (5,)), ("c4", C, (6,))])
    lo = time_bounds(prog.ops)
    assert (lo[1], lo[4], lo[6]) == (0, 2, 3)
    guard = Guard(((D, (lo[1], lo[4]), (1, 2)),))
    assert guard.clear(1, {}) is False               # b0 (issued after c0) may be running
    assert guard.clear(1, {D: 1}) and guard.clear(2, {D: 1})
    assert guard.clear(3, {D: 1}) is False           # b1 (issued after c2) may be running
    assert guard.clear(4, {D: 2})
    assert Guard(((D, (5,), (1,)),)).clear(4, {})   # issued after c5: starts after the gap (3, 4)

"""Steady-state extrapolation (``simtrain.engine.steady``): three short runs a pipeline period apart, extended
by the periods they lack, give what simulating every micro-batch gives, or the shortcut is declined."""

from __future__ import annotations

import importlib
from typing import Any

import pytest
from test_symmetric_full import TINY

from simtrain.engine.records import EngineResult, Ledger, RankStats
from simtrain.engine.steady import ERR_TOL, MAX_WORK_FRACTION, TIMELINE_TOL, extrapolate, plan
from simtrain.studies.simulate import simulate

simulate_module = importlib.import_module("simtrain.studies.simulate")

TINY_MOE = {**TINY, "name": "tiny-moe", "moe": dict(n_experts=8, top_k=2, ffn_hidden=512)}

#: (layout, micro-batches per pipeline, nodes, model); each long enough for the shortcut to be taken
CASES: dict[str, tuple[dict[str, Any], int, int, dict[str, Any]]] = {
    "pp1-zero1-accumulate": (dict(dp=8, zero_stage=1), 32, 1, TINY),
    "pp1-fsdp-accumulate": (dict(dp=8, fsdp="full"), 24, 1, TINY),
    "pp2-1f1b-tp2-sp": (dict(pp=2, tp=2, dp=2, sequence_parallel=True), 40, 1, TINY),
    "pp2-interleaved": (dict(pp=2, vpp=2, tp=2, dp=2), 48, 1, TINY),
    "pp4-zb-h1": (dict(pp=4, dp=2, schedule="zb_h1"), 96, 1, TINY),
    "pp4-dualpipe": (dict(pp=4, dp=2, schedule="dualpipe"), 144, 1, TINY),
    "2n-cp2-ring": (dict(tp=4, cp=2, dp=2, zero_stage=1), 24, 2, TINY),
    "cpu-offload": (dict(tp=2, dp=4, zero_stage=1, offload_activation_layers=5), 24, 1, TINY),
    "moe-ep4-pp2": (dict(pp=2, dp=4, ep=4), 40, 1, TINY_MOE),
    "2n-tp8-pp2-zero1": (dict(tp=8, pp=2, zero_stage=1), 40, 2, TINY),
    # three runs a period (4) apart exceed the budget; 1F1B's short period (1) fits: 5, 6, 7
    "pp4-1f1b-short-period": (dict(pp=4, dp=2), 32, 1, TINY),
}


def _cfg(layout: dict[str, Any], microbatches: int, nodes: int, model: dict[str, Any]) -> dict[str, Any]:
    dp = layout.get("dp", 1)
    return dict(model=model, hardware=dict(n_nodes=nodes), layout=layout,
                train=dict(seq_len=512, global_batch_seqs=microbatches * dp))


def _every_microbatch(cfg: dict[str, Any], mode: str | None = None):  # type: ignore[no-untyped-def]
    return simulate(cfg, overrides=["sim.steady_state=false"], mode=mode)


#: Times agree within this fraction of the step (the shortcut's own error budget, ``steady.ERR_TOL``; a
#: pipeline whose stages settle late, after the short runs, can leave their line by a little: seen
#: 5e-5 of the step on a 384-micro-batch archive row; here ~1e-14, and 7e-7 for 2n-tp8-pp2-zero1,
#: whose first stage runs 2.6e-8 s per period slower than the step grows), timeline events within
#: ``TIMELINE_TOL``; memory within ``EXACT``.
TIE = 1e-5
EXACT = 1e-9


def _assert_same(fast: Any, slow: Any) -> None:
    step = slow.step_time_s
    assert fast.step_time_s == pytest.approx(step, rel=TIE)
    assert fast.microbatches == slow.microbatches and fast.global_batch_tokens == slow.global_batch_tokens
    assert fast.mfu == pytest.approx(slow.mfu, rel=TIE) and fast.hfu == pytest.approx(slow.hfu, rel=TIE)
    for key in ("compute", "bubble", "stage_imbalance", "offload", "optimizer"):
        assert fast.breakdown_s[key] == pytest.approx(slow.breakdown_s[key], abs=TIE * step)
    for axis, v in slow.breakdown_s["exposed_comm"].items():
        assert fast.breakdown_s["exposed_comm"][axis] == pytest.approx(v, abs=TIE * step)
    for a, b in zip(fast.memory, slow.memory, strict=True):
        assert a.peak_bytes == pytest.approx(b.peak_bytes, rel=EXACT)
        assert a.closed_form_peak_bytes == pytest.approx(b.closed_form_peak_bytes, rel=EXACT)
        assert a.fits == b.fits
        assert set(a.components) == set(b.components)
        for k, v in b.components.items():
            assert a.components[k] == pytest.approx(v, abs=EXACT * b.peak_bytes)
        assert len(a.timeline) == len(b.timeline)
        for (ta, va), (tb, vb) in zip(a.timeline, b.timeline, strict=True):
            assert ta == pytest.approx(tb, abs=TIMELINE_TOL * step)
            assert va == pytest.approx(vb, abs=EXACT * b.peak_bytes)


def _took_shortcut(result: Any) -> bool:
    return any(n.startswith("steady state:") for n in result.notes)


def test_only_1f1b_has_a_short_period() -> None:
    """Interleaved 1F1B repeats with a group of p micro-batches and DualPipe with 2p: no shorter fallback."""
    from simtrain.plan.schedules import schedule_of

    assert schedule_of("1f1b").short_period(8) == 1 and schedule_of("1f1b").period(8) == 8
    for name, period in (("interleaved_1f1b", 8), ("dualpipe", 16), ("gpipe", 8), ("zb_h1", 8)):
        assert schedule_of(name).short_period(8) == schedule_of(name).period(8) == period
    short = plan("1f1b", 4, 32)
    assert short is not None and short.period == 1 and tuple(short.counts()) == (5, 6, 7)


@pytest.mark.parametrize("name", list(CASES))
def test_shortcut_gives_what_every_microbatch_gives(name: str) -> None:
    cfg = _cfg(*CASES[name])
    fast = simulate(cfg)
    slow = _every_microbatch(cfg)
    assert _took_shortcut(fast) and not _took_shortcut(slow)
    assert fast.ops_executed < slow.ops_executed  # the three short runs did less work
    _assert_same(fast, slow)


def test_full_mode_takes_the_shortcut_too() -> None:
    cfg = _cfg(*CASES["pp2-1f1b-tp2-sp"])
    fast = simulate(cfg, mode="full")
    assert fast.mode == "full" and _took_shortcut(fast)
    _assert_same(fast, _every_microbatch(cfg, mode="full"))


def test_gpipe_is_right_whether_or_not_it_is_extrapolated() -> None:
    """GPipe's memory grows with m (every forward before any backward): whatever the check decides,
    the answer is the full simulation's."""
    cfg = _cfg(dict(pp=2, dp=4, schedule="gpipe"), 40, 1, TINY)
    _assert_same(simulate(cfg), _every_microbatch(cfg))


def test_trace_and_opt_out_simulate_every_microbatch() -> None:
    cfg = _cfg(*CASES["pp2-1f1b-tp2-sp"])
    slow = _every_microbatch(cfg)
    traced = simulate(cfg, trace=True)
    assert not _took_shortcut(traced) and traced.ops_executed == slow.ops_executed
    assert len(traced.trace) > 0


def test_declined_shortcut_falls_back_to_every_microbatch(monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = _cfg(*CASES["pp2-1f1b-tp2-sp"])
    monkeypatch.setattr(simulate_module, "extrapolate", lambda results, k: None)
    result = simulate(cfg)
    assert not _took_shortcut(result)
    assert result.ops_executed == _every_microbatch(cfg).ops_executed


@pytest.mark.parametrize(("schedule", "pp", "m", "counts"), [
    ("1f1b", 1, 32, (2, 3, 4, 5)),         # a period past the least count (1); 14 <= 0.6 x 32 < 20
    ("1f1b", 4, 96, (8, 12, 16, 20)),
    ("1f1b", 4, 98, (10, 14, 18)),         # congruent to m mod P: 98 = 18 + 20 x 4
    ("1f1b", 8, 64, (9, 10, 11)),          # 16 + 24 + 32 > 38.4: 1F1B's short period, a micro-batch
    ("1f1b", 64, 512, (65, 66, 67, 68)),   # a 1T model on 64 stages (Korthikanti et al. 2022)
    ("interleaved_1f1b", 8, 384, (16, 24, 32, 40, 48, 56)),  # 216 <= 230.4 < 280
    ("dualpipe", 4, 144, (16, 24, 32)),    # DualPipe: period 2p, at least 2p micro-batches
])
def test_plan_counts(schedule: str, pp: int, m: int, counts: tuple[int, ...]) -> None:
    steady = plan(schedule, pp, m)
    assert steady is not None and tuple(steady.counts()) == counts
    assert sum(counts) <= MAX_WORK_FRACTION * m
    for c in counts:
        assert (m - c) % steady.period == 0 and c + steady.periods_added(c) * steady.period == m


@pytest.mark.parametrize(("schedule", "pp", "m"), [("1f1b", 1, 8), ("1f1b", 8, 40), ("interleaved_1f1b", 8, 8),
                                                    ("interleaved_1f1b", 8, 64), ("dualpipe", 16, 120)])
def test_plan_declines_when_three_short_runs_exceed_the_budget(schedule: str, pp: int, m: int) -> None:
    assert plan(schedule, pp, m) is None


def _engine_result(step: float, bubble: float, peak: float, timeline: list[tuple[float, float]]) -> EngineResult:
    stats = RankStats(end_s=step, bubble_s=bubble, flops=1e12 * step, last_compute_end_s=step)
    stats.busy["fwd"] = step - bubble
    ledger = Ledger(total=0.0, peak=peak, at_peak={"activations": peak}, timeline=timeline)
    return EngineResult(step, [0], {0: stats}, {0: ledger}, [], 10, {})


def _sawtooth(periods: int) -> list[tuple[float, float]]:
    """A memory timeline: a fill point, one rise and fall per period, a drain point (t, bytes)."""
    points = [(0.0, 1.0)]
    for i in range(periods):
        points += [(1.0 + i, 3.0), (1.5 + i, 1.0)]
    return [*points, (1.0 + periods, 0.0)]


def test_extrapolate_extends_lines_and_splices_timelines() -> None:
    runs = [_engine_result(1.0 + n, 0.5, 3.0, _sawtooth(n)) for n in (2, 3, 4)]
    out = extrapolate(runs, 6)
    assert out is not None
    assert out.step_time_s == pytest.approx(11.0)
    assert out.stats[0].busy["fwd"] == pytest.approx(10.5) and out.stats[0].bubble_s == pytest.approx(0.5)
    assert out.ledgers[0].peak == pytest.approx(3.0)
    expected = _sawtooth(10)
    assert len(out.ledgers[0].timeline) == len(expected)
    for got, want in zip(out.ledgers[0].timeline, expected, strict=True):
        assert got == pytest.approx(want)
    assert out.ops_executed == 30


def test_extrapolate_declines_runs_off_one_line() -> None:
    counts = (2, 3, 4)
    runs = [_engine_result(1.0 + n + (0.01 if n == 4 else 0.0), 0.5, 3.0, _sawtooth(n)) for n in counts]
    assert extrapolate(runs, 6) is None
    growing = [_engine_result(1.0 + n, 0.5, 3.0 * n ** 2, _sawtooth(n)) for n in counts]
    assert extrapolate(growing, 6) is None
    irregular = [_engine_result(1.0 + n, 0.5, 3.0, _sawtooth(n)) for n in counts]
    irregular[2].ledgers[0].timeline[3] = (2.2, 2.0)
    assert extrapolate(irregular, 6) is None


def test_extrapolate_accepts_float_noise_but_not_an_error_the_extension_would_grow() -> None:
    """A second difference passes while (k + 1) times it stays within ERR_TOL of the scale."""
    counts = (2, 3, 4)
    step = 5.0
    noise = 0.5 * ERR_TOL * step / 7  # (k + 1) x noise = half the tolerance at k = 6
    runs = [_engine_result(1.0 + n + (noise if n == 4 else 0.0), 0.5, 3.0, _sawtooth(n)) for n in counts]
    assert extrapolate(runs, 6) is not None
    assert extrapolate(runs, 60) is None


def test_later_runs_are_tried_when_the_first_three_are_not_steady(monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = _cfg(*CASES["pp1-zero1-accumulate"])
    tried: list[int] = []
    real = simulate_module.extrapolate

    def first_window_refused(results, k):  # type: ignore[no-untyped-def]
        tried.append(k)
        return None if len(tried) == 1 else real(results, k)

    monkeypatch.setattr(simulate_module, "extrapolate", first_window_refused)
    result = simulate(cfg)
    assert tried == [28, 27]  # counts 2, 3, 4 refused; 3, 4, 5 taken
    assert any(n.startswith("steady state: simulated 3, 4 and 5 micro-batches (14 in all)") for n in result.notes)
    _assert_same(result, _every_microbatch(cfg))

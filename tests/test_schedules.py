"""Pipeline schedules as data: completeness, ordering and in-flight counts."""

from __future__ import annotations

from collections import Counter

import pytest

from simtrain.plan.load import load_config
from simtrain.plan.schedules import (
    SCHEDULES,
    Action,
    ActionCosts,
    Route,
    ScheduleError,
    build_schedule,
    dualpipe,
    dualpipev,
    gpipe,
    interleaved_1f1b,
    interleaved_group_size,
    makespan,
    max_in_flight,
    max_pending_weight_grads,
    one_f_one_b,
    schedule_route,
    split_backward_keys,
    splits_backward,
    validate_schedule,
    zb_h1,
)
from simtrain.spec.errors import ConfigError

CASES = [(1, 1), (1, 4), (2, 2), (2, 5), (4, 1), (4, 3), (4, 8), (8, 16), (3, 7)]
INTERLEAVED = [(2, 2, 2), (2, 4, 3), (4, 4, 2), (4, 8, 2), (4, 12, 3), (8, 16, 2), (3, 6, 4)]


def _check_complete(sched, p: int, m: int, v: int) -> None:
    assert len(sched) == p
    for acts in sched:
        counts = Counter(acts)
        expected = {(k, i, c) for k in "FB" for i in range(m) for c in range(v)}
        assert {(a.kind, a.microbatch, a.chunk) for a in acts} == expected
        assert all(n == 1 for n in counts.values())
        pos = {(a.kind, a.microbatch, a.chunk): i for i, a in enumerate(acts)}
        for i in range(m):
            for c in range(v):
                assert pos[("F", i, c)] < pos[("B", i, c)]


@pytest.mark.parametrize("p,m", CASES)
def test_gpipe_complete(p: int, m: int) -> None:
    sched = gpipe(p, m)
    _check_complete(sched, p, m, 1)
    assert all(max_in_flight(acts) == m for acts in sched)


@pytest.mark.parametrize("p,m", CASES)
def test_1f1b_complete_and_in_flight(p: int, m: int) -> None:
    sched = one_f_one_b(p, m)
    _check_complete(sched, p, m, 1)
    for s, acts in enumerate(sched):
        assert max_in_flight(acts) == min(p - s, m)
        # backward of each stage runs micro-batches in order
        assert [a.microbatch for a in acts if a.kind == "B"] == list(range(m))


@pytest.mark.parametrize("p,m,v", INTERLEAVED)
def test_interleaved_complete(p: int, m: int, v: int) -> None:
    sched = interleaved_1f1b(p, m, v)
    _check_complete(sched, p, m, v)
    for s, acts in enumerate(sched):
        # Megatron warm-up: (p - s - 1) * 2 + (v - 1) * p virtual micro-batches, then one more F
        assert max_in_flight(acts) == min((p - s - 1) * 2 + (v - 1) * p + 1, m * v)
        # forwards of a micro-batch go through the chunks in order, backwards in reverse
        for i in range(m):
            fch = [a.chunk for a in acts if a.kind == "F" and a.microbatch == i]
            bch = [a.chunk for a in acts if a.kind == "B" and a.microbatch == i]
            assert fch == list(range(v))
            assert bch == list(reversed(range(v)))


@pytest.mark.parametrize("p,m,v", [(4, 2, 2), (8, 5, 3)])
def test_interleaved_needs_at_least_p_microbatches(p: int, m: int, v: int) -> None:
    with pytest.raises(ValueError, match="at least p"):
        interleaved_1f1b(p, m, v)


def test_interleaved_batch_rule_is_validated() -> None:
    tiny = dict(name="t", n_layers=8, hidden=256, n_heads=4, ffn_hidden=1024, activation="gelu",
                norm="layernorm", position="rope", vocab=1024, tied_embeddings=False, linear_bias=False)
    cfg = dict(model=tiny, layout=dict(pp=4, dp=2, vpp=2), train=dict(seq_len=512, global_batch_seqs=6))
    with pytest.raises(ConfigError) as exc:  # 3 micro-batches < pp
        load_config(cfg)
    assert any(p.path == "train.global_batch_seqs" and "at least" in p.message for p in exc.value.problems)
    cfg["train"]["global_batch_seqs"] = 12  # 6 micro-batches: not a multiple of pp, valid (Megatron-core)
    assert load_config(cfg).layout.vpp == 2
    cfg["layout"] = dict(pp=4, dp=2, schedule="dualpipe")
    with pytest.raises(ConfigError, match="DualPipe"):  # 6 < 2 x pp
        load_config(cfg)
    cfg["train"]["global_batch_seqs"] = 16
    assert load_config(cfg).layout.resolved_schedule == "dualpipe"


def test_build_schedule_dispatch() -> None:
    assert build_schedule("gpipe", 2, 3) == gpipe(2, 3)
    assert build_schedule("1f1b", 2, 3) == one_f_one_b(2, 3)
    assert build_schedule("interleaved_1f1b", 2, 4, 2) == interleaved_1f1b(2, 4, 2)
    with pytest.raises(ValueError):
        build_schedule("zb-h1", 2, 3)


def test_1f1b_holds_fewer_than_gpipe() -> None:
    p, m = 4, 16
    assert max(max_in_flight(a) for a in one_f_one_b(p, m)) == p
    assert max(max_in_flight(a) for a in gpipe(p, m)) == m


# -- Action representation ------------------------------------------------------------------------
def test_action_stays_backward_compatible() -> None:
    a = Action("F", 3, 1)
    assert (a.kind, a.microbatch, a.chunk, a.overlap_with_next) == ("F", 3, 1, False)
    assert a == Action("F", 3, 1, False) and hash(a) == hash(Action("F", 3, 1, False))
    assert not splits_backward(one_f_one_b(4, 8)) and not splits_backward(interleaved_1f1b(2, 4, 2))
    assert all(not a.overlap_with_next for acts in interleaved_1f1b(4, 8, 2) for a in acts)


# -- property checks: every schedule is complete, ordered and deadlock-free ----------------------
def _all_schedules() -> list[tuple[str, int, int, int]]:
    out = [(k, p, m, 1) for k in ("gpipe", "1f1b", "zb_h1") for p, m in CASES]
    out += [("interleaved_1f1b", p, m, v) for p in (1, 2, 3, 4, 8) for m in range(p, 3 * p + 2) for v in (2, 3)]
    out += [("dualpipe", p, m, 2) for p in (2, 4, 6, 8) for m in range(2 * p, 4 * p + 1, 2)]
    out += [("dualpipev", p, m, 2) for p in (1, 2, 3, 4, 8) for m in range(2 * p, 3 * p + 2)]
    return out


@pytest.mark.parametrize("kind,p,m,v", _all_schedules())
def test_every_schedule_is_valid_and_runs(kind: str, p: int, m: int, v: int) -> None:
    sched = build_schedule(kind, p, m, v)
    route = schedule_route(kind, p, m, v)
    validate_schedule(sched, route)  # one F, one B (and at most one W) per visit, in order F < B < W
    timing = makespan(sched, ActionCosts(1.0, 1.0, 0.5, 2.0), route)  # raises on a deadlock
    for s, acts in enumerate(sched):
        pos = {(a.kind, a.microbatch, a.chunk): n for n, a in enumerate(acts)}
        for a in acts:
            if a.kind == "B":
                assert pos[("F", a.microbatch, a.chunk)] < pos[("B", a.microbatch, a.chunk)]
        # each action starts after the previous one on its stage ends
        starts, ends = timing.start_s[s], timing.end_s[s]
        assert all(starts[n + 1] >= ends[n] - 1e-12 or acts[n].overlap_with_next for n in range(len(acts) - 1))
    # work is conserved: nobody is busy longer than the step, and every micro-batch is done
    assert all(0 <= b <= timing.makespan_s for b in timing.busy_s)
    assert {a.microbatch for acts in sched for a in acts} == set(range(m))


def test_every_name_dispatches() -> None:
    for kind in SCHEDULES:
        p, m, v = (4, 8, 2) if kind in ("interleaved_1f1b", "dualpipe", "dualpipev") else (4, 8, 1)
        validate_schedule(build_schedule(kind, p, m, v), schedule_route(kind, p, m, v))
    assert build_schedule("zb_h1", 3, 5) == zb_h1(3, 5)
    assert build_schedule("dualpipe", 4, 8) == dualpipe(4, 8)
    assert build_schedule("dualpipev", 2, 4) == dualpipev(2, 4)
    with pytest.raises(ValueError, match="known"):
        schedule_route("zb-h1", 2, 2)


# -- the evaluator's closed forms -------------------------------------------------------------------
@pytest.mark.parametrize("p,m", CASES)
def test_1f1b_and_gpipe_bubble_closed_form(p: int, m: int) -> None:
    cost = ActionCosts(1.0, 1.5, 0.5)
    full = cost.f_s + cost.b_s + cost.w_s
    for sched in (one_f_one_b(p, m), gpipe(p, m)):
        t = makespan(sched, cost)
        assert t.makespan_s == pytest.approx((m + p - 1) * full)
        assert t.bubble_s == pytest.approx([(p - 1) * full] * p)


def test_gpipe_with_p2p_latency() -> None:
    p, m, d = 4, 6, 0.25
    t = makespan(gpipe(p, m), ActionCosts(1.0, 1.0, 1.0, p2p_s=d))
    assert t.makespan_s == pytest.approx(m * 3.0 + (p - 1) * (1.0 + d) + (p - 1) * (2.0 + d))


@pytest.mark.parametrize("p,m,v", INTERLEAVED)
def test_interleaved_bubble_is_one_vth(p: int, m: int, v: int) -> None:
    # costs are per chunk: a stage's F and full B are v chunks' worth (F_stage = v, B_stage = 2v), so
    # Narayanan et al.'s (p - 1)(F_stage + B_stage) / v is (p - 1) * 3 here
    t = makespan(interleaved_1f1b(p, m, v), ActionCosts(1.0, 1.0, 1.0))
    assert t.max_bubble_s == pytest.approx((p - 1) * (v + 2 * v) / v)
    assert t.makespan_s == pytest.approx(m * v * 3.0 + (p - 1) * 3.0)


def test_uneven_stage_costs() -> None:
    # Llama 3 405B style: lighter first and last stage; the heaviest stage paces the steady state
    p, m = 4, 16

    def cost(stage: int, chunk: int) -> ActionCosts:
        return ActionCosts(0.5, 0.5, 0.5) if stage in (0, p - 1) else ActionCosts(1.0, 1.0, 1.0)

    t = makespan(one_f_one_b(p, m), cost)
    assert t.busy_s == pytest.approx([m * 1.5, m * 3.0, m * 3.0, m * 1.5])
    assert t.makespan_s >= m * 3.0
    assert t.makespan_s < makespan(one_f_one_b(p, m)).makespan_s


# -- ZB-H1 -----------------------------------------------------------------------------------------
@pytest.mark.parametrize("p,m", [(2, 2), (2, 5), (3, 7), (4, 4), (4, 8), (8, 16), (8, 9), (16, 32)])
def test_zb_h1_bubble_is_a_third_of_1f1b(p: int, m: int) -> None:
    # Qi et al. 2023's setting F = B = W: 1F1B idles (p-1)(F+B+W), ZB-H1 (p-1)(F+B-W) = one third
    unit = ActionCosts(1.0, 1.0, 1.0)
    zb, ref = makespan(zb_h1(p, m), unit), makespan(one_f_one_b(p, m), unit)
    assert ref.max_bubble_s == pytest.approx((p - 1) * 3.0)
    assert zb.bubble_s == pytest.approx([(p - 1) * 1.0] * p)
    assert zb.max_bubble_s == pytest.approx(ref.max_bubble_s / 3)


@pytest.mark.parametrize("f,b,w", [(1.0, 1.0, 0.5), (1.0, 2.0, 1.0), (2.0, 1.0, 1.0), (1.0, 4 / 3, 2 / 3)])
def test_zb_h1_bubble_closed_form(f: float, b: float, w: float) -> None:
    # (p-1)(F + B - W) with B the input-gradient part; DeepSeek-V3 Table 2: (PP-1)(F + B_full - 2W)
    for p, m in [(4, 8), (8, 24)]:
        t = makespan(zb_h1(p, m), ActionCosts(f, b, w))
        assert t.max_bubble_s == pytest.approx((p - 1) * (f + b - w))
        assert t.max_bubble_s == pytest.approx((p - 1) * (f + (b + w) - 2 * w))


@pytest.mark.parametrize("p,m", [(2, 4), (4, 4), (4, 8), (8, 16), (3, 7)])
def test_zb_h1_keeps_1f1b_memory(p: int, m: int) -> None:
    sched = zb_h1(p, m)
    assert splits_backward(sched)
    for s, acts in enumerate(sched):
        assert split_backward_keys(acts) == {(i, 0) for i in range(m)}
        assert max_in_flight(acts) == max_in_flight(one_f_one_b(p, m)[s]) == min(p - s, m)
        assert [a.microbatch for a in acts if a.kind == "W"] == list(range(m))
    # memory rule: F +1, input-grad B -(1 - r), W -r; peak over stages = 1F1B's p * M_B (Qi et al.)
    for r in (0.0, 0.3, 1.0):
        assert max(_activation_peak(acts, r) for acts in sched) == pytest.approx(min(p, m))


def _activation_peak(acts: list[Action], kept_for_w: float) -> float:
    split = split_backward_keys(acts)
    live = peak = 0.0
    for a in acts:
        if a.kind == "F":
            live += 1.0
        elif a.kind == "B":
            live -= 1.0 - kept_for_w if (a.microbatch, a.chunk) in split else 1.0
        else:
            live -= kept_for_w
        peak = max(peak, live)
    return peak


# -- DualPipe --------------------------------------------------------------------------------------
@pytest.mark.parametrize("p,m", [(2, 4), (4, 8), (4, 12), (6, 12), (8, 16), (8, 20), (16, 32), (16, 64)])
def test_dualpipe_bubble_matches_deepseek_v3(p: int, m: int) -> None:
    # DeepSeek-V3 Table 2: (PP/2 - 1)(F&B + B - 3W), B the full backward, F&B an overlapped pair;
    # op costs with F equal to the input-gradient backward and W <= F
    sched, route = dualpipe(p, m), schedule_route("dualpipe", p, m)
    for f, w, fb in [(1.0, 1.0, 3.0), (1.0, 1.0, 2.0), (2.0, 1.0, 4.0), (1.0, 0.5, 2.2), (1.5, 0.25, 3.0)]:
        t = makespan(sched, ActionCosts(f, f, w, fb), route)
        assert t.max_bubble_s == pytest.approx((p / 2 - 1) * (fb + (f + w) - 3 * w))


@pytest.mark.parametrize("p,m", [(2, 4), (4, 8), (6, 14), (8, 16), (16, 32)])
def test_dualpipe_memory_matches_deepseek_v3(p: int, m: int) -> None:
    sched, route = dualpipe(p, m), schedule_route("dualpipe", p, m)
    for s, acts in enumerate(sched):
        # Table 2 activation column: PP + 1 micro-batch chunks in flight, on every rank
        assert max_in_flight(acts) == p + 1
        # Table 2 parameter column: two chunks per rank, model stages s and p-1-s (2x of 1F1B's one)
        held = {route.position(a.microbatch, s, a.chunk) for a in acts}
        assert held == {s, p - 1 - s}
    assert route.length == p


def test_dualpipe_feeds_both_ends_and_overlaps_pairs() -> None:
    p, m = 8, 20
    sched, route = dualpipe(p, m), schedule_route("dualpipe", p, m)
    assert route.path(0) == [(s, 0) for s in range(p)]
    assert route.path(m - 1) == [(s, 1) for s in reversed(range(p))]
    assert {a.microbatch for a in sched[0] if a.kind == "F" and a.chunk == 0} == set(range(m // 2))
    assert {a.microbatch for a in sched[p - 1] if a.kind == "F" and a.chunk == 1} == set(range(m // 2, m))
    for acts in sched:
        pairs = [(a, acts[n + 1]) for n, a in enumerate(acts) if a.overlap_with_next]
        assert pairs and all(f.kind == "F" and b.kind == "B" and f.microbatch != b.microbatch for f, b in pairs)
        assert splits_backward([acts]) and 0 < len(split_backward_keys(acts)) < m
    # mirrored ranks run mirrored programs
    flip = {0: 1, 1: 0}
    for s in range(p):
        mirrored = [(a.kind, (a.microbatch + m // 2) % m, flip[a.chunk]) for a in sched[p - 1 - s]]
        assert mirrored == [(a.kind, a.microbatch, a.chunk) for a in sched[s]]
    # overlapping the pairs pays: the step is shorter than running them back to back
    base = makespan(sched, ActionCosts(1.0, 1.0, 1.0), route).makespan_s
    assert makespan(sched, ActionCosts(1.0, 1.0, 1.0, 2.0), route).makespan_s < base


@pytest.mark.parametrize("p,m,match", [(3, 12, "even number of pipeline"), (4, 7, "even micro-batch"),
                                       (4, 6, "at least 2p=8")])
def test_dualpipe_requirements(p: int, m: int, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        dualpipe(p, m)


def test_dualpipev_is_a_v() -> None:
    p, m = 4, 10
    sched, route = dualpipev(p, m), schedule_route("dualpipev", p, m)
    assert route.path(3) == [(0, 0), (1, 0), (2, 0), (3, 0), (3, 1), (2, 1), (1, 1), (0, 1)]
    for s, acts in enumerate(sched):
        assert max_in_flight(acts) == 2 * p + 1
        assert {route.position(a.microbatch, s, a.chunk) for a in acts} == {s, 2 * p - 1 - s}
    # DualPipe on 2p ranks, cut in half: the same bubble in chunk units, (p - 1)(F&B + B - 3W)
    for fb in (2.0, 3.0):
        t = makespan(sched, ActionCosts(1.0, 1.0, 1.0, fb), route)
        assert t.max_bubble_s == pytest.approx((p - 1) * (fb + 2.0 - 3.0))
    with pytest.raises(ValueError, match="at least 2p"):
        dualpipev(4, 7)


# -- interleaved 1F1B with m % p != 0 -----------------------------------------------------------
@pytest.mark.parametrize("p,m,v", [(4, 6, 2), (4, 10, 2), (4, 7, 3), (8, 12, 3), (8, 9, 2), (3, 4, 2), (16, 40, 4)])
def test_interleaved_any_microbatch_count(p: int, m: int, v: int) -> None:
    sched = interleaved_1f1b(p, m, v)
    _check_complete(sched, p, m, v)
    group = interleaved_group_size(p, m)
    assert p <= group <= m and (m % group == 0 or m % group >= p)
    for s, acts in enumerate(sched):
        assert max_in_flight(acts) == min((p - s - 1) * 2 + (v - 1) * group + 1, m * v)
    t = makespan(sched)  # deadlock-free, and the bubble is still (p - 1)(F + B) per chunk
    assert t.max_bubble_s == pytest.approx((p - 1) * 3.0)


def test_interleaved_group_size_rules() -> None:
    assert interleaved_group_size(4, 8) == 4 and interleaved_group_size(4, 6) == 6
    assert interleaved_group_size(4, 10) == 5 and interleaved_group_size(4, 11) == 6
    assert interleaved_1f1b(4, 8, 2, group_size=8) != interleaved_1f1b(4, 8, 2)
    _check_complete(interleaved_1f1b(4, 8, 2, group_size=8), 4, 8, 2)
    with pytest.raises(ValueError, match="last micro-batch group"):
        interleaved_1f1b(4, 10, 2, group_size=4)
    with pytest.raises(ValueError, match="must lie in"):
        interleaved_1f1b(4, 10, 2, group_size=3)


# -- validation and deadlocks ---------------------------------------------------------------------
def test_deadlock_is_reported() -> None:
    # stage 1 wants micro-batch 1 first, stage 0 waits on micro-batch 0's backward before sending it
    sched = [[Action("F", 0, 0), Action("B", 0, 0), Action("F", 1, 0), Action("B", 1, 0)],
             [Action("F", 1, 0), Action("F", 0, 0), Action("B", 0, 0), Action("B", 1, 0)]]
    validate_schedule(sched)
    with pytest.raises(ScheduleError, match="deadlock.*stage 0 waits at B\\(mb=0"):
        makespan(sched)


@pytest.mark.parametrize("edit,match", [
    (lambda a: a[:-1], "B passes missing"),
    (lambda a: [a[2], *a[:2], a[3]], "runs before its F"),
    (lambda a: [Action("W", 0, 0), *a], "runs before its B"),
    (lambda a: [*a[:-1], Action("W", 1, 0)], "has no B"),
    (lambda a: [*a, a[0]], "appears twice"),
    (lambda a: [Action("F", 0, 0, True), *a[1:]], "overlap_with_next"),
    (lambda a: [*a[:-1], Action("X", 1, 0)], "unknown kind"),
])
def test_validation_messages(edit, match: str) -> None:  # type: ignore[no-untyped-def]
    sched = one_f_one_b(2, 2)
    sched[0] = edit(sched[0])
    with pytest.raises(ScheduleError, match=match):
        validate_schedule(sched)


def test_wrong_route_is_caught() -> None:
    with pytest.raises(ScheduleError, match="route"):
        makespan(dualpipe(4, 8))  # the default chunk-major route does not fit DualPipe
    assert Route("interleaved", 4, 2).at(0, 5) == (1, 1)


def test_pending_weight_grads() -> None:
    assert [max_pending_weight_grads(a) for a in zb_h1(4, 8)] == [1, 2, 3, 4]
    assert all(max_pending_weight_grads(a) == 0 for a in one_f_one_b(4, 8))

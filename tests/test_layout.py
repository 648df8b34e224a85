"""RankGrid: coordinates, process groups and stage groups."""

from __future__ import annotations

import itertools

import pytest

from simtrain.plan.layout import GRID_AXES, RankGrid
from simtrain.spec.config import LayoutConfig

LAYOUTS = [
    dict(dp=2, tp=2, pp=2),
    dict(dp=4, tp=2, pp=1),
    dict(dp=2, tp=1, pp=4),
    dict(dp=3, tp=2, pp=2, cp=2),
    dict(dp=8, tp=1, pp=1),
    dict(dp=2, tp=4, pp=2, order=("dp", "tp", "cp", "ep", "pp")),
    dict(dp=2, tp=2, pp=3, order=("pp", "dp", "cp", "ep", "tp")),
    dict(dp=4, tp=2, pp=2, cp=2, order=("cp", "tp", "ep", "dp", "pp")),
]


def _grid(**kw) -> RankGrid:
    return RankGrid(LayoutConfig(**kw))


def _assert_partition(groups, world: int, size: int) -> None:
    flat = [r for g in groups for r in g]
    assert sorted(flat) == list(range(world))
    assert all(len(g) == size for g in groups)


@pytest.mark.parametrize("kw", LAYOUTS)
def test_groups_partition_ranks(kw) -> None:
    g = _grid(**kw)
    world = g.world_size
    for axis in GRID_AXES:
        groups = g.groups(axis)
        _assert_partition(groups, world, g.degree(axis))
        assert len(groups) == world // g.degree(axis)
        for r in range(world):
            grp = g.group(axis, r)
            assert r in grp
            # members agree on every other coordinate and cover the axis
            cs = [g.coords(x) for x in grp]
            assert sorted(c[axis] for c in cs) == list(range(g.degree(axis)))
            for other in GRID_AXES:
                if other != axis:
                    assert len({c[other] for c in cs}) == 1


@pytest.mark.parametrize("kw", LAYOUTS)
def test_coords_round_trip(kw) -> None:
    g = _grid(**kw)
    seen = set()
    for r in range(g.world_size):
        c = g.coords(r)
        assert g.rank_of(**c) == r
        assert g.stage_of(r) == c["pp"]
        seen.add(tuple(c[a] for a in GRID_AXES))
    assert len(seen) == g.world_size


def test_tp_innermost_is_consecutive() -> None:
    g = _grid(dp=2, tp=4, pp=2)
    assert g.groups("tp") == [(0, 1, 2, 3), (4, 5, 6, 7), (8, 9, 10, 11), (12, 13, 14, 15)]
    assert g.group("dp", 0) == (0, 4)
    assert g.group("pp", 1) == (1, 9)
    assert g.stage_ranks(1) == list(range(8, 16))


def test_custom_order() -> None:
    g = _grid(dp=4, tp=2, pp=2, order=("dp", "tp", "cp", "ep", "pp"))
    assert g.group("dp", 0) == (0, 1, 2, 3)
    assert g.group("tp", 0) == (0, 4)
    assert g.stride("pp") == 8
    g2 = _grid(dp=2, tp=2, pp=2, order=("pp", "tp", "cp", "ep", "dp"))
    assert g2.group("pp", 0) == (0, 1)
    assert g2.group("dp", 0) == (0, 4)
    assert g2.stage_ranks(1) == [1, 3, 5, 7]


@pytest.mark.parametrize("kw", LAYOUTS)
@pytest.mark.parametrize("axis", ["tp", "cp", "dp"])
def test_stage_groups_are_groups_of_the_stage(kw, axis) -> None:
    g = _grid(**kw)
    for stage in range(g.layout.pp):
        ranks = set(g.stage_ranks(stage))
        expect = sorted(tuple(sorted(x)) for x in g.groups(axis) if set(x) <= ranks)
        got = g.stage_groups(axis, stage)
        assert sorted(tuple(sorted(x)) for x in got) == expect
        assert sorted(r for x in got for r in x) == sorted(ranks)
        # same member order as group()
        for x in got:
            assert tuple(x) == g.group(axis, x[0])


@pytest.mark.parametrize("dp,shard", [(4, 2), (8, 2), (8, 4), (6, 3), (4, 4), (4, 1)])
@pytest.mark.parametrize("tp,pp", [(1, 1), (2, 2)])
def test_hybrid_shard_groups_partition_dp_groups(dp, shard, tp, pp) -> None:
    g = _grid(dp=dp, tp=tp, pp=pp, fsdp="hybrid", fsdp_shard_size=shard)
    world = g.world_size
    _assert_partition(g.groups("dp_shard"), world, shard)
    _assert_partition(g.groups("dp_replicate"), world, dp // shard)
    for r in range(world):
        dpg = set(g.group("dp", r))
        sh, rep = g.group("dp_shard", r), g.group("dp_replicate", r)
        assert r in sh and r in rep
        assert set(sh) <= dpg and set(rep) <= dpg
        assert set(sh) & set(rep) == {r}
    # every shard group meets every replicate group of the same dp group in exactly one rank
    for dpg in g.groups("dp"):
        shards = {g.group("dp_shard", r) for r in dpg}
        reps = {g.group("dp_replicate", r) for r in dpg}
        for a, b in itertools.product(shards, reps):
            assert len(set(a) & set(b)) == 1
    for stage in range(pp):
        ranks = set(g.stage_ranks(stage))
        for axis in ("dp_shard", "dp_replicate"):
            got = g.stage_groups(axis, stage)
            assert sorted(r for x in got for r in x) == sorted(ranks)


@pytest.mark.parametrize("kw", [dict(dp=4, tp=2, pp=1, ep=2), dict(dp=4, tp=2, pp=2, ep=8, etp=1),
                                dict(dp=2, tp=4, cp=2, pp=2, ep=2, etp=2), dict(dp=8, tp=1, pp=2, ep=4)])
def test_expert_groups_partition_each_stage(kw: dict) -> None:
    """etp x ep x edp tile every stage's ranks (Megatron's expert mesh); each rank in one group per axis."""
    g = _grid(**kw)
    etp, ep = g.etp, kw["ep"]
    edp = g.world_size // kw.get("pp", 1) // (etp * ep)
    for axis, size in (("etp", etp), ("ep", ep), ("edp", edp)):
        _assert_partition(g.groups(axis), g.world_size, size)
    for r in range(g.world_size):
        e, x, d = set(g.group("etp", r)), set(g.group("ep", r)), set(g.group("edp", r))
        assert e & x == {r} and x & d == {r} and e & d == {r}
        assert {g.stage_of(q) for q in e | x | d} == {g.stage_of(r)}


def test_ep_groups_fold_over_dp_cp_with_full_etp() -> None:
    g = _grid(dp=4, tp=2, pp=1, ep=2)  # etp defaults to tp: EP groups are ep members of the dp plane
    for r in range(g.world_size):
        assert set(g.group("ep", r)) <= set(g.group("dp", r))
        assert g.group("etp", r) == g.group("tp", r)


def test_representative_is_stage_origin() -> None:
    g = _grid(dp=2, tp=2, pp=4)
    for s in range(4):
        rep = g.representative(s)
        assert g.stage_of(rep) == s
        assert g.coords(rep) == {"tp": 0, "cp": 0, "dp": 0, "pp": s}


def test_table_matches_coords() -> None:
    g = _grid(dp=3, tp=2, pp=2, cp=2)
    t = g.table()
    outer = list(reversed(g.order))
    for r in range(g.world_size):
        c = g.coords(r)
        assert t[tuple(c[a] for a in outer)] == r

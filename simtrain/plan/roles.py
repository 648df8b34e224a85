"""Rank roles for symmetric mode when groups do not tile the nodes (NVLink domains).

Symmetric mode simulates one representative rank per pipeline stage "and per distinct role"
(DESIGN.md). When every group of an axis has the same member count on each of its nodes, all ranks
of a stage are interchangeable and there is one role per stage. When they are not (e.g. 16-GPU
TP x CP blocks on 72-GPU NVL72 domains: 72 / 16 = 4.5, so every other block's CP groups span two
domains, and the DP groups hold 5 members on one domain and 4 on the next), ranks whose groups are
placed differently are different roles. A role is the tuple, over a rank's communication axes, of
its group's placement signature (which nodes the members sit on, relabelled in order of first
appearance, so translates of one placement compare equal). Ranks of one role are simulated by one
representative; the engine runs each role on its own (``simulate``) and the slowest role sets the
step, as the ranks meet at the data- and pipeline-parallel synchronisations every step.
"""

from __future__ import annotations

from collections.abc import Iterable

from simtrain.hardware.fabric.protocol import Fabric
from simtrain.plan.layout import RankGrid, place

#: Most roles simulated one by one; beyond it ``simulate`` falls back (small worlds) or refuses.
MAX_ROLES = 16


def placement(topo: Fabric, group: tuple[int, ...]) -> tuple[int, ...]:
    """The nodes of ``group``'s members in group order, relabelled 0, 1, ... by first appearance."""
    labels: dict[int, int] = {}
    return tuple(labels.setdefault(topo.node_of(place(r)), len(labels)) for r in group)


def tiles(topo: Fabric, group: tuple[int, ...]) -> bool:
    """Whether ``group`` has the same member count on each of its nodes (its ring/tree is regular)."""
    counts: dict[int, int] = {}
    for r in group:
        n = topo.node_of(place(r))
        counts[n] = counts.get(n, 0) + 1
    return len(set(counts.values())) == 1


def roles(grid: RankGrid, topo: Fabric, axes: Iterable[str]) -> list[list[int]]:
    """The ranks' roles, each as its representative per pipeline stage (stage 0's lowest rank of the
    role and that rank's counterparts on the other stages), in order of stage 0's representative.

    A role is stage 0's rank's signature together with its counterparts' on every stage (the engine
    pipes each representative to its counterpart, so one role spans the stages). ``axes``: the group
    axes the programs communicate over (``Op.axis`` values other than pp).
    """
    axes = sorted(set(axes) - {"pp", ""})
    stride, pp = grid.stride("pp"), grid.layout.pp
    seen: dict[tuple[object, ...], int] = {}
    placed: dict[int, tuple[int, ...]] = {}  # by id(group): RankGrid.group shares one tuple per group

    def place_of(group: tuple[int, ...]) -> tuple[int, ...]:
        hit = placed.get(id(group))
        if hit is None:
            hit = placed[id(group)] = placement(topo, group)
        return hit

    for r0 in grid.stage_ranks(0):
        sig = tuple(place_of(grid.group(a, r0 + s * stride)) for s in range(pp) for a in axes)
        seen.setdefault(sig, r0)
        if len(seen) > MAX_ROLES:
            break
    return [[r0 + s * stride for s in range(pp)] for r0 in seen.values()]

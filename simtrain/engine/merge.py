"""Full mode by classes of ranks that behave alike: one simulated representative per class (issue 28 part 5).

A what-if perturbs a few ranks (a slow GPU, a hot expert); the others fall into classes whose members run
the same program at the same speed and meet, in every collective group and pipeline pair, ranks of the
same classes. Such members' timelines are identical, so the engine simulates one representative per class
(:class:`Classes`, by colour refinement over the group and pipeline structure) and lets a collective's
rendezvous count each class once (:meth:`Classes.rendezvous`).

The network is not merged: when a class's collective (or send) runs, the flows of every group (member) it
stands for go on the network, exactly the flows full mode would start at that instant. That makes the
merged run exact by induction over the events, provided each group's transfer ends when the
representative's does; the engine checks that at every transfer (:func:`alike` for the planned entries,
:data:`END_REL_TOL` for the ends, which only float rounding in the fluid model's sums may separate) and
raises :class:`NotAlike` where it fails (e.g. a slow link that only some groups cross), and the caller then
simulates every rank and says so. The fabric itself therefore needs no symmetry proof.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, cast

import simpy

from simtrain.engine.network import FlowNetwork
from simtrain.engine.records import EngineResult
from simtrain.lower.ops import CollectiveOp, Program, SendOp
from simtrain.plan.layout import RankGrid

#: (latency s, phases of flows, link class, private duration s or None): a planned transfer (``Engine._comm``).
CommEntry = tuple[float, list[list[tuple[Any, ...]]], str, float | None]

#: Two groups' transfers of one class that end within this fraction of the time apart count as one end:
#: the fluid model's rate sums add the same flows in another order for another group (float rounding).
END_REL_TOL = 1e-12


class NotAlike(Exception):
    """Members of a class turned out to differ (their transfers planned or ended differently)."""


@dataclass(slots=True)
class Classes:
    """A partition of the ranks into classes that behave alike, and the collective groups they form."""

    grid: RankGrid
    color: list[int]
    """Class index of every rank."""
    members: dict[int, list[int]]
    """Representative (lowest rank) -> every rank of its class, ascending."""
    rep_of: list[int]
    """Rank -> the representative of its class."""
    _gclass: dict[tuple[str, int], tuple[Any, int]] = field(default_factory=dict)
    _groups: dict[Any, list[tuple[int, ...]]] = field(default_factory=dict)

    @property
    def reps(self) -> list[int]:
        """The representatives, ascending."""
        return sorted(self.members)

    def expand(self, res: EngineResult) -> EngineResult:
        """``res`` of the representatives as every rank's: each member's stats and ledger are (the same
        objects as) its representative's."""
        ranks = list(range(len(self.rep_of)))
        return EngineResult(res.step_time_s, ranks, {r: res.stats[self.rep_of[r]] for r in ranks},
                            {r: res.ledgers[self.rep_of[r]] for r in ranks}, res.trace, res.ops_executed,
                            res.plans, res.notes)

    def rendezvous(self, axis: str, rank: int) -> tuple[Any, int]:
        """(key, arrivals) of ``rank``'s group on ``axis`` at a collective: groups whose members come
        from the same classes (a multiset of class indices) start together, once each class present has
        arrived (its representative stands for every member)."""
        hit = self._gclass.get((axis, rank))
        if hit is None:
            colors = tuple(sorted(self.color[m] for m in self.grid.group(axis, rank)))
            hit = self._gclass[(axis, rank)] = ((axis, colors), len(set(colors)))
        return hit

    def groups(self, key: Any, stage_ranks: Sequence[int]) -> list[tuple[int, ...]]:
        """Every group of rendezvous ``key`` (``rendezvous``) among the groups of ``stage_ranks``."""
        out = self._groups.get(key)
        if out is None:
            axis = key[0]
            seen: dict[tuple[int, ...], None] = {}
            for r in stage_ranks:
                g = self.grid.group(axis, r)
                if g not in seen and self.rendezvous(axis, r)[0] == key:
                    seen[g] = None
            out = self._groups[key] = list(seen)
        return out


def rank_classes(grid: RankGrid, programs: Sequence[Program], speed: dict[int, float],
                 load_factor: dict[int, float]) -> Classes:
    """The coarsest partition of the ranks in which members share their stage, compute speed and expert
    load, and, on every axis their stage's collectives use, groups made of the same classes (as a
    multiset), and pipeline peers of the same classes (colour refinement, to a fixed point)."""
    world, stride = grid.world_size, grid.stride("pp")
    axes = [sorted({op.axis for op in p.ops if isinstance(op, CollectiveOp) and op.axis}) for p in programs]
    peer_stages = [sorted({op.peer_stage for op in p.ops if isinstance(op, SendOp)}
                          | {op.remote[0] for op in p.ops if op.remote is not None}) for p in programs]
    stage = [grid.stage_of(r) for r in range(world)]
    groups = [[grid.group(a, r) for a in axes[stage[r]]] for r in range(world)]
    peers = [[r + (p - stage[r]) * stride for p in peer_stages[stage[r]]] for r in range(world)]
    color = _ids([(stage[r], speed.get(r, 1.0), load_factor.get(r, 1.0)) for r in range(world)])
    n = len(set(color))
    while True:
        multisets: dict[tuple[int, ...], tuple[int, ...]] = {}  # per group (members share one): its classes
        for gs in groups:
            for g in gs:
                if g not in multisets:
                    multisets[g] = tuple(sorted(color[m] for m in g))
        new = _ids([(color[r], tuple(multisets[g] for g in groups[r]), tuple(color[p] for p in peers[r]))
                    for r in range(world)])
        if len(set(new)) == n:  # no class split: a fixed point (each round refines the last)
            break
        color, n = new, len(set(new))
    members: dict[int, list[int]] = {}
    first: dict[int, int] = {}
    for r in range(world):
        rep = first.setdefault(color[r], r)
        members.setdefault(rep, []).append(r)
    return Classes(grid, color, members, [first[c] for c in color])


def _ids(signatures: list[Any]) -> list[int]:
    """Each signature's index in order of first appearance (equal signatures, one index)."""
    index: dict[Any, int] = {}
    return [index.setdefault(s, len(index)) for s in signatures]


def alike(entries: Sequence[tuple[float, list[list[tuple[Any, ...]]], str, float | None]]) -> None:
    """Check that the planned transfers of one class's groups or members (latency s, phases of flows,
    link class, private duration s or None) take the same course: the same latency, link class, phase
    count and private duration, and, per phase, flows in all or none of them.

    Raises:
        NotAlike: they differ.
    """
    lat, phases, cls, private = entries[0]
    for e in entries[1:]:
        if e[0] != lat or e[2] != cls or e[3] != private or len(e[1]) != len(phases):
            raise NotAlike(f"transfers planned differently ({e[0]}, {e[2]}, {e[3]} vs {lat}, {cls}, {private})")
        if any(bool(a) != bool(b) for a, b in zip(e[1], phases, strict=True)):
            raise NotAlike("transfers with different phases")


def transfer_all(env: simpy.Environment, net: FlowNetwork, phases: Sequence[list[tuple[Any, ...]]]):  # type: ignore[no-untyped-def]
    """Run one phase of each of a class's groups (or members) on the network ``net`` (a FlowNetwork):
    every group's flows start now, as in full mode, and the phase is over when all have ended.

    Raises:
        NotAlike: the groups' transfers ended at different times (beyond ``END_REL_TOL``).
    """
    ends: list[float] = []
    events = net.transfer_many(list(phases))
    for ev in events:
        ev.callbacks.append(lambda _: ends.append(env.now))
    for ev in events:
        if not ev.processed:
            yield ev
    if ends[-1] - ends[0] > END_REL_TOL * ends[-1]:
        raise NotAlike(f"transfers of one class ended {ends[-1] - ends[0]:.3g} s apart")


class ClassComm:
    """The engine's communication for a class's representative (``Engine``, full mode by classes): the
    planned transfers a class's send or collective carries, and running them together."""

    classes: Classes | None
    stage: dict[int, int]
    grid: RankGrid
    env: simpy.Environment
    net: FlowNetwork
    active_comm: dict[int, list[str]]
    _comm: dict[int, list[CommEntry | None]]
    _class_entries: dict[Any, list[CommEntry]]
    """Per class send or group-class collective: the planned transfers of the flows it carries."""

    def _comm_changed(self, rank: int) -> None:
        raise NotImplementedError

    def _compute_seconds(self, rank: int) -> float:
        raise NotImplementedError

    def _in_situ_s(self, rank: int, computed: float, stretch: float) -> float:
        """Seconds a comm-stream collective lasts longer for the compute that ran beside its transfer:
        ``stretch`` (``GpuSpec.comm_in_situ_slowdown``) x the compute ``rank`` ran since ``computed``
        (its ``_compute_seconds`` when the transfer started)."""
        return stretch * max(self._compute_seconds(rank) - computed, 0.0)

    def _transfer(self, rank: int, latency: float, phases: list[list[tuple[Any, ...]]], cls: str,
                  private: float | None = None, stretch: float = 0.0):  # type: ignore[no-untyped-def]
        raise NotImplementedError

    def _send_entries(self, rank: int, sig: int) -> list[CommEntry]:
        """The sends of every member of representative ``rank``'s class, of comm signature ``sig``."""
        entries = self._class_entries.get((rank, sig))
        if entries is None:
            members = cast(Classes, self.classes).members[rank]
            entries = self._class_entries[(rank, sig)] = [cast(CommEntry, self._comm[m][sig]) for m in members]
            alike(entries)
        return entries

    def _group_entries(self, rank: int, gkey: Any, sig: int) -> list[CommEntry]:
        """The transfers of every group of rendezvous ``gkey`` (``Classes.rendezvous``) for representative
        ``rank``'s collective of comm signature ``sig``: each group's as its member on ``rank``'s stage plans it."""
        stage = self.stage[rank]
        entries = self._class_entries.get((gkey, stage, sig))
        if entries is None:
            groups = cast(Classes, self.classes).groups(gkey, self.grid.stage_ranks(stage))
            at = [next(m for m in g if self.stage[m] == stage) for g in groups]
            entries = self._class_entries[(gkey, stage, sig)] = [cast(CommEntry, self._comm[m][sig]) for m in at]
            alike(entries)
        return entries

    def _transfer_class(self, rank: int, entries: list[CommEntry], stretch: float):  # type: ignore[no-untyped-def]
        """``Engine._transfer`` of the flows of several groups or members at once (``alike``)."""
        latency, phases, cls, private = entries[0]
        if len(entries) == 1:
            yield from self._transfer(rank, latency, phases, cls, private, stretch)
            return
        active, env = self.active_comm[rank], self.env
        active.append(cls)
        self._comm_changed(rank)
        computed = self._compute_seconds(rank) if stretch > 0 else 0.0
        if private is not None:
            yield env.timeout(private)
        else:
            if latency > 0:
                yield env.timeout(latency)
            for i, ph in enumerate(phases):
                if ph:
                    yield from transfer_all(env, self.net, [e[1][i] for e in entries])
        if stretch > 0 and (extra := self._in_situ_s(rank, computed, stretch)) > 0:  # as Engine._transfer
            yield env.timeout(extra)
        active.remove(cls)
        self._comm_changed(rank)

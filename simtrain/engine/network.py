"""Flows over graph edges with max-min fair bandwidth sharing (a fluid model).

Each flow crosses a path of directed edges; an edge's capacity is shared max-min fairly among the
flows on it (progressive filling), and a flow that stands for ``w`` identical flows (symmetric mode:
the representative's flow and its symmetric copies) counts ``w`` times on that edge. Rates are
recomputed, for the connected set of flows touched, whenever a flow starts or ends, and each flow's
completion is rescheduled from its remaining bytes.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import simpy

Edge = tuple[str, str]
EPS = 1e-12


class _Flow:
    __slots__ = ("edges", "weights", "remaining", "rate", "cap", "updated", "version", "group", "seq")

    def __init__(self, edges: tuple[Edge, ...], weights: tuple[float, ...], nbytes: float, cap: float,
                 now: float, group: _Group, seq: int = 0):
        self.edges = edges
        self.weights = weights
        self.remaining = nbytes
        self.rate = 0.0
        self.cap = cap
        self.updated = now
        self.version = 0
        self.group = group
        self.seq = seq
        """Start order within its network. Flows hash by identity, so a set of them iterates in address
        order; every set is put back in start order before completions are scheduled, so simultaneous
        completions fire in the same order in every run (fuzz campaign, issue 31)."""


class _Group:
    __slots__ = ("left", "event")

    def __init__(self, n: int, event: simpy.Event):
        self.left = n
        self.event = event


class FlowNetwork:
    """Fluid network on a simpy environment.

    Args:
        env: the simpy environment.
        capacity: achievable bandwidth of an edge, bytes/s.
    """

    def __init__(self, env: simpy.Environment, capacity: Callable[[Edge], float], batch_ends: bool = False):
        self.env = env
        self._capacity = capacity
        self._cap_cache: dict[Edge, float] = {}
        self._on_edge: dict[Edge, set[_Flow]] = {}
        self._started = 0
        self._batch_ends = batch_ends
        """Rebalance once for all flows ending at one instant (full mode by classes: a class's groups'
        flows end together, and one rebalance per flow costs flows x component); the rates after the
        instant are the same, max-min over the flows left."""
        self._dirty: set[_Flow] = set()

    def capacity(self, e: Edge) -> float:
        """Cached achievable capacity of edge ``e`` in bytes/s."""
        c = self._cap_cache.get(e)
        if c is None:
            c = self._cap_cache[e] = self._capacity(e)
        return c

    def transfer(self, flows: list[tuple[tuple[Edge, ...], tuple[float, ...], float, float]]) -> simpy.Event:
        """Start flows ``(path, weights per edge, bytes, rate cap)``; the event fires when all finish."""
        new: list[_Flow] = []
        event = self._start(flows, new)
        if new:
            self._rebalance(self._component(new))
        return event

    def transfer_many(self, batches: list[list[tuple[tuple[Edge, ...], tuple[float, ...], float, float]]]
                      ) -> list[simpy.Event]:
        """``transfer`` of several sets of flows at once, with one rate computation for all of them
        instead of one per set (the rates are the same: max-min over the flows present once all have
        started); one event per set."""
        new: list[_Flow] = []
        events = [self._start(flows, new) for flows in batches]
        if new:
            self._rebalance(self._component(new))
        return events

    def _start(self, flows: list[tuple[tuple[Edge, ...], tuple[float, ...], float, float]],
               new: list[_Flow]) -> simpy.Event:
        """Put ``flows`` on their edges (appended to ``new``, rates not yet set); their event."""
        event = self.env.event()
        live = [f for f in flows if f[2] > 0 and f[0]]
        if not live:
            event.succeed()
            return event
        group = _Group(len(live), event)
        now = self.env.now
        for path, weights, nbytes, cap in live:
            fl = _Flow(path, weights, nbytes, cap, now, group, self._started)
            self._started += 1
            for e in path:
                self._on_edge.setdefault(e, set()).add(fl)
            new.append(fl)
        return event

    def _component(self, seeds: list[_Flow]) -> list[_Flow]:
        """All flows connected to ``seeds`` through shared edges."""
        seen = set(seeds)
        stack = list(seeds)
        edges_seen: set[Edge] = set()
        while stack:
            f = stack.pop()
            for e in f.edges:
                if e in edges_seen:
                    continue
                edges_seen.add(e)
                for g in self._on_edge.get(e, ()):
                    if g not in seen:
                        seen.add(g)
                        stack.append(g)
        return sorted(seen, key=_start_order)

    def _rebalance(self, flows: list[_Flow]) -> None:
        now = self.env.now
        for f in flows:
            f.remaining = max(f.remaining - f.rate * (now - f.updated), 0.0)
            f.updated = now
        rates = _max_min_rates(flows, self.capacity)
        for f in flows:
            r = rates[f]
            if f.version and math.isclose(r, f.rate, rel_tol=1e-12):
                continue
            f.rate = r
            f.version += 1
            timer = self.env.timeout(f.remaining / r if r > 0 else math.inf)
            timer.callbacks.append(self._finisher(f, f.version))

    def _finisher(self, f: _Flow, version: int) -> Callable[[Any], None]:
        def done(_: Any) -> None:
            if f.version != version:
                return
            f.version = -1
            neighbours: set[_Flow] = set()
            for e in f.edges:
                s = self._on_edge[e]
                s.discard(f)
                neighbours.update(s)
                if not s:
                    del self._on_edge[e]
            if neighbours and self._batch_ends:
                if not self._dirty:  # after the other flows ending now (their timers are already queued)
                    self.env.timeout(0).callbacks.append(self._rebalance_dirty)
                self._dirty.update(neighbours)
            elif neighbours:
                self._rebalance(self._component(list(neighbours)))
            f.group.left -= 1
            if f.group.left == 0:
                f.group.event.succeed()
        return done


    def _rebalance_dirty(self, _: Any) -> None:
        """The deferred rebalance of the flows next to those that ended at this instant."""
        live = [f for f in self._dirty if f.version >= 0]
        self._dirty = set()
        if live:
            self._rebalance(self._component(live))


def _start_order(f: _Flow) -> int:
    return f.seq


def _max_min_rates(flows: list[_Flow], capacity: Callable[[Edge], float]) -> dict[_Flow, float]:
    """Progressive filling: raise all unfrozen rates equally until an edge or a cap saturates."""
    if len(flows) == 1:
        f = flows[0]
        r = min((capacity(e) / w for e, w in zip(f.edges, f.weights, strict=True)), default=math.inf)
        return {f: min(r, f.cap)}
    rate = {f: 0.0 for f in flows}
    left: dict[Edge, float] = {}
    for f in flows:
        for e in f.edges:
            left[e] = capacity(e)
    active = list(flows)  # in the callers' start order, so the load sums below round alike in every run
    while active:
        load: dict[Edge, float] = {}
        for f in active:
            for e, w in zip(f.edges, f.weights, strict=True):
                load[e] = load.get(e, 0.0) + w
        inc = min(left[e] / w for e, w in load.items())
        inc = min(inc, min(f.cap - rate[f] for f in active))
        for f in active:
            rate[f] += inc
        full = set()
        for e, w in load.items():
            left[e] -= inc * w
            if left[e] <= EPS * capacity(e):
                full.add(e)
        active = [f for f in active if f.cap - rate[f] > EPS * max(rate[f], 1.0) and not any(e in full for e in f.edges)]
    return rate


def fluid_duration(flows: list[tuple[tuple[Edge, ...], tuple[float, ...], float, float]],
                   capacity: Callable[[Edge], float]) -> float:
    """Time for ``flows`` to finish on a network carrying nothing else (same fluid model, offline).

    Used when no other stream can ever touch these edges, so the event loop need not track them.
    """
    now = 0.0
    dummy = _Group(0, None)  # type: ignore[arg-type]
    live = [_Flow(p, w, b, c, 0.0, dummy, i) for i, (p, w, b, c) in enumerate(flows) if b > 0 and p]
    while live:
        rates = _max_min_rates(live, capacity)
        dt = min(f.remaining / rates[f] for f in live)
        now += dt
        for f in live:
            f.remaining -= rates[f] * dt
        live = [f for f in live if f.remaining > 1e-9 * max(f.remaining + rates[f] * dt, 1.0)]
    return now

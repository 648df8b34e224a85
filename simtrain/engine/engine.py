"""The discrete-event engine (simpy): streams per GPU, flows over links, a memory ledger per rank.

Each simulated rank runs one simpy process per stream; a stream executes its ops in issue order and
an op starts once its cross-stream and cross-stage dependencies are done (CUDA stream semantics).
Compute ops take their modelled time, stretched for the part of it during which a communication op
of the same GPU is in flight (NCCL kernels take SMs and HBM bandwidth: Calculon's processor_usage,
reference note 4): a running op is re-timed whenever a collective starts or ends on its GPU.
Communication becomes flows over the graph (``network.FlowNetwork``).

Two exact fast paths cut the simpy events: a collective no other stream can contend with and that the
next compute op waits for runs in line on the compute stream (``simtrain.engine.inline``), and a compute
stream whose rank is quiet runs ahead of the simpy clock until it must wait or fire an event
(``Engine._compute_stream``). ``fast_paths=False`` turns both off; tests compare the two.

Symmetric mode simulates one representative rank per pipeline stage and gives its flows the weight
of the symmetric copies the other ranks of the stage put on the same links. Full mode simulates
every rank: collectives rendezvous across their group and every flow is on the network; without a trace
it simulates one rank per class of alike ranks instead, every flow still on the network
(``simtrain.engine.merge``: exact, and checked as it runs).
"""

from __future__ import annotations

from collections import defaultdict, deque
from typing import Any, cast

import simpy

from simtrain.cost.host import RunAhead
from simtrain.engine.axes import _axis, _axis_of, _interference, charge_stream
from simtrain.engine.comm_planner import CommPlanner
from simtrain.engine.done import DoneEvents, either
from simtrain.engine.gc_pause import gc_paused
from simtrain.engine.inline import Guard, Inline, in_line_costs
from simtrain.engine.merge import ClassComm, CommEntry, NotAlike, rank_classes
from simtrain.engine.network import FlowNetwork, fluid_duration
from simtrain.engine.records import EngineResult, Ledger, RankStats, TraceEvent, _Sharing
from simtrain.engine.stage_tables import StageTables, sends_read
from simtrain.hardware.fabric.protocol import Fabric
from simtrain.hardware.hardware import GpuSpec
from simtrain.lower.ops import (
    CollectiveOp,
    CommOp,
    ComputeOp,
    CopyOp,
    CostedComputeOp,
    CostedCopyOp,
    Op,
    OpKind,
    Program,
    SendOp,
    Stream,
)
from simtrain.plan.layout import RankGrid

_UNCOSTED = (ComputeOp, CopyOp)  # as lowering emits them; the cost pass makes the Costed* subclasses
_FINISHED = object()  # a comm stream with no ops left


#: Ops of each comm stream whose times ``Engine._attribute`` keeps to split a wait among their axes.
RECENT_OPS = 256

#: Full mode without a trace simulates one rank per class of alike ranks (``simtrain.engine.merge``);
#: False: every rank (the reference the merged runs are checked against).
MERGE = True


class Engine(ClassComm):
    """Runs stage programs on simulated ranks.

    Args:
        programs: one program per pipeline stage.
        grid: the rank grid.
        topo: the cluster topology; gpu: the GPU spec (interference factors, link efficiencies).
        symmetric: simulate one representative rank per stage (True) or every rank (False).
        trace: keep a TraceEvent per executed op.
        fast_paths: run private blocking collectives in line and let a quiet rank's compute stream
            run ahead of the simpy clock (exact: the same times; off only to check that).
        planner: a CommPlanner of the same topology, GPU, grid and mode to reuse (its plans are pure
            memos: the short runs of ``simtrain.engine.steady`` share one); None: a new one.
        merge: full mode without a trace: simulate one rank per class of alike ranks (exact; falls back
            to every rank where members turn out to differ); None: ``MERGE``.
    """

    def __init__(self, programs: list[Program], grid: RankGrid, topo: Fabric, gpu: GpuSpec,
                 symmetric: bool = True, trace: bool = True, load_factor: dict[int, float] | None = None,
                 fast_paths: bool = True, planner: CommPlanner | None = None,
                 representatives: list[int] | None = None, speed: dict[int, float] | None = None,
                 merge: bool | None = None):
        self._args = dict(programs=programs, grid=grid, topo=topo, gpu=gpu, symmetric=symmetric, trace=trace,
                          load_factor=load_factor, fast_paths=fast_paths, planner=planner, speed=speed)
        self.programs, self.grid, self.gpu = programs, grid, gpu
        self.speed = speed or {}
        """Compute speed factor per rank (``whatif.slow_gpus``): its compute ops take 1/factor as long."""
        for prog in programs:  # compute ops and host copies need their times (simtrain.cost.cost_pass)
            if any(type(o) in _UNCOSTED for o in prog.ops):
                raise ValueError(f"stage {prog.stage}'s program is not costed (simtrain.cost.cost_pass.cost_program)")
        self.fast_paths = fast_paths
        self.load_factor = load_factor or {}
        """Routed-expert time factor per rank (simtrain.plan.routing); missing ranks run at 1."""
        self.symmetric, self.keep_trace = symmetric, trace
        self.env = simpy.Environment()
        self.planner = planner or CommPlanner(topo, gpu, grid, symmetric)
        self.classes = None
        if symmetric:
            self.ranks = representatives or [grid.representative(s) for s in range(len(programs))]
        else:
            self.ranks = list(range(grid.world_size))
            if (MERGE if merge is None else merge) and not trace:
                classes = rank_classes(grid, programs, self.speed, self.load_factor)
                if len(classes.members) < grid.world_size:
                    self.classes, self.ranks = classes, classes.reps
        self.net = FlowNetwork(self.env, self.planner.capacity, batch_ends=self.classes is not None)
        self._planned = list(range(grid.world_size)) if self.classes else self.ranks
        """Ranks whose communication is planned: every rank in full mode (a class carries its members' flows)."""
        self.stage = {r: grid.stage_of(r) for r in self._planned}
        self._weight = {r: len(self.classes.members[r]) if self.classes else 1 for r in self.ranks}
        """Ranks each simulated rank stands for (its class's size; 1 without classes)."""
        self.notes: list[str] = []
        self._class_entries = {}
        self.done: dict[int, DoneEvents] = {}
        self._tables: dict[int, StageTables] = {}
        """Per stage: what its ranks share (in-line plan, awaited ops, stream queues, FLOPs, sends)."""
        self.started: dict[tuple[int, int], float] = {}
        """(rank, op index) -> start time, seconds, of the sends a receiver reads (``StageTables.sent``)."""
        self.stats = {r: RankStats() for r in self.ranks}
        self.ledgers = {r: Ledger() for r in self.ranks}
        self.trace: list[TraceEvent] = []
        self.active_comm: dict[int, list[str]] = {r: [] for r in self.ranks}
        self._change: dict[int, simpy.Event | None] = {r: None for r in self.ranks}
        """Per rank: the event its running compute op waits on for a change of ``active_comm``."""
        self._rate: dict[int, float] = {r: 1.0 for r in self.ranks}
        """The slowdown a rank's running compute op is timed at while it listens for changes (``_run_slowed``)."""
        self._computed: dict[int, float] = {r: 0.0 for r in self.ranks}
        """Per rank: seconds of compute run by ``_run_slowed`` and finished (``_compute_seconds``)."""
        self._computing: dict[int, float | None] = {r: None for r in self.ranks}
        """Per rank: the start time of the compute op ``_run_slowed`` is running, None when it runs none."""
        self.rendezvous: dict[Any, tuple[int, simpy.Event]] = {}
        self.executed = 0
        self._comm: dict[int, list[CommEntry | None]] = {}
        """Per rank, per comm signature (``_sig_of``): (latency s, phases of flows, link class, private
        duration s or None)."""
        self._sig_of: dict[int, list[int]] = {}
        """Per stage, per op index: its comm signature's position in ``_comm[rank]`` (-1: not a comm op);
        one table per rank per op would hold ranks x ops entries."""
        self._inline: dict[int, Inline] = {}
        self._alone: dict[int, dict[int, float]] = {}
        """Per rank: in-line comm ops that may skip the network, op index -> time alone, seconds."""
        self._guard: dict[int, dict[int, Guard]] = {}
        """Per rank: of those, the ones that may only where their Guard is clear."""
        self._finished: dict[int, dict[Stream, int]] = {r: defaultdict(int) for r in self.ranks}
        """Per rank: ops each comm stream has finished."""
        self._waiting: dict[int, dict[Stream, Any]] = {r: {} for r in self.ranks}
        """What each comm stream of a rank waits for: an event, None while running, _FINISHED."""
        self._recent: dict[int, dict[Stream, deque[tuple[float, float, str]]]] = {
            r: defaultdict(lambda: deque(maxlen=RECENT_OPS)) for r in self.ranks}
        """Per rank and comm stream: (start, end, axis) of its last ``RECENT_OPS`` ops (``_attribute``)."""

    def _comm_entry(self, rank: int, op: Op) -> tuple[float, list[list[tuple[Any, ...]]], str]:
        stage = self.stage[rank]
        if isinstance(op, SendOp):
            peer = self._remote_rank(rank, op.peer_stage) if self.symmetric else self._peer(rank, op.peer_stage)
            return self.planner.send(op, rank, stage, peer)
        return self.planner.collective(cast(CollectiveOp, op), rank, stage)

    def _owner(self, rank: int, op: Op) -> tuple[Any, ...]:
        if self.symmetric or op.kind == OpKind.SEND:
            return (op.stream, rank)
        return (op.stream, self.grid.group(cast(CollectiveOp, op).axis, rank))

    def _prepare_comm(self) -> _Sharing:
        """Plan every communication op once; mark those whose edges no other stream ever uses as
        private, so their time is computed offline by the same fluid model (no contention possible:
        one stream runs one op at a time). Returns who uses which edges (for ``_in_line_costs``)."""
        owners: dict[Any, set[Any]] = defaultdict(set)
        uses: list[tuple[int, list[int], tuple[float, list[list[tuple[Any, ...]]], str], Any]] = []
        sigs: dict[int, dict[tuple[Any, ...], list[int]]] = {}  # per stage: its ranks run one program
        for r in self._planned:
            ops = self.programs[self.stage[r]].ops
            # ops of one signature share an entry and an owner: plan each signature once per rank
            by_sig = sigs.get(self.stage[r])
            if by_sig is None:
                by_sig = sigs[self.stage[r]] = {}
                for op in ops:
                    if isinstance(op, CommOp):
                        peer = op.peer_stage if isinstance(op, SendOp) else -1
                        by_sig.setdefault((op.kind, op.stream, op.coll, op.axis, op.comm_bytes, peer),
                                          []).append(op.idx)
                sig_of = self._sig_of[self.stage[r]] = [-1] * len(ops)
                for j, idxs in enumerate(by_sig.values()):
                    for i in idxs:
                        sig_of[i] = j
            self._comm[r] = [None] * len(by_sig)
            for idxs in by_sig.values():
                op = ops[idxs[0]]
                entry, owner = self._comm_entry(r, op), self._owner(r, op)
                uses.append((r, idxs, entry, owner))
        edges_of: dict[tuple[int, Any], set[Any]] = {}
        for _, _, entry, owner in uses:
            key = (id(entry), owner)
            if key not in edges_of:
                edges_of[key] = {e for ph in entry[1] for f in ph for e in f[0]}
                for e in edges_of[key]:
                    owners[e].add(owner)
        values: dict[tuple[int, Any], CommEntry] = {}
        for r, idxs, entry, owner in uses:
            key = (id(entry), owner)
            if key not in values:
                private = all(owners[e] == {owner} for e in edges_of[key])
                values[key] = (*entry, self._alone_s(entry) if private else None)
            self._comm[r][self._sig_of[self.stage[r]][idxs[0]]] = values[key]
        return _Sharing(uses, edges_of, owners)

    def _alone_s(self, entry: tuple[float, list[list[tuple[Any, ...]]], str]) -> float:
        """Time of a communication op on a network carrying nothing else, seconds."""
        return entry[0] + sum(fluid_duration(ph, self.planner.capacity) for ph in entry[1])

    def _in_line_costs(self, rank: int, sharing: _Sharing) -> None:
        """Which of ``rank``'s in-line comm ops may skip the network (``inline.in_line_costs``)."""
        stage = self.stage[rank]
        self._alone[rank], self._guard[rank] = in_line_costs(
            rank, self.programs[stage].ops, self._inline[rank], self._comm[rank], self._sig_of[stage], sharing,
            self._alone_s)

    def run(self) -> EngineResult:
        """Simulate the step; returns per-rank stats, ledgers and the trace."""
        sharing = self._prepare_comm()
        read = sends_read(self.programs)
        for r in self.ranks:
            prog = self.programs[self.stage[r]]
            if self.stage[r] not in self._tables:
                self._tables[self.stage[r]] = StageTables.of(prog, self.programs, self.fast_paths, read)
            if self.fast_paths:
                self._inline[r] = self._tables[self.stage[r]].inline
                if self.symmetric:  # full mode: an in-line collective still meets its group on the network
                    self._in_line_costs(r, sharing)
            self.done[r] = DoneEvents(self.env)  # events of the stage's ``need``, made on first use
            self.ledgers[r].apply(0.0, tuple(prog.static_mem.items()))
        for r in self.ranks:
            for stream, ops in self._tables[self.stage[r]].queues:
                if not ops:
                    continue
                if stream == Stream.COMPUTE:  # compute ops only (costed: checked in __init__)
                    self.env.process(self._compute_stream(r, cast(list[CostedComputeOp], ops)))
                else:
                    self._waiting[r][stream] = None
                    self.env.process(self._comm_stream(r, stream, ops))
        # The simulation makes no reference cycles of note, but millions of live objects (events, flows,
        # timelines): each of the collector's full passes walks them all, a cost per event that grows
        # with the rank count. Off while the loop runs (``gc_paused``); reference counting still frees everything.
        try:
            with gc_paused():
                self.env.run()
        except NotAlike as e:  # members of a class differ: the merged run proves nothing, so run every rank
            res = Engine(**self._args, merge=False).run()  # type: ignore[arg-type]
            res.notes.append(f"full mode simulated every rank: ranks alike in program, speed and groups did not "
                             f"behave alike on the fabric ({e}), so they could not be simulated once per class")
            return res
        step = max(s.end_s for s in self.stats.values())
        res = EngineResult(step, self.ranks, self.stats, self.ledgers, self.trace, self.executed,
                           self.planner.plans, self.notes)
        return self.classes.expand(res) if self.classes else res

    def _remote_rank(self, rank: int, stage: int) -> int:
        """The simulated rank that stands for ``rank``'s peer on pipeline stage ``stage``."""
        if self.symmetric:
            return self.ranks[stage]  # the stage's representative
        peer = self._peer(rank, stage)
        return self.classes.rep_of[peer] if self.classes else peer

    def _peer(self, rank: int, stage: int) -> int:
        """``rank``'s peer on pipeline stage ``stage`` (full mode)."""
        return rank + (stage - self.stage[rank]) * self.grid.stride("pp")

    def _comm_stream(self, rank: int, stream: Stream, ops: list[Op]):  # type: ignore[no-untyped-def]
        """One communication stream of ``rank``: ops in issue order, each once its deps are done."""
        env, done, ledger, need = self.env, self.done[rank], self.ledgers[rank], self._tables[self.stage[rank]].need
        waiting, finished = self._waiting[rank], self._finished[rank]
        for op in ops:
            for d in op.deps:
                ev = done[d]
                if not ev.processed:
                    waiting[stream] = ev
                    yield ev
            waiting[stream] = None  # running (or about to): not quiet
            start = env.now
            if op.mem_start:
                ledger.apply(start, op.mem_start)
            if op.kind == OpKind.COPY:  # a host copy: its own link (PCIe / C2C), no network flows
                yield env.timeout(cast(CostedCopyOp, op).duration_s)  # costed: checked in __init__
            else:
                # a collective on a comm stream may run beside this rank's compute, which slows it (the part
                # that did: GpuSpec.comm_in_situ_slowdown, Engine._transfer)
                stretch = self.gpu.comm_in_situ_slowdown if op.kind != OpKind.SEND else 0.0
                yield from self._communicate(rank, op, stretch)
            end = env.now
            finished[stream] += 1
            self._ended(rank, op, start, end)
            if op.idx in need:
                self._fire(rank, op.idx, start)
        waiting[stream] = _FINISHED

    def _quiet(self, rank: int) -> bool:
        """Whether none of ``rank``'s comm streams can act before its compute stream fires an event:
        each has finished or waits for an event not yet triggered (comm ops wait only on their own
        rank's ops, so only this rank's compute stream can wake them)."""
        for ev in self._waiting[rank].values():
            if ev is not _FINISHED and (ev is None or ev.triggered):
                return False
        return True

    def _compute_stream(self, rank: int, ops: list[CostedComputeOp]):  # type: ignore[no-untyped-def]
        """The compute stream of ``rank``, running the blocking collectives before their consumers
        itself (simtrain.engine.inline).

        The stream keeps its own clock ``t`` and runs ahead of the simpy clock while that cannot
        change anything: the op is awaited by nothing (no done event), its deps are already done, and
        the rank is quiet (``_quiet``), so no other process can touch this rank's state before ``t``.
        It yields (catches up) only to wait, to fire an event, to put flows on the network, or at the
        end: the same times as one timeout per op, with far fewer simpy events.
        """
        env, done, stats, ledger = self.env, self.done[rank], self.stats[rank], self.ledgers[rank]
        need, flops = self._tables[self.stage[rank]].need, self._tables[self.stage[rank]].flops
        extra_load = self.load_factor.get(rank, 1.0) - 1.0  # routed-expert load beyond balanced
        speed = self.speed.get(rank, 1.0)  # x / 1.0 == x: unperturbed ranks keep their exact times
        inline = self._inline.get(rank, {})
        alone, guards, finished = self._alone.get(rank, {}), self._guard.get(rank, {}), self._finished[rank]
        active, quiet = self.active_comm[rank], self._quiet  # the list is only ever changed in place
        t = env.now
        run_ahead, prev_end = RunAhead(), t
        for k, op in enumerate(ops):
            deps = op.deps
            awaited = op.idx in need
            pre = inline.get(op.idx)
            if pre is not None:
                deps = pre[1]
                for c in pre[0]:
                    needed = c.idx in need
                    if t > env.now and (needed or not quiet(rank)):
                        yield env.timeout(t - env.now)  # catch up
                        t = env.now
                    quick = alone.get(c.idx)
                    guard = guards.get(c.idx)
                    if quick is not None and (guard is None or guard.clear(k, finished)):
                        end = self._inline_op(rank, c, t, t + quick)
                        if needed:
                            yield env.timeout(end - t)
                            end = env.now
                    else:  # its flows may meet others': on the network, from this stream
                        if t > env.now:
                            yield env.timeout(t - env.now)  # catch up
                        t = env.now
                        if c.mem_start:
                            ledger.apply(t, c.mem_start)
                        # no in-situ stretch: the compute stream runs it, so no compute runs beside it
                        yield from self._communicate(rank, c)
                        end = self._inline_op(rank, c, t, env.now, mem_start=False)
                    if needed:
                        self._fire(rank, c.idx, t)
                    t = end
            ready = t
            blocker: tuple[str, Any] | None = None
            wait = [d for d in deps if not done[d].processed]
            remote = None
            if op.remote is not None:
                src = self._remote_rank(rank, op.remote[0])
                if not self.done[src][op.remote[1]].processed:
                    remote = src
            if t > env.now and (wait or remote is not None or awaited or not quiet(rank)):
                yield env.timeout(t - env.now)  # catch up
                t = ready = env.now
            for d in wait:
                ev = done[d]
                if not ev.processed:
                    yield ev
                    blocker = ("dep", d)
            if remote is not None:
                ev = self.done[remote][op.remote[1]]  # type: ignore[index]
                if not ev.processed:
                    yield ev
                    blocker = ("remote", (remote, op.remote[1]))  # type: ignore[index]
            if blocker is not None:
                t = env.now
            start = t
            if start > ready and blocker is not None:
                self._attribute(rank, blocker, ready, start)
            if op.mem_start:
                ledger.apply(start, op.mem_start)
            # the host stall is GPU idle time (waiting for the CPU's issue): neither slowed nor sped up; at the
            # step's first op, shortened by the wait before it (the CPU ran ahead meanwhile)
            stall = run_ahead.stall(op, start - prev_end)
            work = (op.duration_s - op.host_stall_s + extra_load * op.expert_s) / speed
            if not active and quiet(rank):
                # no collective in flight and none can start before this stream fires an event
                dur = stall + work if stall else work
                t = end = start + dur
                if awaited:
                    yield env.timeout(dur)
                    end = t = env.now
            else:  # not quiet: caught up above, so start == env.now
                if stall:
                    yield env.timeout(stall)
                yield from self._run_slowed(rank, work)
                end = t = env.now
                dur = end - start
            stats.busy[op.category] += dur
            stats.flops += flops[k]
            stats.last_compute_end_s = prev_end = end
            self._ended(rank, op, start, end)
            if awaited:
                self._fire(rank, op.idx, start)
        if t > env.now:
            yield env.timeout(t - env.now)

    def _fire(self, rank: int, idx: int, start: float) -> None:
        """Op ``idx`` of ``rank``, started at ``start`` (seconds), is done: fire its event for its waiters."""
        if idx in self._tables[self.stage[rank]].sent:
            self.started[(rank, idx)] = start
        self.done[rank].fire(idx)

    def _inline_op(self, rank: int, op: Op, t: float, end: float, mem_start: bool = True) -> float:
        """Bookkeeping of a blocking collective the compute stream ran from ``t`` to ``end``
        (simtrain.engine.inline): memory, trace, and the compute stream's idle time charged to its axis.
        Returns ``end`` (the caller fires its done event, if it has one, at that time)."""
        if mem_start and op.mem_start:
            self.ledgers[rank].apply(t, op.mem_start)
        self.stats[rank].exposed[_axis_of(op)] += end - t
        self._ended(rank, op, t, end)
        return end

    def _ended(self, rank: int, op: Op, start: float, end: float) -> None:
        """What every executed op records when it ends: its memory frees, its trace event, the count,
        and the rank's end time with the axis of its last op."""
        if op.mem_end:
            self.ledgers[rank].apply(end, op.mem_end)
        axis = _axis_of(op)
        if op.stream != Stream.COMPUTE:
            self._recent[rank][op.stream].append((start, end, axis))
        if self.keep_trace:
            self.trace.append(TraceEvent(rank, op.stream.name.lower(), op.name, op.category, start, end, op,
                                         *self._trace_links(rank, op)))
        self.executed += self._weight[rank]
        stats = self.stats[rank]
        if end >= stats.end_s:
            stats.end_s = end
            stats.last_axis = axis

    def _trace_links(self, rank: int, op: Op) -> tuple[int, tuple[int, ...], str]:
        """(peer rank, collective group, algorithm/protocol) of ``rank``'s op, for its trace event."""
        if isinstance(op, SendOp):
            return self._remote_rank(rank, op.peer_stage), (), ""
        if op.remote is not None:
            return self._remote_rank(rank, op.remote[0]), (), ""
        if not isinstance(op, CollectiveOp):
            return -1, (), ""
        group = self.grid.group(op.axis, rank)
        plans = self.planner.plans
        # a symmetric stage translated from stage 0 (CommPlanner._translation) runs stage 0's plan
        base = rank - self.stage[rank] * self.grid.stride("pp")  # rank's counterpart on stage 0
        plan = (plans.get((op.coll, group, op.comm_bytes))
                or plans.get((op.coll, self.grid.group(op.axis, base), op.comm_bytes)))
        return -1, group, f"{plan.algorithm}/{plan.protocol}" if plan is not None else ""

    def _slowdown(self, rank: int) -> float:
        active = self.active_comm[rank]
        if not active:
            return 1.0
        return 1.0 + max(_interference(self.gpu, c) for c in active)

    def _run_slowed(self, rank: int, work_s: float):  # type: ignore[no-untyped-def]
        """Run ``work_s`` seconds of compute (its time alone) on ``rank``, at the rate the collectives
        in flight leave it: 1 / (1 + interference) while one runs, re-timed whenever that rate changes
        (a collective starting or ending: ``_comm_changed``), so a kernel pays only for the part of it
        that a collective overlaps."""
        env = self.env
        slow = self._slowdown(rank)
        t0 = self._computing[rank] = env.now
        done = env.timeout(work_s * slow)
        while True:
            if slow == 1.0 and self._quiet(rank):  # nothing can start before this op ends
                yield done
                break
            changed = self._change[rank] = env.event()
            self._rate[rank] = slow
            yield either(env, done, changed)
            if self._change[rank] is changed:
                self._change[rank] = None
            if done.processed or env.now >= t0 + work_s * slow:
                break
            now_slow = self._slowdown(rank)
            if now_slow != slow:  # an unchanged rate keeps its end time (no rounding from re-timing)
                work_s -= (env.now - t0) / slow
                slow, t0 = now_slow, env.now
                done = env.timeout(work_s * slow)
        self._computed[rank] += env.now - cast(float, self._computing[rank])
        self._computing[rank] = None

    def _compute_seconds(self, rank: int) -> float:
        """Seconds ``rank``'s compute stream has run compute in ``_run_slowed`` up to now. Every compute op
        that overlaps a collective in flight runs there (``_compute_stream`` runs ahead of the clock only
        while no collective is in flight and none can start), so the difference over a transfer is the
        compute that ran beside it."""
        start = self._computing[rank]
        return self._computed[rank] + (self.env.now - start if start is not None else 0.0)

    def _comm_changed(self, rank: int) -> None:
        """The set of ``rank``'s collectives in flight changed: re-time its running compute op."""
        ev = self._change[rank]
        # a change that leaves the rate as it was would only wake the op to wait again, ending when it would
        # have ended (an unchanged rate keeps its end time): skipped, saving its events
        if ev is not None and self._slowdown(rank) != self._rate[rank]:
            self._change[rank] = None
            ev.succeed()

    def _attribute(self, rank: int, blocker: tuple[str, Any], ready: float, start: float) -> None:
        """Charge an idle gap of the compute stream to what it waited for."""
        stats = self.stats[rank]
        kind, ref = blocker
        prog = self.programs[self.stage[rank]]
        if kind == "dep":
            op = prog.ops[ref]
            axis = _axis(op)
            if op.stream == Stream.COMPUTE:
                stats.exposed[axis] += start - ready
            else:
                charge_stream(self._recent[rank][op.stream], stats.exposed, ready, start, axis)
            return
        src, idx = ref
        send_start = self.started.get((src, idx), start)
        bubble = max(0.0, min(send_start, start) - ready)
        stats.bubble_s += bubble
        stats.exposed["pp"] += (start - ready) - bubble

    def _communicate(self, rank: int, op: Op, stretch: float = 0.0):  # type: ignore[no-untyped-def]
        """Run collective or send ``op`` of ``rank`` (a collective once its whole group has arrived);
        ``stretch``: it lasts ``stretch`` x the compute that ran beside its transfer longer (in situ)."""
        sig = self._sig_of[self.stage[rank]][op.idx]
        latency, phases, cls, private = self._comm[rank][sig]  # type: ignore[misc]
        if self.classes is not None and op.kind == OpKind.SEND:  # a class's send carries its members' flows
            yield from self._transfer_class(rank, self._send_entries(rank, sig), stretch)
            return
        if op.kind == OpKind.SEND or self.symmetric:
            yield from self._transfer(rank, latency, phases, cls, private, stretch)
            return
        op = cast(CollectiveOp, op)
        if self.classes is None:
            group = self.grid.group(op.axis, rank)
            gkey, need = group, len(group)
        else:  # groups made of the same classes meet once each of those classes is here
            gkey, need = self.classes.rendezvous(op.axis, rank)
        # the embedding all-reduce pairs two stages' programs, whose op indices differ; it runs once a step
        key = (gkey, op.name if op.axis == "pp_emb" else op.idx)
        count, ev = self.rendezvous.get(key, (0, None))  # type: ignore[assignment]
        if ev is None:
            ev = self.env.event()
        count += 1
        self.rendezvous[key] = (count, ev)
        if count < need:
            self.active_comm[rank].append(cls)
            self._comm_changed(rank)
            yield ev
            self.active_comm[rank].remove(cls)
            self._comm_changed(rank)
            return
        del self.rendezvous[key]
        if self.classes is None:
            yield from self._transfer(rank, latency, phases, cls, private, stretch)
        else:
            yield from self._transfer_class(rank, self._group_entries(rank, gkey, sig), stretch)
        ev.succeed()

    def _transfer(self, rank: int, latency: float, phases: list[list[tuple[Any, ...]]], cls: str,
                  private: float | None = None, stretch: float = 0.0):  # type: ignore[no-untyped-def]
        active = self.active_comm[rank]
        active.append(cls)
        self._comm_changed(rank)
        computed = self._compute_seconds(rank) if stretch > 0 else 0.0
        if private is not None:
            yield self.env.timeout(private)
        else:
            if latency > 0:
                yield self.env.timeout(latency)
            for ph in phases:
                if ph:
                    yield self.net.transfer(ph)
        # the links are free again; the endpoints are still busy with the compute that ran beside it
        if stretch > 0 and (extra := self._in_situ_s(rank, computed, stretch)) > 0:
            yield self.env.timeout(extra)
        active.remove(cls)
        self._comm_changed(rank)

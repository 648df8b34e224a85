"""Layout search: every valid layout for a model, a GPU count and a batch, ranked.

1. **Enumerate** (``enumerate_layouts``): TP (powers of two within a node, dividing heads, KV heads,
   FFN and vocab), PP (dividing the GPUs left, at most the layers), DP (what is left), VPP (dividing
   the layers per stage, micro-batches a multiple of PP), ZeRO stage 0-3, micro-batch size (dividing
   the sequences per DP rank), recompute (none; selective only with unfused attention, since with
   FlashAttention there is nothing to recompute; full with the fewest recomputed layers per chunk
   that fit; with pp = 1, CPU activation offloading of the fewest layers that fit, Megatron-core
   allowing it only without pipeline parallelism and recompute), sequence parallelism on whenever
   TP > 1 (Megatron's advice: it only saves memory).
   CP 1, 2, 4, 8 (sequence divisible by 2 x CP, Megatron's load-balanced causal split).
   Mixture-of-experts models also get: EP (every divisor of the routed experts such that
   EP x ETP divides the stage's tp x cp x dp ranks it folds over, Megatron-core's expert mesh), ETP
   1 or TP (Megatron's ``--expert-tensor-parallel-size``: experts unsharded, or sharded like the
   dense layers), sequence parallelism whenever TP > 1 (required), and the pipeline schedule:
   1F1B/interleaved (``auto``), DualPipe (DeepSeek-V3 sec. 3.2.1; pp even, micro-batches even and at
   least 2 x pp, vpp 1), DualPipeV (deepseek-ai/DualPipe ``dualpipev.py``: DualPipe's steps on pp
   ranks holding 2 x pp stages in a V, so one copy of the parameters; any pp > 1, at least 2 x pp
   micro-batches, vpp 1, at least one layer per stage) and, when asked, ZB-H1. ZeRO-3 with MoE shards the
   expert-data-parallel group (tp x cp x dp / (ep x etp)), whose per-layer gathers and gradient
   reduce-scatters lowering emits beside the dense part's over dp x cp (the estimate times both).
   Not enumerated for MoE: ETP other than 1 and TP.
   Sliding-window models are searched like the others: the estimate costs each layer's own window.
   The config's ``cp_comm``, ``ep_comm_overlap`` and ``recompute_modules`` are kept (selective
   recompute is tried when they name something besides unfused attention's ``core_attn``).
2. **Prune** with the memory closed form (``simtrain.studies.estimate``, exact against the engine's ledger)
   and rank the layouts that fit by their estimated step: the lowered, costed program of one
   micro-batch per (stage, chunk) timed by the critical-path evaluator, the pipeline by the schedule's
   action lists (``simtrain.engine.probe``).
3. **Simulate** the best ``top_k`` estimates (worker processes, or Dask) and rank them by simulated
   step time. Every other layout says why it lost: memory, or its estimated/simulated excess over the
   best broken down by cause (bubble, communication per axis, compute, optimizer).
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from simtrain.hardware.fabric.wiring import fabric_of
from simtrain.plan.load import load_config
from simtrain.spec.config import LayoutConfig, RunConfig, TrainConfig
from simtrain.spec.errors import ConfigError, Problem
from simtrain.studies.estimate import Estimate, Estimator
from simtrain.studies.labels import layout_label
from simtrain.studies.progress import progress_bar, ticking
from simtrain.studies.search_space import SearchSpace, enumerate_layouts, explain_empty
from simtrain.studies.simulate import cluster_of
from simtrain.studies.variability import nominal

if TYPE_CHECKING:
    import pandas as pd

GiB = 1024.0**3
# Simulation budget of a search, micro-batches x layers summed over the simulated layouts: about 40 s
# of CPU on this project's 2-core machine with today's engine (Llama 3.1 405B, 16 micro-batches x 126
# layers = 2,016 units, simulates in ~0.7 s).
DEFAULT_BUDGET_UNITS = 100_000
# What each time component is, for "why it lost".
CAUSE = {"compute": "compute", "bubble": "bubble", "stage imbalance": "bubble", "optimizer": "optimizer",
         "tp comm": "communication",
         "tp/cp comm": "communication",
         "dp comm": "communication", "pp comm": "communication", "cp comm": "communication",
         "ep comm": "communication", "CPU offload": "CPU offload", "other": "other",
         "wait for the slowest rank": "rank jitter"}


@dataclass(slots=True)
class Candidate:
    """One layout and what the search found about it (times in s, memory in bytes)."""

    layout: dict[str, Any]
    micro_batch_size: int
    microbatches: int
    est_step_time_s: float | None = None
    est_mfu: float | None = None
    est_peak_bytes: float | None = None
    est_components_s: dict[str, float] = field(default_factory=dict)
    step_time_s: float | None = None
    mfu: float | None = None
    peak_memory_bytes: float | None = None
    fits: bool | None = None
    status: str = "enumerated"
    """best, simulated, estimated (not simulated), memory, dominated or error."""
    lost_to: str | None = None
    """memory, bubble, communication, compute, CPU offload, optimizer, or None for the best."""
    reason: str = ""
    rank: int = 0
    row: dict[str, Any] | None = field(default=None, repr=False)

    def label(self) -> str:
        """Short layout label with every parallel axis (``simtrain.studies.labels``): tp cp (ep etp) pp vpp dp,
        ZeRO, micro-batch, recompute or CPU offload, schedule."""
        return layout_label(self.layout, micro_batch_size=self.micro_batch_size)

    def over_capacity_bytes(self, capacity: float) -> float | None:
        """How far the (simulated, else estimated) peak is over ``capacity`` bytes; None when it fits or
        has no peak."""
        peak = self.peak_memory_bytes if self.peak_memory_bytes is not None else self.est_peak_bytes
        if peak is None or peak <= capacity:
            return None
        return peak - capacity


@dataclass(slots=True)
class SearchResult:
    """Candidates ranked (best first) and the search's counts and wall time."""

    model: str
    n_gpus: int
    global_batch_tokens: int
    candidates: list[Candidate]
    n_enumerated: int
    n_memory: int
    n_simulated: int
    elapsed_s: float
    capacity_bytes: float = 0.0
    """HBM per GPU, bytes (what a layout's peak must fit in)."""

    @property
    def best(self) -> Candidate | None:
        """The fastest simulated layout that fits, if any."""
        return next((c for c in self.candidates if c.status == "best"), None)

    def counts(self) -> dict[str, int]:
        """What became of the enumerated layouts; ``simulated`` splits into ``fit`` and ``do_not_fit``:

        ``pruned_memory`` (the closed form's peak is over HBM even with the most recompute or offload),
        ``dominated`` (a memory lever the layout does not need), ``infeasible`` (the simulation refused
        it), ``simulated``, ``estimated_only`` (fit by the estimate, not simulated: past ``top_k`` or the
        budget).
        """
        cs = self.candidates
        sim = [c for c in cs if c.row is not None and c.status != "error"]
        return {"enumerated": self.n_enumerated,
                "pruned_memory": sum(1 for c in cs if c.status == "memory" and c.row is None),
                "dominated": sum(1 for c in cs if c.status == "dominated"),
                "infeasible": sum(1 for c in cs if c.status == "error"),
                "simulated": len(sim), "fit": sum(1 for c in sim if c.fits),
                "do_not_fit": sum(1 for c in sim if not c.fits),
                "estimated_only": sum(1 for c in cs if c.status == "estimated")}

    def not_fitting(self) -> list[Candidate]:
        """Layouts whose (simulated, else estimated) peak is over HBM, closest to fitting first."""
        over = [c for c in self.candidates if c.over_capacity_bytes(self.capacity_bytes) is not None]
        return sorted(over, key=lambda c: c.over_capacity_bytes(self.capacity_bytes) or 0.0)

    def to_dict(self, limit: int | None = None) -> dict[str, Any]:
        """JSON-ready dict; ``limit`` keeps the first candidates only."""
        cands = self.candidates if limit is None else self.candidates[:limit]
        return {"model": self.model, "n_gpus": self.n_gpus, "global_batch_tokens": self.global_batch_tokens,
                "n_enumerated": self.n_enumerated, "n_memory": self.n_memory, "n_simulated": self.n_simulated,
                "elapsed_s": self.elapsed_s, "capacity_bytes": self.capacity_bytes, "counts": self.counts(),
                "best": None if self.best is None else _cand_dict(self.best),
                "candidates": [_cand_dict(c) for c in cands]}

    def to_frame(self) -> pd.DataFrame:
        """One row per candidate: sweep-style columns for simulated ones, estimate and verdict for all."""
        from simtrain.studies.sweep import to_frame

        rows = []
        for c in self.candidates:
            row: dict[str, Any] = {"point": c.rank, **{f"layout.{k}": v for k, v in c.layout.items()},
                                   "train.micro_batch_size": c.micro_batch_size}
            if c.row:
                row.update({k: v for k, v in c.row.items() if k != "point"})
            row.setdefault("capacity_bytes", self.capacity_bytes)
            row.update({"microbatches": c.microbatches, "est_step_time_s": c.est_step_time_s,
                        "est_mfu": c.est_mfu, "est_peak_memory_bytes": c.est_peak_bytes, "status": c.status,
                        "lost_to": c.lost_to, "reason": c.reason})
            rows.append(row)
        return to_frame(rows)


def _cand_dict(c: Candidate) -> dict[str, Any]:
    d = asdict(c)
    d.pop("row")
    d["label"] = c.label()
    return d


# -- pruning ----------------------------------------------------------------------------------------
def _fit_recompute(est: Estimator, lay: LayoutConfig, train: TrainConfig, mb: int) -> tuple[LayoutConfig, tuple[float, ...]]:
    """Full recompute with the fewest layers per chunk that fit."""
    per_chunk = max(max(c) for c in est.chunk_layers(lay))
    return _fewest_layers_that_fit(est, lay, train, mb, "recompute_layers", per_chunk)


def _fit_offload(est: Estimator, lay: LayoutConfig, train: TrainConfig, mb: int) -> tuple[LayoutConfig, tuple[float, ...]]:
    """CPU activation offloading of the fewest layers that fit."""
    return _fewest_layers_that_fit(est, lay, train, mb, "offload_activation_layers", lay.offload_activation_layers)


def _fewest_layers_that_fit(est: Estimator, lay: LayoutConfig, train: TrainConfig, mb: int, field: str,
                            most: int) -> tuple[LayoutConfig, tuple[float, ...]]:
    """The layout with the smallest layer count ``field`` in 1..``most`` whose per-stage peaks fit (binary
    search: memory falls as the count grows), with those peaks; ``most`` when even that does not fit."""
    hi_lay = lay.model_copy(update={field: most})
    best = (hi_lay, est.stage_memory(hi_lay, train, mb))
    if max(best[1]) > est.cluster.gpu.hbm_bytes:
        return best
    lo, hi = 1, most
    while lo < hi:
        mid = (lo + hi) // 2
        cand = lay.model_copy(update={field: mid})
        mem = est.stage_memory(cand, train, mb)
        if max(mem) <= est.cluster.gpu.hbm_bytes:
            best, hi = (cand, mem), mid
        else:
            lo = mid + 1
    return best


def _memory_reason(mem: tuple[float, ...], capacity: float, full: bool, offload: bool = False) -> str:
    s = max(range(len(mem)), key=mem.__getitem__)
    tail = " even with full recompute of every layer" if full else ""
    tail = " even with every layer but the last offloaded to CPU memory" if offload else tail
    return f"memory: stage {s} needs {mem[s] / GiB:.1f} GiB > {capacity / GiB:.1f} GiB HBM ({_over(mem[s], capacity)}){tail}"


def _over(peak: float, capacity: float) -> str:
    """'+3.2 GiB, +4.0 %': how far ``peak`` bytes are over ``capacity``."""
    return f"+{(peak - capacity) / GiB:.1f} GiB, +{100.0 * (peak / capacity - 1.0):.1f} %"


def _layout_dict(lay: LayoutConfig) -> dict[str, Any]:
    keys = ("tp", "pp", "vpp", "dp", "cp", "ep", "etp", "schedule", "zero_stage", "recompute", "recompute_layers",
            "offload_activation_layers", "sequence_parallel")
    return {k: getattr(lay, k) for k in keys}


def _estimate_all(est: Estimator, layouts: Iterable[tuple[LayoutConfig, TrainConfig]]) -> list[tuple[Candidate, LayoutConfig]]:
    """Memory-check and estimate every layout; full recompute gets its fewest fitting layers."""
    out: list[tuple[Candidate, LayoutConfig]] = []
    fits_without: set[tuple[Any, ...]] = set()
    capacity = est.cluster.gpu.hbm_bytes
    for lay, train in layouts:
        mb = train.global_batch_seqs_resolved // (train.micro_batch_size * lay.dp)
        key = (lay.tp, lay.pp, lay.vpp, lay.dp, lay.cp, lay.ep, lay.etp, lay.schedule, lay.zero_stage,
               train.micro_batch_size)
        static = tuple(b * (1 + est.fragmentation_ratio) for b in est.static_memory(lay, train))
        if max(static) > capacity:  # weights, gradients and optimizer state alone overflow
            cand = Candidate(_layout_dict(lay), train.micro_batch_size, mb, est_peak_bytes=max(static),
                             status="memory", lost_to="memory")
            cand.reason = _memory_reason(static, capacity, False) + " before any activation"
            out.append((cand, lay))
            continue
        offload = lay.offload_activation_layers > 0
        if lay.recompute == "full" or offload:
            if key in fits_without:
                what = ("CPU offloading not needed: this layout fits without it, and the copies can only add "
                        "waits") if offload else ("full recompute not needed: this layout fits without it, and "
                                                  "recompute only adds compute")
                cand = Candidate(_layout_dict(lay), train.micro_batch_size, mb, status="dominated",
                                 lost_to="compute", reason=what)
                out.append((cand, lay))
                continue
            lay, mem = _fit_offload(est, lay, train, mb) if offload else _fit_recompute(est, lay, train, mb)
        else:
            mem = est.stage_memory(lay, train, mb)
        cand = Candidate(_layout_dict(lay), train.micro_batch_size, mb, est_peak_bytes=max(mem))
        if max(mem) > capacity:
            cand.status, cand.lost_to = "memory", "memory"
            cand.reason = _memory_reason(mem, capacity, lay.recompute == "full", offload)
        else:
            if lay.recompute == "none" and not offload:
                fits_without.add(key)
            e: Estimate = est.estimate(lay, train)
            cand.est_step_time_s, cand.est_mfu, cand.est_components_s = e.step_time_s, e.mfu, e.components()
            cand.status = "estimated"
        out.append((cand, lay))
    return out


# -- simulation and ranking -------------------------------------------------------------------------
def _point(c: Candidate) -> dict[str, Any]:
    lay = {f"layout.{k}": v for k, v in c.layout.items()}
    return {"layout.schedule": "auto", **lay, "layout.fsdp": "none", "layout.fsdp_shard_size": None,
            "train.micro_batch_size": c.micro_batch_size}


def _sim_components(row: dict[str, Any]) -> dict[str, float]:
    return {"compute": row["compute_s"], "bubble": row["bubble_s"], "stage imbalance": row["stage_imbalance_s"],
            "tp comm": row["exposed_tp_s"],
            "dp comm": row["exposed_dp_s"], "pp comm": row["exposed_pp_s"], "cp comm": row["exposed_cp_s"],
            "ep comm": row["exposed_ep_s"], "CPU offload": row.get("offload_s", 0.0), "optimizer": row["optimizer_s"],
            "other": row["other_s"], "wait for the slowest rank": row.get("sync_wait_s", 0.0)}


def _why(mine: dict[str, float], best: dict[str, float], total: float, best_total: float, what: str) -> tuple[str, str]:
    """(cause, text): the excess over the best by component, largest first."""
    deltas = sorted(((mine.get(k, 0.0) - best.get(k, 0.0), k) for k in mine), reverse=True)
    # differences below a nanosecond per second of step are float noise of equal sums, not causes
    parts = [f"{k} {d:+.3g} s" for d, k in deltas[:2] if d > 1e-9 * max(total, best_total)]
    cause = CAUSE[deltas[0][1]] if deltas and deltas[0][0] > 0 else "other"
    pct = 100.0 * (total / best_total - 1.0) if best_total > 0 else 0.0
    return cause, f"{what} {total:.4g} s, +{pct:.1f} % vs best" + (f": {', '.join(parts)}" if parts else "")


def _rank(cands: list[Candidate]) -> list[Candidate]:
    """Simulated fitting layouts by step time, then other simulated, then estimates, then the rest."""
    def key(c: Candidate) -> tuple[int, float]:
        if c.status in ("best", "simulated") and c.fits:
            return (0, c.step_time_s or 0.0)
        if c.status == "simulated":
            return (1, c.step_time_s or 0.0)
        if c.status == "estimated":
            return (2, c.est_step_time_s or 0.0)
        order = {"error": 3, "dominated": 4, "memory": 5}
        return (order.get(c.status, 6), c.est_peak_bytes or 0.0)

    ranked = sorted(cands, key=key)
    for i, c in enumerate(ranked, 1):
        c.rank = i
    return ranked


def _explain(ranked: list[Candidate]) -> None:
    """Fill in status, cause and reason relative to the best simulated and the best estimated layout."""
    sim_ok = [c for c in ranked if c.status == "simulated" and c.fits]
    best = sim_ok[0] if sim_ok else None
    est_ok = [c for c in ranked if c.est_step_time_s is not None]
    best_est = min(est_ok, key=lambda c: c.est_step_time_s or 0.0) if est_ok else None
    for c in ranked:
        if c is best:
            c.status, c.lost_to = "best", None
            c.reason = f"best: {c.step_time_s:.4g} s per step, MFU {100 * (c.mfu or 0):.1f} %"
        elif c.status == "simulated" and c.fits and best is not None and c.row and best.row:
            c.lost_to, c.reason = _why(_sim_components(c.row), _sim_components(best.row), c.step_time_s or 0.0,
                                       best.step_time_s or 0.0, "simulated")
        elif c.status == "simulated" and not c.fits:
            c.lost_to = "memory"
            peak, cap = c.peak_memory_bytes or 0.0, float((c.row or {}).get("capacity_bytes") or 0.0)
            over = f" > {cap / GiB:.1f} GiB HBM ({_over(peak, cap)})" if cap else " does not fit"
            c.reason = f"memory (simulated): peak {peak / GiB:.1f} GiB{over}"
        elif c.status == "estimated" and best_est is not None and not c.reason:
            c.lost_to, text = _why(c.est_components_s, best_est.est_components_s, c.est_step_time_s or 0.0,
                                   best_est.est_step_time_s or 0.0, "not simulated: estimated")
            c.reason = text.replace("vs best", "vs best estimate")


def search(config: RunConfig | dict[str, Any] | str | Path, gpus: int | None = None,
           space: SearchSpace | None = None, top_k: int = 8, budget_units: int = DEFAULT_BUDGET_UNITS,
           overrides: list[str] | None = None,
           workers: int | None = None, scheduler: str | None = None, progress: bool = False) -> SearchResult:
    """Search the layout space of a config's model and batch on ``gpus`` GPUs; best layouts first.

    Args:
        config: RunConfig, dict or path; its model, hardware node, train section and layout switches
            (overlap, rank order, buckets) are kept, its degrees are searched.
        gpus: GPUs to use (a multiple of the node's GPUs; default: the config's cluster).
        space: values to try per knob (default: every valid value).
        top_k: how many of the best estimates are simulated (at most).
        budget_units: simulation cost allowed over all of them, in micro-batches x layers
            (``sim_cost_units``); the best estimate is simulated whatever its cost.
        workers, scheduler: as ``simtrain.studies.sweep`` (local processes, or a Dask scheduler address).

    Raises:
        ConfigError: a bad config, or a GPU count that is not a whole number of nodes.
    """
    t0 = time.perf_counter()
    run = load_config(config, overrides)
    cluster = cluster_of(run)
    if gpus is not None:
        if gpus <= 0 or gpus % cluster.gpus_per_node:
            raise ConfigError(Problem("--gpus", f"{gpus} is not a positive multiple of the "
                                                f"{cluster.gpus_per_node} GPUs per {run.hardware.node} node"))
        run = run.model_copy(update={"hardware": run.hardware.model_copy(
            update={"n_nodes": gpus // cluster.gpus_per_node})})
        cluster = cluster_of(run)
    if top_k < 1:
        raise ConfigError(Problem("--top", f"{top_k} must be at least 1"))
    space = space or SearchSpace()
    layouts = enumerate_layouts(run, cluster.n_gpus, space)
    if not layouts:
        raise ConfigError(explain_empty(run, cluster.n_gpus, space))
    est = Estimator(run.model, cluster, run.sim.fragmentation_ratio, fabric_of(run.hardware.fabric, cluster))
    with progress_bar("estimating layouts", len(layouts), enabled=progress) as advance:
        cands = [c for c, _ in _estimate_all(est, ticking(layouts, advance))]
    _simulate_best(run, cands, top_k, budget_units, workers, scheduler, progress)
    ranked = _rank(cands)
    _explain(ranked)
    ranked = _rank(ranked)
    tokens = run.train.global_batch_seqs_resolved * run.train.seq_len
    return SearchResult(run.model.name, cluster.n_gpus, tokens, ranked, len(layouts),
                        sum(1 for c in cands if c.status == "memory"),
                        sum(1 for c in cands if c.row is not None), time.perf_counter() - t0,
                        cluster.gpu.hbm_bytes)


def sim_cost_units(c: Candidate, n_layers: int) -> int:
    """Relative cost of simulating a candidate: micro-batches x layers, x (1 + (cp - 1)/4) for the ring
    attention steps (the symmetric engine runs one rank per stage, so its ops grow with micro-batches
    x layers, not with GPUs or stages; measured ~20 ops per unit at cp=1, ~50 at cp=8)."""
    return int(c.microbatches * n_layers * (1 + (c.layout.get("cp", 1) - 1) / 4))


def choose_to_simulate(ranked: list[Candidate], top_k: int, budget_units: int, n_layers: int) -> list[Candidate]:
    """The best estimates, in order, up to ``top_k`` and ``budget_units`` of simulation cost; the best
    estimate is always simulated; a candidate too costly for what is left of the budget is skipped
    (and says so) in favour of the next ones."""
    chosen: list[Candidate] = []
    spent = 0
    for c in ranked:
        if len(chosen) >= top_k:
            break
        units = sim_cost_units(c, n_layers)
        if chosen and spent + units > budget_units:
            c.reason = (f"not simulated: over the simulation budget ({units:,} units for {c.microbatches} "
                        f"micro-batches x {n_layers} layers; {budget_units - spent:,} left)")
            continue
        chosen.append(c)
        spent += units
    return chosen


def _simulate_best(run: RunConfig, cands: list[Candidate], top_k: int, budget_units: int, workers: int | None,
                   scheduler: str | None, progress: bool) -> None:
    """Simulate the ``top_k`` best estimates and record their results on the candidates."""
    from simtrain.studies.sweep import base_data, run_points

    estimated = sorted((c for c in cands if c.status == "estimated"), key=lambda c: c.est_step_time_s or 0.0)
    chosen = choose_to_simulate(estimated, top_k, budget_units, run.model.n_layers)
    if not chosen:
        return
    base = base_data(nominal(run).model_copy(update={"run": None}))  # ranked by the nominal step: no draws
    rows = run_points(base, [_point(c) for c in chosen], workers, scheduler, progress, whole_run=False,
                      label="simulating best layouts")
    for c, row in zip(chosen, rows, strict=True):
        c.row = row
        if row.get("error"):
            c.status, c.lost_to, c.reason = "error", "error", str(row["error"])
            continue
        c.status = "simulated"
        c.step_time_s, c.mfu, c.fits = row["step_time_s"], row["mfu"], bool(row["fits"])
        c.peak_memory_bytes = row["peak_memory_bytes"]

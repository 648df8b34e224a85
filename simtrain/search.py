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
2. **Prune** with the memory closed form (``simtrain.estimate``, exact against the engine's ledger)
   and rank the layouts that fit by the closed-form step estimate.
3. **Simulate** the best ``top_k`` estimates (worker processes, or Dask) and rank them by simulated
   step time. Every other layout says why it lost: memory, or its estimated/simulated excess over the
   best broken down by cause (bubble, communication per axis, compute, optimizer).
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from simtrain.config import LayoutConfig, RunConfig, TrainConfig, load_config
from simtrain.errors import ConfigError, Problem
from simtrain.estimate import Estimate, Estimator
from simtrain.simulate import cluster_of

if TYPE_CHECKING:
    import pandas as pd

GiB = 1024.0**3
ZERO_STAGES = (0, 1, 2, 3)
MICRO_BATCHES = (1, 2, 4, 8)
RECOMPUTE = ("none", "selective", "full", "offload")
"""Memory levers tried per layout: no recompute, selective or full recompute, or (pp = 1) CPU activation
offloading of the fewest layers that fit (``layout.offload_activation_layers``, recompute none)."""
SEARCH_SCHEDULES = ("auto", "dualpipe", "dualpipev", "zb_h1")
# Simulation budget of a search, micro-batches x layers summed over the simulated layouts: about 40 s
# of CPU on this project's 2-core machine with today's engine (Llama 3.1 405B, 16 micro-batches x 126
# layers = 2,016 units, simulates in ~0.7 s).
DEFAULT_BUDGET_UNITS = 100_000
# What each time component is, for "why it lost".
CAUSE = {"compute": "compute", "bubble": "bubble", "stage imbalance": "bubble", "optimizer": "optimizer",
         "tp comm": "communication",
         "tp/cp comm": "communication",
         "dp comm": "communication", "pp comm": "communication", "cp comm": "communication",
         "ep comm": "communication", "other": "other"}


@dataclass(frozen=True, slots=True)
class SearchSpace:
    """Values to try per knob; None means every valid value (see the module docstring)."""

    tp: tuple[int, ...] | None = None
    pp: tuple[int, ...] | None = None
    vpp: tuple[int, ...] | None = None
    micro_batch_size: tuple[int, ...] = MICRO_BATCHES
    zero_stage: tuple[int, ...] = ZERO_STAGES
    recompute: tuple[str, ...] = RECOMPUTE
    cp: tuple[int, ...] | None = None
    ep: tuple[int, ...] | None = None
    """Expert-parallel degrees (MoE models; dense models always 1)."""
    etp: tuple[int, ...] | None = None
    """Expert tensor-parallel degrees (MoE models): default 1 and tp."""
    schedule: tuple[str, ...] | None = None
    """Pipeline schedules: ``auto`` (1F1B, interleaved when vpp > 1), ``dualpipe``, ``dualpipev``,
    ``zb_h1``; default ``auto`` for dense models, ``auto``, ``dualpipe`` and ``dualpipev`` for MoE models."""


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
    """memory, bubble, communication, compute, optimizer, or None for the best."""
    reason: str = ""
    rank: int = 0
    row: dict[str, Any] | None = field(default=None, repr=False)

    def label(self) -> str:
        """Short layout label: tp/pp/vpp/dp, ZeRO, micro-batch, recompute (or CPU offload)."""
        lay = self.layout
        rec = lay["recompute"] + (f"({lay['recompute_layers']})" if lay.get("recompute_layers") else "")
        if lay.get("offload_activation_layers"):
            rec = f"offload({lay['offload_activation_layers']})"
        cp = f" cp{lay['cp']}" if lay.get("cp", 1) > 1 else ""
        ep = f" ep{lay['ep']} etp{lay['etp']}" if lay.get("etp") is not None else ""
        sched = f" {lay['schedule']}" if lay.get("schedule", "auto") != "auto" else ""
        return (f"tp{lay['tp']} pp{lay['pp']} vpp{lay['vpp']} dp{lay['dp']}{cp}{ep} zero{lay['zero_stage']} "
                f"mbs{self.micro_batch_size} {rec}{sched}")


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

    @property
    def best(self) -> Candidate | None:
        """The fastest simulated layout that fits, if any."""
        return next((c for c in self.candidates if c.status == "best"), None)

    def to_dict(self, limit: int | None = None) -> dict[str, Any]:
        """JSON-ready dict; ``limit`` keeps the first candidates only."""
        cands = self.candidates if limit is None else self.candidates[:limit]
        return {"model": self.model, "n_gpus": self.n_gpus, "global_batch_tokens": self.global_batch_tokens,
                "n_enumerated": self.n_enumerated, "n_memory": self.n_memory, "n_simulated": self.n_simulated,
                "elapsed_s": self.elapsed_s, "best": None if self.best is None else _cand_dict(self.best),
                "candidates": [_cand_dict(c) for c in cands]}

    def to_frame(self) -> pd.DataFrame:
        """One row per candidate: sweep-style columns for simulated ones, estimate and verdict for all."""
        from simtrain.sweep import to_frame

        rows = []
        for c in self.candidates:
            row: dict[str, Any] = {"point": c.rank, **{f"layout.{k}": v for k, v in c.layout.items()},
                                   "train.micro_batch_size": c.micro_batch_size}
            if c.row:
                row.update({k: v for k, v in c.row.items() if k != "point"})
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


# -- enumeration ------------------------------------------------------------------------------------
def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def _tp_ok(run: RunConfig, tp: int) -> bool:
    """TP divides heads, KV heads (or is a multiple of them), FFN and vocab, as ``validate`` demands."""
    m = run.model
    kv_ok = m.kv_heads % tp == 0 or tp % m.kv_heads == 0
    dims_ok = m.n_heads % tp == 0 and kv_ok and m.ffn_hidden % tp == 0 and m.vocab % tp == 0
    # MoE with TP needs sequence parallelism (validate._expert_problems), so tp must divide the sequence
    return dims_ok and (m.moe is None or tp == 1 or run.train.seq_len % tp == 0)


def _expert_degrees(run: RunConfig, tp: int, plane: int, space: SearchSpace) -> list[tuple[int, int | None]]:
    """(ep, etp) pairs of a stage of ``plane`` = tp x cp x dp ranks: ETP 1 or TP dividing the expert
    width, EP dividing the routed experts with EP x ETP dividing the plane (validate._expert_problems).
    A dense model gets (1, None)."""
    moe = run.model.moe
    if moe is None:
        return [(1, None)]
    etps = sorted({e for e in (space.etp or (1, tp)) if tp % e == 0 and moe.ffn_hidden % e == 0})
    return [(ep, etp) for etp in etps for ep in _divisors(moe.n_experts)
            if plane % (ep * etp) == 0 and (space.ep is None or ep in space.ep)]


def _schedules(run: RunConfig, pp: int, vpp: int, microbatches: int, space: SearchSpace) -> list[str]:
    """Schedules worth trying: ``auto`` (1F1B/interleaved); for MoE models DualPipe where it can run
    (even pp, an even micro-batch count of at least 2 x pp, vpp 1: deepseek-ai/DualPipe's asserts,
    validate._schedule_batch_problems) and DualPipeV where it can (at least 2 x pp micro-batches, the
    assert of deepseek-ai/DualPipe ``dualpipev.py``; vpp 1, as it places its two chunks itself; at
    least one layer on each of its 2 x pp stages); ZB-H1 when the space names it (vpp 1, pp > 1)."""
    allowed = space.schedule or (("auto", "dualpipe", "dualpipev") if run.model.is_moe else ("auto",))
    out = ["auto"] if "auto" in allowed else []
    if vpp > 1 or pp == 1:
        return out
    if "dualpipe" in allowed and pp % 2 == 0 and microbatches % 2 == 0 and microbatches >= 2 * pp:
        out.append("dualpipe")
    if "dualpipev" in allowed and microbatches >= 2 * pp and run.model.n_layers >= 2 * pp:
        out.append("dualpipev")
    if "zb_h1" in allowed:
        out.append("zb_h1")
    return out


def _recompute_choices(run: RunConfig, space: SearchSpace) -> list[str]:
    """none, full, offload, and selective where it recomputes something (unfused attention, or modules
    besides ``core_attn``)."""
    tr, modules = run.train, run.layout.recompute_modules
    useful = tr.attention_kernel != "flash" or any(mod != "core_attn" for mod in modules)
    return [r for r in RECOMPUTE if r in space.recompute and (r != "selective" or useful)]


def _base_layout(run: RunConfig) -> dict[str, Any]:
    """The config's layout switches that the search keeps (overlaps, rank order, buckets)."""
    keep = ("order", "overlap_grad_reduce", "overlap_param_gather", "tp_comm_overlap", "grad_bucket_MiB",
            "fsdp_prefetch_layers", "cp_comm", "ep_comm_overlap", "recompute_modules")
    dumped = run.layout.model_dump()
    return {k: dumped[k] for k in keep}


def enumerate_layouts(run: RunConfig, n_gpus: int, space: SearchSpace) -> list[tuple[LayoutConfig, TrainConfig]]:
    """Every valid (layout, train) of the space on ``n_gpus`` GPUs for the config's batch.

    Recompute ``full`` is listed once per layout with ``recompute_layers`` None (the search fills in the
    fewest layers that fit).
    """
    m, tr = run.model, run.train
    gpn = cluster_of(run).gpus_per_node
    seqs = tr.global_batch_seqs_resolved
    tps = space.tp or tuple(t for t in (1, 2, 4, 8, 16, 32, 64) if t <= gpn)
    recompute = _recompute_choices(run, space)
    zeros = list(space.zero_stage)
    base = _base_layout(run)
    out = []
    for tp in (t for t in tps if n_gpus % t == 0 and _tp_ok(run, t)):
        cps = space.cp or (1, 2, 4, 8)
        for cp in (c for c in cps if (n_gpus // tp) % c == 0 and tr.seq_len % (2 * c if c > 1 else 1) == 0):
            rest = n_gpus // (tp * cp)
            pps = space.pp or tuple(_divisors(rest))
            for pp in (p for p in pps if rest % p == 0 and p <= m.n_layers):
                dp = rest // pp
                for mbs in (b for b in space.micro_batch_size if seqs % (b * dp) == 0):
                    mb = seqs // (mbs * dp)
                    train = tr.model_copy(update={"micro_batch_size": mbs})
                    for vpp in _vpps(m.n_layers, pp, mb, space.vpp):
                        for ep, etp in _expert_degrees(run, tp, tp * cp * dp, space):
                            for sched in _schedules(run, pp, vpp, mb, space):
                                lay = {**base, "tp": tp, "pp": pp, "dp": dp, "cp": cp, "ep": ep, "etp": etp,
                                       "vpp": vpp, "sequence_parallel": tp > 1 and tr.seq_len % tp == 0,
                                       "schedule": sched, "fsdp": "none", "fsdp_shard_size": None,
                                       "recompute_layers": None}
                                out += [(_with_lever(lay, zero, rec, m.n_layers), train)
                                        for zero in zeros for rec in recompute
                                        if rec != "offload" or (pp == 1 and m.n_layers > 1)]
    return out


def _with_lever(lay: dict[str, Any], zero: int, lever: str, n_layers: int) -> LayoutConfig:
    """The layout with its ZeRO stage and memory lever (a recompute kind, or ``offload``: recompute none
    and every layer but the last offloaded, which ``_fit_offload`` then cuts to the fewest that fit)."""
    if lever == "offload":
        return LayoutConfig(**{**lay, "zero_stage": zero, "recompute": "none",
                               "offload_activation_layers": n_layers - 1})
    return LayoutConfig(**{**lay, "zero_stage": zero, "recompute": lever})


def _vpps(n_layers: int, pp: int, microbatches: int, allowed: tuple[int, ...] | None) -> list[int]:
    """1, and the interleaving degrees that split the layers evenly with micro-batches a multiple of pp."""
    out = [1] if allowed is None or 1 in allowed else []
    if pp == 1 or microbatches % pp:
        return out
    per_stage, rem = divmod(n_layers, pp)
    if rem:
        return out
    return out + [v for v in _divisors(per_stage)[1:] if allowed is None or v in allowed]


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
    return f"memory: stage {s} needs {mem[s] / GiB:.1f} GiB > {capacity / GiB:.1f} GiB HBM{tail}"


def _layout_dict(lay: LayoutConfig) -> dict[str, Any]:
    keys = ("tp", "pp", "vpp", "dp", "cp", "ep", "etp", "schedule", "zero_stage", "recompute", "recompute_layers",
            "offload_activation_layers", "sequence_parallel")
    return {k: getattr(lay, k) for k in keys}


def _estimate_all(est: Estimator, layouts: list[tuple[LayoutConfig, TrainConfig]]) -> list[tuple[Candidate, LayoutConfig]]:
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
            "other": row["other_s"]}


def _why(mine: dict[str, float], best: dict[str, float], total: float, best_total: float, what: str) -> tuple[str, str]:
    """(cause, text): the excess over the best by component, largest first."""
    deltas = sorted(((mine.get(k, 0.0) - best.get(k, 0.0), k) for k in mine), reverse=True)
    parts = [f"{k} {d:+.3g} s" for d, k in deltas[:2] if d > 0]
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
            c.reason = f"memory (simulated): peak {(c.peak_memory_bytes or 0) / GiB:.1f} GiB does not fit"
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
        workers, scheduler: as ``simtrain.sweep`` (local processes, or a Dask scheduler address).

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
    layouts = enumerate_layouts(run, cluster.n_gpus, space or SearchSpace())
    est = Estimator(run.model, cluster, run.sim.fragmentation_ratio)
    cands = [c for c, _ in _estimate_all(est, layouts)]
    _simulate_best(run, cands, top_k, budget_units, workers, scheduler, progress)
    ranked = _rank(cands)
    _explain(ranked)
    ranked = _rank(ranked)
    tokens = run.train.global_batch_seqs_resolved * run.train.seq_len
    return SearchResult(run.model.name, cluster.n_gpus, tokens, ranked, len(layouts),
                        sum(1 for c in cands if c.status == "memory"),
                        sum(1 for c in cands if c.row is not None), time.perf_counter() - t0)


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
    from simtrain.sweep import base_data, run_points

    estimated = sorted((c for c in cands if c.status == "estimated"), key=lambda c: c.est_step_time_s or 0.0)
    chosen = choose_to_simulate(estimated, top_k, budget_units, run.model.n_layers)
    if not chosen:
        return
    base = base_data(run.model_copy(update={"run": None}))
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


def render_search(r: SearchResult, show: int = 15) -> str:
    """Human-readable ranking: the best ``show`` candidates with why each lost, and the counts."""
    by_status: dict[str, int] = {}
    for c in r.candidates:
        by_status[c.status] = by_status.get(c.status, 0) + 1
    counts = ", ".join(f"{n} {s}" for s, n in sorted(by_status.items()))
    lines = [f"simtrain search: {r.model} on {r.n_gpus:,} GPUs, {r.global_batch_tokens:,} tokens per step",
             f"  {r.n_enumerated} layouts enumerated ({counts}); {r.n_simulated} simulated; {r.elapsed_s:.1f} s",
             f"  {'#':>4}  {'layout':<44}{'mbs/step':>9}{'est (s)':>10}{'sim (s)':>10}{'MFU %':>7}{'peak GiB':>10}  why"]
    for c in r.candidates[:show]:
        sim = f"{c.step_time_s:10.4g}" if c.step_time_s is not None else f"{'-':>10}"
        est = f"{c.est_step_time_s:10.4g}" if c.est_step_time_s is not None else f"{'-':>10}"
        mfu = c.mfu if c.mfu is not None else c.est_mfu
        mfu_s = f"{100 * mfu:7.1f}" if mfu is not None else f"{'-':>7}"
        peak = c.peak_memory_bytes or c.est_peak_bytes
        peak_s = f"{peak / GiB:10.1f}" if peak else f"{'-':>10}"
        lines.append(f"  {c.rank:>4}  {c.label():<44}{c.microbatches:>9}{est}{sim}{mfu_s}{peak_s}  {c.reason}")
    if r.best is None:
        lines.append("  no simulated layout fits in memory")
    elif (band := _likely(r.best)) is not None:
        lines.append(f"  best: {r.best.label()}, {r.best.step_time_s:.4g} s per step, likely measured "
                     f"{band[0]:.4g} - {band[1]:.4g} s (simtrain.uncertainty)")
    return "\n".join(lines)


def _likely(c: Candidate) -> tuple[float, float] | None:
    """The simulated candidate's likely measured step-time range (s), when its row has one."""
    lo, hi = (c.row or {}).get("step_time_low_s"), (c.row or {}).get("step_time_high_s")
    return (float(lo), float(hi)) if lo is not None and hi is not None else None

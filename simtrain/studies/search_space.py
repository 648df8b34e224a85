"""Layout search, step 1: the layouts of a search space (``simtrain.studies.search`` explains the space).

``enumerate_layouts`` lists every valid (layout, train) of a ``SearchSpace``; ``explain_empty`` says
which knob left nothing when the list is empty (a bad ``--tp``, ``--mbs``, ...).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from simtrain.plan.schedules import schedule_of
from simtrain.spec.config import LayoutConfig, RunConfig, TrainConfig
from simtrain.spec.errors import Problem
from simtrain.studies.simulate import cluster_of

ZERO_STAGES = (0, 1, 2, 3)
MICRO_BATCHES = (1, 2, 4, 8)
RECOMPUTE = ("none", "selective", "full", "offload")
"""Memory levers tried per layout: no recompute, selective or full recompute, or (pp = 1) CPU activation
offloading of the fewest layers that fit (``layout.offload_activation_layers``, recompute none)."""
SEARCH_SCHEDULES = ("auto", "dualpipe", "dualpipev", "zb_h1")
"""Schedules ``--schedule`` may name, in the order candidates are listed: ``auto`` (1F1B, interleaved when
vpp > 1), then registered schedule names (``simtrain.plan.schedules.REGISTRY``)."""


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
    ``Schedule.problems``, as validate checks) and DualPipeV where it can (at least 2 x pp micro-batches, the
    assert of deepseek-ai/DualPipe ``dualpipev.py``; vpp 1, as it places its two chunks itself; at
    least one layer on each of its 2 x pp stages); ZB-H1 when the space names it (vpp 1, pp > 1)."""
    # by default MoE models also try the schedules whose overlapped F&B pairs hide the all-to-alls
    overlapping = tuple(k for k in SEARCH_SCHEDULES[1:] if schedule_of(k).overlaps_forward_backward)
    allowed = space.schedule or (("auto", *overlapping) if run.model.is_moe else ("auto",))
    out = ["auto"] if "auto" in allowed else []
    if vpp > 1 or pp == 1:
        return out
    n_layers = run.model.n_layers
    for kind in (k for k in SEARCH_SCHEDULES if k != "auto" and k in allowed):
        sched = schedule_of(kind)
        # what validate would refuse (simtrain.plan.schedules constraints), and a model stage without a layer
        if not sched.problems(pp, vpp, microbatches, n_layers, "") and sched.route(pp, microbatches).length <= n_layers:
            out.append(kind)
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


def enumerate_layouts(run: RunConfig, n_gpus: int, space: SearchSpace,
                      funnel: dict[str, int] | None = None) -> list[tuple[LayoutConfig, TrainConfig]]:
    """Every valid (layout, train) of the space on ``n_gpus`` GPUs for the config's batch.

    Recompute ``full`` is listed once per layout with ``recompute_layers`` None (the search fills in the
    fewest layers that fit). ``funnel``, when given, counts the values that passed each knob's test
    (``tp``, ``cp``, ``pp``, ``mbs``, ``vpp``, ``ep``, ``schedule``, ``lever``), so that an empty result
    can say which knob left nothing (``explain_empty``).
    """
    seen = funnel if funnel is not None else {}

    def passed(knob: str) -> bool:
        seen[knob] = seen.get(knob, 0) + 1
        return True

    m, tr = run.model, run.train
    gpn = cluster_of(run).gpus_per_node
    seqs = tr.global_batch_seqs_resolved
    tps = space.tp or tuple(t for t in (1, 2, 4, 8, 16, 32, 64) if t <= gpn)
    recompute = _recompute_choices(run, space)
    zeros = list(space.zero_stage)
    base = _base_layout(run)
    out = []
    for tp in (t for t in tps if n_gpus % t == 0 and _tp_ok(run, t) and passed("tp")):
        cps = space.cp or (1, 2, 4, 8)
        for cp in (c for c in cps if (n_gpus // tp) % c == 0 and tr.seq_len % (2 * c if c > 1 else 1) == 0
                   and passed("cp")):
            rest = n_gpus // (tp * cp)
            pps = space.pp or tuple(_divisors(rest))
            for pp in (p for p in pps if rest % p == 0 and p <= m.n_layers and passed("pp")):
                dp = rest // pp
                for mbs in (b for b in space.micro_batch_size if seqs % (b * dp) == 0 and passed("mbs")):
                    mb = seqs // (mbs * dp)
                    train = tr.model_copy(update={"micro_batch_size": mbs})
                    for vpp in (v for v in _vpps(m.n_layers, pp, mb, space.vpp) if passed("vpp")):
                        for ep, etp in (e for e in _expert_degrees(run, tp, tp * cp * dp, space) if passed("ep")):
                            for sched in (k for k in _schedules(run, pp, vpp, mb, space) if passed("schedule")):
                                lay = {**base, "tp": tp, "pp": pp, "dp": dp, "cp": cp, "ep": ep, "etp": etp,
                                       "vpp": vpp, "sequence_parallel": tp > 1 and tr.seq_len % tp == 0,
                                       "schedule": sched, "fsdp": "none", "fsdp_shard_size": None,
                                       "recompute_layers": None}
                                levers = [(_with_lever(lay, zero, rec, m.n_layers), train)
                                          for zero in zeros for rec in recompute
                                          if rec != "offload" or (pp == 1 and m.n_layers > 1)]
                                seen["lever"] = seen.get("lever", 0) + len(levers)
                                out += levers
    return out


def _tp_faults(run: RunConfig, n_gpus: int, tp: int) -> list[str]:
    """Why ``tp`` cannot be used on ``n_gpus`` GPUs (empty when it can): what it fails to divide."""
    m = run.model
    faults = [f"the {n_gpus} GPUs"] if n_gpus % tp else []
    faults += [f"the {n} {what}" for n, what in ((m.n_heads, "attention heads"), (m.ffn_hidden, "FFN width"),
                                                  (m.vocab, "vocabulary entries")) if n % tp]
    if m.kv_heads % tp and tp % m.kv_heads:
        faults.append(f"the {m.kv_heads} KV heads (nor is it a multiple of them)")
    if m.moe is not None and tp > 1 and run.train.seq_len % tp:
        faults.append(f"the {run.train.seq_len}-token sequence (MoE with TP needs sequence parallelism)")
    return faults


def _tp_why(tp: int, faults: list[str]) -> str:
    if len(faults) == 1:
        return f"tp {tp} does not divide {faults[0]}"
    return f"tp {tp} divides neither {' nor '.join(faults)}"


def explain_empty(run: RunConfig, n_gpus: int, space: SearchSpace) -> list[Problem]:
    """Why ``enumerate_layouts`` found no layout: the first knob no value of which passed, with why."""
    funnel: dict[str, int] = {}
    enumerate_layouts(run, n_gpus, space, funnel)
    gpn = cluster_of(run).gpus_per_node
    if not funnel.get("tp"):
        tps = space.tp or tuple(t for t in (1, 2, 4, 8, 16, 32, 64) if t <= gpn)
        why = "; ".join(_tp_why(t, _tp_faults(run, n_gpus, t)) for t in tps)
        return [Problem("--tp", f"{', '.join(map(str, tps))}: no tensor-parallel degree is usable: {why}")]
    seqs, seq_len = run.train.global_batch_seqs_resolved, run.train.seq_len
    texts = {
        "cp": ("--cp", f"no context-parallel degree of {space.cp or (1, 2, 4, 8)} divides the GPUs left by tp "
                       f"with the {seq_len}-token sequence divisible by 2 x cp"),
        "pp": ("--pp", f"no pipeline degree of {space.pp or 'the divisors'} divides the GPUs left by tp x cp "
                       f"with at most {run.model.n_layers} layers"),
        "mbs": ("--mbs", f"no micro-batch size of {space.micro_batch_size} divides the {seqs} sequences per step "
                         "over any data-parallel degree left"),
        "vpp": ("--vpp", f"no interleaving degree of {space.vpp} splits the layers per stage evenly with the "
                         "micro-batches a multiple of pp"),
        "ep": ("--ep", f"no expert-parallel pair of ep {space.ep or 'any'} and etp {space.etp or '1 or tp'} "
                       "divides the routed experts and the tp x cp x dp ranks"),
        "schedule": ("--schedule", f"no schedule of {space.schedule} can run these layouts (dualpipe: even pp, "
                                   "at least 2 x pp micro-batches, vpp 1; zb_h1: pp > 1)"),
        "lever": ("--recompute", f"no memory lever of {space.recompute} applies (selective needs something to "
                                 "recompute; offload needs pp 1)"),
    }
    for knob, (path, text) in texts.items():
        if not funnel.get(knob):
            return [Problem(path, f"{text}, so no layout was enumerated")]
    return [Problem("search", "no layout was enumerated")]  # pragma: no cover - every knob passed


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

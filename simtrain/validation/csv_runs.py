"""Published-run CSV rows -> RunConfig: robust parsing of the free-text cells, every gap named.

A row of ``published_runs.csv`` (columns described in ``validation/README.md``) becomes a
:class:`ParsedRow`: the RunConfig to simulate (or the missing field that makes it not simulatable),
the measured step time and peak memory, and the list of assumptions made to fill gaps. Nothing is
guessed silently: every default taken, every free-text cell read loosely, every GPU, framework or
recipe mapped to a nearest documented profile is one line in ``assumptions``.

Numeric cells may hold text ("2M (approx)", "up to 147", "47 (README: ...)"): the first number is
read and, when the cell held more than a number, an assumption says so.

Beyond ``published_runs.csv``'s columns, an optional ``cpu_offload_layers`` column gives the
transformer layers whose activations the run offloaded to CPU memory (Megatron
``cpu_offloading_num_layers``; ``layout.offload_activation_layers``).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Any

from simtrain.spec.config import RunConfig
from simtrain.spec.errors import ConfigError, Problem
from simtrain.spec.stacks import DEFAULT_STACK, SoftwareStack, stack_from_text
from simtrain.validation.csv_cells import (
    _POSITIVE_COLUMNS,
    NotSimulatable,
    _blank,
    count,
    integer,
    is_visible,
    number,
    parse_gpu,
    parse_precision,
    parse_recompute,
    parse_sharding,
    recompute_modules_of,
    source_label,
    text,
)
from simtrain.validation.csv_models import build_model


@dataclass(slots=True)
class ParsedRow:
    """One CSV row turned into what the simulator and the comparison need.

    Times in seconds, memory in bytes. ``run`` is None when the row is not simulatable.
    """

    run_id: str
    source: str
    gpu_type: str
    n_gpus: int | None
    run: RunConfig | None
    status: str
    assumptions: list[str] = field(default_factory=list)
    measured_step_time_s: float | None = None
    measured_peak_mem_bytes: float | None = None
    measured_tokens_per_s_per_gpu: float | None = None
    source_mfu_pct: float | None = None
    source_hfu_pct: float | None = None
    peak_tflops_used: float | None = None
    flop_convention: str | None = None
    visible: bool = False
    stack_profiled: bool = True
    """False when the ``framework`` cell names no framework with a stack profile (or is blank): the run is
    simulated with the fallback stack, and its likely range is widened (``uncertainty.band_for``)."""


# ---- cells --------------------------------------------------------------------------------------


# ---- source, GPU, precision, recompute ------------------------------------------------------------


# ---- the model ------------------------------------------------------------------------------------


# ---- the row ------------------------------------------------------------------------------------

def parse_row(row: dict[str, str]) -> ParsedRow:
    """Turn one CSV row into a ParsedRow; a missing needed field gives status ``not simulatable: <field>``,
    an inconsistent row ``error: <message>``. Never raises for bad cells."""
    notes: list[str] = []
    run_id = row.get("run_id", "") or "?"
    gpu, node, gpu_note = parse_gpu(row.get("gpu", "") or "")
    out = ParsedRow(run_id=run_id, source=source_label(row), gpu_type=gpu, n_gpus=None, run=None, status="ok",
                    assumptions=notes, visible=is_visible(row))
    if gpu_note:
        notes.append(gpu_note)
    out.flop_convention = " ".join(filter(None, (row.get("flop_convention"), row.get("tflops_kind")))) or None
    try:
        _measured(row, out, notes)
        out.n_gpus = count(row, "n_gpus", notes)
        out.run = _run_config(row, out, gpu, node, notes)
    except NotSimulatable as exc:
        out.status = f"not simulatable: {exc.field}"
    except ConfigError as exc:
        out.status = "error: " + "; ".join(str(p) for p in exc.problems)
    except (ValueError, ArithmeticError) as exc:  # a malformed cell the checks above did not foresee
        out.status = f"error: {exc}"
    return out


def _measured(row: dict[str, str], out: ParsedRow, notes: list[str]) -> None:
    """The row's measured values; a zero, negative or infinite time, memory or throughput is a
    ConfigError naming the column (the row becomes an error row, not a wild percentage error)."""
    for col in _POSITIVE_COLUMNS:
        value = number(row, col, [])
        if value is not None and not (0 < value < math.inf):
            raise ConfigError(Problem(col, f"{row.get(col)!r} is not valid; a positive measured value (or blank)"))
    out.measured_step_time_s = number(row, "step_time_s", notes)
    mem_gib = number(row, "peak_mem_gib", notes)
    out.measured_peak_mem_bytes = mem_gib * 1024.0**3 if mem_gib else None
    out.measured_tokens_per_s_per_gpu = number(row, "tokens_per_s_per_gpu", notes)
    out.source_mfu_pct = number(row, "mfu_pct", notes)
    out.source_hfu_pct = number(row, "hfu_pct", notes)
    out.peak_tflops_used = number(row, "peak_tflops_used", notes)


def _run_config(row: dict[str, str], out: ParsedRow, gpu: str, node: str, notes: list[str]) -> RunConfig:
    from simtrain.hardware.load import load_gpu, load_node
    from simtrain.plan.load import load_config

    stack, stack_note = stack_from_text(row.get("framework"), row.get("source"))
    # stack_from_text returns the default stack with a note only when no pattern matched (a matched
    # framework comes with no note, or, torchtitan without "eager", with torchtitan-eager's)
    if stack_note and stack.name == DEFAULT_STACK:
        out.stack_profiled = False
        framework = (row.get("framework") or "").strip()
        stack_note = (f"framework {framework!r} has no stack profile" if framework else "framework not given") + (
            f"; simulated with stack {stack.name} ({stack.description.split(' (')[0]}), the default; likely "
            "range widened by the spread of the model's error across profiled stacks")
    if stack_note:
        notes.append(stack_note)
    if out.n_gpus is None:
        out.n_gpus = _smallest_world(row, notes)
    seq = count(row, "seq_len", notes)
    if seq is None:
        raise NotSimulatable("seq_len")
    model = build_model(row, seq, notes)
    layout = _layout(row, stack, out.n_gpus, notes)
    train = _train(row, stack, layout, seq, load_gpu(gpu).has_fp8, notes, has_fp4=load_gpu(gpu).has_fp4)
    if model.activation == "gelu" and re.search(r"mpt|bloom", (row.get("model") or "").lower()):
        train["dropout"] = False
        notes.append("dropout off (MPT and BLOOM train without dropout)")
    hardware = _hardware(row, gpu, node, load_node(node).gpus_per_node, out.n_gpus, notes)
    run = load_config({"name": out.run_id, "model": model, "hardware": hardware, "layout": layout,
                       "train": train})
    notes.extend(run.assumptions)
    return run


def _smallest_world(row: dict[str, str], notes: list[str]) -> int:
    """The GPU count of a row that gives its layout but not ``n_gpus``: tp x pp x cp x dp, with dp the
    row's or the fewest that hold its expert parallelism (ep / cp: experts fold over dp x cp with
    expert TP 1), named in the assumptions; NotSimulatable without tp and pp."""
    tp, pp = count(row, "tp", notes), count(row, "pp", notes)
    if tp is None or pp is None:
        raise NotSimulatable("n_gpus", "neither the GPU count nor the layout (tp, pp) is given")
    cp, ep = count(row, "cp", notes) or 1, count(row, "ep", notes) or 1
    dp = count(row, "dp", notes) or max(1, -(-ep // cp))
    n = tp * pp * cp * dp
    notes.append(f"n_gpus not given: {n} assumed, the smallest world that holds the layout "
                 f"(tp {tp} x pp {pp} x cp {cp} x dp {dp})")
    return n


def _layout(row: dict[str, str], stack: SoftwareStack, n_gpus: int, notes: list[str]) -> dict[str, Any]:
    cp = count(row, "cp", notes) or 1
    ep = count(row, "ep", notes) or 1
    dp = count(row, "dp", notes)
    tp = count(row, "tp", notes)
    pp = count(row, "pp", notes)
    if tp is None:
        tp = _missing_degree("tp", n_gpus, (pp or 1) * cp, dp, notes)
    if pp is None:
        pp = _missing_degree("pp", n_gpus, tp * cp, dp, notes)
    derived = n_gpus // (tp * pp * cp) if n_gpus % (tp * pp * cp) == 0 else None
    if dp is None or (derived is not None and dp != derived):
        if derived is None:
            raise NotSimulatable("dp", f"n_gpus={n_gpus} is not a multiple of tp*pp*cp={tp * pp * cp}")
        if dp is not None:
            notes.append(f"dp {dp} inconsistent with n_gpus/(tp*pp*cp) = {derived}; {derived} used")
        dp = derived
    lay: dict[str, Any] = {"tp": tp, "pp": pp, "cp": cp, "dp": dp, "ep": ep}
    lay.update(_expert_tp(tp, cp * dp, ep, notes))
    said = f"{text(row, 'framework')} {text(row, 'notes')}"
    if ep > 1 and re.search(r"deep-?ep|hybrid-?ep", said):
        lay["ep_dispatcher"] = "deepep"
        notes.append("DeepEP/HybridEP named: tokens cross the network once per remote node (ep_dispatcher deepep)")
    if ep > 1 and re.search(r"a2a[ _-]?overlap|\b(?:ep|all-?to-?all)[ _-]?(?:comm[ _-]?)?overlap", said):
        lay["ep_comm_overlap"] = True
        notes.append("all-to-all overlap named (Megatron moe_a2a_overlap): dispatch and combine overlapped with "
                     "computation (ep_comm_overlap)")
    vp = integer(row, "vp", notes)
    framework = text(row, "framework")
    if vp and vp > 1:
        lay["vpp"] = vp
    if "interleaved" in framework:
        lay["schedule"] = "interleaved_1f1b"
        if not vp or vp == 1:
            lay["vpp"] = 2
            notes.append("interleaved 1F1B without a VP degree: 2 stages per rank assumed (torchtitan default)")
    elif "1f1b" in framework:
        lay["schedule"] = "1f1b"
    sp = text(row, "seq_parallel")
    if sp in ("on", "yes", "true", "1"):
        # Megatron-LM turns sequence parallelism off at TP 1, where it has nothing to split (arguments.py)
        lay["sequence_parallel"] = tp > 1
        if tp == 1:
            notes.append("seq_parallel on at tp 1: a no-op (Megatron turns it off)")
    elif sp in ("off", "no", "false", "0"):
        lay["sequence_parallel"] = False
    else:
        lay["sequence_parallel"] = stack.sequence_parallel and tp > 1
        if tp > 1:
            notes.append(f"seq_parallel not given: {'on' if lay['sequence_parallel'] else 'off'} (stack {stack.name})")
    lay.update(_recompute(row, stack, lay, notes))
    lay.update(_offload(row, notes))
    shard, shard_notes = parse_sharding(row.get("zero_fsdp", "") or "", stack, lay.get("dp"))
    lay.update(shard)
    notes.extend(shard_notes)
    if tp > 1:
        lay["tp_comm_overlap"] = _tp_overlap(row, stack, notes)
    return lay


def _offload(row: dict[str, str], notes: list[str]) -> dict[str, Any]:
    """Layout fields for the optional ``cpu_offload_layers`` column (Megatron ``cpu_offloading_num_layers``:
    transformer layers whose activations are offloaded to CPU memory); blank or absent: none."""
    layers = integer(row, "cpu_offload_layers", notes)
    if layers is None or layers == 0:
        return {}
    if layers < 0:
        raise ConfigError(Problem("cpu_offload_layers", f"{layers}: must be a layer count >= 0 (or blank)"))
    notes.append(f"activations of the first {layers} layers offloaded to CPU memory (cpu_offload_layers)")
    return {"offload_activation_layers": layers}


def _missing_degree(col: str, n_gpus: int, others: int, dp: int | None, notes: list[str]) -> int:
    """A blank tp or pp: what the GPU count leaves for it once dp and the other degrees are given, else 1."""
    if dp is not None and n_gpus % (others * dp) == 0:
        degree = n_gpus // (others * dp)
        notes.append(f"{col} not given: {degree} = n_gpus / the other degrees")
        return degree
    notes.append(f"{col} not given: 1 assumed")
    return 1


def _expert_tp(tp: int, data: int, ep: int, notes: list[str]) -> dict[str, Any]:
    """``{"etp": 1}`` when the row's EP does not fold over a stage with expert TP = tp (Megatron's default)
    but does with expert TP 1: Megatron-core's MoE parallel folding sets expert TP apart from attention
    TP (Liu et al. 2025, arXiv 2504.14960), and published Megatron MoE layouts such as TP2 EP32 over
    32 ranks per stage run ETP 1 (NVIDIA Megatron-MoE-ModelZoo best_practice/Qwen3 table)."""
    plane = tp * data
    if ep <= 1 or tp <= 1 or plane % (ep * tp) == 0 or plane % ep != 0:
        return {}
    notes.append(f"expert TP not given: ep x tp = {ep} x {tp} does not fold over tp x cp x dp = {plane}; "
                 "etp 1 assumed (Megatron MoE parallel folding)")
    return {"etp": 1}


#: A FLOP convention that counts the activation-recompute forward (Narayanan et al. SC'21:
#: 96BslH^2(1 + s/6h + V/16lh) "incl. activation-recompute forward"): the run recomputed.
_COUNTS_RECOMPUTE = r"(?<!no )(?:incl\.?|includes|counts?|counted)\s+(?:the\s+)?(?:activation[- ])?recompute"


def _recompute(row: dict[str, str], stack: SoftwareStack, lay: dict[str, Any],
                notes: list[str]) -> dict[str, Any]:
    """Layout fields for the ``recompute`` cell; a blank cell in a row whose FLOP convention counts the
    recompute forward is full recompute (named), else none."""
    cell = row.get("recompute", "") or ""
    said = f"{text(row, 'flop_convention')} {text(row, 'tflops_kind')}"
    if _blank(cell) and re.search(_COUNTS_RECOMPUTE, said):
        notes.append("recompute not given: full assumed (the row's FLOP convention counts the recompute forward)")
        return {"recompute": "full"}
    recompute, rec_notes = parse_recompute(cell, stack.name)
    notes.extend(rec_notes)
    if recompute == "full":
        return {"recompute": "full", **_recomputed_share(row, cell, lay, notes)}
    modules = recompute_modules_of(cell)[0]
    return {"recompute": recompute, **({"recompute_modules": modules} if recompute == "selective" and modules else {})}


def _pipeline_chunks(lay: dict[str, Any]) -> int:
    """Model chunks over the pipeline: pp stages x virtual stages per rank."""
    return int(lay["pp"] * (lay.get("vpp") or 1))


def _recomputed_share(row: dict[str, str], cell: str, lay: dict[str, Any], notes: list[str]) -> dict[str, Any]:
    """``recompute_layers`` for a full-recompute cell that names part of the layers: "every 2nd layer"
    (torchtitan's ``selective_ac_option`` = 2), "12 of 48 layers", "4 layers per stage" (Megatron's
    ``--recompute-num-layers`` with the block method: per pipeline-stage chunk)."""
    low = cell.lower()
    if "uniform" in low:  # Megatron's uniform method: every layer, checkpointed in groups of N
        return {}
    per_chunk = -(-(count(row, "n_layers", []) or 0) // _pipeline_chunks(lay))
    if every := re.search(r"every\s*(?:(\d+)(?:st|nd|rd|th)?|other)\s*layers?", low):
        share = 1 / int(every.group(1) or 2)
    elif part := re.search(r"(\d+)\s*(?:/|of)\s*(\d+)\s*layers?", low):
        share = int(part.group(1)) / max(int(part.group(2)), 1)
    elif fixed := re.search(r"(\d+)\s*layers?", low):
        notes.append(f"recompute {cell!r}: {fixed.group(1)} layers of each pipeline-stage chunk (Megatron's "
                     "--recompute-num-layers, block method)")
        return {"recompute_layers": int(fixed.group(1))}
    else:
        return {}
    if not per_chunk:
        notes.append(f"recompute {cell!r}: n_layers not given; every layer recomputed")
        return {}
    layers = min(per_chunk, max(0, round(share * per_chunk)))
    notes.append(f"recompute {cell!r}: {layers} of each chunk's {per_chunk} layers recomputed")
    return {"recompute_layers": layers}


def _tp_overlap(row: dict[str, str], stack: SoftwareStack, notes: list[str]) -> bool:
    framework = text(row, "framework")
    if "asynctp" in framework or "async tp" in framework:
        return True
    if "vanillatp" in framework or "vanilla tp" in framework:
        return False
    if "tp-comm-overlap" in text(row, "notes"):
        return True
    notes.append(f"TP comm overlap not stated: {'on' if stack.tp_comm_overlap else 'off'} (stack {stack.name})")
    return stack.tp_comm_overlap


def _train(row: dict[str, str], stack: SoftwareStack, lay: dict[str, Any], seq: int, has_fp8: bool,
           notes: list[str], has_fp4: bool = False) -> dict[str, Any]:
    gbs = count(row, "global_batch_seqs", notes)
    batch: dict[str, int] = {"global_batch_seqs": gbs} if gbs is not None else {}
    if gbs is None:
        tokens = count(row, "global_batch_tokens", notes)
        if tokens is None:
            raise NotSimulatable("global_batch_seqs")
        # a batch quoted in tokens ("2M") need not be whole micro-batches: load_config rounds it to the
        # nearest batch that is (simtrain.spec.load.round_token_batch) and says so in the assumptions
        batch = {"global_batch_tokens": tokens}
    mbs = count(row, "micro_batch", notes)
    if mbs is None:
        mbs = 1
        notes.append("micro_batch not given: 1 assumed")
    stages = _pipeline_chunks(lay)
    if stack.pp_microbatches_equal_pp and lay["pp"] > 1 and mbs % stages == 0:
        notes.append(f"micro_batch {mbs} is the local batch; split into {stages} micro-batches of "
                     f"{mbs // stages}, one per pipeline stage (torchtitan pipeline_parallel_microbatches default)")
        mbs //= stages
    precision, recipe, prec_notes = parse_precision(row.get("precision", "") or "", stack, has_fp8, has_fp4)
    notes.extend(prec_notes)
    train: dict[str, Any] = {"seq_len": seq, "micro_batch_size": mbs, **batch,
                             "precision": precision, "stack": stack.name,
                             "attention_kernel": "unfused" if stack.attention == "unfused" else "flash"}
    if precision == "fp8":
        train["fp8_recipe"] = recipe
    if "pure" in text(row, "zero_fsdp"):
        train["grad_dtype"] = "bf16"  # Composer mixed_precision=PURE reduces gradients in bf16
    return train


def _gpus_per_node(n_gpus: int, node_gpus: int) -> int | None:
    """GPUs used per node: all of them when ``n_gpus`` fills whole nodes; all ``n_gpus`` on one node when
    they fit in one; on a rack-scale NVLink domain (GB200 NVL72: 18 trays of 4 GPUs), the fewest domains
    that hold them, filled equally in whole trays (64 GPUs of a rack; 128 as 2 x 64). None otherwise."""
    if n_gpus % node_gpus == 0:
        return node_gpus
    if n_gpus < node_gpus:
        return n_gpus
    if node_gpus > 8:
        # the fewest domains d >= n / node_gpus that split n_gpus into equal whole trays is the largest
        # multiple of 4 GPUs per domain, at most node_gpus, that divides n_gpus: at most node_gpus / 4 tries
        for per_domain in range(node_gpus - node_gpus % 4, 0, -4):
            if n_gpus % per_domain == 0:
                return per_domain
    return None


def _used_per_node(row: dict[str, str], node: str, node_gpus: int, n_gpus: int, notes: list[str]) -> int:
    """GPUs per node the row runs on: its ``gpus_per_node`` when smaller nodes of the same GPU (4-GPU
    A100/H100 nodes of many HPC centres), else ``_gpus_per_node``; every departure from the node profile
    named in ``notes``."""
    gpn = count(row, "gpus_per_node", notes)
    if gpn is not None and gpn < node_gpus <= 8 and n_gpus % gpn == 0:
        used: int | None = gpn
        notes.append(f"gpus_per_node {gpn}: nodes of {gpn} GPUs, as node profile {node} with {gpn} of its "
                     f"{node_gpus} GPUs and their NICs")
    else:
        if gpn is not None and gpn != node_gpus:
            notes.append(f"gpus_per_node {gpn}: the NVLink domain of node profile {node} is {node_gpus} GPUs"
                         + (f" ({gpn} is a compute tray's)" if node_gpus > 8 and node_gpus % gpn == 0 else ""))
        used = _gpus_per_node(n_gpus, node_gpus)
    if used is None:
        raise NotSimulatable("n_gpus", f"{n_gpus} is not a whole number of {node_gpus}-GPU nodes")
    if used != node_gpus and used != gpn:
        notes.append(f"n_gpus {n_gpus} on {node} nodes of {node_gpus}: {n_gpus // used} node(s) of {used} GPUs "
                     "each assumed" + (" (whole 4-GPU trays per NVLink domain)" if node_gpus > 8 else ""))
    return used


def _hardware(row: dict[str, str], gpu: str, node: str, node_gpus: int, n_gpus: int,
              notes: list[str]) -> dict[str, Any]:
    from simtrain.hardware.load import load_node

    hw: dict[str, Any] = {"node": node}
    if load_node(node).gpu.name != gpu:
        hw["gpu"] = gpu
    used = _used_per_node(row, node, node_gpus, n_gpus, notes)
    if used != node_gpus:
        hw["gpus_per_node"] = used
    hw["n_nodes"] = n_gpus // used
    inter = text(row, "inter_node")
    match = re.search(r"(\d+(?:\.\d+)?)\s*gb(?:it)?(?:p|/)s", inter)
    if match and "per node" in inter:
        hw["nic_Gbps"] = float(match.group(1)) / used
        hw["nics_per_node"] = used
        notes.append(f"inter_node {inter!r}: {used} NICs of {hw['nic_Gbps']:g} Gb/s per node assumed")
    elif match:
        hw["nic_Gbps"] = float(match.group(1))
    elif "omni-path" in inter or "opa" in inter:
        links = re.search(r"(\d+)\s*opa", inter)
        hw["nics_per_node"] = int(links.group(1)) if links else 4
        hw["nic_Gbps"] = 100.0  # Intel Omni-Path 100 Series: 100 Gb/s per port
        notes.append(f"inter_node {inter!r}: {hw['nics_per_node']} x 100 Gb/s Omni-Path ports, modelled as NICs")
    elif hw["n_nodes"] > 1:
        notes.append(f"inter_node not given: node profile {node} NICs")
    if "roce" in inter:
        notes.append("RoCE assumed to reach InfiniBand per-NIC bandwidth")
    return hw

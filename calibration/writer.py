"""Build the calibrated profile from the journal and write it atomically.

The layout of the file is documented in ``simtrain/hardware/profile.py`` (which reads it). Everything here is
derived from the journal, so rewriting the profile after more measurements (for example the
collectives of a later ``torchrun`` run) keeps what was measured before.
"""

from __future__ import annotations

import json
import statistics
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import yaml

from calibration.fit import fit_curve, fit_gemm
from calibration.insitu import in_situ_factor
from calibration.instep import expand
from calibration.shapes import Target, kernel_calls
from simtrain.engine.trace import write_atomic
from simtrain.hardware.calibrated import busbw_factor
from simtrain.hardware.profile import PROFILE_FILE, SCHEMA, SCHEMA_VERSION, parse_profile
from simtrain.spec.collective_kinds import CollectiveKind


def _ok(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [r for r in records if r["status"] == "ok" and r.get("stats", {}).get("median_s", 0) > 0]


def _stat_cols(r: dict[str, Any]) -> list[Any]:
    st = r.get("stats") or {}
    return [st.get("median_s"), st.get("p25_s"), st.get("p75_s"), st.get("repeats"), r["status"]]


STAT_COLUMNS = ["median_s", "p25_s", "p75_s", "repeats", "status"]
#: A normal distribution's inter-quartile range in standard deviations (2 x 0.6745)
IQR_PER_SIGMA = 1.349
#: Fewest pooled whole steps ``step_jitter`` takes a spread from (quartiles of fewer are mostly noise)
MIN_JITTER_STEPS = 8


def _tables(by_kind: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    """Every measurement, one table per kind."""
    t: dict[str, Any] = {}
    gemm = by_kind.get("gemm", [])
    t["gemm"] = {"columns": ["kernel", "role", "m", "n", "k", "parts", "round", *STAT_COLUMNS, "flops_per_s"],
                 "rows": [[r["params"][c] for c in ("kernel", "role", "m", "n", "k")]
                          + [r["params"].get("parts", []), r["params"].get("round", 0)] + _stat_cols(r)
                          + [_rate(r, "flops")] for r in gemm]}
    att_cols = ["b", "s_q", "s_kv", "heads", "kv_heads", "d", "causal", "backward"]
    t["attention"] = {"columns": [*att_cols, "round", *STAT_COLUMNS, "flops_per_s"],
                      "rows": [[r["params"][c] for c in att_cols] + [r["params"].get("round", 0)] + _stat_cols(r)
                               + [_rate(r, "flops")] for r in by_kind.get("attention", [])]}
    t["memory_ops"] = {"columns": ["op", "shape", "round", "sim_bytes", *STAT_COLUMNS],
                       "rows": [[r["params"]["op"], json.dumps({k: v for k, v in r["params"].items()
                                                                if k not in ("op", "round")}),
                                 r["params"].get("round", 0), r.get("sim_bytes")] + _stat_cols(r)
                                for r in by_kind.get("memory_op", [])]}
    t["optimizer"] = {"columns": ["layers", "tensors", "round", "sim_bytes", *STAT_COLUMNS],
                      "rows": [[r["params"]["layers"], len(r["params"]["params"]), r["params"].get("round", 0),
                                r.get("sim_bytes")] + _stat_cols(r) for r in by_kind.get("optimizer", [])]}
    t["copy"] = {"columns": ["bytes", *STAT_COLUMNS, "Bps"],
                 "rows": [[r["params"]["bytes"]] + _stat_cols(r) + [_rate(r, "moved_bytes")]
                          for r in by_kind.get("copy", [])]}
    t["launch"] = {"columns": STAT_COLUMNS, "rows": [_stat_cols(r) for r in by_kind.get("launch", [])]}
    t["collectives"] = {"columns": ["collective", "ranks", "nodes", "size_bytes", *STAT_COLUMNS, "algbw_Bps",
                                    "busbw_Bps"],
                        "rows": [_collective_row(r) for r in by_kind.get("collective", [])]}
    t["contention"] = {"columns": ["processes", "op_class", "solo_s", "concurrent_s", "factor"],
                       "rows": [[r["params"]["processes"], r["params"]["op_class"], r["result"]["solo_s"],
                                 r["result"]["concurrent_s"], r["result"]["factor"]]
                                for r in by_kind.get("contention", []) if r["status"] == "ok"]}
    t["interference"] = {"columns": ["ranks", "nodes", "comm_bytes", "gemm_s", "gemm_with_comm_s", "slowdown"],
                         "rows": [[r["params"]["ranks"], r["params"]["nodes"], r["params"]["comm_bytes"],
                                   r["result"]["gemm_s"], r["result"]["gemm_with_comm_s"], r["result"]["slowdown"]]
                                  for r in by_kind.get("interference", []) if r["status"] == "ok"]}
    mem_cols = ["saved_bytes", "activation_bytes", "peak_bytes", "reserved_bytes", "context_bytes"]
    t["layer_memory"] = {"columns": ["model", "tp", "seq_len", "micro_batch_size", *mem_cols],
                         "rows": [[r["params"][c] for c in ("model", "tp", "seq_len", "micro_batch_size")]
                                  + [r.get("result", {}).get(c) for c in mem_cols]
                                  for r in by_kind.get("layer_memory", []) if r["status"] == "ok"]}
    return t


def _rate(r: dict[str, Any], what: str) -> float | None:
    med = (r.get("stats") or {}).get("median_s")
    return float(r[what]) / med if r["status"] == "ok" and med and r.get(what) else None


def _collective_row(r: dict[str, Any]) -> list[Any]:
    p = r["params"]
    med = (r.get("stats") or {}).get("median_s")
    algbw = p["size_bytes"] / med if med and r["status"] == "ok" else None
    busbw = algbw * busbw_factor(CollectiveKind(p["collective"]), p["ranks"]) if algbw else None
    return [p["collective"], p["ranks"], p["nodes"], p["size_bytes"], *_stat_cols(r), algbw, busbw]


def _fits(by_kind: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    fits: dict[str, Any] = {}
    plain: dict[tuple[str, int, int, int], list[float]] = defaultdict(list)
    for r in _ok(by_kind.get("gemm", [])):
        if not r["params"].get("kernel"):  # composites (several Linears) are looked up, not fitted
            p = r["params"]
            plain[(p["role"], p["m"], p["n"], p["k"])].append(r["stats"]["median_s"])
    gemm = [{"role": r, "m": m, "n": n, "k": k, "median_s": statistics.median(ts)} for (r, m, n, k), ts in plain.items()]
    if gemm:
        fits["gemm"] = fit_gemm(gemm)
    att = _ok(by_kind.get("attention", []))
    curves = {d: [(r["flops"], r["stats"]["median_s"]) for r in att if r["params"]["backward"] == (d == "bwd")]
              for d in ("fwd", "bwd")}
    if any(curves.values()):
        fits["attention"] = {d: fit_curve(*zip(*pts, strict=True)) for d, pts in curves.items() if pts}
    ops: dict[str, list[tuple[float, float]]] = defaultdict(list)
    memory = [(r["params"]["op"], r) for r in _ok(by_kind.get("memory_op", []))]
    memory += [("optimizer.step", r) for r in _ok(by_kind.get("optimizer", []))]
    # a kernel timed inside training steps (calibration.instep) replaces its other timings at that size
    in_step = {(op, r["sim_bytes"]) for op, r in memory if r["params"].get("in_step")}
    for op, r in memory:
        if r["params"].get("in_step") or (op, r["sim_bytes"]) not in in_step:
            ops[op].append((r["sim_bytes"], r["stats"]["median_s"]))
    for r in _ok(by_kind.get("copy", [])):
        ops["copy"].append((r["moved_bytes"], r["stats"]["median_s"]))
    fits["memory_ops"] = {op: fit_curve(*zip(*pts, strict=True)) for op, pts in sorted(ops.items())}
    groups: dict[tuple[str, int, int], list[tuple[float, float]]] = defaultdict(list)
    for r in _ok(by_kind.get("collective", [])):
        p = r["params"]
        groups[(p["collective"], p["ranks"], p["nodes"])].append((p["size_bytes"], r["stats"]["median_s"]))
    fits["collectives"] = [{"collective": c, "ranks": p, "nodes": n, **fit_curve(*zip(*pts, strict=True))}
                           for (c, p, n), pts in sorted(groups.items())]
    return fits


def _best(records: list[dict[str, Any]], what: str) -> float | None:
    rates = [float(r[what]) / r["stats"]["median_s"] for r in _ok(records) if r.get(what)]
    return max(rates) if rates else None


def _slowest(records: list[dict[str, Any]], what: str) -> float | None:
    """The lower of the best rates per ``params.direction``."""
    rates: dict[str, float] = {}
    for r in _ok(records):
        if r.get(what):
            d = r["params"].get("direction", "")
            rates[d] = max(rates.get(d, 0.0), float(r[what]) / r["stats"]["median_s"])
    return min(rates.values()) if rates else None


def _summary(by_kind: dict[str, list[dict[str, Any]]], header: dict[str, Any]) -> dict[str, Any]:
    launch = _ok(by_kind.get("launch", []))
    att = _ok(by_kind.get("attention", []))
    mem = [r["sim_bytes"] / r["stats"]["median_s"] for r in _ok(by_kind.get("memory_op", []))]
    s: dict[str, Any] = {
        "peak_flops_per_s": _best(by_kind.get("gemm", []), "flops"),
        "memory_Bps": _best(by_kind.get("copy", []), "moved_bytes"),
        "launch_s": launch[-1]["stats"]["median_s"] if launch else None,
        "attention_fwd_flops_per_s": _best([r for r in att if not r["params"]["backward"]], "flops"),
        "attention_bwd_flops_per_s": _best([r for r in att if r["params"]["backward"]], "flops"),
        "memory_op_Bps": statistics.median(mem) if mem else None,
        # CPU activation offloading's copy rate: the slower direction (simtrain uses one rate both ways)
        "host_copy_Bps": _slowest(by_kind.get("host_copy", []), "moved_bytes"),
    }
    # per scope: the compute's slowdown beside a collective, and (journals since comm_in_situ) the reverse
    for key, field in (("comm_interference", "slowdown"), ("comm_in_situ", "comm_slowdown")):
        by_scope = {("inter" if r["params"]["nodes"] > 1 else "intra"): r["result"][field]
                    for r in by_kind.get("interference", []) if r["status"] == "ok" and field in r["result"]}
        if by_scope:
            s[key] = by_scope
    cont: dict[int, dict[str, float]] = defaultdict(dict)
    for r in by_kind.get("contention", []):
        if r["status"] == "ok":
            cont[int(r["params"]["processes"])][r["params"]["op_class"]] = r["result"]["factor"]
    if cont:
        s["contention"] = {p: dict(sorted(f.items())) for p, f in sorted(cont.items())}
    ctx = [r["result"].get("context_bytes") for r in by_kind.get("layer_memory", []) if r["status"] == "ok"]
    if ctx and ctx[-1]:
        s["context_bytes"] = ctx[-1]
    return s


def step_jitter(records: list[dict[str, Any]]) -> dict[str, float] | None:
    """``summary.step_jitter`` from the ok ``in_step`` records' whole steps (``instep_measure``: one
    record per round), each step over its round's median (a drift between rounds is not jitter) and
    pooled: ``cv`` = their inter-quartile range / 1.349 (the normal's; a robust standard deviation: one
    long step must not stand for the spread), ``median_s`` (the rounds' median), ``sigma_s`` = cv x
    median_s, ``steps``; None with fewer than ``MIN_JITTER_STEPS`` steps (journals before them)."""
    rounds = [r["result"]["step_s"] for r in records
              if r["kind"] == "in_step" and r["status"] == "ok" and r.get("result", {}).get("step_s")]
    medians = [statistics.median(xs) for xs in rounds]
    pooled = [x / m for xs, m in zip(rounds, medians, strict=True) if m > 0 for x in xs]
    if len(pooled) < MIN_JITTER_STEPS:
        return None
    q = statistics.quantiles(pooled, n=4, method="inclusive")
    cv = (q[2] - q[0]) / IQR_PER_SIGMA
    median = statistics.median(medians)
    return {"median_s": median, "sigma_s": cv * median, "cv": cv, "steps": len(pooled)}


def build_profile(name: str, header: dict[str, Any], records: list[dict[str, Any]]) -> dict[str, Any]:
    """The profile (see ``simtrain/hardware/profile.py``) from a journal's header and records."""
    by_kind: dict[str, list[dict[str, Any]]] = defaultdict(list)
    target = Target.from_header(header.get("calibrated_for") or {})
    for r in records:
        if r["kind"] == "in_step" and r["status"] == "ok" and target is not None:
            for e in expand(r, target, kernel_calls(target).memory_bytes):
                by_kind[e["kind"]].append(e)
        else:
            by_kind[r["kind"]].append(r)
    summary = _summary(by_kind, header)  # figures not measured (e.g. a collectives-only run) are null
    jitter = step_jitter(records)
    if jitter is not None:
        summary["step_jitter"] = jitter
    profile = {
        "schema": SCHEMA, "schema_version": SCHEMA_VERSION, "name": name,
        "created_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "device": header["device"], "software_stack": header.get("software_stack", "eager_hf"),
        "settings": header.get("settings", {}), "calibrated_for": header.get("calibrated_for", {}),
        "summary": summary, "fits": _fits(by_kind), "measurements": _tables(by_kind), "end_of_profile": True,
    }
    compute = parse_profile(profile, f"{name} (being written)").compute
    situ = in_situ_factor(target, records, compute)
    if situ is not None:
        summary["in_situ"] = situ["factor"]
        profile["measurements"]["layer_step"] = {"columns": ["measured_s", "kernels_s", "factor"],
                                                 "rows": [[situ["measured_s"], situ["kernels_s"], situ["factor"]]]}
    return profile


HEADER = """\
# simtrain calibrated hardware profile (schema: simtrain/hardware/profile.py). Written by `simtrain calibrate`
# and `python -m calibration.collectives` from the measurements in measurements.jsonl beside it;
# re-run the calibration rather than editing it. Units are in the key names (SI).
"""


def write_profile(folder: Path, profile: dict[str, Any]) -> Path:
    """Write ``profile`` to ``folder/profile.yaml`` atomically; returns the path."""
    text = yaml.safe_dump(profile, sort_keys=False, default_flow_style=None, width=140, allow_unicode=True)
    path = folder / PROFILE_FILE
    write_atomic(path, HEADER + text)
    return path

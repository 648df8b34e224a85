"""Fidelity: predict published training runs and say how far off the predictions are.

``validate_runs(path)`` reads a CSV of measured runs (the columns of ``validation/published_runs.csv``),
turns each row into a RunConfig (``simtrain.validation.csv_runs``), simulates it, and compares the predicted step
time (and peak memory, where the row has one) with the measured one. A row that cannot be simulated
becomes a row with its status (``not simulatable: <field>`` or ``error: <message>``); the run goes on.

Measured step time: the row's ``step_time_s``; else global batch tokens / tokens per second; else
the model FLOPs per step in the source's own convention / (TFLOP/s per GPU x GPUs) (named in the
row's assumptions). The source's MFU is recomputed from the predicted step time in the source's
FLOP convention (``convention_flops_per_token``) as a second opinion on the comparison.

This module imports pandas (reporting); the HTML report imports matplotlib (Agg) lazily.
"""

from __future__ import annotations

import base64
import html
import io
import itertools
import math
import re
import statistics
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor, as_completed
from pathlib import Path
from typing import Any

import pandas as pd

from simtrain.engine.results import AXES, StepResult
from simtrain.engine.steady import plan
from simtrain.lower.flops import attention_keys_per_query, model_flops_per_token
from simtrain.lower.layer_plan import microbatches
from simtrain.spec.errors import SimtrainError
from simtrain.spec.model import ModelSpec
from simtrain.studies.labels import layout_label
from simtrain.studies.uncertainty import band_for, error_rows, leave_one_out, read_error_table
from simtrain.validation.csv_cells import read_rows
from simtrain.validation.csv_runs import ParsedRow, parse_row

GiB = 1024.0**3

#: Row keys, in output order (the names the issue and README document).
ROW_KEYS = (
    "run_id", "source", "gpu_type", "n_gpus", "model", "layout", "stack", "stack_profiled", "moe", "visible", "status",
    "predicted_step_time_s", "measured_step_time_s", "step_time_error_pct", "likely_low_s", "likely_high_s",
    "predicted_tokens_per_s_per_gpu", "measured_tokens_per_s_per_gpu",
    "predicted_peak_mem_gib", "measured_peak_mem_gib", "peak_mem_error_pct", "predicted_fits",
    "predicted_compute_s", *(f"predicted_exposed_{a}_s" for a in AXES), "predicted_bubble_s", "predicted_stage_imbalance_s",
    "predicted_offload_s", "predicted_optimizer_s", "predicted_other_s", "predicted_mfu_pct",
    "mfu_convention", "source_mfu_pct", "predicted_mfu_pct_source_convention", "assumptions",
)


# ---- FLOP conventions of the sources (validation/README.md "FLOP-counting conventions") ----------

def _attention_term_per_token(model: ModelSpec, seq_len: int) -> float:
    """Forward attention FLOPs per token summed over layers, causal (simtrain's convention)."""
    return sum(2 * attention_keys_per_query(model, i, seq_len) * (model.d_head + model.v_head_dim) * model.n_heads
               for i in range(model.n_layers))


def convention_flops_per_token(convention: str, model: ModelSpec, seq_len: int) -> float:
    """Training FLOPs per token in a source's convention.

    - ``causal``: Megatron-LM ``num_floating_point_operations`` with causal attention (= simtrain's
      model FLOPs; Megatron-Bridge 25.x).
    - ``noncausal``: the same with the full s x s score term (NeMo 24.07, DGXC formula
      12Lh^2(1+g/a+s/h)+18Lfh+6Vh per token; Korthikanti's MFU; Megatron-LM README 2024).
    - ``sc21``: 96 l h^2 (1 + s/6h + V/16lh) per token, activation recompute included (Narayanan et al. 2021).
    - ``mpt``: 6N + 12 L d s per token (llm-foundry benchmarking README).
    - ``bloom``: 8 P per token (BigScience tr11 README; recompute counted, no attention term).
    """
    if convention == "causal":
        return model_flops_per_token(model, seq_len)
    if convention == "noncausal":
        return model_flops_per_token(model, seq_len) + 3.0 * _attention_term_per_token(model, seq_len)
    h, n_layers, v = model.hidden, model.n_layers, model.vocab
    if convention == "sc21":
        return 96.0 * n_layers * h * h * (1 + seq_len / (6 * h) + v / (16 * n_layers * h))
    if convention == "mpt":
        return 6.0 * model.param_count() + 12.0 * n_layers * h * seq_len
    if convention == "bloom":
        return 8.0 * model.param_count()
    raise ValueError(f"unknown FLOP convention {convention!r}")


_CONVENTIONS: tuple[tuple[str, str], ...] = (
    (r"96\s*\*?\s*b\s*\*?\s*s|narayanan", "sc21"),
    (r"6\s*\*\s*n\s*\*\s*s|mfu = \(6", "mpt"),
    (r"8\s*\*\s*p", "bloom"),
    (r"\bcausal\b(?!.*non)", "causal"),
    (r"s/h|nemo|dgxc|non-causal|noncausal|megatron model flops|attention-score", "noncausal"),
)


def convention_of(text: str | None) -> str | None:
    """The FLOP convention key a row's ``flop_convention``/``tflops_kind`` text describes (None if unknown)."""
    low = (text or "").lower()
    for pattern, key in _CONVENTIONS:
        if re.search(pattern, low):
            return key
    return None


def _measured_step_time(p: ParsedRow, row: dict[str, str], conv: str | None) -> float | None:
    """The measured step time, derived from throughput or TFLOP/s when the row does not give it."""
    from simtrain.validation.csv_cells import number

    if p.measured_step_time_s:
        return p.measured_step_time_s
    if p.run is None:
        return None
    tokens = p.run.train.global_batch_seqs_resolved * p.run.train.seq_len
    scratch: list[str] = []
    total = number(row, "tokens_per_s_total", scratch)
    if total:
        p.assumptions.append("measured step time = global batch tokens / tokens_per_s_total")
        return tokens / total
    if p.measured_tokens_per_s_per_gpu and p.n_gpus:
        p.assumptions.append("measured step time = global batch tokens / (tokens_per_s_per_gpu x n_gpus)")
        return tokens / (p.measured_tokens_per_s_per_gpu * p.n_gpus)
    tflops = number(row, "tflops_per_gpu", scratch)
    if tflops and conv and p.n_gpus:
        flops = convention_flops_per_token(conv, p.run.model, p.run.train.seq_len) * tokens
        p.assumptions.append(f"measured step time = model FLOPs ({conv} convention) / (tflops_per_gpu x n_gpus)")
        return flops / (tflops * 1e12 * p.n_gpus)
    return None


# ---- one row ------------------------------------------------------------------------------------

def _pct(pred: float | None, meas: float | None) -> float | None:
    if pred is None or meas is None or not meas or not math.isfinite(pred):
        return None
    return 100.0 * (pred - meas) / meas


def _source_mfu(p: ParsedRow, conv: str | None) -> float | None:
    """The utilisation the source reports in its convention (HFU-like conventions report % of peak as HFU)."""
    if conv in ("sc21",):
        return p.source_hfu_pct
    return p.source_mfu_pct


def simulate_row(row: dict[str, str], simulate_fn: Callable[..., StepResult] | None = None
                 ) -> tuple[ParsedRow, StepResult | None]:
    """One CSV row parsed (``parse_row``) and simulated: the StepResult (None when the row does not simulate),
    its ``notes`` led by the row's assumptions, and, for a framework with no stack profile, the likely range
    widened (``uncertainty.band_for(..., stack_profiled=False)``).

    Raises:
        SimtrainError: the row's config is valid but cannot be simulated (``evaluate_row`` reports it).
    """
    p = parse_row(row)
    return p, (None if p.run is None else _simulate_parsed(p, simulate_fn))


def _simulate_parsed(p: ParsedRow, simulate_fn: Callable[..., StepResult] | None) -> StepResult:
    """``simulate_row``'s StepResult of a parsed row that has a run."""
    from simtrain.studies.simulate import simulate

    assert p.run is not None
    result = (simulate_fn or simulate)(p.run)
    result.notes[:0] = [a for a in p.assumptions if a not in result.notes]
    if not p.stack_profiled:
        result.error_band = band_for(result.step_time_s, p.run.train.stack_name, p.run.model.is_moe, p.gpu_type,
                                     read_error_table(), stack_profiled=False)
    return result


def evaluate_row(row: dict[str, str], simulate_fn: Callable[..., StepResult] | None = None) -> dict[str, Any]:
    """Simulate one CSV row and compare it; never raises (failures become the row's ``status``)."""
    p = parse_row(row)
    conv = convention_of(p.flop_convention)
    out: dict[str, Any] = {k: None for k in ROW_KEYS}
    out.update(run_id=p.run_id, source=p.source, gpu_type=p.gpu_type, n_gpus=p.n_gpus, visible=p.visible,
               status=p.status, mfu_convention=conv, source_mfu_pct=_source_mfu(p, conv),
               stack=p.run.train.stack_name if p.run is not None else None, stack_profiled=p.stack_profiled,
               model=p.run.model.name if p.run is not None else (row.get("model") or None),
               layout=_layout_of(p, row),
               moe=p.run.model.is_moe if p.run is not None else None)
    if p.run is not None:
        try:
            out["measured_step_time_s"] = _measured_step_time(p, row, conv)
            result = _simulate_parsed(p, simulate_fn)
        except SimtrainError as exc:
            out["status"] = f"error: {exc}".splitlines()[0]
        except Exception as exc:  # noqa: BLE001 - a failing row is reported, the table goes on
            out["status"] = f"error: {type(exc).__name__}: {exc}".splitlines()[0]
        else:
            _fill_prediction(out, p, result, conv)
    elif p.measured_step_time_s:
        out["measured_step_time_s"] = p.measured_step_time_s
    out["measured_tokens_per_s_per_gpu"] = p.measured_tokens_per_s_per_gpu
    if p.measured_peak_mem_bytes:
        out["measured_peak_mem_gib"] = p.measured_peak_mem_bytes / GiB
    out["peak_mem_error_pct"] = _pct(out["predicted_peak_mem_gib"], out["measured_peak_mem_gib"])
    out["assumptions"] = list(p.assumptions) + _overflow_note(out)
    return out


def _layout_of(p: ParsedRow, row: dict[str, str]) -> str | None:
    """The row's layout label (``simtrain.studies.labels``): of its config, else of the CSV's degrees."""
    if p.run is not None:
        return layout_label(p.run.layout.model_dump(), micro_batch_size=p.run.train.micro_batch_size)
    cells = {k: int(row[c]) for k, c in (("tp", "tp"), ("cp", "cp"), ("ep", "ep"), ("pp", "pp"), ("vpp", "vp"),
                                          ("dp", "dp")) if (row.get(c) or "").strip().isdigit()}
    return layout_label(cells, micro_batch_size=row.get("micro_batch") or None) or None


def _overflow_note(out: dict[str, Any]) -> list[str]:
    """A note when the predicted peak does not fit the GPU: the measured run did, so the row leaves out
    something that saves memory, and its step time is predicted for a run that could not have happened."""
    if out["predicted_fits"] is not False:
        return []
    return [f"predicted peak {out['predicted_peak_mem_gib']:.1f} GiB does not fit the GPU: the measured run did, "
            "so the row leaves out something that saves memory (recompute, sequence parallelism, sharding, "
            "offload); the step time is for the layout as given"]


def _fill_prediction(out: dict[str, Any], p: ParsedRow, r: StepResult, conv: str | None) -> None:
    assert p.run is not None
    out["predicted_step_time_s"] = r.step_time_s
    if r.error_band is not None:
        out["likely_low_s"], out["likely_high_s"] = r.error_band.low_s, r.error_band.high_s
    out["predicted_tokens_per_s_per_gpu"] = r.tokens_per_s_per_gpu
    out["step_time_error_pct"] = _pct(r.step_time_s, out["measured_step_time_s"])
    if out["measured_tokens_per_s_per_gpu"] is None and out["measured_step_time_s"]:
        out["measured_tokens_per_s_per_gpu"] = r.global_batch_tokens / out["measured_step_time_s"] / r.n_gpus
    out["predicted_peak_mem_gib"] = max(m.peak_bytes for m in r.memory) / GiB
    out["predicted_fits"] = r.fits
    bd = r.breakdown_s
    out["predicted_compute_s"] = bd["compute"]
    for axis in AXES:
        out[f"predicted_exposed_{axis}_s"] = bd["exposed_comm"].get(axis, 0.0)
    out["predicted_bubble_s"] = bd["bubble"]
    out["predicted_stage_imbalance_s"] = bd["stage_imbalance"]
    out["predicted_offload_s"] = bd.get("offload", 0.0)
    out["predicted_optimizer_s"] = bd["optimizer"]
    out["predicted_other_s"] = bd["other"]
    out["predicted_mfu_pct"] = 100.0 * r.mfu
    if conv is not None:
        peak = (p.peak_tflops_used or 0.0) * 1e12 or _bf16_peak(p)
        flops = convention_flops_per_token(conv, p.run.model, p.run.train.seq_len) * r.global_batch_tokens
        out["predicted_mfu_pct_source_convention"] = 100.0 * flops / (r.step_time_s * r.n_gpus * peak)


def _bf16_peak(p: ParsedRow) -> float:
    from simtrain.hardware.load import load_gpu

    return load_gpu(p.gpu_type).bf16_flops_per_s


# ---- the table and its summary ------------------------------------------------------------------

def error_stats(errors: list[float]) -> dict[str, Any]:
    """Median, mean and 90th percentile of |error| in percent (nearest-rank p90), and the count."""
    vals = sorted(abs(e) for e in errors if e is not None and math.isfinite(e))
    if not vals:
        return {"count": 0, "median_abs_pct": None, "mean_abs_pct": None, "p90_abs_pct": None}
    p90 = vals[min(len(vals) - 1, max(0, math.ceil(0.9 * len(vals)) - 1))]
    return {"count": len(vals), "median_abs_pct": statistics.median(vals), "mean_abs_pct": statistics.fmean(vals),
            "p90_abs_pct": p90}


def summarize(rows: pd.DataFrame) -> dict[str, Any]:
    """The summary: counts, |step-time error| overall / visible rows / per source / per GPU, memory errors."""
    ok = rows[rows["status"] == "ok"]
    compared = ok[ok["step_time_error_pct"].notna()]

    def stats(frame: pd.DataFrame, col: str = "step_time_error_pct") -> dict[str, Any]:
        return error_stats([float(x) for x in frame[col].dropna()])

    return {
        "rows": len(rows),
        "simulated": len(ok),
        "compared": len(compared),
        "not_simulatable": int(rows["status"].str.startswith("not simulatable").sum()),
        "errors": int(rows["status"].str.startswith("error").sum()),
        "not_fitting": int((rows["predicted_fits"] == False).sum()),  # noqa: E712 - None (not simulated) excluded
        "step_time": stats(compared),
        "step_time_visible": stats(compared[compared["visible"]]),
        "by_source": {k: stats(g) for k, g in compared.groupby("source", sort=True)},
        "by_gpu": {k: stats(g) for k, g in compared.groupby("gpu_type", sort=True)},
        "peak_mem": stats(ok, "peak_mem_error_pct"),
        "likely_range": leave_one_out(error_rows(rows)),
    }


def work_estimate(row: dict[str, str]) -> float:
    """A row's relative simulation cost, to start the costly rows first (``validate_runs``): the
    micro-batches the engine runs (the steady state's three short runs when it applies,
    ``simtrain.engine.steady``) x layers, x 8 for MoE (its layers run several times the ops). Only an
    order: 0 for a row that does not parse to a run."""
    try:
        p = parse_row(row)
        if p.run is None:
            return 0.0
        run = p.run
        m = max(microbatches(run), 1)
        steady = plan(run.layout.resolved_schedule, run.layout.pp, m) if run.sim.steady_state else None
        if steady is not None:
            m = sum(itertools.islice(steady.counts(), 3))
        return float(m * run.model.n_layers * (8 if run.model.is_moe else 1))
    except Exception:  # noqa: BLE001 - an estimate only; evaluate_row reports the row's problem
        return 0.0


def validate_runs(path: str | Path, simulate_fn: Callable[..., StepResult] | None = None,
                  workers: int | None = 1, progress: bool = False,
                  select: Callable[[dict[str, str]], bool] | None = None) -> tuple[pd.DataFrame, dict[str, Any]]:
    """Predict every row of a runs CSV; return (one row per run with ``ROW_KEYS``, summary dict).

    ``workers``: rows simulated in that many local processes (None: the CPUs; 1: in this process, as
    with a custom ``simulate_fn``). The rows keep the file's order whatever the worker count.
    ``progress``: a bar with its ETA on stderr (``simtrain.studies.progress``), one unit per row.
    ``select``: only the CSV rows it accepts are simulated and tabled (e.g. ``csv_cells.is_visible``: the rows
    the accuracy targets and the error tables count); None: every row.

    Raises:
        ConfigError: the file is missing, unreadable, or lacks the ``run_id`` column.
    """
    from simtrain.studies.progress import progress_bar
    from simtrain.studies.sweep import default_workers

    cells = [r for r in read_rows(path) if select is None or select(r)]
    n = min(workers or default_workers(), max(len(cells), 1))
    rows: list[dict[str, Any]] = []
    with progress_bar("validating runs", len(cells), enabled=progress) as advance:
        if n <= 1 or simulate_fn is not None:
            for r in cells:
                rows.append(evaluate_row(r, simulate_fn))
                advance(1)
        else:
            # the costliest rows first (longest processing time first): the last rows to finish are then
            # short ones, instead of one worker simulating a big row while the others idle; the table
            # keeps the file's order (each row is simulated on its own, so its numbers do not depend on it)
            order = sorted(range(len(cells)), key=lambda i: -work_estimate(cells[i]))
            with ProcessPoolExecutor(max_workers=n) as pool:
                futures = {i: pool.submit(evaluate_row, cells[i]) for i in order}
                for _ in as_completed(futures.values()):
                    advance(1)
                rows = [futures[i].result() for i in range(len(cells))]
    frame = pd.DataFrame(rows, columns=list(ROW_KEYS))
    return frame, summarize(frame)


# ---- outputs ------------------------------------------------------------------------------------

def to_csv_text(frame: pd.DataFrame) -> str:
    """The rows as CSV text (assumptions joined with '; ')."""
    flat = frame.copy()
    flat["assumptions"] = flat["assumptions"].map(lambda a: "; ".join(a) if isinstance(a, list) else a)
    return flat.to_csv(index=False)


def to_json_dict(frame: pd.DataFrame, summary: dict[str, Any]) -> dict[str, Any]:
    """``{"summary": ..., "rows": [...]}`` with NaN as null."""
    records = frame.astype(object).where(frame.notna(), None).to_dict(orient="records")
    return {"summary": summary, "rows": records}


def _fmt(x: Any, spec: str = ".1f") -> str:
    return "-" if x is None or (isinstance(x, float) and not math.isfinite(x)) else format(x, spec)


def render_table(frame: pd.DataFrame, summary: dict[str, Any]) -> str:
    """Plain-text table of the rows and the summary."""
    lines = [f"{'run_id':<46}{'pred s':>10}{'meas s':>10}{'err %':>8}{'mem err %':>10}  status"]
    for r in frame.itertuples(index=False):
        lines.append(f"{str(r.run_id)[:45]:<46}{_fmt(r.predicted_step_time_s, '.3f'):>10}"
                     f"{_fmt(r.measured_step_time_s, '.3f'):>10}{_fmt(r.step_time_error_pct, '+.1f'):>8}"
                     f"{_fmt(r.peak_mem_error_pct, '+.1f'):>10}  {r.status}"
                     f"{' (predicted peak does not fit)' if r.predicted_fits is False else ''}")
    lines.append("")
    lines += render_summary(summary)
    return "\n".join(lines)


def render_summary(summary: dict[str, Any]) -> list[str]:
    """Summary lines: counts and |step-time error| statistics overall, visible, per source, per GPU."""
    def line(label: str, s: dict[str, Any]) -> str:
        return (f"  {label:<34}{s['count']:>4}  median {_fmt(s['median_abs_pct'])} %  mean {_fmt(s['mean_abs_pct'])} %"
                f"  p90 {_fmt(s['p90_abs_pct'])} %")

    out = [f"{summary['rows']} rows: {summary['simulated']} simulated, {summary['compared']} compared with a "
           f"measured step time, {summary['not_simulatable']} not simulatable, {summary['errors']} errors; "
           f"{summary['not_fitting']} predicted not to fit their GPUs (see assumptions)",
           "|step-time error|:", line("all compared rows", summary["step_time"]),
           line("visible (simulatable yes/mostly)", summary["step_time_visible"]), "by source:"]
    out += [line(k, v) for k, v in summary["by_source"].items()]
    out.append("by GPU:")
    out += [line(k, v) for k, v in summary["by_gpu"].items()]
    out.append("|peak-memory error|:")
    out.append(line("rows with a measured peak", summary["peak_mem"]))
    lr = summary["likely_range"]
    if lr["runs"]:
        out.append(f"likely range (simtrain.studies.uncertainty), each visible run left out of its own: held {lr['held']} "
                   f"of {lr['runs']} ({lr['held_pct']:.0f} %), promised {lr['promised_pct']:.0f} % on average")
    return out


def _plot_png(frame: pd.DataFrame) -> bytes:
    """Predicted vs measured step time (log-log, one colour per source) as PNG bytes."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ok = frame[frame["step_time_error_pct"].notna()]
    fig, ax = plt.subplots(figsize=(7, 6), dpi=100)
    for source, g in ok.groupby("source", sort=True):
        ax.scatter(g["measured_step_time_s"], g["predicted_step_time_s"], label=str(source), s=22)
    if len(ok):
        lo = float(min(ok["measured_step_time_s"].min(), ok["predicted_step_time_s"].min())) * 0.8
        hi = float(max(ok["measured_step_time_s"].max(), ok["predicted_step_time_s"].max())) * 1.25
        ax.plot([lo, hi], [lo, hi], "k-", lw=1)
        ax.plot([lo, hi], [lo * 1.15, hi * 1.15], "k:", lw=0.8)
        ax.plot([lo, hi], [lo / 1.15, hi / 1.15], "k:", lw=0.8)
        ax.set_xscale("log")
        ax.set_yscale("log")
    ax.set_xlabel("measured step time (s)")
    ax.set_ylabel("predicted step time (s)")
    ax.set_title("simtrain vs published runs (dotted: +/-15 %)")
    ax.legend(fontsize=7, loc="upper left")
    buf = io.BytesIO()
    fig.savefig(buf, format="png", bbox_inches="tight")
    plt.close(fig)
    return buf.getvalue()


#: The fidelity page's table: (row key, header, format; "" for text), the columns a reader needs.
PAGE_COLUMNS: tuple[tuple[str, str, str], ...] = (
    ("run_id", "run", ""), ("source", "source", ""), ("gpu_type", "GPU", ""), ("n_gpus", "GPUs", ".0f"),
    ("model", "model", ""), ("layout", "layout", ""), ("stack", "stack", ""),
    ("measured_step_time_s", "measured step s", ".3f"), ("predicted_step_time_s", "predicted step s", ".3f"),
    ("step_time_error_pct", "step error %", "+.1f"), ("measured_peak_mem_gib", "measured peak GiB", ".1f"),
    ("predicted_peak_mem_gib", "predicted peak GiB", ".1f"), ("peak_mem_error_pct", "memory error %", "+.1f"),
    ("source_mfu_pct", "source MFU %", ".1f"), ("predicted_mfu_pct_source_convention", "predicted MFU %", ".1f"),
    ("status", "status", ""),
)

# Sorts a table.sortable by the clicked column (again: the other way), by each cell's data-v, numbers as
# numbers; cells without a value stay last whichever way. Plain DOM, no library: the page is offline.
_SORT_JS = """
document.querySelectorAll('table.sortable th').forEach(function (th, col) {
  th.addEventListener('click', function () {
    var table = th.closest('table'), body = table.tBodies[0];
    var asc = th.getAttribute('aria-sort') !== 'ascending';
    table.querySelectorAll('th').forEach(function (h) { h.removeAttribute('aria-sort'); });
    th.setAttribute('aria-sort', asc ? 'ascending' : 'descending');
    var rows = Array.prototype.slice.call(body.rows);
    rows.sort(function (a, b) {
      var x = a.cells[col].getAttribute('data-v'), y = b.cells[col].getAttribute('data-v');
      if (x === y) return 0;
      if (x === '') return 1;
      if (y === '') return -1;
      var nx = Number(x), ny = Number(y);
      var c = (isNaN(nx) || isNaN(ny)) ? x.localeCompare(y) : nx - ny;
      return asc ? c : -c;
    });
    rows.forEach(function (r) { body.appendChild(r); });
  });
});
"""


def _cell(value: Any, fmt: str) -> tuple[str, str]:
    """(sort key, shown text) of a table cell; ('', '-') when empty. Numbers are formatted as floats: a
    column with an empty cell (a GPU count a row lacks) comes out of pandas as floats."""
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "", "-"
    if fmt:
        return repr(float(value)), format(float(value), fmt)
    return str(value), str(value)


def page_table(frame: pd.DataFrame) -> str:
    """The fidelity page's sortable table (``PAGE_COLUMNS``): one row per run, a run predicted not to
    fit its GPU flagged in its status."""
    head = "".join(f"<th title='click to sort'>{html.escape(h)}</th>" for _, h, _ in PAGE_COLUMNS)
    body = []
    for rec in frame.astype(object).where(frame.notna(), None).to_dict(orient="records"):
        cells = []
        for key, _, fmt in PAGE_COLUMNS:
            sort, text = _cell(rec.get(key), fmt)
            if key == "status" and rec.get("predicted_fits") is False:
                text += " (predicted peak does not fit)"
            cells.append(f"<td data-v='{html.escape(sort, quote=True)}'>{html.escape(text)}</td>")
        body.append(f"<tr>{''.join(cells)}</tr>")
    return (f"<table class='sortable'><thead><tr>{head}</tr></thead><tbody>\n" + "\n".join(body)
            + "\n</tbody></table>")


def render_html(frame: pd.DataFrame, summary: dict[str, Any]) -> str:
    """A self-contained HTML page: summary, predicted-vs-measured plot (inline PNG), and a table of the
    columns a reader needs, sortable by clicking a header (inline script). Every column, assumptions
    included, is in ``validate --out``'s CSV."""
    png = base64.b64encode(_plot_png(frame)).decode("ascii")
    summary_text = html.escape("\n".join(render_summary(summary)))
    return ("<!DOCTYPE html>\n<html lang='en'><head><meta charset='utf-8'><title>simtrain fidelity</title>"
            "<style>body{font-family:sans-serif;margin:2em;color:#222} table{border-collapse:collapse;font-size:12px}"
            "td,th{border:1px solid #ccc;padding:2px 6px;vertical-align:top;text-align:right}"
            "td:nth-child(-n+7),td:last-child{text-align:left} th{background:#f0f0f0;cursor:pointer}"
            "th[aria-sort=ascending]::after{content:' \\25B2'} th[aria-sort=descending]::after{content:' \\25BC'}"
            "</style></head><body>"
            "<h1>simtrain: predicted vs measured training runs</h1>"
            f"<pre>{summary_text}</pre><img alt='predicted vs measured step time' "
            f"src='data:image/png;base64,{png}'/><h2>Runs</h2>"
            "<p>Errors are (predicted - measured) / measured. Click a header to sort. Every column (the "
            "step-time breakdown, the assumptions behind each row) is in the CSV of <code>simtrain validate "
            "--out</code>.</p>"
            f"{page_table(frame)}<script>{_SORT_JS}</script></body></html>\n")

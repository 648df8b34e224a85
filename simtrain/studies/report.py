"""Reports of a sweep/search/what-if table: self-contained HTML with plots, Markdown and CSV tables.

``write_report(df, html="report.html", md="report.md", csv="best.csv")``. The HTML needs no network:
every plot is a PNG drawn with matplotlib's Agg canvas (no pyplot, no global state) and inlined as a
base64 ``data:`` URI, styles are inline, and there is no script. Plots, each drawn only when the
table has the columns it needs:

- ``fig-mfu-tp-pp``: best MFU over TP x PP (layouts that fit);
- ``fig-mfu-study``: best MFU per model and GPU count (a study over models and cluster sizes);
- ``fig-step-breakdown``: where the step time goes for the best layouts;
- ``fig-memory-stages``: the best layout's peak memory per pipeline stage by component;
- ``fig-memory-timeline``: the best layout's memory over one step, per stage;
- ``fig-time-vs-batch``: time to train (and to the target loss, from the convergence model) against
  the global batch.
"""

from __future__ import annotations

import base64
import html
import io
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from simtrain.spec.errors import ConfigError, Problem
from simtrain.studies.labels import layout_label

if TYPE_CHECKING:
    import pandas as pd
    from matplotlib.figure import Figure

GiB = 1024.0**3
S_PER_HOUR = 3600.0
BREAKDOWN = (("compute_s", "compute"), ("bubble_s", "bubble"), ("stage_imbalance_s", "stage imbalance"),
             ("exposed_tp_s", "exposed TP"),
             ("exposed_cp_s", "exposed CP"), ("exposed_ep_s", "exposed EP"), ("exposed_dp_s", "exposed DP"),
             ("exposed_pp_s", "exposed PP"), ("offload_s", "CPU offload waits"), ("optimizer_s", "optimizer"),
             ("other_s", "other"), ("sync_wait_s", "wait for the slowest rank"))
MEMORY_PARTS = ("weights", "grads", "optimizer", "fp8_weights", "activations", "comm_buffers", "pp_buffers",
                "workspace", "context", "fragmentation")
TABLE_ROWS = 20
RESULT_COLUMNS = ("step_time_s", "mfu", "time_to_train_s", "time_to_target_s")
"""A table to report on has at least one of these (sweep, search, run --out and what-if tables do)."""


@dataclass(frozen=True, slots=True)
class Plot:
    """One figure of the report: an id (HTML anchor), a title, a caption and the PNG bytes."""

    id: str
    title: str
    caption: str
    png: bytes


# -- selecting rows ---------------------------------------------------------------------------------
def ok_rows(df: pd.DataFrame) -> pd.DataFrame:
    """Rows without an error that fit in memory (all rows without error if there is no ``fits``)."""
    out = df
    if "error" in out:
        out = out[out["error"].isna()]
    if "fits" in out:
        out = out[_fits(out)]
    return out


def _fits(df: pd.DataFrame) -> pd.Series:
    """The ``fits`` column as booleans, an empty cell (a layout not simulated) as False."""
    return df["fits"].map(lambda v: v is not None and v == v and bool(v)).astype(bool)


def best_row(df: pd.DataFrame) -> pd.Series | None:
    """The fitting row with the highest MFU (or the shortest step), or None."""
    ok = ok_rows(df)
    if ok.empty:
        return None
    if "mfu" in ok and ok["mfu"].notna().any():
        return ok.iloc[int(ok["mfu"].astype(float).fillna(-1.0).to_numpy().argmax())]
    if "step_time_s" in ok and ok["step_time_s"].notna().any():
        return ok.iloc[int(ok["step_time_s"].astype(float).fillna(float("inf")).to_numpy().argmin())]
    return ok.iloc[0]


def _get(row: Any, key: str, default: Any = None) -> Any:
    value = row.get(key, default) if hasattr(row, "get") else default
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return default
    return value


def label(row: Any, with_model: bool = False) -> str:
    """Short layout label of a row with every parallel axis (``simtrain.studies.labels``): tp cp (ep etp) pp
    vpp dp, ZeRO or FSDP, micro-batch, recompute or CPU offload, schedule (and model x GPUs)."""
    parts = []
    if with_model and _get(row, "model.name"):
        parts.append(f"{_get(row, 'model.name')} x{_get(row, 'n_gpus', '?')}")
    values = row if hasattr(row, "get") else {}
    lay = layout_label(values, prefix="layout.", micro_batch_size=_get(row, "train.micro_batch_size"))
    if lay:
        parts.append(lay)
    return " ".join(parts) or f"point {_get(row, 'point', '?')}"


def check_table(df: pd.DataFrame, source: str = "table") -> None:
    """Raise unless ``df`` has rows and a result column to report on.

    Raises:
        ConfigError: at ``source`` (the file): no rows, or none of ``RESULT_COLUMNS``.
    """
    if not any(c in df.columns for c in RESULT_COLUMNS):
        raise ConfigError(Problem(source, f"no result column: it needs one of {', '.join(RESULT_COLUMNS)} "
                                          f"(it has {', '.join(map(str, df.columns)) or 'none'}); report reads the "
                                          "tables sweep, search and run --out write"))
    if df.empty:
        raise ConfigError(Problem(source, "the table has a header but no rows: nothing to report"))
    bad = _bad_number_cells(df, source)
    if bad:
        raise ConfigError(bad)


def _numeric_columns() -> tuple[str, ...]:
    """The columns the report does arithmetic on (scales, sums, plots, sorts): each cell must be a finite
    number or empty. Text columns (``model.name``, ``error``, ``reason``, ``memory_json``) are free."""
    cols = [c for c, _, scale, _ in _SUMMARY if scale is not None]
    cols += [c for c, _ in BREAKDOWN]
    cols += ["capacity_bytes", "est_peak_memory_bytes", "deepseek_b_opt_tokens", "model.params", "layout.tp",
             "layout.pp", "layout.dp", "layout.cp", "layout.ep", "layout.etp", "layout.vpp",
             "train.micro_batch_size"]
    return tuple(dict.fromkeys(cols))


_MAX_BAD_CELLS = 10
"""At most this many bad cells are listed in one refusal (a garbage file would list them all)."""


def _bad_number_cells(df: pd.DataFrame, source: str) -> list[Problem]:
    """One problem per cell of a numeric column that is neither empty nor a finite number (text such as
    ``true`` or ``{}``, ``inf``, ``1e400`` which overflows to inf); rows are numbered from 1 after the
    header, as a spreadsheet shows them minus the header line."""
    out: list[Problem] = []
    for col in _numeric_columns():
        if col not in df.columns:
            continue
        for i, v in enumerate(df[col].tolist(), start=1):
            if v is None or (isinstance(v, str) and not v.strip()):
                continue
            try:
                x = math.nan if isinstance(v, bool) else float(v)
                ok = not isinstance(v, bool) and (math.isfinite(x) or math.isnan(x) and not isinstance(v, str))
            except (TypeError, ValueError, OverflowError):
                ok = False
            if not ok:
                out.append(Problem(f"{source}: column {col!r}, row {i}",
                                   f"{v!r} is not a finite number; the cell must be a number (or empty)"))
                if len(out) >= _MAX_BAD_CELLS:
                    return out
    return out


# -- plots ------------------------------------------------------------------------------------------
def _figure(width_in: float = 7.5, height_in: float = 4.2) -> Figure:
    from matplotlib.figure import Figure

    return Figure(figsize=(width_in, height_in), dpi=100, layout="constrained")


def _png(fig: Figure) -> bytes:
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    FigureCanvasAgg(fig)
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    return buf.getvalue()


def _heatmap(table: pd.DataFrame, xlabel: str, ylabel: str, title: str) -> Figure:
    fig = _figure(max(4.5, 1.1 * len(table.columns) + 2.5), max(3.0, 0.6 * len(table.index) + 1.8))
    ax = fig.add_subplot()
    values = table.to_numpy(dtype=float)
    im = ax.imshow(values, cmap="viridis", aspect="auto", origin="lower")
    ax.set_xticks(range(len(table.columns)), [str(c) for c in table.columns])
    ax.set_yticks(range(len(table.index)), [str(i) for i in table.index])
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    for (i, j), v in ((ij, values[ij]) for ij in ((i, j) for i in range(values.shape[0])
                                                    for j in range(values.shape[1]))):
        ax.text(j, i, "-" if math.isnan(v) else f"{100 * v:.1f}", ha="center", va="center",
                color="white" if math.isnan(v) or v < float(table.max().max()) * 0.7 else "black", fontsize=9)
    fig.colorbar(im, ax=ax, label="MFU")
    return fig


def plot_mfu_tp_pp(df: pd.DataFrame) -> Plot | None:
    """Best MFU (%) over TP x PP among the fitting rows."""
    ok = ok_rows(df)
    if not {"layout.tp", "layout.pp", "mfu"} <= set(ok.columns) or ok.empty:
        return None
    table = ok.pivot_table(index="layout.pp", columns="layout.tp", values="mfu", aggfunc="max")
    fig = _heatmap(table, "tensor parallel (TP)", "pipeline parallel (PP)", "best MFU (%) over TP x PP")
    return Plot("fig-mfu-tp-pp", "MFU over TP x PP", "Best model-FLOPs utilisation (%) of the layouts that fit, "
                "for each TP and PP degree (other knobs at their best); '-' = none fits or none tried.", _png(fig))


def plot_mfu_study(df: pd.DataFrame) -> Plot | None:
    """Best MFU per model and GPU count (an Ultra-Scale-Playbook-style study)."""
    ok = ok_rows(df)
    if not {"model.name", "n_gpus", "mfu"} <= set(ok.columns) or ok.empty:
        return None
    if ok["model.name"].nunique() < 2 and ok["n_gpus"].nunique() < 2:
        return None
    order = ok.groupby("model.name")["model.params"].max().sort_values() if "model.params" in ok else None
    table = ok.pivot_table(index="model.name", columns="n_gpus", values="mfu", aggfunc="max")
    if order is not None:
        table = table.reindex(order.index)
    fig = _heatmap(table, "GPUs", "model", "best MFU (%) per model and cluster size")
    return Plot("fig-mfu-study", "Best MFU per model and cluster size", "The best layout's MFU (%) found for each "
                "model and GPU count; '-' = no layout fits.", _png(fig))


def plot_step_breakdown(df: pd.DataFrame, n: int = 10) -> Plot | None:
    """Stacked step-time breakdown of the ``n`` best fitting rows."""
    ok = ok_rows(df)
    if "step_time_s" not in ok or "compute_s" not in ok or ok.empty:
        return None
    top = ok.sort_values("mfu" if "mfu" in ok else "step_time_s", ascending="mfu" not in ok).head(n)
    many_models = "model.name" in ok and ok["model.name"].nunique() > 1
    fig = _figure(8.5, max(2.5, 0.42 * len(top) + 1.6))
    ax = fig.add_subplot()
    left = [0.0] * len(top)
    ys = list(range(len(top)))[::-1]
    for col, name in BREAKDOWN:
        if col not in top:
            continue
        vals = [float(v) if v == v else 0.0 for v in top[col]]
        if not any(vals):
            continue
        ax.barh(ys, vals, left=left, label=name)
        left = [a + b for a, b in zip(left, vals, strict=True)]
    ax.set_yticks(ys, [label(r, many_models) for _, r in top.iterrows()], fontsize=8)
    ax.set_xlabel("seconds per step (critical rank)")
    ax.set_title("step-time breakdown of the best layouts")
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    return Plot("fig-step-breakdown", "Step-time breakdown", "Where each step's time goes on the critical rank, for "
                "the best layouts (highest MFU first): compute, pipeline bubble, exposed communication per axis, "
                "optimizer.", _png(fig))


def _memory(row: Any) -> list[dict[str, Any]] | None:
    raw = _get(row, "memory_json")
    if not raw:
        return None
    try:
        out = json.loads(raw)
    except (TypeError, ValueError):
        return None
    return out if isinstance(out, list) and out else None


def plot_memory_stages(best: Any) -> Plot | None:
    """The best row's peak memory per pipeline stage, stacked by component, with the HBM capacity."""
    stages = _memory(best) if best is not None else None
    if not stages:
        return None
    fig = _figure(max(5.0, 0.35 * len(stages) + 4.0), 4.2)
    ax = fig.add_subplot()
    xs = [s["stage"] for s in stages]
    bottom = [0.0] * len(stages)
    for part in MEMORY_PARTS:
        vals = [s["components"].get(part, 0.0) / GiB for s in stages]
        if any(vals):
            ax.bar(xs, vals, bottom=bottom, label=part)
            bottom = [a + b for a, b in zip(bottom, vals, strict=True)]
    ax.axhline(stages[0]["capacity_bytes"] / GiB, color="red", linestyle="--", label="HBM capacity")
    ax.set_xticks(xs, [str(x) for x in xs])
    ax.set_xlabel("pipeline stage")
    ax.set_ylabel("GiB at the stage's peak")
    ax.set_title(f"memory per stage: {label(best)}")
    ax.legend(fontsize=7, ncol=3, loc="upper right")
    return Plot("fig-memory-stages", "Memory breakdown per stage", "Peak memory of each pipeline stage of the best "
                "layout, by what is held at that peak (bytes from the simulated allocation ledger).", _png(fig))


def plot_memory_timeline(best: Any) -> Plot | None:
    """The best row's allocated memory over one step, one line per stage."""
    stages = _memory(best) if best is not None else None
    if not stages or not any(s.get("timeline") for s in stages):
        return None
    fig = _figure(8.0, 4.2)
    ax = fig.add_subplot()
    for s in stages[:16]:
        pts = s.get("timeline") or []
        if pts:
            ax.step([p[0] for p in pts], [p[1] / GiB for p in pts], where="post", label=f"stage {s['stage']}",
                    linewidth=1.2)
    ax.axhline(stages[0]["capacity_bytes"] / GiB, color="red", linestyle="--", label="HBM capacity")
    ax.set_xlabel("time in the step (s)")
    ax.set_ylabel("allocated GiB")
    ax.set_title(f"memory over one step: {label(best)}")
    ax.legend(fontsize=7, ncol=2)
    return Plot("fig-memory-timeline", "Memory timeline of a step", "Allocated memory of each stage's busiest rank "
                "over one simulated step of the best layout (highest level per time bin).", _png(fig))


def plot_time_vs_batch(df: pd.DataFrame) -> Plot | None:
    """Time to train (fixed tokens) and to the target loss (convergence model) against the batch."""
    ok = df[df["error"].isna()] if "error" in df else df
    bcol = next((c for c in ("global_batch_tokens", "train.global_batch_tokens") if c in ok
                 and ok[c].nunique() >= 2), None)
    ycols = [c for c in ("time_to_train_s", "time_to_target_s") if c in ok]
    if bcol is None or not ycols:
        return None
    ok = ok[ok[bcol].notna()]
    fig = _figure(7.5, 4.2)
    ax = fig.add_subplot()
    names = {"time_to_train_s": "time to train the token budget", "time_to_target_s":
             "time to the target loss (McCandlish et al. 2018 model)"}
    for col in ycols:
        series = ok.groupby(bcol)[col].min().dropna()
        if not series.empty:
            ax.plot(series.index.astype(float) / 1e6, series.to_numpy(dtype=float) / S_PER_HOUR, marker="o",
                    label=names[col])
    if "deepseek_b_opt_tokens" in ok and ok["deepseek_b_opt_tokens"].notna().any():
        ax.axvline(float(ok["deepseek_b_opt_tokens"].dropna().iloc[0]) / 1e6, color="grey", linestyle=":",
                   label="DeepSeek LLM B_opt (fit)")
    ax.set_xscale("log")
    ax.set_xlabel("global batch (M tokens)")
    ax.set_ylabel("hours")
    ax.set_title("time to train against batch size")
    ax.legend(fontsize=8)
    return Plot("fig-time-vs-batch", "Time to train against batch size", "Wall-clock time of the run at each global "
                "batch (best layout per batch). Time to a target loss comes from an empirical model, not from the "
                "simulation (McCandlish et al. 2018; see simtrain.studies.convergence for its assumptions).", _png(fig))


def plots(df: pd.DataFrame) -> list[Plot]:
    """Every plot the table has the data for."""
    best = best_row(df)
    candidates = [plot_mfu_tp_pp(df), plot_mfu_study(df), plot_step_breakdown(df), plot_memory_stages(best),
                  plot_memory_timeline(best), plot_time_vs_batch(df)]
    return [p for p in candidates if p is not None]


# -- tables -----------------------------------------------------------------------------------------
# (column, header, scale or None to copy, decimals) of the best-layouts table
_SUMMARY: tuple[tuple[str, str, float | None, int], ...] = (
    ("n_gpus", "GPUs", 1.0, 0), ("global_batch_tokens", "batch tokens", 1.0, 0),
    ("train.global_batch_tokens", "batch tokens", 1.0, 0), ("step_time_s", "step s", 1.0, 4),
    ("step_time_low_s", "likely from s", 1.0, 4), ("step_time_high_s", "likely to s", 1.0, 4),
    ("mfu", "MFU %", 100.0, 2), ("tokens_per_s_per_gpu", "tokens/s/GPU", 1.0, 0),
    ("peak_memory_bytes", "peak GiB", 1 / GiB, 2), ("time_to_train_s", "time to train h", 1 / S_PER_HOUR, 1),
    ("time_to_target_s", "time to target h", 1 / S_PER_HOUR, 1), ("gpu_hours", "GPU-hours", 1.0, 0),
    ("cost", "cost", 1.0, 0), ("reason", "why", None, 0))


def summary_table(df: pd.DataFrame, n: int = TABLE_ROWS) -> pd.DataFrame:
    """The best ``n`` fitting rows (highest MFU first) with the columns people read."""
    import pandas as pd

    ok = ok_rows(df)
    if "mfu" in ok:
        ok = ok.sort_values("mfu", ascending=False)
    many = "model.name" in ok and ok["model.name"].nunique() > 1
    rows = []
    for _, r in ok.head(n).iterrows():
        row: dict[str, Any] = {"layout": label(r, many)}
        for col, name, scale, digits in _SUMMARY:
            v = _get(r, col)
            if v is None or name in row:
                continue
            if scale is None:
                row[name] = v
            else:
                x = float(v) * scale
                row[name] = int(round(x)) if digits == 0 else round(x, digits)
        rows.append(row)
    return pd.DataFrame(rows)


def not_fitting_table(df: pd.DataFrame, n: int = 10) -> pd.DataFrame:
    """The ``n`` rows whose peak memory is over capacity by the least: layout, peak GiB, and how far over
    (GiB and % of the capacity). The peak is the simulated one, else the search's closed-form estimate
    (``est_peak_memory_bytes``); rows without both a peak and a capacity are left out."""
    import pandas as pd

    if "capacity_bytes" not in df or not ({"peak_memory_bytes", "est_peak_memory_bytes"} & set(df.columns)):
        return pd.DataFrame()
    ok = df[df["error"].isna()] if "error" in df else df
    peak = ok["peak_memory_bytes"] if "peak_memory_bytes" in ok else pd.Series(float("nan"), index=ok.index)
    if "est_peak_memory_bytes" in ok:
        peak = peak.fillna(ok["est_peak_memory_bytes"])
    cap = ok["capacity_bytes"].astype(float)
    over = (peak.astype(float) - cap)
    rows = ok[over > 0].assign(_over=over[over > 0], _peak=peak[over > 0], _cap=cap[over > 0])
    many = "model.name" in ok and ok["model.name"].nunique() > 1
    return pd.DataFrame([{"layout": label(r, many), "peak GiB": round(r["_peak"] / GiB, 1),
                          "capacity GiB": round(r["_cap"] / GiB, 1), "over GiB": round(r["_over"] / GiB, 1),
                          "over %": round(100.0 * r["_over"] / r["_cap"], 1)}
                         for _, r in rows.sort_values("_over").head(n).iterrows()])


def markdown_table(df: pd.DataFrame) -> str:
    """A GitHub-flavoured Markdown table (no extra dependency)."""
    if df.empty:
        return "_no rows_\n"
    cols = list(df.columns)
    lines = ["| " + " | ".join(cols) + " |", "|" + "|".join("---" for _ in cols) + "|"]
    for _, r in df.iterrows():
        lines.append("| " + " | ".join("" if _get(r, c) is None else str(r[c]).replace("|", "/") for c in cols) + " |")
    return "\n".join(lines) + "\n"


def counts(df: pd.DataFrame) -> dict[str, int]:
    """Rows by outcome: ``simulated`` (a step time, no error) split into ``fit`` and ``do_not_fit``,
    ``failed`` (an error), and for a search table ``pruned_memory`` (over HBM by the closed form, not
    simulated) and ``estimated_only`` (fit by the estimate, not simulated)."""
    import pandas as pd

    failed = df["error"].notna() if "error" in df else pd.Series(False, index=df.index)
    simulated = ~failed & (df["step_time_s"].notna() if "step_time_s" in df else True)
    fits = _fits(df) if "fits" in df else simulated
    out = {"rows": len(df), "simulated": int(simulated.sum()), "fit": int((simulated & fits).sum()),
           "do_not_fit": int((simulated & ~fits).sum()), "failed": int(failed.sum())}
    if "status" in df:  # a search table: what became of the layouts that were not simulated
        status = df["status"].astype(str)
        out["pruned_memory"] = int(((status == "memory") & ~simulated).sum())
        out["estimated_only"] = int((status == "estimated").sum())
        out["dominated"] = int((status == "dominated").sum())
    return out


def _counts(df: pd.DataFrame) -> str:
    c = counts(df)
    text = (f"{c['rows']} rows: {c['simulated']} simulated ({c['fit']} fit, {c['do_not_fit']} do not fit in memory), "
            f"{c['failed']} failed")
    if "pruned_memory" in c:
        text += (f"; not simulated: {c['pruned_memory']} pruned for memory, {c['dominated']} dominated, "
                 f"{c['estimated_only']} estimated only")
    return text


# -- documents --------------------------------------------------------------------------------------
_CSS = ("body{font-family:sans-serif;margin:2em;max-width:1100px;color:#222}"
        "table{border-collapse:collapse;font-size:13px}td,th{border:1px solid #ccc;padding:3px 6px;text-align:right}"
        "th{background:#f0f0f0}td:first-child{text-align:left}figure{margin:1.5em 0}"
        "figcaption{font-size:13px;color:#555;max-width:850px}img{max-width:100%;border:1px solid #eee}")


def render_html(df: pd.DataFrame, title: str = "simtrain report", source: str = "") -> str:
    """The self-contained HTML report (inline PNG plots, inline CSS, no script, no network)."""
    figs = plots(df)
    parts = [f"<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'><title>{html.escape(title)}</title>",
             f"<style>{_CSS}</style></head><body>", f"<h1>{html.escape(title)}</h1>",
             f"<p>{html.escape(source)} {html.escape(_counts(df))}.</p>"]
    for p in figs:
        data = base64.b64encode(p.png).decode("ascii")
        parts.append(f"<figure id='{p.id}'><h2>{html.escape(p.title)}</h2>"
                     f"<img alt='{html.escape(p.title)}' src='data:image/png;base64,{data}'>"
                     f"<figcaption>{html.escape(p.caption)}</figcaption></figure>")
    parts.append("<h2>Best layouts</h2>")
    parts.append(summary_table(df).to_html(index=False, border=0, escape=True))
    over = not_fitting_table(df)
    if not over.empty:
        parts.append(f"<h2>Closest layouts that do not fit ({counts_over(df)} over capacity)</h2>")
        parts.append(over.to_html(index=False, border=0, escape=True))
    errs = df[df["error"].notna()] if "error" in df else df.iloc[0:0]
    if not errs.empty:
        parts.append(f"<h2>Failed points ({len(errs)})</h2><ul>")
        parts += [f"<li>{html.escape(label(r))}: {html.escape(str(r['error']))}</li>" for _, r in errs.head(20).iterrows()]
        parts.append("</ul>")
    parts.append("</body></html>")
    return "\n".join(parts)


def render_markdown(df: pd.DataFrame, title: str = "simtrain report", source: str = "") -> str:
    """Markdown: title, counts, the best-layouts table and the layouts closest to fitting among those
    that do not (how far over capacity, GiB and %)."""
    text = f"# {title}\n\n{source} {_counts(df)}.\n\n## Best layouts\n\n{markdown_table(summary_table(df))}"
    over = not_fitting_table(df)
    if not over.empty:
        text += (f"\n## Closest layouts that do not fit ({counts_over(df)} over capacity)\n\n"
                 f"{markdown_table(over)}")
    return text


def counts_over(df: pd.DataFrame) -> int:
    """How many rows' peak memory is over capacity (``not_fitting_table``'s rule)."""
    return len(not_fitting_table(df, len(df)))


def write_report(df: pd.DataFrame, html_path: str | Path | None = None, md_path: str | Path | None = None,
                 csv_path: str | Path | None = None, title: str = "simtrain report", source: str = "") -> list[Path]:
    """Write the HTML report and/or the Markdown and CSV tables atomically; returns the paths written.

    Raises:
        ConfigError: matplotlib is missing (HTML needs it).
    """
    from simtrain.studies.sweep import write_text_atomic as write_atomic

    written = []
    if html_path:
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            raise ConfigError(Problem("--html", "plots need matplotlib: pip install 'simtrain[report]'")) from None
        write_atomic(html_path, render_html(df, title, source))
        written.append(Path(html_path))
    if md_path:
        write_atomic(md_path, render_markdown(df, title, source))
        written.append(Path(md_path))
    if csv_path:
        write_atomic(csv_path, summary_table(df).to_csv(index=False))
        written.append(Path(csv_path))
    return written

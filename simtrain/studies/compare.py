"""Two configurations side by side: ``compare(a, b) -> Comparison``.

Each config is loaded and validated (presets expanded, ``--set`` style overrides applied), simulated,
and the two results are put in one table: step time, throughput, MFU/HFU, the critical rank's
step-time breakdown, and each pipeline stage's peak memory and whether it fits, with the columns A, B,
B-A and B/A. ``Comparison.diff`` lists every config field that differs, by dotted path.

Renderings: a terminal table (``render_text``), Markdown (``render_markdown``), a self-contained HTML
page (``render_html``: inline CSS, no script, no network) and JSON (``Comparison.to_dict``).
"""

from __future__ import annotations

import html
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Any

from simtrain.engine.axes import AXES
from simtrain.engine.results import StepResult
from simtrain.plan.load import load_config
from simtrain.spec.config import RunConfig
from simtrain.spec.errors import ConfigError, InfeasibleLayout, Problem, problem

if TYPE_CHECKING:
    import pandas as pd

GiB = 1024.0**3
SAME_TOL = 1e-9
"""Values this close (relative, or absolute below 1 in the row's unit) are equal: a breakdown's
remainder ("other") is a difference of sums and carries float rounding (~1e-15 s)."""
ABSENT = "(absent)"
"""A field one config has and the other has not (e.g. ``model.moe.*`` against a dense model)."""


class Better(StrEnum):
    """Which direction of a row is the improvement (for colouring B against A)."""

    LOWER = "lower"
    HIGHER = "higher"
    NONE = ""


@dataclass(frozen=True, slots=True)
class Row:
    """One metric of both configs, in ``unit`` (``None``: the config has no such value, e.g. a stage
    beyond its pipeline depth)."""

    metric: str
    unit: str
    a: float | bool | None
    b: float | bool | None
    better: Better = Better.NONE
    group: str = "throughput"
    """Section of the table: "throughput", "breakdown" or "memory"."""

    @property
    def delta(self) -> float | None:
        """B - A (numbers only); exactly 0 within float rounding (``SAME_TOL``)."""
        if _number(self.a) and _number(self.b):
            a, b = float(self.a), float(self.b)  # type: ignore[arg-type]
            return 0.0 if abs(b - a) <= SAME_TOL * max(1.0, abs(a), abs(b)) else b - a
        return None

    @property
    def ratio(self) -> float | None:
        """B / A (numbers only, A non-zero)."""
        if _number(self.a) and _number(self.b) and self.a:
            return float(self.b) / float(self.a)  # type: ignore[arg-type]
        return None

    @property
    def verdict(self) -> str:
        """"better", "worse" or "" (equal, or no direction): B against A."""
        if isinstance(self.a, bool) and isinstance(self.b, bool) and self.a != self.b:
            return "better" if self.b else "worse"
        d = self.delta
        if d is None or d == 0 or self.better is Better.NONE:
            return ""
        return "better" if (d < 0) == (self.better is Better.LOWER) else "worse"


def _number(x: object) -> bool:
    return isinstance(x, int | float) and not isinstance(x, bool)


@dataclass(frozen=True, slots=True)
class FieldDiff:
    """A config field whose value differs between A and B (``ABSENT`` where one lacks it)."""

    path: str
    a: Any
    b: Any


@dataclass(slots=True)
class Comparison:
    """Two simulated configs side by side.

    Attributes:
        label_a / label_b: how each config was given (file and overrides).
        run_a / run_b: the validated configs.
        result_a / result_b: their simulated steps.
        rows: the metrics table (``frame()`` as a DataFrame).
        diff: every config field that differs, by dotted path, in schema order.
    """

    label_a: str
    label_b: str
    run_a: RunConfig
    run_b: RunConfig
    result_a: StepResult
    result_b: StepResult
    rows: list[Row] = field(default_factory=list)
    diff: list[FieldDiff] = field(default_factory=list)

    def frame(self) -> pd.DataFrame:
        """The rows as a DataFrame: metric, unit, A, B, B-A, B/A."""
        import pandas as pd

        return pd.DataFrame([{"metric": r.metric, "unit": r.unit, "A": r.a, "B": r.b, "B-A": r.delta,
                              "B/A": r.ratio} for r in self.rows])

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready: both labels, the rows, the config diff and both results (``StepResult.to_dict``)."""
        return {"a": self.label_a, "b": self.label_b,
                "rows": [{"metric": r.metric, "unit": r.unit, "a": r.a, "b": r.b, "b_minus_a": r.delta,
                          "b_over_a": r.ratio, "better": r.better.value, "verdict": r.verdict} for r in self.rows],
                "diff": [{"path": d.path, "a": d.a, "b": d.b} for d in self.diff],
                "result_a": self.result_a.to_dict(), "result_b": self.result_b.to_dict()}


# -- building -------------------------------------------------------------------------------------
def _load(which: str, config: RunConfig | dict[str, Any] | str | Path, overrides: list[str] | None) -> RunConfig:
    """Load one side, its problems' paths prefixed with the side ("B: layout.tp: ...")."""
    try:
        return load_config(config, overrides)
    except ConfigError as exc:
        raise ConfigError([Problem(f"{which}: {p.path}" if p.path else which, p.message)
                           for p in exc.problems]) from None


def compare(a: RunConfig | dict[str, Any] | str | Path, b: RunConfig | dict[str, Any] | str | Path | None = None,
            overrides_a: list[str] | None = None, overrides_b: list[str] | None = None,
            mode: str | None = None) -> Comparison:
    """Simulate two configs and compare them.

    Args:
        a, b: RunConfigs, dicts or YAML/JSON paths; ``b=None`` compares ``a`` with itself under the
            two override sets (one file, two ``--set`` sets).
        overrides_a, overrides_b: dotted ``key=value`` overrides of each side.
        mode: "symmetric" or "full" for both (default: each config's ``sim.mode``).

    Raises:
        ConfigError: invalid input on either side (every problem, its path prefixed "A: " or "B: ").
        InfeasibleLayout: a valid config that cannot be simulated (the message names the side).
    """
    from simtrain.studies.simulate import simulate

    b_source = a if b is None else b
    problems: list[Problem] = []
    if mode not in (None, "symmetric", "full"):
        problems.append(problem("mode", mode, "'symmetric' or 'full' (or None: each config's sim.mode)"))
    runs: list[RunConfig] = []
    for which, src, ov in (("A", a, overrides_a), ("B", b_source, overrides_b)):
        try:
            runs.append(_load(which, src, ov))
        except ConfigError as exc:
            problems += exc.problems
    if problems:
        raise ConfigError(problems)
    run_a, run_b = runs
    results = []
    for which, run in (("A", run_a), ("B", run_b)):
        try:
            results.append(simulate(run, mode=mode))
        except InfeasibleLayout as exc:
            raise InfeasibleLayout(f"config {which}: {exc.reason}", **exc.numbers) from None
    out = Comparison(describe(a, overrides_a), describe(b_source, overrides_b), run_a, run_b, results[0], results[1])
    out.rows = metric_rows(out.result_a, out.result_b)
    out.diff = config_diff(run_a, run_b)
    return out


def describe(config: RunConfig | dict[str, Any] | str | Path, overrides: list[str] | None) -> str:
    """A short label of one side: its file (or config name) and its overrides."""
    if isinstance(config, RunConfig):
        base = config.name
    elif isinstance(config, dict):
        base = str(config.get("name", "config"))
    else:
        base = str(config)
    return " ".join([base, *(f"--set {o}" for o in overrides or [])])


def flatten(data: Any, prefix: str = "") -> dict[str, Any]:
    """Nested dicts as ``{dotted.path: leaf}`` (lists are leaves), in key order."""
    if not isinstance(data, dict):
        return {prefix: data}
    out: dict[str, Any] = {}
    for k, v in data.items():
        path = f"{prefix}.{k}" if prefix else str(k)
        if isinstance(v, dict) and v:
            out.update(flatten(v, path))
        else:
            out[path] = v
    return out


def config_diff(a: RunConfig, b: RunConfig) -> list[FieldDiff]:
    """Every field of the validated configs whose value differs (A's field order, then B's extras)."""
    fa, fb = flatten(a.model_dump(mode="json")), flatten(b.model_dump(mode="json"))
    keys = list(fa) + [k for k in fb if k not in fa]
    return [FieldDiff(k, fa.get(k, ABSENT), fb.get(k, ABSENT)) for k in keys
            if fa.get(k, ABSENT) != fb.get(k, ABSENT)]


_BREAKDOWN = (("compute", "compute"), ("bubble", "pipeline bubble"), ("stage_imbalance", "stage imbalance"),
              ("optimizer", "optimizer"), ("offload", "CPU offload waits"), ("other", "other"),
              ("sync_wait", "wait for the slowest rank"))


def metric_rows(a: StepResult, b: StepResult) -> list[Row]:
    """The comparison table's rows (units in each row's ``unit``)."""
    rows = [Row("GPUs", "", a.n_gpus, b.n_gpus), Row("tokens per step", "tokens", a.global_batch_tokens,
                                                      b.global_batch_tokens),
            Row("micro-batches per step", "", a.microbatches, b.microbatches),
            Row("step time", "s", a.step_time_s, b.step_time_s, Better.LOWER),
            # the likely measured step time (simtrain.studies.uncertainty): whether a difference is within simtrain's error
            Row("likely step time from", "s", a.error_band.low_s if a.error_band else None,
                b.error_band.low_s if b.error_band else None, Better.LOWER),
            Row("likely step time to", "s", a.error_band.high_s if a.error_band else None,
                b.error_band.high_s if b.error_band else None, Better.LOWER),
            Row("throughput", "tokens/s", a.tokens_per_s, b.tokens_per_s, Better.HIGHER),
            Row("throughput per GPU", "tokens/s/GPU", a.tokens_per_s_per_gpu, b.tokens_per_s_per_gpu, Better.HIGHER),
            Row("MFU", "%", 100 * a.mfu, 100 * b.mfu, Better.HIGHER),
            Row("HFU", "%", 100 * a.hfu, 100 * b.hfu, Better.HIGHER)]
    ba, bb = a.breakdown_s, b.breakdown_s
    for key, name in _BREAKDOWN[:1]:
        rows.append(Row(name, "s", ba[key], bb[key], Better.LOWER, "breakdown"))
    for axis in AXES:
        rows.append(Row(f"exposed {axis.upper()} comm", "s", ba["exposed_comm"].get(axis, 0.0),
                        bb["exposed_comm"].get(axis, 0.0), Better.LOWER, "breakdown"))
    for key, name in _BREAKDOWN[1:]:
        rows.append(Row(name, "s", ba.get(key, 0.0), bb.get(key, 0.0), Better.LOWER, "breakdown"))
    peak_a, peak_b = max(m.peak_bytes for m in a.memory), max(m.peak_bytes for m in b.memory)
    rows.append(Row("peak memory (highest stage)", "GiB", peak_a / GiB, peak_b / GiB, Better.LOWER, "memory"))
    rows.append(Row("fits in memory (all stages)", "", a.fits, b.fits, Better.NONE, "memory"))
    ma, mb = {m.stage: m for m in a.memory}, {m.stage: m for m in b.memory}
    for s in range(max(len(a.memory), len(b.memory))):
        sa, sb = ma.get(s), mb.get(s)
        rows.append(Row(f"stage {s} peak memory", "GiB", sa.peak_bytes / GiB if sa else None,
                        sb.peak_bytes / GiB if sb else None, Better.LOWER, "memory"))
        rows.append(Row(f"stage {s} fits", "", sa.fits if sa else None, sb.fits if sb else None, Better.NONE,
                        "memory"))
    return rows


# -- rendering ------------------------------------------------------------------------------------
def fmt(x: float | bool | None, unit: str = "") -> str:
    """One value as the tables print it."""
    if x is None:
        return "-"
    if isinstance(x, bool):
        return "yes" if x else "NO"
    if unit in ("tokens/s", "tokens") or (float(x).is_integer() and unit == ""):
        return f"{x:,.0f}"
    if unit == "s":
        return f"{x:.4f}"
    return f"{x:,.2f}"


def fmt_delta(r: Row) -> str:
    """B-A with its sign, in the row's unit."""
    d = r.delta
    if d is None:
        return "-"
    return ("+" if d > 0 else "") + fmt(d, r.unit) if d else "0"


def fmt_ratio(r: Row) -> str:
    """B/A as a factor."""
    q = r.ratio
    return "-" if q is None else f"{q:.3f}x"


def _table(c: Comparison) -> list[list[str]]:
    head = ["metric", "unit", "A", "B", "B-A", "B/A"]
    return [head] + [[r.metric, r.unit, fmt(r.a, r.unit), fmt(r.b, r.unit), fmt_delta(r), fmt_ratio(r)]
                     for r in c.rows]


def _diff_value(v: Any) -> str:
    return v if v == ABSENT else _short(v)


def _short(v: Any) -> str:
    import json

    return json.dumps(v) if not isinstance(v, str) else v


def render_text(c: Comparison) -> str:
    """The terminal table: the two sides, the metrics and the differing fields."""
    table = _table(c)
    widths = [max(len(row[i]) for row in table) for i in range(len(table[0]))]
    lines = ["simtrain compare", f"  A: {c.label_a}", f"  B: {c.label_b}", ""]
    for i, row in enumerate(table):
        cells = [row[0].ljust(widths[0]), row[1].ljust(widths[1])]
        cells += [cell.rjust(w) for cell, w in zip(row[2:], widths[2:], strict=True)]
        verdict = c.rows[i - 1].verdict if i else ""
        lines.append("  " + "  ".join(cells) + (f"  ({verdict})" if verdict else ""))
    lines.append("")
    lines.append(f"  config fields that differ ({len(c.diff)}):" if c.diff else "  the configs are identical")
    for d in c.diff:
        lines.append(f"    {d.path}: {_diff_value(d.a)} -> {_diff_value(d.b)}")
    return "\n".join(lines)


def _fields(n: int) -> str:
    return f"{n} field" if n == 1 else f"{n} fields"


def _md_cell(s: str) -> str:
    return s.replace("|", "\\|")


def render_markdown(c: Comparison, title: str = "simtrain compare") -> str:
    """Markdown: the sides, the metrics table and the config diff."""
    table = _table(c)
    lines = [f"# {title}", "", f"- **A**: `{c.label_a}`", f"- **B**: `{c.label_b}`", "", "## Metrics", "",
             "| " + " | ".join(table[0]) + " |", "|---|---|" + "---:|" * 4]
    lines += ["| " + " | ".join(_md_cell(x) for x in row) + " |" for row in table[1:]]
    lines += ["", f"## What differs ({_fields(len(c.diff))})", ""]
    if c.diff:
        lines += ["| field | A | B |", "|---|---|---|"]
        lines += [f"| `{d.path}` | {_md_cell(_diff_value(d.a))} | {_md_cell(_diff_value(d.b))} |" for d in c.diff]
    else:
        lines.append("The configs are identical.")
    return "\n".join(lines) + "\n"


_CSS = ("body{font-family:sans-serif;margin:2em;max-width:1100px;color:#222}"
        "table{border-collapse:collapse;font-size:13px;margin:.5em 0}"
        "td,th{border:1px solid #ccc;padding:3px 8px;text-align:right}th{background:#f0f0f0}"
        "td:first-child,td.l,th:first-child,th.l{text-align:left}tr.sec td{background:#fafafa;font-weight:bold;text-align:left}"
        "td.better{background:#dff3df}td.worse{background:#f8dddd}code{font-size:12px}"
        ".bar{display:flex;height:26px;margin:3px 0;background:#eee}.bar div{height:100%}"
        ".row{display:flex;align-items:center;gap:1em;font-size:13px}.row span{width:12em}"
        ".key{display:inline-block;width:12px;height:12px;margin:0 4px 0 12px;vertical-align:middle}"
        "p.legend{font-size:12px}")
# colour of each breakdown component in the bars (matplotlib's tab10, for the reports' look)
_COLOURS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f",
            "#bcbd22", "#17becf", "#aec7e8")
_SECTIONS = {"throughput": "Step and throughput", "breakdown": "Where the step goes (critical rank)",
             "memory": "Memory per pipeline stage"}


def _bars(c: Comparison) -> str:
    """The two step-time breakdowns as stacked CSS bars on one scale (no image, no script)."""
    scale = max(c.result_a.step_time_s, c.result_b.step_time_s)
    # components of either side, less float rounding (a remainder of ~1e-15 s is no component)
    parts = [r for r in c.rows if r.group == "breakdown" and max(float(r.a or 0), float(r.b or 0)) > SAME_TOL * scale]
    out = []
    for side, step in (("A", c.result_a.step_time_s), ("B", c.result_b.step_time_s)):
        segs = []
        for i, r in enumerate(parts):
            v = float((r.a if side == "A" else r.b) or 0.0)
            if v > 0:
                segs.append(f"<div style='width:{100 * v / step:.3f}%;background:{_COLOURS[i % len(_COLOURS)]}' "
                            f"title='{html.escape(r.metric)}: {v:.4f} s'></div>")
        # the bar's length is the step time on a common scale; its segments split it by component
        out.append(f"<div class='row'><span>{side}: {step:.4f} s</span><div class='bar' id='bar-{side}' "
                   f"style='width:{80 * step / scale:.3f}%'>{''.join(segs)}</div></div>")
    legend = "".join(f"<span class='key' style='background:{_COLOURS[i % len(_COLOURS)]}'></span>"
                     f"{html.escape(r.metric)}" for i, r in enumerate(parts))
    return "\n".join(out) + f"<p class='legend'>{legend}</p>"


def render_html(c: Comparison, title: str = "simtrain compare") -> str:
    """A self-contained HTML page (inline CSS, no script, no network): the sides, the metrics with B
    against A coloured (green better, red worse), the two breakdowns as bars, the config diff."""
    e = html.escape
    doc = [f"<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'><title>{e(title)}</title>",
           f"<style>{_CSS}</style></head><body>", f"<h1>{e(title)}</h1>",
           f"<p><b>A</b>: <code>{e(c.label_a)}</code><br><b>B</b>: <code>{e(c.label_b)}</code></p>",
           "<h2>Metrics</h2><table id='metrics'><thead><tr><th>metric</th><th class='l'>unit</th><th>A</th><th>B</th>"
           "<th>B-A</th><th>B/A</th></tr></thead><tbody>"]
    section = ""
    for r in c.rows:
        if r.group != section:
            section = r.group
            doc.append(f"<tr class='sec'><td colspan='6'>{e(_SECTIONS[section])}</td></tr>")
        cls = f" class='{r.verdict}'" if r.verdict else ""
        doc.append(f"<tr><td>{e(r.metric)}</td><td class='l'>{e(r.unit)}</td><td>{e(fmt(r.a, r.unit))}</td>"
                   f"<td>{e(fmt(r.b, r.unit))}</td><td{cls}>{e(fmt_delta(r))}</td><td{cls}>{e(fmt_ratio(r))}</td>"
                   "</tr>")
    doc.append("</tbody></table>")
    doc.append("<h2>Step-time breakdown</h2>" + _bars(c))
    doc.append(f"<h2>What differs ({_fields(len(c.diff))})</h2>")
    if c.diff:
        doc.append("<table id='diff'><thead><tr><th>field</th><th class='l'>A</th><th class='l'>B</th></tr></thead><tbody>")
        doc += [f"<tr><td><code>{e(d.path)}</code></td><td class='l'>{e(_diff_value(d.a))}</td>"
                f"<td class='l'>{e(_diff_value(d.b))}</td></tr>" for d in c.diff]
        doc.append("</tbody></table>")
    else:
        doc.append("<p>The configs are identical.</p>")
    notes = [f"{side}: {n}" for side, res in (("A", c.result_a), ("B", c.result_b)) for n in res.notes]
    if notes:
        doc.append("<h2>Notes</h2><ul>" + "".join(f"<li>{e(n)}</li>" for n in notes) + "</ul>")
    doc.append("</body></html>")
    return "\n".join(doc)


def write_outputs(c: Comparison, markdown: str | Path | None = None, html_path: str | Path | None = None) -> list[Path]:
    """Write the Markdown and/or HTML renderings atomically; returns the paths written."""
    from simtrain.engine.trace import write_atomic

    written = []
    if markdown:
        write_atomic(markdown, render_markdown(c))
        written.append(Path(markdown))
    if html_path:
        write_atomic(html_path, render_html(c))
        written.append(Path(html_path))
    return written

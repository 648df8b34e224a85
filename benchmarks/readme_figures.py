"""The figures README.md and the example comments quote, computed by running simtrain (issue 31, part 5).

    python benchmarks/readme_figures.py            # compute every figure, compare with the docs; exit 1 on drift
    python benchmarks/readme_figures.py --fast     # only the figures that take seconds
    python benchmarks/readme_figures.py --fix      # rewrite the drifted numbers in place (numbers only)

Each :class:`Figure` is a phrase of a document with ``{name:format}`` placeholders, e.g.
``"predicts {days:.1f} days"``, and a function computing its values from the code (a simulation, a
whole run, a search or the shipped error tables). The phrase is looked up in the document with every
placeholder matching any number and every space matching any whitespace (the README wraps lines), so
the check names the phrase that drifted and what the code gives now; ``--fix`` replaces only the
numbers. ``tests/test_readme_figures.py`` runs the fast figures in the default suite; the slow ones
(whole runs and searches, minutes on a shared CPU) run here and in ``.ci/run``'s slow stage.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import math
import re
import string
import sys
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
GiB = 2.0**30
NUMBER = r"[-+]?[\d][\d,]*(?:\.\d+)?"
SPACE = r"\s+(?:#\s+)?"
"""Whitespace between words of a phrase: a README line break, or a YAML comment's "# " after one."""


@dataclass(frozen=True)
class Figure:
    """A phrase of ``doc`` whose ``{name:format}`` placeholders ``compute()`` fills."""

    doc: str
    """Path relative to the repository root."""
    phrase: str
    compute: Callable[[], dict[str, float]]
    slow: bool = False
    end_of_line: bool = False
    """The phrase ends its line (a table row that is the prefix of a wider table's row)."""
    tol: float = 0.0
    """Slack beyond the quoted rounding: the error tables store errors to 0.01 %, so a statistic
    the README rounded from the unrounded errors may sit across a rounding boundary from them."""

    def fields(self) -> list[tuple[str, str, str]]:
        """(literal text before, field name, format spec) for each placeholder, and the tail as ("", "", "")."""
        return [(lit, name or "", spec or "") for lit, name, spec, _ in string.Formatter().parse(self.phrase)]

    def pattern(self) -> re.Pattern[str]:
        """The phrase as a regex: each placeholder a number group, each space run any whitespace."""
        out = []
        for lit, name, _ in self.fields():
            out.append(SPACE.join(re.escape(part) for part in re.split(r"\s+", lit)))
            if name:
                out.append(f"({NUMBER})")
        return re.compile("".join(out) + ("(?=[ \t]*\n)" if self.end_of_line else ""))

    def render(self, values: dict[str, float]) -> list[str]:
        """Each placeholder's value formatted as the document writes it."""
        return [format(values[name], spec) for _, name, spec in self.fields() if name]

    def raw(self, values: dict[str, float]) -> list[float]:
        """Each placeholder's value unformatted."""
        return [float(values[name]) for _, name, _ in self.fields() if name]


def _cli_json(argv: list[str]) -> Any:
    """Run ``simtrain`` in this process and parse its JSON output."""
    from simtrain.cli.main import main

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        rc = main(argv)
    if rc != 0:
        raise RuntimeError(f"simtrain {' '.join(argv)} exited {rc}")
    return json.loads(out.getvalue())


@cache
def _sim(example: str, *overrides: str) -> Any:
    from simtrain.studies.simulate import simulate

    return simulate(str(ROOT / "examples" / example), list(overrides))


@cache
def _run(example: str) -> Any:
    from simtrain.studies.run import simulate_run

    return simulate_run(str(ROOT / "examples" / example))


@cache
def _search(example: str, *args: str) -> Any:
    return _cli_json(["search", str(ROOT / "examples" / example), *args, "--json"])


def _peak_gib(result: Any) -> float:
    return max(m.peak_bytes for m in result.memory) / GiB


def _seventy_b_band() -> dict[str, float]:
    r = _sim("llama3_70b_h100.yaml")
    b = r.error_band
    return {"t": r.step_time_s, "low": b.low_s, "high": b.high_s, "cov": 100 * b.coverage, "runs": b.runs,
            "elow": b.error_low_pct, "ehigh": b.error_high_pct}


@cache
def _seventy_b_full_recompute() -> dict[str, float]:
    """The README's `simtrain compare` example: the 70B example with full recompute instead of selective."""
    from simtrain.studies.compare import compare

    c = compare(str(ROOT / "examples" / "llama3_70b_h100.yaml"), overrides_b=["layout.recompute=full"])
    f = c.frame().set_index("metric")

    def ab(metric: str) -> tuple[float, float]:
        return float(f.loc[metric, "A"]), float(f.loc[metric, "B"])

    (a, b), (ma, mb) = ab("step time"), ab("MFU")
    (ca, cb), (ta, tb), (pa, pb) = ab("compute"), ab("exposed TP comm"), ab("stage 0 peak memory")
    return {"a": a, "b": b, "r": b / a, "ma": ma, "mb": mb, "ca": ca, "cb": cb, "ta": ta, "tb": tb,
            "pa": pa, "pb": pb}


def _band(moe: bool, gpu: str) -> Any:
    from simtrain.studies.uncertainty import band_for, read_error_table

    return band_for(1.0, "megatron-te", moe, gpu, read_error_table())


def _gb200_band() -> dict[str, float]:
    b = _band(False, "gb200")
    return {"runs": b.runs, "elow": b.error_low_pct, "ehigh": b.error_high_pct, "x": b.high_s}


def _moe_band() -> dict[str, float]:
    b = _band(True, "no-such-gpu")
    return {"runs": b.runs, "elow": b.error_low_pct, "ehigh": b.error_high_pct}


def _leave_one_out() -> dict[str, float]:
    from simtrain.studies.uncertainty import PACKAGED_TABLE, leave_one_out, read_error_table

    published = read_error_table(PACKAGED_TABLE)
    both = read_error_table()  # the published runs, then the out-of-sample archive
    a, b = leave_one_out(published), leave_one_out(both)
    return {"held": a["held"], "runs": a["runs"], "pct": a["held_pct"], "held2": b["held"], "runs2": b["runs"],
            "pct2": b["held_pct"], "promised2": b["promised_pct"]}


def _dense_shift() -> dict[str, float]:
    import statistics

    from simtrain.studies.uncertainty import Sample, read_error_table, sample_shift

    rows = [r for r in read_error_table() if not r.moe]
    shift = sample_shift(rows, False)
    assert shift is not None
    return {"x": math.exp(abs(shift)), "ins": statistics.median(r.error_pct for r in rows if r.sample is Sample.IN),
            "outs": statistics.median(r.error_pct for r in rows if r.sample is Sample.OUT)}


@cache
def _cross_set() -> dict[str, float]:
    from dataclasses import replace

    from simtrain.studies.uncertainty import ARCHIVE_TABLE, PACKAGED_TABLE, Sample, read_error_table, transfer

    published, archived = read_error_table(PACKAGED_TABLE), read_error_table(ARCHIVE_TABLE)

    def source_out(rows: list[Any]) -> tuple[int, int, float]:  # (held, runs, promised %), one source left out
        parts = [transfer([r for r in rows if r.source != s], [r for r in rows if r.source == s])
                 for s in sorted({r.source for r in rows})]
        n = sum(d["runs"] for d in parts)
        return sum(d["held"] for d in parts), n, sum(d["promised_pct"] * d["runs"] for d in parts) / n

    held, runs, promised = source_out(published + archived)
    alike = source_out([replace(r, sample=Sample.OUT) for r in published + archived])
    pa, ap = transfer(published, archived), transfer(archived, published)
    return {"held": held, "runs": runs, "pct": 100 * held / runs, "promised": promised, "alike": alike[0],
            "pa": pa["held"], "pan": pa["runs"], "papct": pa["held_pct"], "paprom": pa["promised_pct"],
            "ap": ap["held"], "apn": ap["runs"], "appct": ap["held_pct"], "approm": ap["promised_pct"]}


def _llama65b_run() -> dict[str, float]:
    r = _run("llama1_65b_a100_run.yaml")
    paper = 1_022_362  # Touvron et al. 2023, Table 15 (the example's comment)
    return {"days": r.time_to_train_s / 86400, "gpuh": r.gpu_hours, "gpuh_m": r.gpu_hours / 1e6, "mfu": 100 * r.mfu,
            "vs": 100 * (r.gpu_hours / paper - 1)}


def _deepseek_run() -> dict[str, float]:
    r = _run("deepseek_v3_h800.yaml")
    steady = r.phases[-1]
    report = 2.664e6  # DeepSeek-V3 report, pre-training GPU-hours (the example's comment)
    return {"gpuh_m": r.gpu_hours / 1e6, "days": r.time_to_train_s / 86400, "step": steady.step_time_s,
            "mfu": 100 * steady.mfu, "fewer": 100 * (1 - r.gpu_hours / report)}


def _gb200_search() -> dict[str, float]:
    res = _search("llama3_70b_gb200_offload.yaml", "--tp", "1", "--pp", "1,2", "--cp", "1", "--zero", "3",
                  "--mbs", "2")
    best = res["best"]
    recompute = [c for c in res["candidates"] if c["step_time_s"] is not None and c["layout"].get("recompute") == "full"
                 and c["layout"].get("pp") == 1]
    return {"layers": best["layout"]["offload_activation_layers"], "best": best["step_time_s"],
            "recompute": min(c["step_time_s"] for c in recompute)}


def _deepseek_estimate() -> dict[str, float]:
    from simtrain.plan.load import load_config
    from simtrain.studies.estimate import Estimator
    from simtrain.studies.simulate import cluster_of

    run = load_config(str(ROOT / "examples" / "deepseek_v3_h800.yaml"))
    est = Estimator(run.model, cluster_of(run), run.sim.fragmentation_ratio).estimate(run.layout, run.train)
    return {"est": est.step_time_s, "sim": _sim("deepseek_v3_h800.yaml").step_time_s}


def _gb200_offload() -> dict[str, float]:
    base = _sim("llama3_70b_gb200_offload.yaml")
    none = _sim("llama3_70b_gb200_offload.yaml", "layout.offload_activation_layers=0")
    most = _sim("llama3_70b_gb200_offload.yaml", "layout.offload_activation_layers=79")
    return {"none": _peak_gib(none), "forty": _peak_gib(base), "wait_ms": 1e3 * base.breakdown_s["offload"],
            "most": _peak_gib(most), "most_ms": 1e3 * most.breakdown_s["offload"]}


@cache
def _two_sites() -> dict[str, float]:
    """examples/llama3_8b_two_sites_hsdp.yaml: step times on two sites (400 and 100 Gbit/s) and one site, and
    the bytes the replicas' gradient all-reduces put on the inter-site link each way."""
    from simtrain.hardware.load import build_cluster
    from simtrain.studies.simulate import simulate

    example = "llama3_8b_two_sites_hsdp.yaml"
    traced = simulate(str(ROOT / "examples" / example), trace=True)
    ops = [e.op for e in traced.trace if e.rank == 0 and e.name.startswith("fsdp.all_reduce.replicas")]
    pairs = traced.n_gpus // 2  # every shard's pair of replicas, all across the link at once
    gb = pairs * sum(op.comm_bytes for op in ops) / 1e9
    eta = build_cluster("dgx-h100", 1).gpu.nic_efficiency  # the example's comment quotes it: 0.94
    one = _sim(example, "hardware.fabric=rail_optimised").step_time_s
    slow = _sim(example, "hardware.fabric.link_Gbps=100").step_time_s
    return {"step": traced.step_time_s, "one": one, "slower": 100 * (traced.step_time_s / one - 1), "gb": gb,
            "link_s": gb / (eta * 400 / 8), "link100_s": gb / (eta * 100 / 8), "step100": slow,
            "slower100": 100 * (slow / one - 1)}


def _llama405b() -> dict[str, float]:
    base = _sim("llama3_405b_h100.yaml")
    bare = _sim("llama3_405b_h100.yaml", "layout.recompute=none", "layout.recompute_layers=null")
    return {"bare": bare.memory[1].peak_bytes / GiB, "rec": _peak_gib(base), "mfu": 100 * base.mfu}


def _variability_405b() -> dict[str, float]:
    """The README's ``sim.variability`` example: the 405B example with a 2 % GPU speed spread, 4 draws."""
    v = _sim("llama3_405b_h100.yaml", "sim.variability.gpu_speed_cv=0.02", "sim.variability.samples=4").variability
    st, nominal = v["step_time_s"], v["nominal_step_time_s"]
    return {"p10": st["p10"], "p50": st["p50"], "p90": st["p90"], "pct": 100 * (st["p50"] / nominal - 1),
            "nominal": nominal, "slowest": v["slowest_gpu_speed_p50"]}


def _llama8b() -> dict[str, float]:
    return {"peak": _peak_gib(_sim("llama3_8b_h100_fsdp.yaml"))}


def _slow_gpu() -> dict[str, float]:
    ex = "llama3_8b_slow_gpu.yaml"
    w = _sim(ex).whatif
    first = _sim(ex, "whatif={slow_gpus: {node0/gpu5: 0.85}}").whatif
    net = _sim(ex, "whatif={background: {net: 0.5}}").whatif
    return {"t": w["step_time_s"], "b": w["baseline_step_time_s"], "c": w["cost_s"], "p": w["cost_pct"],
            "loss": 100 * (1 / w["bottleneck_speed"] - 1), "first": first["cost_pct"], "net": net["cost_pct"]}


def _error_frame(archive: bool) -> Any:
    import pandas as pd

    from simtrain.studies.uncertainty import ARCHIVE_TABLE, PACKAGED_TABLE

    return pd.read_csv(ARCHIVE_TABLE if archive else PACKAGED_TABLE)


def _in_sample_row(source: str | None) -> Callable[[], dict[str, float]]:
    """A row of the README's accuracy table: |step-time error| of the published runs of ``source``
    (None: all), as ``simtrain validate`` summarises them (``fidelity.error_stats``, nearest-rank p90)."""
    def compute() -> dict[str, float]:
        from simtrain.validation.fidelity import error_stats

        df = _error_frame(False)
        rows = df if source is None else df[df["source"] == source]
        st = error_stats(list(rows["step_time_error_pct"]))
        return {"n": st["count"], "med": st["median_abs_pct"], "mean": st["mean_abs_pct"], "p90": st["p90_abs_pct"]}
    return compute


def _signed_published() -> dict[str, float]:
    e = _error_frame(False)["step_time_error_pct"]
    return {"neg": int((e < 0).sum()), "n": len(e), "med": float(e.median())}


def _out_of_sample_row(gpus: tuple[str, ...] | None, moe: bool | None) -> Callable[[], dict[str, float]]:
    """A row of the README's out-of-sample table (the archived Megatron-Bridge runs' errors): |error|
    median, mean and p90 (numpy's linear interpolation, as that table was written) and signed median."""
    def compute() -> dict[str, float]:
        import numpy as np

        df = _error_frame(True)
        if gpus is not None:
            df = df[df["gpu_type"].isin(gpus) & (df["moe"] == moe)]
        e = df["step_time_error_pct"]
        return {"n": len(e), "med": float(e.abs().median()), "mean": float(e.abs().mean()),
                "p90": float(np.percentile(e.abs(), 90)), "signed": float(e.median())}
    return compute


def _row_errors(**run_ids: str) -> Callable[[], dict[str, float]]:
    """Signed step-time errors (%) of published runs by ``run_id`` (simtrain/data/published_errors.csv)."""
    def compute() -> dict[str, float]:
        df = _error_frame(False).set_index("run_id")["step_time_error_pct"]
        return {name: float(df[run_id]) for name, run_id in run_ids.items()}
    return compute


IN_SAMPLE = (("Korthikanti 2022 (A100, Megatron-LM)", "Korthikanti 2022"),
             ("MosaicML llm-foundry (A100, FSDP)", "MosaicML llm-foundry"), ("NeMo 24.07 (H100, FP8)", "NeMo 24.07"),
             ("Megatron-LM H100 (2024)", "Megatron-LM H100 (2024)"), ("torchtitan (H100 500 W, H200)", "torchtitan"),
             ("BLOOM (A100, Megatron-DeepSpeed)", "BLOOM"), ("Megatron-Bridge 25.11 (MoE)", "Megatron-Bridge 25.11"),
             ("**all**", None))
"""(README label, ``source`` in simtrain/data/published_errors.csv) of the accuracy table's rows."""
OUT_OF_SAMPLE: tuple[tuple[str, tuple[str, ...] | None, bool | None], ...] = (
    ("dense, H100", ("h100-sxm",), False), ("dense, B200", ("b200",), False), ("dense, GB200", ("gb200",), False),
    ("dense, GB300 (GB200's rates)", ("gb300",), False), ("MoE, H100", ("h100-sxm",), True),
    ("MoE, B200 / B300", ("b200", "b300"), True), ("MoE, GB200 / GB300", ("gb200", "gb300"), True),
    ("**all**", None, None))
"""(README label, GPU types, MoE) of the out-of-sample table's rows."""

README = "README.md"
FIGURES: tuple[Figure, ...] = (
    Figure(README, "the 70B example, {t:.2f} s, is likely {low:.1f}-{high:.1f} s ({cov:.0f} %; {runs:d} Megatron runs "
                   "on H100 with errors from {elow:.1f} % to {ehigh:+.1f} %)", _seventy_b_band),
    Figure(README, "full recompute instead of selective: step time {a:.2f} s -> {b:.2f} s ({r:.3f}x), MFU {ma:.2f} % "
                   "-> {mb:.2f} %, compute {ca:.2f} s -> {cb:.2f} s and exposed TP {ta:.2f} s -> {tb:.2f} s",
           _seventy_b_full_recompute),
    Figure(README, "stage 0's peak memory falls from {pa:.2f} to {pb:.2f} GiB", _seventy_b_full_recompute),
    Figure(README, "gets the ten GB200 runs' {elow:.1f} .. {ehigh:+.1f} %, so its measured step is likely up to "
                   "{x:.2f}x", _gb200_band),
    Figure(README, "gets the range of the {runs:d} out-of-sample Megatron MoE runs ({elow:.1f} .. {ehigh:+.1f} %)",
           _moe_band),
    Figure(README, "(x{x:.3f} for dense runs today, {ins:.2f} % against {outs:.2f} %;", _dense_shift),
    Figure(README, "source at a time, {held:d} of {runs:d} runs fell in their band ({pct:.0f} %, {promised:.0f} % "
                   "promised; {alike:d} with every run taken alike)", _cross_set),
    Figure(README, "bands held {pa:d} of {pan:d} archive runs ({papct:.0f} %, {paprom:.0f} % promised: four MoE runs), "
                   "the archive's {ap:d} of {apn:d} published runs ({appct:.0f} %, {approm:.0f} % promised)", _cross_set),
    Figure(README, "it held {held:d} of {runs:d} ({pct:.0f} %;", _leave_one_out),
    Figure(README, "together {held2:d} of {runs2:d} ({pct2:.0f} %, {promised2:.0f} % promised)", _leave_one_out),
    *(Figure(README, f"| {label} | {{n:d}} | {{med:.1f}} | {{mean:.1f}} | {{p90:.1f}} |", _in_sample_row(source),
             end_of_line=True, tol=0.01)
      for label, source in IN_SAMPLE),
    Figure(README, "predicted **too fast** ({neg:d} of {n:d} signed errors are negative; signed median {med:.0f} %)",
           _signed_published),
    *(Figure(README, f"| {label} | {{n:d}} | {{med:.1f}} | {{mean:.1f}} | {{p90:.1f}} | {{signed:+.1f}} |",
             _out_of_sample_row(gpus, moe), tol=0.01) for label, gpus, moe in OUT_OF_SAMPLE),
    Figure(README, "Megatron-LM's TP8 32B {e:+.0f} %", _row_errors(e="mlm-h100-32B"), tol=0.01),
    Figure(README, "its 1.7B is {e:.0f} %", _row_errors(e="mlm-h100-1.7B"), tol=0.01),
    Figure(README, "torchtitan's CP2 row {cp2:+.0f} % while its CP4 / CP8 rows are {cp4:.0f} / {cp8:.0f} %",
           _row_errors(cp2="torchtitan-T2-4", cp4="torchtitan-T2-5", cp8="torchtitan-T2-6"), tol=0.01),
    Figure(README, "interleaved 1F1B {e:.1f} % (its 1F1B twin", _row_errors(e="torchtitan-T5-13"), tol=0.01),
    Figure(README, "Megatron-LM's 70B {e:+.1f} %", _row_errors(e="mlm-h100-70B"), tol=0.01),
    Figure(README, "async TP in BF16 {bf16:.1f} % (FP8 {fp8:.1f} %;",
           _row_errors(bf16="torchtitan-asynctp-llama3-8b-bf16-asyncTP", fp8="torchtitan-asynctp-llama3-8b-fp8-asyncTP"),
           tol=0.01),
    Figure(README, "and its 7.1B {e:.1f} %", _row_errors(e="mlm-h100-7.1B"), tol=0.01),
    Figure(README, "MPT-70B at micro-batch 2 is {e:.1f} %", _row_errors(e="mpt-a100_80gb-70b-s2048-g32-bf16"), tol=0.01),
    Figure(README, "2,048 A100: ~{days:.1f} days, ~{gpuh_m:.2f}M GPU-hours", _llama65b_run, slow=True),
    Figure(README, "predicts {days:.1f} days and {gpuh:,.0f} GPU-hours ({mfu:.1f} % MFU)", _llama65b_run, slow=True),
    Figure(README, "stack's bf16 gradient reduction ({vs:+.1f} %;", _llama65b_run, slow=True),
    Figure(README, "it picks offloading {layers:d} layers (the recipe offloads 40): {best:.2f} s per step, against "
                   "{recompute:.2f} s with the fewest recomputed layers", _gb200_search, slow=True),
    Figure(README, "predicts {gpuh_m:.2f}M H800 GPU-hours ({days:.1f} days on 2,048 GPUs, {step:.1f} s per steady "
                   "step, {mfu:.1f} % BF16-peak MFU) against the report's 2.664M", _deepseek_run, slow=True),
    Figure(README, "context extension and post-training): {fewer:.0f} % fewer", _deepseek_run, slow=True),
    Figure(README, "published layout on 2,048 H800 estimates {est:.1f} s against {sim:.1f} s simulated",
           _deepseek_estimate, slow=True),
    Figure("examples/deepseek_v3_h800.yaml", "simtrain predicts ~{gpuh_m:.2f}M GPU-hours", _deepseek_run, slow=True),
    Figure(README, "step p10 / p50 / p90 {p10:.4f} / {p50:.4f} / {p90:.4f} s ({pct:+.2f} % at p50 over the nominal "
                   "{nominal:.4f} s; slowest GPU at {slowest:.3f}x", _variability_405b, slow=True),
    Figure("examples/llama3_405b_h100.yaml", "stage 1 peaks at ~{bare:.0f} GiB", _llama405b),
    Figure("examples/llama3_405b_h100.yaml", "per model chunk brings it to ~{rec:.0f} GiB. Predicted ~{mfu:.0f} % MFU",
           _llama405b),
    Figure("examples/llama3_8b_h100_fsdp.yaml", "peaks at ~{peak:.0f} GiB of 80 GiB", _llama8b),
    Figure(README, "one GPU of the second stage at 0.85x costs the step +{c:.2f} s (+{p:.1f} %: the step follows "
                   "the slow GPU, which loses {loss:.1f} %), the same GPU on the lighter first stage +{first:.1f} %, "
                   "and half of every network link taken by other traffic +{net:.2f} %", _slow_gpu),
    Figure("examples/llama3_8b_slow_gpu.yaml", "what-if {t:.4f} s vs {b:.4f} s unperturbed: +{c:.4f} s (+{p:.2f} %)",
           _slow_gpu),
    Figure("examples/llama3_8b_slow_gpu.yaml", "so one GPU in 16 costs the step {p:.1f} %, close to the {loss:.1f} % "
                                               "that GPU itself loses", _slow_gpu),
    Figure("examples/llama3_8b_slow_gpu.yaml", "costs only +{first:.2f} %", _slow_gpu),
    Figure("examples/llama3_8b_slow_gpu.yaml", "costs +{net:.2f} %, since only", _slow_gpu),
    Figure("examples/llama3_70b_gb200_offload.yaml", "the step needs ~{none:.0f} GiB per GPU", _gb200_offload),
    Figure("examples/llama3_70b_gb200_offload.yaml", "offloaded it peaks at ~{forty:.0f} GiB", _gb200_offload),
    Figure("examples/llama3_70b_gb200_offload.yaml", "so the waits are ~{wait_ms:.0f} ms a step", _gb200_offload),
    Figure("examples/llama3_70b_gb200_offload.yaml", "`={most_layers:d}` ({most:.0f} GiB", lambda: {
        "most_layers": 79, **_gb200_offload()}),
    Figure("examples/llama3_70b_gb200_offload.yaml", "against one layer's forward: {most_ms:.0f} ms of waits)",
           _gb200_offload),
    Figure("examples/llama3_8b_two_sites_hsdp.yaml", "Output: {step:.3f} s per step, {slower:.1f} % slower than on one "
           "site ({one:.3f} s,", _two_sites),
    Figure("examples/llama3_8b_two_sites_hsdp.yaml", "the link carries {gb:.1f} GB each way, {link_s:.2f} s at 0.94 x 50",
           _two_sites),
    Figure("examples/llama3_8b_two_sites_hsdp.yaml", "the same {gb:.1f} GB take {link100_s:.2f} s and the step "
           "{step100:.3f} s ({slower100:.0f} % slower)", _two_sites),
    Figure(README, "32 GPU pairs at once, {gb:.1f} GB each way per step. It takes {step:.3f} s per step against "
           "{one:.3f} s on one site (the link's {link_s:.2f} s hide", _two_sites),
    Figure(README, "100 Gbit/s link the {gb:.1f} GB take {link100_s:.2f} s and the step {step100:.3f} s.", _two_sites),
)
"""Every figure the README and the example comments quote that the code computes."""


@dataclass
class Check:
    """One figure's outcome: what the document says and what the code gives."""

    figure: Figure
    quoted: list[str] | None
    computed: list[str]
    span: list[tuple[int, int]]
    values: list[float]

    @property
    def ok(self) -> bool:
        if self.quoted is None:
            return False
        if self.quoted == self.computed:
            return True
        return self.figure.tol > 0 and all(_within(q, v, self.figure.tol) for q, v in zip(self.quoted, self.values,
                                                                                          strict=True))


def _within(quoted: str, value: float, tol: float) -> bool:
    """``value`` rounds to ``quoted`` give or take ``tol`` (the last digit's half unit plus the slack)."""
    text = quoted.replace(",", "")
    decimals = len(text.split(".")[1]) if "." in text else 0
    return abs(float(text) - value) <= 0.5 * 10.0**-decimals + tol


def check(figure: Figure) -> Check:
    """Compute ``figure`` and find its phrase in its document."""
    text = (ROOT / figure.doc).read_text(encoding="utf-8")
    values = figure.compute()
    computed, raw = figure.render(values), figure.raw(values)
    m = figure.pattern().search(text)
    if m is None:
        return Check(figure, None, computed, [], raw)
    return Check(figure, list(m.groups()), computed, [m.span(i + 1) for i in range(len(m.groups()))], raw)


def number_spans(figures: list[Figure]) -> list[tuple[str, tuple[int, int], Figure]]:
    """Where each figure's numbers stand in its document, (doc, span, figure), sorted (no values computed)."""
    out = []
    for f in figures:
        m = f.pattern().search((ROOT / f.doc).read_text(encoding="utf-8"))
        if m is not None:
            out += [(f.doc, m.span(i + 1), f) for i in range(len(m.groups()))]
    return sorted(out, key=lambda e: (e[0], e[1]))


def overlapping(figures: list[Figure]) -> list[tuple[Figure, Figure]]:
    """Pairs of figures quoting the same characters of a document: ``fix`` would write both into one number
    (two edits of one span garble it), so each number has one figure."""
    spans = number_spans(figures)
    return [(a[2], b[2]) for a, b in zip(spans, spans[1:], strict=False) if a[0] == b[0] and b[1][0] < a[1][1]]


def fix(checks: list[Check]) -> int:
    """Replace drifted numbers in their documents (numbers only; phrases not found are left)."""
    by_doc: dict[str, list[tuple[tuple[int, int], str]]] = {}
    for c in checks:
        if c.quoted is not None and not c.ok:
            for span, new in zip(c.span, c.computed, strict=True):
                by_doc.setdefault(c.figure.doc, []).append((span, new))
    for doc, edits in by_doc.items():
        path = ROOT / doc
        text = path.read_text(encoding="utf-8")
        ordered = sorted(set(edits), reverse=True)
        if any(later[0][1] > earlier[0][0] for earlier, later in zip(ordered, ordered[1:], strict=False)):
            raise SystemExit(f"{doc}: two figures quote one number; give each number one figure (overlapping())")
        for (a, b), new in ordered:
            text = text[:a] + new + text[b:]
        path.write_text(text, encoding="utf-8")
    return sum(len(e) for e in by_doc.values())


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--fast", action="store_true", help="only the figures that take seconds")
    p.add_argument("--fix", action="store_true", help="rewrite drifted numbers in the documents")
    args = p.parse_args(argv)
    checks = [check(f) for f in FIGURES if not (args.fast and f.slow)]
    for c in checks:
        state = "ok   " if c.ok else ("MISSING" if c.quoted is None else "DRIFT")
        print(f"{state} {c.figure.doc}: {c.figure.phrase}")
        if not c.ok:
            print(f"        quoted {c.quoted}, computed {c.computed}")
    bad = [c for c in checks if not c.ok]
    if args.fix and bad:
        print(f"fixed {fix(checks)} numbers")
        return 0
    print(f"{len(checks) - len(bad)} of {len(checks)} figures agree with the code")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    sys.exit(main())

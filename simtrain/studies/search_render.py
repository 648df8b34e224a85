"""The text report of a layout search (``simtrain search`` without ``--json``).

The ranking with why each layout lost, what became of every enumerated layout (pruned for memory by
the closed form, dominated, infeasible, simulated and whether those fit, estimated only), and the
layouts that do not fit with how far over the GPU's memory they are (GiB and %).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:  # annotations only: simtrain.studies.search re-exports render_search
    from simtrain.studies.search import Candidate, SearchResult

GiB = 1024.0**3
NOT_FITTING_SHOWN = 5  # layouts over capacity listed, the closest to fitting first


def count_line(r: SearchResult) -> str:
    """'N layouts enumerated: a pruned for memory, b dominated, ...; s simulated (f fit, n do not)'."""
    c = r.counts()
    return (f"{c['enumerated']} layouts enumerated: {c['pruned_memory']} pruned for memory (closed-form peak over "
            f"HBM), {c['dominated']} dominated (a memory lever they do not need), "
            f"{c['infeasible']} infeasible, {c['simulated']} simulated ({c['fit']} fit, {c['do_not_fit']} do not), "
            f"{c['estimated_only']} estimated only")


def over_text(c: Candidate, capacity: float) -> str:
    """'+3.2 GiB (+4.0 %) over 80.0 GiB': how far a candidate's peak is over ``capacity`` bytes."""
    over = c.over_capacity_bytes(capacity) or 0.0
    return f"+{over / GiB:.1f} GiB (+{100.0 * over / capacity:.1f} %) over {capacity / GiB:.1f} GiB"


def render_search(r: SearchResult, show: int = 15) -> str:
    """Human-readable ranking: the best ``show`` candidates with why each lost, the counts, and the
    layouts closest to fitting among those that do not."""
    lines = [f"simtrain search: {r.model} on {r.n_gpus:,} GPUs, {r.global_batch_tokens:,} tokens per step",
             f"  {count_line(r)}; {r.elapsed_s:.1f} s",
             f"  {'#':>4}  {'layout':<52}{'mbs/step':>9}{'est (s)':>10}{'sim (s)':>10}{'MFU %':>7}{'peak GiB':>10}  why"]
    for c in r.candidates[:show]:
        sim = f"{c.step_time_s:10.4g}" if c.step_time_s is not None else f"{'-':>10}"
        est = f"{c.est_step_time_s:10.4g}" if c.est_step_time_s is not None else f"{'-':>10}"
        mfu = c.mfu if c.mfu is not None else c.est_mfu
        mfu_s = f"{100 * mfu:7.1f}" if mfu is not None else f"{'-':>7}"
        peak = c.peak_memory_bytes or c.est_peak_bytes
        peak_s = f"{peak / GiB:10.1f}" if peak else f"{'-':>10}"
        lines.append(f"  {c.rank:>4}  {c.label():<52}{c.microbatches:>9}{est}{sim}{mfu_s}{peak_s}  {c.reason}")
    over = r.not_fitting() if r.capacity_bytes > 0 else []
    if over:
        lines.append(f"  {len(over)} layouts do not fit in memory; the closest:")
        lines += [f"        {c.label():<52} peak {(c.peak_memory_bytes or c.est_peak_bytes or 0) / GiB:.1f} GiB, "
                  f"{over_text(c, r.capacity_bytes)}" for c in over[:NOT_FITTING_SHOWN]]
    if r.best is None:
        lines.append("  no simulated layout fits in memory")
    elif (band := _likely(r.best)) is not None:
        lines.append(f"  best: {r.best.label()}, {r.best.step_time_s:.4g} s per step, likely measured "
                     f"{band[0]:.4g} - {band[1]:.4g} s (simtrain.studies.uncertainty)")
    return "\n".join(lines)


def _likely(c: Candidate) -> tuple[float, float] | None:
    """The simulated candidate's likely measured step-time range (s), when its row has one."""
    lo, hi = (c.row or {}).get("step_time_low_s"), (c.row or {}).get("step_time_high_s")
    return (float(lo), float(hi)) if lo is not None and hi is not None else None

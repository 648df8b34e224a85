"""A run's batch schedule resolved into constant-batch phases (``run.batch``: ramps, tables, token budgets),
and the cross-field problems of a schedule; the schema the user writes is ``simtrain.spec.batch``."""

from __future__ import annotations

import math
from dataclasses import dataclass

from simtrain.plan.schedules import schedule_of
from simtrain.spec.batch import RunSpec
from simtrain.spec.config import RunConfig
from simtrain.spec.errors import ConfigError, Problem
from simtrain.spec.limits import MAX_PHASES


@dataclass(frozen=True, slots=True)
class Phase:
    """One constant-batch stretch of a run.

    ``start_tokens`` is the tokens consumed before it; it runs ``steps`` optimizer steps of
    ``batch_seqs`` sequences of ``seq_len`` tokens. ``source`` is the dotted config path that set the
    batch (for error messages).
    """

    index: int
    batch_seqs: int
    seq_len: int
    start_tokens: float
    steps: int
    source: str

    @property
    def batch_tokens(self) -> int:
        """Tokens per optimizer step."""
        return self.batch_seqs * self.seq_len

    @property
    def tokens(self) -> float:
        """Tokens trained in this phase (whole steps)."""
        return float(self.steps) * self.batch_tokens


@dataclass(frozen=True, slots=True)
class _Segment:
    """A scheduled batch held until ``until_tokens`` (None: the end of the budget)."""

    batch_seqs: int
    seq_len: int
    until_tokens: float | None
    source: str


def _seqs(tokens: int | None, seqs: int | None, seq_len: int, path: str, out: list[Problem]) -> int | None:
    """Sequences of a batch given in tokens or sequences (exactly one), or None with a problem."""
    if (tokens is None) == (seqs is None):
        out.append(Problem(path, "give exactly one of global_batch_tokens and global_batch_seqs"
                           if "phases" in path else "give exactly one of start_tokens and start_seqs"))
        return None
    if seqs is not None:
        return seqs
    assert tokens is not None
    if tokens % seq_len:
        out.append(Problem(path, f"{tokens} tokens is not a multiple of the sequence length {seq_len}"))
        return None
    return tokens // seq_len


def _train_segment(run: RunConfig) -> _Segment:
    tr = run.train
    src = "train.global_batch_tokens" if tr.global_batch_tokens is not None else "train.global_batch_seqs"
    return _Segment(tr.global_batch_seqs_resolved, tr.seq_len, None, src)


def _ramp_segments(run: RunConfig, spec: RunSpec, out: list[Problem]) -> list[_Segment]:
    """Megatron ramp-up levels: start + k * increment, level k held until (k + 1) * ramp / n."""
    sch, base = spec.batch_schedule, "run.batch_schedule"
    end = _train_segment(run)
    start_path = f"{base}.start_tokens" if sch.start_tokens is not None else f"{base}.start_seqs"
    start = _seqs(sch.start_tokens, sch.start_seqs, run.train.seq_len, start_path, out)
    if sch.ramp_tokens is None:
        out.append(Problem(f"{base}.ramp_tokens", f"missing: a {sch.kind!r} schedule needs ramp_tokens"))
    if start is None or sch.ramp_tokens is None:
        return []
    if sch.kind == "step":
        return [_Segment(start, end.seq_len, sch.ramp_tokens, start_path), end]
    if start >= end.batch_seqs:
        out.append(Problem(start_path, f"{start} sequences must be below the final batch "
                                       f"({end.batch_seqs} sequences, {end.source}) for a linear ramp-up"))
        return []
    span = end.batch_seqs - start
    if (sch.increments is None) == (sch.increment_seqs is None):
        out.append(Problem(f"{base}.increments", "give exactly one of increments and increment_seqs "
                                                 f"(the ramp adds {span} sequences)"))
        return []
    n = sch.increments if sch.increments is not None else span // (sch.increment_seqs or 1)
    if n > MAX_PHASES:  # each level is a batch to simulate
        out.append(Problem(f"{base}.increment_seqs", f"{sch.increment_seqs} splits the ramp of {span} sequences "
                                                     f"into {n:,} levels; at most {MAX_PHASES:,}"))
        return []
    step = span // n if sch.increments is not None else sch.increment_seqs
    assert step is not None
    if span % n or n * step != span:
        path = f"{base}.increments" if sch.increments is not None else f"{base}.increment_seqs"
        given = sch.increments if sch.increments is not None else sch.increment_seqs
        out.append(Problem(path, f"{given} does not split the ramp of {span} sequences "
                                 f"({start} to {end.batch_seqs}) into whole equal increments"))
        return []
    return [_Segment(start + k * step, end.seq_len, (k + 1) * sch.ramp_tokens / n,
                     start_path if k == 0 else f"{base}.increments") for k in range(n)] + [end]


def _table_segments(run: RunConfig, spec: RunSpec, out: list[Problem]) -> list[_Segment]:
    sch = spec.batch_schedule
    if not sch.phases:
        out.append(Problem("run.batch_schedule.phases", "a 'table' schedule needs at least one phase"))
        return []
    segs: list[_Segment] = []
    previous = 0.0
    for i, ph in enumerate(sch.phases):
        path = f"run.batch_schedule.phases[{i}]"
        seq_len = ph.seq_len or run.train.seq_len
        seqs = _seqs(ph.global_batch_tokens, ph.global_batch_seqs, seq_len, path, out)
        last = i == len(sch.phases) - 1
        if ph.until_tokens is None and not last:
            out.append(Problem(f"{path}.until_tokens", "missing: only the last phase may leave it out"))
        elif ph.until_tokens is not None and ph.until_tokens <= previous:
            out.append(Problem(f"{path}.until_tokens", f"{ph.until_tokens:.6g} must be above the previous "
                                                       f"phase's end ({previous:.6g} tokens)"))
        previous = ph.until_tokens or previous
        field = "global_batch_tokens" if ph.global_batch_tokens is not None else "global_batch_seqs"
        if seqs is not None:
            segs.append(_Segment(seqs, seq_len, ph.until_tokens, f"{path}.{field}"))
    if sch.phases[-1].until_tokens is not None:
        segs.append(_train_segment(run))
    return segs


def _segments(run: RunConfig, out: list[Problem]) -> list[_Segment]:
    spec = run.run
    assert spec is not None
    kind = spec.batch_schedule.kind
    if kind == "constant":
        return [_train_segment(run)]
    if kind in ("step", "linear"):
        return _ramp_segments(run, spec, out)
    return _table_segments(run, spec, out)


def _phases_from(segments: list[_Segment], budget_tokens: float) -> list[Phase]:
    """Whole steps per segment: ceil(tokens left in the segment / batch tokens) (Megatron's counter)."""
    phases: list[Phase] = []
    consumed = 0.0
    for seg in segments:
        target = budget_tokens if seg.until_tokens is None else min(seg.until_tokens, budget_tokens)
        if consumed >= target:
            continue
        batch_tokens = seg.batch_seqs * seg.seq_len
        steps = math.ceil((target - consumed) / batch_tokens)
        phases.append(Phase(len(phases), seg.batch_seqs, seg.seq_len, consumed, steps, seg.source))
        consumed += float(steps) * batch_tokens
        if consumed >= budget_tokens:
            break
    return phases


def schedule_problems(run: RunConfig) -> list[Problem]:
    """Problems of the ``run`` section: schedule shape, and every batch against the layout.

    Each distinct batch must split into whole micro-batches: sequences divisible by
    micro_batch_size x dp, and a micro-batch count the pipeline schedule can run
    (``Schedule.microbatch_problems``: interleaved 1F1B at least pp, DualPipe even and at least 2 x pp, ...).
    """
    if run.run is None:
        return []
    out: list[Problem] = []
    segments = _segments(run, out)
    lay, mbs = run.layout, run.train.micro_batch_size
    seen: set[tuple[int, str]] = set()
    for seg in segments:
        if (seg.batch_seqs, seg.source) in seen or seg.source.startswith("train."):
            continue
        seen.add((seg.batch_seqs, seg.source))
        unit = mbs * lay.dp
        if seg.batch_seqs % unit:
            out.append(Problem(seg.source, f"a batch of {seg.batch_seqs} sequences ({seg.batch_seqs * seg.seq_len} "
                                           f"tokens) is not divisible by micro_batch_size x dp = {mbs} x {lay.dp} "
                                           f"= {unit}"))
        else:  # the micro-batch counts the pipeline schedule can run, as for train's batch (validate)
            out += [Problem(seg.source, f"a batch of {seg.batch_seqs} sequences gives {seg.batch_seqs // unit} "
                                        f"micro-batches; {pr.message}")
                    for pr in schedule_of(lay.resolved_schedule).microbatch_problems(lay.pp, seg.batch_seqs // unit,
                                                                                     seg.source)]
        long = seg.seq_len != run.train.seq_len and seg.seq_len > run.model.max_position
        if run.model.position == "learned" and long:
            out.append(Problem(seg.source, f"seq_len {seg.seq_len} exceeds model.max_position="
                                           f"{run.model.max_position}"))
    return _first_per_path(out)


#: Problems listed per config path; a ramp of thousands of levels would otherwise print thousands of lines.
_SHOWN_PER_PATH = 5


def _first_per_path(problems: list[Problem]) -> list[Problem]:
    """The first ``_SHOWN_PER_PATH`` problems of each path, then one saying how many more there are."""
    out: list[Problem] = []
    count: dict[str, int] = {}
    for p in problems:
        count[p.path] = count.get(p.path, 0) + 1
        if count[p.path] <= _SHOWN_PER_PATH:
            out.append(p)
    out += [Problem(path, f"... and {n - _SHOWN_PER_PATH:,} more like these")
            for path, n in count.items() if n > _SHOWN_PER_PATH]
    return out


def resolve_phases(run: RunConfig) -> list[Phase]:
    """The phases of a validated config's run: batch, sequence length and whole steps of each.

    Raises:
        ConfigError: no ``run`` section, or a schedule that does not resolve.
    """
    if run.run is None:
        raise ConfigError(Problem("run", "missing: a whole-run simulation needs a 'run:' section with at least "
                                         "'tokens' (the token budget), e.g. --set run.tokens=1.4T"))
    out: list[Problem] = []
    segments = _segments(run, out)
    if out:
        raise ConfigError(out)
    return _phases_from(segments, run.run.tokens)

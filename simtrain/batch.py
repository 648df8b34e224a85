"""Batch-size schedules and the whole-run section of a config (``run:``).

A training run is a token budget and a global batch that may change as training goes on. The
schedule kinds:

- ``constant``: ``train``'s global batch for the whole budget;
- ``linear``: Megatron-LM's batch-size ramp-up (``--rampup-batch-size start increment samples``,
  ``megatron/core/num_microbatches_calculator.py``, ``RampupBatchsizeNumMicroBatchesCalculator``):
  the batch grows from ``start`` to ``train``'s batch in equal increments, each held for an equal
  share of ``ramp_tokens``, then stays constant (DeepSeek-V3, arXiv:2412.19437 sec. 4.2: 3,072 to
  15,360 sequences over the first 469B tokens);
- ``step``: ``start`` until ``ramp_tokens``, then ``train``'s batch (a ramp of one increment);
- ``table``: explicit phases, each a batch (and optionally a sequence length) held until a
  cumulative token count (Llama 3, arXiv:2407.21783 sec. 3.4.1: 4M tokens at 4,096, 8M at 8,192
  after 252M tokens, 16M after 2.87T tokens).

Training happens in whole optimizer steps, so each phase runs ``ceil(tokens left in the phase /
batch tokens)`` steps and the next phase starts from the tokens actually consumed (as Megatron's
consumed-samples counter does). ``resolve_phases`` is pure arithmetic; simulating the phases is
``simtrain.run``.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, field_validator

from simtrain.errors import Problem
from simtrain.goodput import CheckpointSpec, FailureSpec
from simtrain.limits import MAX_BATCH_TOKENS, MAX_PHASES, MAX_RUN_TOKENS, MAX_SEQ_LEN

if TYPE_CHECKING:
    from simtrain.config import RunConfig

_STRICT = ConfigDict(frozen=True, extra="forbid")
_SUFFIX = {"": 1.0, "K": 1e3, "M": 1e6, "B": 1e9, "G": 1e9, "T": 1e12, "P": 1e15,
           "KI": 2.0**10, "MI": 2.0**20, "GI": 2.0**30, "TI": 2.0**40}
_COUNT_RE = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?)\s*([KMBGTP]i?)?\s*$", re.IGNORECASE)


def parse_count(value: Any) -> Any:
    """A count given as a number or a string with a suffix: decimal ("469B", "1.4T", "4M", "1e12") or
    binary ("4Mi" = 4,194,304 tokens, the "4M-token batch" of the Llama papers).

    Returns a float for strings it understands; anything else is returned for pydantic to reject.
    """
    if isinstance(value, str):
        match = _COUNT_RE.match(value)
        if match:
            return float(match.group(1)) * _SUFFIX[(match.group(2) or "").upper()]
    return value


def whole_number(value: Any) -> Any:
    """A count as an int: booleans (YAML ``true``, which Python counts as 1) and floats with a fraction
    are refused (ValueError, which pydantic reports with the field's path); integral floats (``4096.0``,
    ``1e6``) become ints; anything else is left for pydantic's int check."""
    if isinstance(value, bool):
        raise ValueError("a yes/no value is not a count; give a whole number")
    if isinstance(value, float):
        if not value.is_integer():
            raise ValueError(f"{value:g} is not a whole number")
        return int(value)
    return value


#: A count (sequences, tokens, increments): a whole number, never a boolean.
Count = Annotated[int, BeforeValidator(whole_number)]


def _count_int(value: Any) -> Any:
    """Like ``parse_count``, and integral floats become ints (for sequence/token batch sizes)."""
    value = parse_count(value)
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


class TablePhase(BaseModel):
    """One row of a ``table`` schedule: a batch held until ``until_tokens`` tokens have been trained."""

    model_config = _STRICT
    until_tokens: float | None = Field(None, gt=0, le=MAX_RUN_TOKENS)
    """Cumulative tokens at which this phase ends (None on the last row: the rest of the budget)."""
    global_batch_tokens: Count | None = Field(None, gt=0, le=MAX_BATCH_TOKENS)
    global_batch_seqs: Count | None = Field(None, gt=0, le=MAX_BATCH_TOKENS)
    seq_len: Count | None = Field(None, gt=0, le=MAX_SEQ_LEN)
    """Sequence length of this phase (None: ``train.seq_len``)."""

    @field_validator("until_tokens", mode="before")
    @classmethod
    def _count(cls, value: Any) -> Any:
        return parse_count(value)

    @field_validator("global_batch_tokens", "global_batch_seqs", mode="before")
    @classmethod
    def _batch(cls, value: Any) -> Any:
        return _count_int(value)


class BatchSchedule(BaseModel):
    """How the global batch changes over the run (see the module docstring for the kinds)."""

    model_config = _STRICT
    kind: Literal["constant", "step", "linear", "table"] = "constant"
    start_tokens: Count | None = Field(None, gt=0, le=MAX_BATCH_TOKENS)
    """``step``/``linear``: global batch at the start, tokens (or give ``start_seqs``)."""
    start_seqs: Count | None = Field(None, gt=0, le=MAX_BATCH_TOKENS)
    """``step``/``linear``: global batch at the start, sequences."""
    ramp_tokens: float | None = Field(None, gt=0, le=MAX_RUN_TOKENS)
    """``linear``: tokens over which the batch ramps up; ``step``: tokens at which it steps up."""
    increments: Count | None = Field(None, gt=0, le=MAX_PHASES)
    """``linear``: number of equal batch increments in the ramp (or give ``increment_seqs``)."""
    increment_seqs: Count | None = Field(None, gt=0, le=MAX_BATCH_TOKENS)
    """``linear``: sequences added at each increment (Megatron's ``increment``)."""
    phases: tuple[TablePhase, ...] = Field((), max_length=MAX_PHASES)
    """``table``: the phases in order; tokens past the last ``until_tokens`` use ``train``'s batch."""

    @field_validator("ramp_tokens", mode="before")
    @classmethod
    def _count(cls, value: Any) -> Any:
        return parse_count(value)

    @field_validator("start_tokens", "start_seqs", mode="before")
    @classmethod
    def _batch(cls, value: Any) -> Any:
        return _count_int(value)


class RunSpec(BaseModel):
    """A whole training run: token budget, batch schedule and the price of a GPU-hour."""

    model_config = _STRICT
    tokens: float = Field(gt=0, le=MAX_RUN_TOKENS)
    """Token budget of the run (accepts "1.4T", "469B", 1.4e12)."""
    batch_schedule: BatchSchedule = BatchSchedule()
    price_per_gpu_hour: float | None = Field(None, ge=0)
    """Price of one GPU-hour, in ``currency`` (None: no cost is reported)."""
    currency: str = "USD"
    failures: FailureSpec | None = None
    """Failures (``simtrain.goodput``); with ``checkpoint`` or this, ``simtrain run`` reports goodput."""
    checkpoint: CheckpointSpec | None = None
    """Checkpointing: interval (s, steps or ``auto``), storage bandwidth, sync/async (``simtrain.goodput``)."""

    @field_validator("tokens", mode="before")
    @classmethod
    def _count(cls, value: Any) -> Any:
        return parse_count(value)


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
                    for pr in lay.pipeline_schedule.microbatch_problems(lay.pp, seg.batch_seqs // unit, seg.source)]
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
    from simtrain.errors import ConfigError

    if run.run is None:
        raise ConfigError(Problem("run", "missing: a whole-run simulation needs a 'run:' section with at least "
                                         "'tokens' (the token budget), e.g. --set run.tokens=1.4T"))
    out: list[Problem] = []
    segments = _segments(run, out)
    if out:
        raise ConfigError(out)
    return _phases_from(segments, run.run.tokens)

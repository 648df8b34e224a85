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
``simtrain.studies.run``.
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, field_validator

from simtrain.spec.goodput_spec import CheckpointSpec, FailureSpec
from simtrain.spec.limits import MAX_BATCH_TOKENS, MAX_PHASES, MAX_RUN_TOKENS, MAX_SEQ_LEN

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
    """Failures (``simtrain.studies.goodput``); with ``checkpoint`` or this, ``simtrain run`` reports goodput."""
    checkpoint: CheckpointSpec | None = None
    """Checkpointing: interval (s, steps or ``auto``), storage bandwidth, sync/async (``simtrain.studies.goodput``)."""

    @field_validator("tokens", mode="before")
    @classmethod
    def _count(cls, value: Any) -> Any:
        return parse_count(value)

"""Reading a run config: a RunConfig, a dict or a YAML/JSON file, plus ``--set`` overrides, checked field by
field (``simtrain.spec.config``). ``simtrain.plan.load.load_config`` (``simtrain.load_config``) adds the checks
across fields (``simtrain.plan.validate``), which need the hardware and the schedules, later stages of the
dataflow than spec.

One gap is filled rather than refused: a global batch given in tokens that is not a whole number of
micro-batches on every data-parallel rank (``round_token_batch``), as batches are usually quoted ("16M
tokens"); the rounding is one of the config's ``assumptions``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import ValidationError

from simtrain.spec.config import RunConfig, apply_overrides, bool_count_problems, read_config_file
from simtrain.spec.errors import ConfigError, Problem, pydantic_problems
from simtrain.spec.limits import MAX_BATCH_TOKENS


def parse_config(source: RunConfig | dict[str, Any] | str | Path, overrides: list[str] | None = None) -> RunConfig:
    """Build a RunConfig from a RunConfig, dict or file path, plus overrides, each field validated (not
    across fields: ``simtrain.plan.load.load_config`` does both).

    Raises:
        ConfigError: listing every problem, each with its dotted path.
    """
    if isinstance(source, RunConfig) and not overrides:
        data: dict[str, Any] | None = None
        run = source
    else:
        if isinstance(source, RunConfig):
            data = source.model_dump()
        elif isinstance(source, dict):
            data = source
        elif isinstance(source, str | Path):
            data = read_config_file(source)
        else:
            raise ConfigError(Problem("config", f"a {type(source).__name__} is not a config; give a RunConfig, a "
                                                "dict or the path of a YAML/JSON file"))
        data = apply_overrides(data, overrides or [])
        bools = bool_count_problems(RunConfig, data)
        try:
            run = RunConfig.model_validate(data)
        except ValidationError as exc:
            found = pydantic_problems(exc)  # a field's own message first (Count fields refuse booleans too)
            raise ConfigError(found + [b for b in bools if b.path not in {p.path for p in found}]) from None
        if bools:
            raise ConfigError(bools)
    run = round_token_batch(run)
    return run


def round_token_batch(run: RunConfig) -> RunConfig:
    """``run`` with ``train.global_batch_tokens`` rounded to the nearest valid batch, named in its assumptions.

    A step trains whole sequences, the same number of micro-batches of ``micro_batch_size`` sequences on
    each of the ``dp`` data-parallel ranks (Megatron-LM asserts global batch = micro-batch x dp x
    micro-batches, ``num_microbatches_calculator.py``). So the batch is a multiple of
    U = seq_len x micro_batch_size x dp tokens. Rule: a token batch T that is not one becomes k x U tokens
    with k = floor(T / U + 1/2) (the nearest multiple; a tie goes to the larger batch), at least one
    (k >= 1) and at most ``MAX_BATCH_TOKENS`` (k - 1 when k x U would pass it). A batch given in
    sequences (``global_batch_seqs``) is the user's exact count and is checked as given.
    """
    tr = run.train
    tokens = tr.global_batch_tokens
    if tokens is None or tr.global_batch_seqs is not None:
        return run
    unit = tr.seq_len * tr.micro_batch_size * run.layout.dp
    if tokens % unit == 0:
        return run
    k = max(1, (2 * tokens + unit) // (2 * unit))  # floor(T / U + 1/2) in integers: a tie rounds up
    if k > 1 and k * unit > MAX_BATCH_TOKENS:
        k -= 1
    rounded = k * unit
    note = (f"train.global_batch_tokens {tokens:,} is not a whole number of micro-batches on every data-parallel "
            f"rank (seq_len {tr.seq_len:,} x micro_batch_size {tr.micro_batch_size} x dp {run.layout.dp} = "
            f"{unit:,} tokens): rounded to the nearest such batch, {rounded:,} tokens ({rounded // tr.seq_len:,} "
            f"sequences, {k:,} micro-batch{'es' if k > 1 else ''} per rank; a tie goes to the larger batch)")
    train = tr.model_copy(update={"global_batch_tokens": rounded})
    return run.model_copy(update={"train": train}).with_assumptions(note)

"""Reading a run config: a RunConfig, a dict or a YAML/JSON file, plus ``--set`` overrides, checked field by
field (``simtrain.spec.config``). ``simtrain.plan.load.load_config`` (``simtrain.load_config``) adds the checks
across fields (``simtrain.plan.validate``), which need the hardware and the schedules, later stages of the
dataflow than spec."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import ValidationError

from simtrain.spec.config import RunConfig, apply_overrides, bool_count_problems, read_config_file
from simtrain.spec.errors import ConfigError, Problem, pydantic_problems


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
    return run

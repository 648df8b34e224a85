"""Loading a run config: a RunConfig, a dict or a YAML/JSON file, plus ``--set`` overrides, checked field by
field (``simtrain.spec.config``) and across fields (``simtrain.plan.validate``) before anything is built."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import ValidationError

from simtrain.plan.validate import check_run
from simtrain.spec.config import RunConfig, apply_overrides, bool_count_problems, read_config_file
from simtrain.spec.errors import ConfigError, Problem, pydantic_problems


def load_config(source: RunConfig | dict[str, Any] | str | Path, overrides: list[str] | None = None) -> RunConfig:
    """Build and fully validate a RunConfig from a RunConfig, dict or file path, plus overrides.

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
    problems = check_run(run)
    if problems:
        raise ConfigError(problems)
    return run

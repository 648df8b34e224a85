"""Loading a run config: read and checked field by field (``simtrain.spec.load.parse_config``), then
across fields (``simtrain.plan.validate.check_run``: the layout against the model, the cluster and the
schedule) before anything is built. ``simtrain.load_config`` is this function."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from simtrain.plan.validate import check_run
from simtrain.spec.config import RunConfig
from simtrain.spec.errors import ConfigError
from simtrain.spec.load import parse_config


def load_config(source: RunConfig | dict[str, Any] | str | Path, overrides: list[str] | None = None) -> RunConfig:
    """Build and fully validate a RunConfig from a RunConfig, dict or file path, plus overrides.

    Raises:
        ConfigError: listing every problem, each with its dotted path.
    """
    run = parse_config(source, overrides)
    problems = check_run(run)
    if problems:
        raise ConfigError(problems)
    return run

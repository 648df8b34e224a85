"""Sweeps: any config field over a grid, every point simulated, one DataFrame row per point.

``sweep(config, {"layout.tp": [1, 2, 4, 8], "train.micro_batch_size": [1, 2]})`` simulates the
cartesian product of the grid (first key slowest) and returns a pandas DataFrame with one row per
point, in grid order whatever ran them: the grid values, the resolved config fields (dotted names, in
the config's own units), the results (``step_time_s`` with its likely measured range ``step_time_low_s`` /
``step_time_high_s`` from ``simtrain.studies.uncertainty``; with ``sim.variability`` its percentiles over the draws
``step_time_p10_s`` / ``step_time_p50_s`` / ``step_time_p90_s``, ``mfu``, breakdown ``*_s``), memory
(``peak_memory_bytes``, ``fits``, and ``memory_json``: per-stage components and a down-sampled memory
timeline), the whole run when the config has a ``run:`` section (``time_to_train_s``, ``gpu_hours``,
``cost``), and ``error``: a failing point becomes a row with its error and the sweep goes on.

Points run in local worker processes (``concurrent.futures.ProcessPoolExecutor``) by default, or on
a Dask distributed cluster when a scheduler address is given; each point is a pure function of its
config, and rows are put back in grid order, so the table is the same either way.

``layout.dp=auto`` (in the grid or the base) sets dp so that dp x tp x pp x cp fills the cluster.
"""

from __future__ import annotations

import itertools
import json
import os
import tempfile
import typing
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel

from simtrain.engine.results import AXES, StepResult
from simtrain.plan.load import load_config
from simtrain.spec.config import RunConfig, apply_overrides, read_config_file
from simtrain.spec.errors import ConfigError, InfeasibleLayout, Problem, SimtrainError
from simtrain.spec.safe_yaml import load_yaml
from simtrain.spec.stacks import StackOverride, override_names
from simtrain.studies.variability import PERCENTILES

if TYPE_CHECKING:
    import pandas as pd

TIMELINE_POINTS = 96  # memory timeline samples kept per stage in ``memory_json`` (max per time bin)
Row = dict[str, Any]


# -- the grid ---------------------------------------------------------------------------------------
def parse_grid(items: Iterable[str]) -> dict[str, list[Any]]:
    """Parse ``--grid key=v1,v2,...`` items (values read as YAML: 4 -> int, true -> bool, full -> str).

    Raises:
        ConfigError: an item without ``=`` or values, or a key given twice (path ``--grid``).
    """
    grid: dict[str, list[Any]] = {}
    problems = []
    for item in items:
        key, sep, raw = item.partition("=")
        key = key.strip()
        values = [v.strip() for v in raw.split(",") if v.strip()]
        if not sep or not key or not values:
            problems.append(Problem("--grid", f"{item!r} is not of the form dotted.key=v1,v2,..."))
        elif key in grid:
            problems.append(Problem("--grid", f"{key!r} is given twice; list all its values in one --grid"))
        else:
            grid[key] = [load_yaml(v, f"--grid {key}") for v in values]
    if problems:
        raise ConfigError(problems)
    return grid


def _submodel(annotation: Any) -> type[BaseModel] | None:
    """The pydantic model an annotation holds (``X``, ``X | None``), or None for a plain value."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in typing.get_args(annotation):
        if (sub := _submodel(arg)) is not None:
            return sub
    return None


def _free_form(annotation: Any) -> bool:
    """Whether an annotation takes any keys below it (a mapping or Any)."""
    if annotation is Any or annotation is dict:
        return True
    origin = typing.get_origin(annotation)
    return origin is dict or any(_free_form(a) for a in typing.get_args(annotation) if origin is not dict)


def key_problem(key: str) -> Problem | None:
    """Why a dotted grid/override key names no field of the config schema (None when it does): the
    part that is unknown and the fields valid at that level. ``model`` also takes ``preset`` and
    ``hf_config`` (``RunConfig._resolve_model``)."""
    from simtrain.spec.config import RunConfig
    from simtrain.spec.model import ModelSpec

    cls: type[BaseModel] | None = RunConfig
    parts = key.split(".")
    for i, part in enumerate(parts):
        where = ".".join(parts[:i]) or "the config"
        if cls is None:
            return Problem("--grid", f"{key!r}: {where} is a single value, it has no field {part!r}")
        valid = list(cls.model_fields) + (["preset", "hf_config"] if cls is ModelSpec else []) + (
            override_names() if cls is StackOverride else [])  # a stack field by its flat name (simtrain.spec.stacks)
        if part not in valid:
            return Problem("--grid", f"{key!r}: {part!r} is not a field of {where}; valid: {', '.join(valid)}")
        if part not in cls.model_fields:  # model.preset / model.hf_config: a string
            cls = None
            continue
        annotation = cls.model_fields[part].annotation
        if _free_form(annotation):
            return None
        cls = _submodel(annotation)
    return None


def check_grid(grid: dict[str, list[Any]]) -> None:
    """Raise for grid keys that name no config field, before anything is simulated.

    Raises:
        ConfigError: each unknown key with the valid fields at the level it goes wrong.
    """
    problems = [p for p in (key_problem(k) for k in grid) if p is not None]
    if problems:
        raise ConfigError(problems)


def expand_grid(grid: dict[str, list[Any]]) -> list[dict[str, Any]]:
    """The cartesian product of the grid as a list of points (first key varies slowest)."""
    keys = list(grid)
    return [dict(zip(keys, combo, strict=True)) for combo in itertools.product(*(grid[k] for k in keys))]


def base_data(config: RunConfig | dict[str, Any] | str | Path, overrides: list[str] | None = None) -> dict[str, Any]:
    """The config as a plain dict (file read, relative paths resolved), overrides applied, not validated."""
    if isinstance(config, RunConfig):
        data: dict[str, Any] = config.model_dump(mode="json")
    elif isinstance(config, dict):
        data = config
    else:
        data = read_config_file(config)
    return apply_overrides(data, overrides or [])


def point_data(base: dict[str, Any], point: dict[str, Any]) -> dict[str, Any]:
    """The base dict with a grid point's dotted values set, and ``layout.dp=auto`` resolved."""
    data = apply_overrides(base, [f"{k}={json.dumps(v)}" for k, v in point.items()])
    return fill_auto_dp(data)


def fill_auto_dp(data: dict[str, Any]) -> dict[str, Any]:
    """Replace ``layout.dp: auto`` by the cluster's GPUs / (tp x pp x cp), when that divides."""
    layout = data.get("layout")
    if not isinstance(layout, dict) or layout.get("dp") != "auto":
        return data
    from simtrain.hardware.load import load_node

    hw = data.get("hardware") or {}
    node = load_node(str(hw.get("node", "dgx-h100")), hw.get("gpu"))
    gpus = int(hw.get("gpus_per_node") or node.gpus_per_node) * int(hw.get("n_nodes", 1))
    other = int(layout.get("tp", 1)) * int(layout.get("pp", 1)) * int(layout.get("cp", 1))
    if gpus % other:
        raise ConfigError(Problem("layout.dp", f"'auto' needs tp x pp x cp = {other} to divide the cluster's "
                                               f"{gpus} GPUs"))
    return {**data, "layout": {**layout, "dp": gpus // other}}


# -- one point --------------------------------------------------------------------------------------
def _flatten(prefix: str, value: Any, out: Row) -> None:
    if isinstance(value, dict):
        for k, v in value.items():
            _flatten(f"{prefix}.{k}" if prefix else k, v, out)
    elif isinstance(value, list | tuple):
        out[prefix] = json.dumps(value)
    else:
        out[prefix] = value


def config_columns(run: RunConfig) -> Row:
    """Resolved config fields as dotted columns (model: its name and parameter count only)."""
    out: Row = {"model.name": run.model.name, "model.params": run.model.param_count()}
    dumped = run.model_dump(mode="json", exclude={"model"})
    for section in ("hardware", "layout", "train", "sim", "run"):
        if dumped.get(section) is not None:
            _flatten(section, dumped[section], out)
    return out


def downsample_timeline(points: Sequence[tuple[float, float]], n: int = TIMELINE_POINTS) -> list[list[float]]:
    """At most ``n`` (time_s, bytes) points: the highest level in each of ``n`` equal time bins."""
    if len(points) <= n:
        return [[float(t), float(b)] for t, b in points]
    t0, t1 = points[0][0], points[-1][0]
    width = (t1 - t0) / n or 1.0
    bins: dict[int, list[float]] = {}
    for t, b in points:
        k = min(int((t - t0) / width), n - 1)
        if k not in bins or b > bins[k][1]:
            bins[k] = [t0 + k * width, float(b)]
    return [bins[k] for k in sorted(bins)]


def memory_json(r: StepResult) -> str:
    """Per-stage memory: peak, capacity, components and a down-sampled timeline, as JSON (bytes, s)."""
    return json.dumps([{"stage": m.stage, "peak_bytes": m.peak_bytes, "capacity_bytes": m.capacity_bytes,
                        "fits": m.fits, "components": m.components, "timeline": downsample_timeline(m.timeline)}
                       for m in r.memory])


def result_columns(r: StepResult) -> Row:
    """StepResult as unit-suffixed columns."""
    bd = r.breakdown_s
    exposed = {f"exposed_{a}_s": float(bd["exposed_comm"].get(a, 0.0)) for a in AXES}
    peak = max(m.peak_bytes for m in r.memory)
    capacity = r.memory[0].capacity_bytes
    band = r.error_band
    return {
        "n_gpus": r.n_gpus, "global_batch_tokens": r.global_batch_tokens, "microbatches": r.microbatches,
        "step_time_s": r.step_time_s, "step_time_low_s": band.low_s if band else None,
        "step_time_high_s": band.high_s if band else None,
        "tokens_per_s": r.tokens_per_s, "tokens_per_s_per_gpu": r.tokens_per_s_per_gpu,
        "model_tflops_per_gpu": r.model_tflops_per_gpu, "hardware_tflops_per_gpu": r.hardware_tflops_per_gpu,
        "mfu": r.mfu, "hfu": r.hfu, "compute_s": float(bd["compute"]), "bubble_s": float(bd["bubble"]),
        "stage_imbalance_s": float(bd["stage_imbalance"]), "offload_s": float(bd.get("offload", 0.0)),
        "exposed_comm_s": sum(exposed.values()), **exposed, "optimizer_s": float(bd["optimizer"]),
        "other_s": float(bd["other"]), "sync_wait_s": float(bd.get("sync_wait", 0.0)), "peak_memory_bytes": peak, "capacity_bytes": capacity,
        "memory_headroom_bytes": capacity - peak, "fits": r.fits, "memory_json": memory_json(r),
        **variability_columns(r),
    }


def variability_columns(r: StepResult) -> Row:
    """``sim.variability``'s step-time percentiles as ``step_time_p10_s`` / ``_p50_s`` / ``_p90_s`` (none without it)."""
    if r.variability is None:
        return {}
    st = r.variability["step_time_s"]
    return {f"step_time_p{p}_s": st[f"p{p}"] for p in PERCENTILES}


def step_config(run: RunConfig) -> RunConfig:
    """The one-step config simulated for a point: batch in sequences, no ``run`` section (the same key
    ``simtrain.studies.run`` caches its phases under, so a constant-batch run reuses the point's step)."""
    train = run.train.model_copy(update={"global_batch_seqs": run.train.global_batch_seqs_resolved,
                                         "global_batch_tokens": None})
    return run.model_copy(update={"train": train, "run": None})


def evaluate_point(base: dict[str, Any], point: dict[str, Any], index: int, whole_run: bool = True) -> Row:
    """Simulate one grid point; never raises for bad input (the row carries the error).

    Module-level and pure, so that worker processes and Dask workers can run it.
    """
    from simtrain.studies.simulate import simulate

    row: Row = {"point": index, **{k: _cell(v) for k, v in point.items()}}
    try:
        data = point_data(base, point)
        row.update({k: _cell(_lookup(data, k, v)) for k, v in point.items()})
        run = load_config(data)
        row.update(config_columns(run))
        cfg = step_config(run)
        result = simulate(cfg)
        row.update(result_columns(result))
        if whole_run and run.run is not None:
            row.update(_run_columns(run, {cfg.model_dump_json(): result}))
        row["error"] = None
    except ConfigError as exc:
        row.update(error=str(exc), error_kind="config")
    except InfeasibleLayout as exc:
        row.update(error=str(exc), error_kind="infeasible")
    except SimtrainError as exc:
        row.update(error=str(exc), error_kind="error")
    except Exception as exc:  # noqa: BLE001 - a sweep goes on past a failing point, with its error
        row.update(error=f"internal error: {type(exc).__name__}: {exc}", error_kind="internal")
    return row


def _lookup(data: dict[str, Any], dotted: str, default: Any) -> Any:
    """The value at a dotted path of a nested dict (``default`` when absent)."""
    node: Any = data
    for part in dotted.split("."):
        if not isinstance(node, dict) or part not in node:
            return default
        node = node[part]
    return node


def _cell(value: Any) -> Any:
    return json.dumps(value) if isinstance(value, list | dict) else value


def _run_columns(run: RunConfig, cache: dict[str, StepResult]) -> Row:
    from simtrain.studies.run import simulate_run

    rr = simulate_run(run, cache=cache)
    return {"run_tokens": rr.tokens, "run_steps": rr.steps, "time_to_train_s": rr.time_to_train_s,
            "gpu_hours": rr.gpu_hours, "cost": rr.cost, "run_mfu": rr.mfu, "run_phases": len(rr.phases)}


# -- running many points ----------------------------------------------------------------------------
Progress = Callable[[int], None]


def run_points(base: dict[str, Any], points: list[dict[str, Any]], workers: int | None = None,
               scheduler: str | None = None, progress: bool = False, whole_run: bool = True,
               label: str = "simulating", connect_timeout_s: float = 10.0) -> list[Row]:
    """Evaluate every point (locally in processes, or on Dask), rows returned in point order; with
    ``progress``, a bar with its ETA on stderr (``simtrain.studies.progress``)."""
    from simtrain.studies.progress import progress_bar

    with progress_bar(label, len(points), enabled=progress) as advance:
        if scheduler:
            rows = _run_dask(base, points, scheduler, whole_run, advance, connect_timeout_s)
        else:
            rows = _run_local(base, points, workers, whole_run, advance)
    return sorted(rows, key=lambda r: r["point"])


def default_workers() -> int:
    """Worker processes by default: the CPUs this process may use."""
    try:
        return max(len(os.sched_getaffinity(0)), 1)
    except AttributeError:  # pragma: no cover - not Linux
        return max(os.cpu_count() or 1, 1)


def _run_local(base: dict[str, Any], points: list[dict[str, Any]], workers: int | None, whole_run: bool,
               advance: Progress) -> list[Row]:
    n = min(workers or default_workers(), max(len(points), 1))
    if n <= 1:
        rows = []
        for i, p in enumerate(points):
            rows.append(evaluate_point(base, p, i, whole_run))
            advance(1)
        return rows
    out = []
    with ProcessPoolExecutor(max_workers=n) as pool:
        futures = [pool.submit(evaluate_point, base, p, i, whole_run) for i, p in enumerate(points)]
        for fut in as_completed(futures):
            out.append(fut.result())
            advance(1)
    return out


def _run_dask(base: dict[str, Any], points: list[dict[str, Any]], address: str, whole_run: bool,
              advance: Progress, connect_timeout_s: float) -> list[Row]:
    try:
        from dask.distributed import Client
        from dask.distributed import as_completed as dask_completed
    except ImportError:
        raise ConfigError(Problem("--scheduler", "a Dask scheduler needs dask.distributed: "
                                                 "pip install 'simtrain[distributed]'")) from None
    try:
        client = Client(address, timeout=f"{connect_timeout_s}s")
    except (OSError, TimeoutError) as exc:
        raise ConfigError(Problem("--scheduler", f"cannot connect to the Dask scheduler {address!r}: {exc}")) from None
    out = []
    with client:
        n = len(points)
        futures = client.map(evaluate_point, [base] * n, points, list(range(n)), [whole_run] * n, pure=False)
        for fut in dask_completed(futures):
            out.append(fut.result())
            advance(1)
    return out


def sweep(config: RunConfig | dict[str, Any] | str | Path, grid: dict[str, list[Any]] | list[str],
          overrides: list[str] | None = None, workers: int | None = None, scheduler: str | None = None,
          progress: bool = False, whole_run: bool = True, connect_timeout_s: float = 10.0) -> pd.DataFrame:
    """Simulate every point of a grid over config fields; one DataFrame row per point, in grid order.

    Args:
        config: base RunConfig, dict or YAML/JSON path.
        grid: ``{"layout.tp": [1, 2, 4]}`` or ``["layout.tp=1,2,4", ...]`` (as ``--grid``).
        overrides: ``--set`` style overrides applied to the base first.
        workers: local worker processes (default: the CPUs available; 1 runs in this process).
        scheduler: a Dask distributed scheduler address (``tcp://host:8786``); overrides ``workers``.
        progress: show a progress bar on stderr.
        whole_run: with a ``run:`` section, add the whole run's columns (time to train, GPU-hours, cost).
        connect_timeout_s: how long to try reaching the Dask scheduler, seconds.

    Raises:
        ConfigError: a malformed grid, a grid key that names no config field, a base file that cannot be
            read, or an unreachable scheduler.
    """
    if not isinstance(grid, dict):
        grid = parse_grid(grid)
    check_grid(grid)
    base = base_data(config, overrides)
    rows = run_points(base, expand_grid(grid), workers, scheduler, progress, whole_run,
                      connect_timeout_s=connect_timeout_s)
    return to_frame(rows, list(grid))


def to_frame(rows: list[Row], first: list[str] | None = None) -> pd.DataFrame:
    """Rows -> DataFrame: ``point`` and the grid columns first, ``error`` last, mixed columns as text."""
    import pandas as pd

    df = pd.DataFrame(rows)
    if "error" not in df:
        df["error"] = None
    lead = ["point", *[c for c in (first or []) if c != "point"]]
    order = [c for c in lead if c in df] + [c for c in df.columns if c not in lead and c not in ("error", "error_kind")]
    order += [c for c in ("error", "error_kind") if c in df]
    return _arrow_safe(df[order])


def _arrow_safe(df: pd.DataFrame) -> pd.DataFrame:
    """Columns holding more than one Python type (e.g. 4 and 'auto') become text, so Parquet can store them."""
    df = df.copy()
    for col in df.columns:
        if df[col].dtype != object:
            continue
        kinds = {type(v) for v in df[col] if v is not None and v == v}
        if len(kinds) > 1 and not kinds <= {int, float}:
            df[col] = [None if v is None or v != v else str(v) for v in df[col]]
    return df


# -- files ------------------------------------------------------------------------------------------
def write_table(df: pd.DataFrame, path: str | Path) -> None:
    """Write a table atomically: ``.parquet`` (pyarrow) or ``.csv`` by the file's suffix.

    Raises:
        ConfigError: an unknown suffix or a missing pyarrow (path ``--out``).
    """
    p = Path(path)
    suffix = p.suffix.lower()
    if suffix not in (".parquet", ".pq", ".csv"):
        raise ConfigError(Problem("--out", f"{str(p)!r}: unknown table format; use .parquet or .csv"))
    if suffix != ".csv":
        _need_pyarrow()
    if suffix == ".csv":
        write_atomic_with(p, lambda tmp: df.to_csv(tmp, index=False))
    else:
        write_atomic_with(p, lambda tmp: df.to_parquet(tmp, index=False))


def write_atomic_with(path: str | Path, write: Callable[[str], object]) -> None:
    """Call ``write(tmp)`` on a temporary file beside ``path``, then rename it over ``path``.

    The file gets the usual permissions (0666 less the umask), not mkstemp's 0600; a failed write
    leaves any existing file untouched.
    """
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=p.parent, prefix=f".{p.name}.", suffix=".tmp")
    os.close(fd)
    try:
        write(tmp)
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)
        os.replace(tmp, p)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_text_atomic(path: str | Path, text: str) -> None:
    """Write text atomically (see ``write_atomic_with``)."""
    write_atomic_with(path, lambda tmp: Path(tmp).write_text(text, encoding="utf-8"))


def read_table(path: str | Path) -> pd.DataFrame:
    """Read a table written by ``write_table`` (Parquet or CSV), with ``fits`` as booleans.

    Raises:
        ConfigError: a missing, empty or unparsable file, or an unknown format.
    """
    import pandas as pd

    p = Path(path)
    if not p.is_file():
        raise ConfigError(Problem("table", f"file not found: {str(p)!r}"))
    suffix = p.suffix.lower()
    if suffix in (".parquet", ".pq"):
        _need_pyarrow()
        try:
            df = pd.read_parquet(p)
        except (OSError, ValueError) as exc:  # pyarrow's ArrowInvalid is a ValueError
            raise ConfigError(Problem(str(p), f"not a readable Parquet table: {exc}")) from None
    elif suffix == ".csv":
        try:
            df = pd.read_csv(p)
        except pd.errors.EmptyDataError:
            raise ConfigError(Problem(str(p), "the file is empty (no header, no rows); write one with "
                                              "sweep, search or run --out")) from None
        except (pd.errors.ParserError, UnicodeDecodeError) as exc:
            raise ConfigError(Problem(str(p), f"not a readable CSV table: {exc}")) from None
    else:
        raise ConfigError(Problem("table", f"{str(p)!r}: unknown table format; use .parquet or .csv"))
    if "fits" in df:
        df["fits"] = [str(v).lower() == "true" for v in df["fits"]]
    return df


def _need_pyarrow() -> None:
    try:
        import pyarrow  # noqa: F401
    except ImportError:
        raise ConfigError(Problem("--out", "Parquet needs pyarrow: pip install 'simtrain[report]' "
                                           "(or write .csv)")) from None

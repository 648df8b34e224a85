"""Calibrated hardware profiles: loading, validation, and the cluster a run gets from one.

A calibrated profile is what ``simtrain calibrate`` (the torch suite in ``calibration/``) measured on
one machine. It lives in ``calibrated/<name>/profile.yaml`` of the user profile directory (or of the
package, for the shipped example; ``simtrain/hardware/profile_paths.py`` says where), the raw measurements
appended to ``measurements.jsonl`` beside it while calibrating, and is selected with
``hardware.profile: <name>`` (or a path to the file or its folder).

File format (``schema: simtrain-calibrated-profile``, ``schema_version: 1``; YAML):

- ``device``: ``kind`` (``cpu`` or ``cuda``), name, ``dtype`` measured, ``threads_per_process``,
  ``base_gpu`` (cuda: the built-in GPU profile this device is), ``memory_bytes``, clocks, driver and
  library versions (informational).
- ``summary``: headline figures derived from the measurements: ``peak_flops_per_s`` (best GEMM),
  ``memory_Bps`` (copy bandwidth), ``launch_s`` (smallest op), attention and memory-op throughput,
  ``host_copy_Bps`` (device <-> pinned host copies, the slower direction: CPU activation offloading),
  ``in_situ`` (a layer step measured whole over the sum of its kernels measured alone),
  ``comm_interference`` (GEMM slowdown while a collective runs: ``intra``/``inter`` node), on a
  CPU ``contention`` (slowdown per op class when ``N`` processes share the machine), and
  ``step_jitter`` (``median_s``, ``sigma_s``, ``cv``, ``steps``: the spread of whole training steps).
- ``fits``: the fitted cost functions (``simtrain/hardware/calibrated.py`` documents how each is evaluated):
  ``gemm`` (parametric model), ``attention.fwd|bwd`` and ``memory_ops.<kind>`` curves
  (``x``, ``t_s``, ``a_s``, ``rate``, residuals), ``collectives`` (one curve per collective, ranks, nodes).
- ``measurements``: every measurement as tables (``columns`` + ``rows``); the GEMM and attention
  rows are also the exact-shape lookups.
- ``end_of_profile: true`` as the last key: a file without it was cut short.

How a profile enters a run:

- ``cuda``: the node keeps its topology; its GPU becomes the base GPU profile with the measured
  efficiencies, launch overhead and interference, and ``ComputeCostModel`` / the collective planner
  use the calibrated functions (``CalibratedGpuSpec``). ``hardware.node: calibrated`` is the
  calibrated machine itself (up to the GPUs it had, e.g. one GPU), on the links of the built-in node
  that carries its GPU.
- ``cpu``: the profile *is* the device: one machine running ``layout.world_size`` processes (at most
  the number calibrated), each with ``threads_per_process`` threads, a single-node "cluster" whose
  links are the measured gloo curves. Compute times are multiplied by the measured contention of that
  many processes sharing the cores. The profile's ``dtype`` (fp32 on CPUs) stands for the run's
  compute dtype: calibrated kernel times are used as measured.
"""

from __future__ import annotations

import functools
import math
import statistics
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import ConfigDict

from simtrain.hardware.calibrated import (
    GEMM_ROLES,
    AttentionModel,
    CalibratedCompute,
    CollectiveTable,
    Curve,
    GemmModel,
    curve_from_lists,
)
from simtrain.hardware.hardware import ClusterSpec, GpuSpec, NodeSpec
from simtrain.hardware.load import build_cluster, list_nodes, load_node
from simtrain.hardware.profile_paths import (
    PROFILE_FILE as PROFILE_FILE,  # re-exported: the writer names the file
)
from simtrain.hardware.profile_paths import ProfileKind, names, output_folder, resolve, user_root
from simtrain.spec.collective_kinds import CollectiveKind
from simtrain.spec.config import HardwareConfig
from simtrain.spec.errors import ConfigError, Problem, problem
from simtrain.spec.safe_yaml import load_yaml
from simtrain.spec.units import GB

SCHEMA = "simtrain-calibrated-profile"
SCHEMA_VERSION = 1
JOURNAL_FILE = "measurements.jsonl"
KINDS = ("cpu", "cuda")
CALIBRATED_NODE = "calibrated"  # hardware.node naming the calibrated machine itself
OP_CLASSES = ("gemm", "attention", "memory")


class CalibratedGpuSpec(GpuSpec):
    """A GpuSpec carrying a calibrated profile's cost functions (compute tables and collective curves)."""

    model_config = ConfigDict(frozen=True, extra="forbid", arbitrary_types_allowed=True)

    profile_name: str
    compute: CalibratedCompute
    collectives: CollectiveTable


@dataclass(frozen=True, slots=True, eq=False)
class CalibratedProfile:
    """A loaded, validated calibrated profile (SI units).

    Attributes:
        name: profile name; file: where it was read from.
        kind: "cpu" or "cuda". dtype: the dtype compute was measured in.
        base_gpu: the built-in GPU profile of a cuda device (None if unknown or a CPU).
        threads_per_process: CPU threads each process used (1 on GPUs).
        memory_bytes: device memory (a CPU: the machine's RAM), bytes.
        device_count: GPUs (or CPU cores) the calibrated machine had.
        summary: headline figures (see the module docstring), SI.
        compute: calibrated compute functions; collectives: measured collective curves.
        contention: processes -> {op class -> slowdown factor} (CPU).
    """

    name: str
    file: str
    kind: str
    dtype: str
    base_gpu: str | None
    threads_per_process: int
    memory_bytes: float
    device_count: int
    summary: dict[str, Any]
    compute: CalibratedCompute
    collectives: CollectiveTable
    contention: dict[int, dict[str, float]]

    @property
    def max_processes(self) -> int:
        """The most processes per machine this profile was calibrated with (its collective world)."""
        sizes = [p for (_, p, n) in self.collectives.curves if n == 1]
        return max([1, *sizes, *self.contention])

    def contention_for(self, processes: int) -> dict[str, float]:
        """Slowdown per op class with ``processes`` sharing a CPU: measured, or linear between 1 and
        the nearest measured count (1 process: no slowdown)."""
        if processes <= 1 or not self.contention:
            return {}
        if processes in self.contention:
            return dict(self.contention[processes])
        upper = min((p for p in self.contention if p > processes), default=max(self.contention))
        w = (processes - 1) / (upper - 1)
        return {c: 1.0 + w * (f - 1.0) for c, f in self.contention[upper].items()}


def calibrated_dir() -> Path:
    """The user's folder of calibrated profiles, where ``simtrain calibrate --out NAME`` writes:
    ``<user profile dir>/calibrated`` (``simtrain/hardware/profile_paths.py``)."""
    return user_root() / ProfileKind.CALIBRATED.value


def list_profiles() -> list[str]:
    """Names of the calibrated profiles present, built-in and the user's (folders holding a ``profile.yaml``), sorted."""
    return names(ProfileKind.CALIBRATED)


def profile_folder(name_or_path: str) -> Path:
    """The folder calibration writes profile ``name_or_path`` to: a name under the user's ``calibrated/``
    (refused if it is a built-in profile's), or the folder given (a profile file's folder).

    Raises:
        ConfigError: the name is a built-in profile's.
    """
    return output_folder(name_or_path)


def load_profile(name_or_path: str, *, path: str = "hardware.profile") -> CalibratedProfile:
    """Load and validate a calibrated profile by name (built-in or the user's) or path (a folder or its file).

    Raises:
        ConfigError: unknown name (listing the valid ones), unreadable, truncated, corrupt or
            wrong-version file, each problem with its place in the file.
    """
    ref = resolve(ProfileKind.CALIBRATED, name_or_path, path, hint="; create one with `simtrain calibrate --out NAME`")
    file = ref.path()
    if file is None:  # the package is not on disk (a zip): read it directly, uncached
        return _parse_text(ref.read_text(), str(ref))
    stat = file.stat()
    return _load_cached(str(file.resolve()), stat.st_mtime_ns, stat.st_size)


@functools.lru_cache(maxsize=16)
def _load_cached(file: str, mtime_ns: int, size: int) -> CalibratedProfile:
    try:
        text = Path(file).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(Problem(file, f"cannot read the calibrated profile: {exc}")) from None
    return _parse_text(text, file)


def _parse_text(text: str, file: str) -> CalibratedProfile:
    try:
        data = load_yaml(text, file)  # bounded: simtrain.spec.safe_yaml
    except ConfigError as exc:
        raise ConfigError(Problem(file, f"corrupt calibrated profile ({exc.problems[0].message}); "
                                        "re-run the calibration")) from None
    return parse_profile(data, file)


def parse_profile(data: Any, file: str) -> CalibratedProfile:
    """Validate a profile's parsed YAML and build the CalibratedProfile; every problem is collected."""
    r = _Reader(file)
    if not isinstance(data, dict):
        raise ConfigError(Problem(file, f"corrupt calibrated profile: expected a mapping, got {type(data).__name__}"))
    if data.get("schema") != SCHEMA:
        raise ConfigError(problem(f"{file}: schema", data.get("schema"), f"expected {SCHEMA!r} (not a calibrated "
                                                                          "profile)"))
    version = data.get("schema_version")
    if version != SCHEMA_VERSION:
        raise ConfigError(problem(f"{file}: schema_version", version, f"this simtrain reads version {SCHEMA_VERSION}; "
                                                                       "re-run the calibration with this simtrain"))
    if data.get("end_of_profile") is not True:
        raise ConfigError(Problem(f"{file}: end_of_profile", "missing: the file is truncated (it must end with "
                                                             "`end_of_profile: true`); re-run the calibration"))
    device = r.mapping(data, "device")
    summary = r.mapping(data, "summary")
    fits = r.mapping(data, "fits")
    measurements = r.mapping(data, "measurements")
    kind = device.get("kind")
    if kind not in KINDS:
        r.bad("device.kind", kind, f"valid: {', '.join(KINDS)}")
    in_situ = r.number(summary, "in_situ", "summary", strict=True) if summary.get("in_situ") is not None else 1.0
    compute = CalibratedCompute(gemm=_gemm(r, fits, measurements), attention=_attention(r, fits, measurements),
                                memory_ops=_memory_ops(r, fits), in_situ=in_situ)
    collectives = CollectiveTable(_collectives(r, fits))
    contention = _contention(r, summary)
    for key in ("peak_flops_per_s", "memory_Bps", "launch_s", "host_copy_Bps"):  # null: not measured
        if summary.get(key) is not None:
            r.number(summary, key, "summary", minimum=0.0, strict=key != "launch_s")
    jitter = r.optional_mapping(summary, "step_jitter", "summary.")
    if jitter is not None:
        r.number(jitter, "cv", "summary.step_jitter")
        if jitter.get("median_s") is not None:
            r.number(jitter, "median_s", "summary.step_jitter", strict=True)
    memory = r.number(device, "memory_bytes", "device", minimum=0.0, strict=True)
    threads = device.get("threads_per_process", 1)
    if not isinstance(threads, int) or isinstance(threads, bool) or threads < 1:
        r.bad("device.threads_per_process", threads, "expected an integer >= 1")
        threads = 1
    count = device.get("count", 1)
    if not isinstance(count, int) or isinstance(count, bool) or count < 1:
        r.bad("device.count", count, "expected an integer >= 1")
    r.raise_if_any()
    base = device.get("base_gpu")
    return CalibratedProfile(
        name=str(data.get("name") or Path(file).parent.name), file=file, kind=str(kind),
        dtype=str(device.get("dtype", "bf16")), base_gpu=str(base) if base else None, threads_per_process=threads,
        memory_bytes=memory, device_count=int(count), summary=summary, compute=compute, collectives=collectives, contention=contention)


class _Reader:
    """Collects every problem of one file, each with its dotted place in the file."""

    def __init__(self, file: str):
        self.file = file
        self.problems: list[Problem] = []

    def bad(self, where: str, value: Any, valid: str) -> None:
        self.problems.append(problem(f"{self.file}: {where}", value, valid))

    def missing(self, where: str) -> None:
        self.problems.append(Problem(f"{self.file}: {where}", "missing"))

    def mapping(self, data: dict[str, Any], key: str, where: str = "") -> dict[str, Any]:
        value = data.get(key)
        if not isinstance(value, dict):
            if value is None:
                self.missing(f"{where}{key}")
            else:
                self.bad(f"{where}{key}", type(value).__name__, "expected a mapping")
            return {}
        return value

    def optional_mapping(self, data: dict[str, Any], key: str, where: str = "",
                         expected: str = "expected a mapping") -> dict[str, Any] | None:
        """``data[key]`` when it is a mapping; None when it is absent, or (a problem recorded) not a mapping."""
        value = data.get(key)
        if value is not None and not isinstance(value, dict):
            self.bad(f"{where}{key}", type(value).__name__, expected)
            return None
        return value

    def number(self, data: dict[str, Any], key: str, where: str, minimum: float = 0.0, strict: bool = False,
               default: float | None = None) -> float:
        value = data.get(key, default)
        ok = (isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
              and (value > minimum if strict else value >= minimum))
        if not ok or value is None:
            self.bad(f"{where}.{key}", value, f"expected a finite number {'>' if strict else '>='} {minimum}")
            return 1.0
        return float(value)

    def curve(self, data: Any, where: str) -> Curve | None:
        if not isinstance(data, dict):
            self.bad(where, type(data).__name__, "expected a curve mapping (x, t_s, a_s, rate)")
            return None
        xs, ts = data.get("x"), data.get("t_s")
        a_s = self.number(data, "a_s", where)
        rate = self.number(data, "rate", where, strict=True)
        if not (isinstance(xs, list) and isinstance(ts, list) and xs and len(xs) == len(ts)):
            self.bad(f"{where}.x", xs, "expected non-empty lists x and t_s of equal length")
            return None
        if not all(_positive(v) for v in xs + ts):
            self.bad(f"{where}.t_s", ts, "every x and t_s must be a finite number > 0")
            return None
        if any(b <= a for a, b in zip(xs, xs[1:], strict=False)):
            self.bad(f"{where}.x", xs, "must be strictly increasing")
            return None
        return curve_from_lists(xs, ts, a_s, rate)

    def table(self, measurements: dict[str, Any], name: str, needed: tuple[str, ...]) -> list[dict[str, Any]]:
        """Rows of ``measurements.<name>`` as dicts (missing table: empty)."""
        tab = measurements.get(name)
        if tab is None:
            return []
        where = f"measurements.{name}"
        if not isinstance(tab, dict) or not isinstance(tab.get("columns"), list) or not isinstance(tab.get("rows"), list):
            self.bad(where, type(tab).__name__, "expected a table with `columns` and `rows` lists")
            return []
        cols = tab["columns"]
        absent = [c for c in needed if c not in cols]
        if absent:
            self.bad(f"{where}.columns", cols, f"missing columns {absent}")
            return []
        out = []
        for i, row in enumerate(tab["rows"]):
            if not isinstance(row, list) or len(row) != len(cols):
                self.bad(f"{where}.rows[{i}]", row, f"expected a list of {len(cols)} values")
                continue
            out.append(dict(zip(cols, row, strict=True)))
        return out

    def raise_if_any(self) -> None:
        if self.problems:
            raise ConfigError(self.problems)


def _positive(v: Any) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v) and v > 0


def _ok_rows(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [row for row in rows if row.get("status", "ok") == "ok" and _positive(row.get("median_s"))]


def _medians(rows: list[dict[str, Any]], key: Callable[[dict[str, Any]], Any]) -> dict[Any, float]:
    """Median time per key over the rows (a shape measured in several rounds)."""
    groups: dict[Any, list[float]] = {}
    for row in _ok_rows(rows):
        groups.setdefault(key(row), []).append(float(row["median_s"]))
    return {k: statistics.median(v) for k, v in groups.items()}


def _gemm(r: _Reader, fits: dict[str, Any], measurements: dict[str, Any]) -> GemmModel | None:
    fit = r.optional_mapping(fits, "gemm", "fits.")
    if fit is None:
        return None
    where = "fits.gemm"
    peaks = r.mapping(fit, "peak_flops_per_s", f"{where}.")
    peak = {role: r.number(peaks, role, f"{where}.peak_flops_per_s", strict=True) for role in peaks}
    if "fwd" not in peak:
        r.missing(f"{where}.peak_flops_per_s.fwd")
    if set(peak) - set(GEMM_ROLES):
        r.bad(f"{where}.peak_flops_per_s", sorted(peak), f"roles are {', '.join(GEMM_ROLES)}")
    rows = r.table(measurements, "gemm", ("kernel", "role", "m", "n", "k", "median_s"))
    points = _medians(rows, lambda x: (str(x["kernel"] or ""), str(x["role"]), int(x["m"]), int(x["n"]), int(x["k"])))
    return GemmModel(t0_s=r.number(fit, "t0_s", where), peak_flops_per_s=peak,
                     m_half=r.number(fit, "m_half", where), n_half=r.number(fit, "n_half", where),
                     k_half=r.number(fit, "k_half", where), points=points)


def _attention(r: _Reader, fits: dict[str, Any], measurements: dict[str, Any]) -> AttentionModel | None:
    fit = r.optional_mapping(fits, "attention", "fits.", "expected a mapping with fwd and bwd curves")
    if fit is None:
        return None
    fwd = r.curve(fit["fwd"], "fits.attention.fwd") if "fwd" in fit else None
    bwd = r.curve(fit["bwd"], "fits.attention.bwd") if "bwd" in fit else None
    cols = ("b", "s_q", "s_kv", "heads", "kv_heads", "d", "causal", "backward", "median_s")
    points = _medians(r.table(measurements, "attention", cols),
                      lambda x: (int(x["b"]), int(x["s_q"]), int(x["s_kv"]), int(x["heads"]), int(x["kv_heads"]),
                                 int(x["d"]), bool(x["causal"]), bool(x["backward"])))
    return AttentionModel(fwd=fwd, bwd=bwd, points=points)


def _memory_ops(r: _Reader, fits: dict[str, Any]) -> dict[str, Curve]:
    ops = fits.get("memory_ops") or {}
    if not isinstance(ops, dict):
        r.bad("fits.memory_ops", type(ops).__name__, "expected a mapping of operation kind to curve")
        return {}
    out = {}
    for kind, data in ops.items():
        c = r.curve(data, f"fits.memory_ops.{kind}")
        if c is not None:
            out[str(kind)] = c
    return out


def _collectives(r: _Reader, fits: dict[str, Any]) -> dict[tuple[CollectiveKind, int, int], Curve]:
    items = fits.get("collectives") or []
    if not isinstance(items, list):
        r.bad("fits.collectives", type(items).__name__, "expected a list of curves")
        return {}
    out = {}
    for i, data in enumerate(items):
        where = f"fits.collectives[{i}]"
        if not isinstance(data, dict) or not isinstance(data.get("collective"), str):
            r.bad(where, data if not isinstance(data, dict) else data.get("collective"), "expected a curve with a "
                                                                                         "`collective` name")
            continue
        try:  # profiles store a kind by its string value (calibration/writer.py)
            kind = CollectiveKind(data["collective"])
        except ValueError:
            r.bad(f"{where}.collective", data["collective"], f"expected one of {CollectiveKind.names()}")
            continue
        ranks, nodes = data.get("ranks"), data.get("nodes")
        if not (isinstance(ranks, int) and ranks >= 2 and isinstance(nodes, int) and nodes >= 1):
            r.bad(f"{where}.ranks", (ranks, nodes), "ranks must be an integer >= 2 and nodes >= 1")
            continue
        c = r.curve(data, where)
        if c is not None:
            out[(kind, ranks, nodes)] = c
    return out


def _contention(r: _Reader, summary: dict[str, Any]) -> dict[int, dict[str, float]]:
    raw = summary.get("contention") or {}
    if not isinstance(raw, dict):
        r.bad("summary.contention", type(raw).__name__, "expected processes -> {gemm, attention, memory}")
        return {}
    out: dict[int, dict[str, float]] = {}
    for procs, factors in raw.items():
        where = f"summary.contention.{procs}"
        if not (str(procs).isdigit() and int(procs) >= 2 and isinstance(factors, dict)):
            r.bad(where, factors, "expected an integer process count >= 2 mapping to {gemm, attention, memory}")
            continue
        out[int(procs)] = {c: r.number(factors, c, where, minimum=0.0, strict=True, default=1.0) for c in OP_CLASSES}
    return out


# --------------------------------------------------------------------------------------------------
# The cluster a run gets
# --------------------------------------------------------------------------------------------------


def run_cluster(hw: HardwareConfig, world_size: int) -> ClusterSpec:
    """The ClusterSpec of a run's hardware section, with its calibrated profile applied when it names one.

    Raises:
        ConfigError: bad hardware fields, or a profile that is missing, corrupt, or does not fit the run.
    """
    if hw.profile is None:
        return build_cluster(hw.node, hw.n_nodes, gpu=hw.gpu, nics_per_node=hw.nics_per_node, nic_Gbps=hw.nic_Gbps,
                             oversubscription=hw.oversubscription, nodes_per_leaf=hw.nodes_per_leaf,
                             net_hop_latency_us=hw.net_hop_latency_us, gpus_per_node=hw.gpus_per_node,
                             host_copy_GBps=hw.host_copy_GBps)
    prof = load_profile(hw.profile)
    if prof.kind == "cpu":
        return _cpu_cluster(prof, hw, world_size)
    if hw.node == CALIBRATED_NODE:
        return _cuda_machine(prof, hw, world_size)
    return _cuda_cluster(prof, hw)


def _cpu_cluster(prof: CalibratedProfile, hw: HardwareConfig, world_size: int) -> ClusterSpec:
    explicit = [k for k in ("node", "gpu") if k in hw.model_fields_set and not (k == "node" and hw.node == CALIBRATED_NODE)]
    problems = [Problem(f"hardware.{k}", f"{getattr(hw, k)!r}: a CPU profile ({prof.name}) is its own node; "
                                         "remove this field") for k in explicit]
    if hw.n_nodes != 1:
        problems.append(problem("hardware.n_nodes", hw.n_nodes, f"a CPU profile ({prof.name}) describes one machine; "
                                                                 "use 1"))
    if world_size > prof.max_processes:
        problems.append(Problem("layout", f"{world_size} processes, but CPU profile {prof.name!r} was calibrated "
                                          f"for at most {prof.max_processes} (re-run `simtrain calibrate --device cpu "
                                          f"--processes {world_size}`)"))
    s = prof.summary
    if not (_positive(s.get("peak_flops_per_s")) and _positive(s.get("memory_Bps"))):
        problems.append(Problem(f"{prof.file}: summary", "no compute measurements in this CPU profile; run "
                                                          f"`simtrain calibrate --device cpu --out {prof.name}`"))
    if problems:
        raise ConfigError(problems)
    link_Bps = max(prof.collectives.peak_busbw_Bps, 1.0) if prof.collectives.curves else float(s["memory_Bps"])
    peak = float(s["peak_flops_per_s"])
    gpu = CalibratedGpuSpec(
        name=f"cpu:{prof.name}", bf16_flops_per_s=peak, fp8_flops_per_s=0.0, tf32_flops_per_s=peak,
        fp32_flops_per_s=peak, hbm_bytes=prof.memory_bytes / world_size, hbm_Bps=float(s["memory_Bps"]),
        sm_count=prof.threads_per_process, l2_bytes=0.0, nvlink_Bps=link_Bps, nvlink_domain=prof.max_processes,
        gemm_efficiency=1.0, hbm_efficiency=1.0, nvlink_efficiency=1.0, nvls_algbw_Bps=0.0, nvls_min_gpus=0,
        nic_efficiency=1.0, cuda_context_bytes=0.0, nccl_buffer_bytes=0.0, kernel_launch_s=float(s.get("launch_s") or 0.0),
        **_measured_fractions(s, peak, float(s["memory_Bps"])),
        profile_name=prof.name, compute=prof.compute.with_contention(prof.contention_for(world_size)),
        collectives=prof.collectives)
    node = NodeSpec(name=f"cpu:{prof.name}", gpu=gpu, gpus_per_node=world_size, scaleup="nvswitch", nics_per_node=1,
                    nic_Bps=link_Bps, pcie_Bps=link_Bps, nvlink_latency_s=0.0, net_hop_latency_s=0.0,
                    host_copy_Bps=_host_copy_Bps(hw, s))
    return ClusterSpec(node=node, n_nodes=1, nics_per_node=1, nic_Bps=link_Bps, net_hop_latency_s=0.0,
                       nvlink_latency_s=0.0)


def _host_copy_Bps(hw: HardwareConfig, summary: dict[str, Any]) -> float:
    """The device <-> host copy rate, bytes/s: the config's what-if (``hardware.host_copy_GBps``), else the
    profile's measured one, else 0 (not known)."""
    if hw.host_copy_GBps is not None:
        return float(hw.host_copy_GBps) * GB
    value: Any = summary.get("host_copy_Bps")
    return float(value) if _positive(value) else 0.0


def _measured_fractions(s: dict[str, Any], peak: float, memory_Bps: float,
                        defaults: tuple[float, float, float] = (1.0, 1.0, 1.0)) -> dict[str, float]:
    """Efficiencies (attention fwd/bwd of ``peak``, memory ops of ``memory_Bps``; ``defaults`` when not
    measured) and interference from the summary, clamped to GpuSpec's ranges. They price the kernels
    the calibrated tables do not cover."""
    def frac(value: Any, ref: float, default: float) -> float:
        return min(max(float(value) / ref, 1e-3), 1.0) if _positive(value) and ref > 0 else default

    inter = s.get("comm_interference") or {}
    intra = inter.get("intra", 0.0) if isinstance(inter, dict) else 0.0
    net = inter.get("inter", intra) if isinstance(inter, dict) else 0.0
    in_situ = s.get("comm_in_situ") or {}
    comm_in_situ = in_situ.get("intra", in_situ.get("inter", 0.0)) if isinstance(in_situ, dict) else 0.0
    return {"attention_fwd_efficiency": frac(s.get("attention_fwd_flops_per_s"), peak, defaults[0]),
            "attention_bwd_efficiency": frac(s.get("attention_bwd_flops_per_s"), peak, defaults[1]),
            "memory_op_efficiency": frac(s.get("memory_op_Bps"), memory_Bps, defaults[2]),
            "comm_interference_nvlink": min(max(float(intra or 0.0), 0.0), 0.99),
            "comm_interference_net": min(max(float(net or 0.0), 0.0), 0.99),
            "comm_in_situ_slowdown": max(float(comm_in_situ or 0.0), 0.0),
            **_step_jitter(s)}


def _step_jitter(s: dict[str, Any]) -> dict[str, float]:
    """GpuSpec's jitter fields from ``summary.step_jitter`` (``calibration.writer``): ``step_time_cv``, its
    ``cv`` (the spread of the calibrated stack's whole steps), and ``step_time_ref_s``, its ``median_s`` (the
    length of the steps the cv was measured on, ``simtrain.engine.sync_wait``); each clamped to GpuSpec's
    range, 0 when not measured."""
    jitter = s.get("step_jitter") or {}
    jitter = jitter if isinstance(jitter, dict) else {}
    cv: Any = jitter.get("cv")
    ref: Any = jitter.get("median_s")
    return {"step_time_cv": min(float(cv), 0.5) if _positive(cv) else 0.0,
            "step_time_ref_s": min(float(ref), 1e6) if _positive(ref) else 0.0}


def _cuda_cluster(prof: CalibratedProfile, hw: HardwareConfig) -> ClusterSpec:
    if hw.gpu is not None and prof.base_gpu is not None and hw.gpu != prof.base_gpu:
        raise ConfigError(problem("hardware.gpu", hw.gpu, f"profile {prof.name!r} was measured on a {prof.base_gpu}; "
                                                          "remove hardware.gpu or use a matching profile"))
    cluster = build_cluster(hw.node, hw.n_nodes, gpu=hw.gpu or prof.base_gpu, nics_per_node=hw.nics_per_node,
                            nic_Gbps=hw.nic_Gbps, oversubscription=hw.oversubscription,
                            nodes_per_leaf=hw.nodes_per_leaf, net_hop_latency_us=hw.net_hop_latency_us,
                            gpus_per_node=hw.gpus_per_node, host_copy_GBps=hw.host_copy_GBps)
    base, s = cluster.gpu, prof.summary
    peak = base.peak_flops_per_s("bf16")
    fields = base.model_dump()
    fields.update(_measured_fractions(s, peak, base.hbm_Bps, (base.attention_fwd_efficiency,
                                                              base.attention_bwd_efficiency,
                                                              base.memory_op_efficiency)))
    measured = {"gemm_efficiency": (s.get("peak_flops_per_s"), peak), "hbm_efficiency": (s.get("memory_Bps"),
                                                                                        base.hbm_Bps)}
    for field, (value, ref) in measured.items():  # only what was measured replaces the base GPU's figure
        if isinstance(value, int | float) and _positive(value):
            fields[field] = min(float(value) / ref, 1.0)
    if s.get("launch_s") is not None:
        fields["kernel_launch_s"] = float(s["launch_s"])
    if prof.collectives.curves:
        fields["nvlink_efficiency"] = min(max(base.nvlink_efficiency, prof.collectives.peak_busbw_Bps
                                              / base.nvlink_Bps), 1.0)
    if _positive(s.get("context_bytes")):
        fields["cuda_context_bytes"] = float(s["context_bytes"])
    gpu = CalibratedGpuSpec(**fields, profile_name=prof.name, compute=prof.compute, collectives=prof.collectives)
    node: dict[str, Any] = {"gpu": gpu}
    if host := _host_copy_Bps(hw, s):
        node["host_copy_Bps"] = host
    return cluster.model_copy(update={"node": cluster.node.model_copy(update=node)})


def _cuda_machine(prof: CalibratedProfile, hw: HardwareConfig, world_size: int) -> ClusterSpec:
    """``hardware.node: calibrated``: the calibrated machine itself, ``world_size`` of its GPUs (at most the
    GPUs it had), on the links of the built-in node that carries its GPU (for one GPU they go unused)."""
    gpu_name = hw.gpu or prof.base_gpu
    count = int(prof.device_count)
    if gpu_name is None:
        raise ConfigError(Problem("hardware.gpu", f"profile {prof.name!r} was measured on an unknown GPU; name the "
                                                  "built-in GPU profile it is with hardware.gpu"))
    if world_size > count:
        raise ConfigError(Problem("layout", f"{world_size} GPUs, but the calibrated machine of {prof.name!r} had "
                                            f"{count}; use another hardware.node"))
    node = next((n for n in list_nodes() if load_node(n).gpu.name == gpu_name), None)
    if node is None:
        raise ConfigError(problem("hardware.gpu", gpu_name, "no built-in node carries this GPU"))
    base = _cuda_cluster(prof, hw.model_copy(update={"node": node, "n_nodes": 1, "gpu": gpu_name}))
    return base.model_copy(update={"node": base.node.model_copy(update={"gpus_per_node": world_size,
                                                                          "name": f"calibrated:{prof.name}"})})


def compute_calibration(gpu: GpuSpec) -> CalibratedCompute | None:
    """The calibrated compute functions a cluster's GPU carries (None for a built-in profile)."""
    return gpu.compute if isinstance(gpu, CalibratedGpuSpec) else None

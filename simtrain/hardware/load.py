"""Hardware profiles: reading GPU and node YAML files into specs, and building a cluster.

Profiles are ``gpus/<name>.yaml`` and ``nodes/<name>.yaml``, built into the package or in the user
directory (``simtrain/hardware/profile_paths.py`` says where and how names resolve), or given by path. Their
keys name their unit (``bf16_tflops``, ``hbm_GiB``, ``nvlink_GBps``, ``nic_Gbps``,
``kernel_launch_us``); they are converted to SI exactly once, here, at load.
"""

from __future__ import annotations

import functools
from typing import Any

from pydantic import ValidationError

from simtrain.hardware.hardware import DEFAULT_NODES_PER_LEAF, ClusterSpec, GpuSpec, NodeSpec
from simtrain.hardware.profile_paths import ProfileKind, ProfileRef, names, resolve
from simtrain.spec.errors import ConfigError, Problem, problem, pydantic_problems
from simtrain.spec.safe_yaml import load_yaml
from simtrain.spec.units import GB, TB, TFLOPS, US, GiB, MiB, gbps_to_Bps

# yaml key -> (GpuSpec field, scale to SI, kind). kind: "f" float, "i" int, "f0" float with null -> 0,
# "i0" int with null -> 0.
_GPU_KEYS: dict[str, tuple[str, float, str]] = {
    "bf16_tflops": ("bf16_flops_per_s", TFLOPS, "f"),
    "fp8_tflops": ("fp8_flops_per_s", TFLOPS, "f0"),
    "fp4_tflops": ("fp4_flops_per_s", TFLOPS, "f0"),
    "tf32_tflops": ("tf32_flops_per_s", TFLOPS, "f"),
    "fp32_tflops": ("fp32_flops_per_s", TFLOPS, "f"),
    "hbm_GiB": ("hbm_bytes", GiB, "f"),
    "hbm_GB": ("hbm_bytes", GB, "f"),
    "hbm_TBps": ("hbm_Bps", TB, "f"),
    "sm_count": ("sm_count", 1, "i"),
    "l2_MiB": ("l2_bytes", MiB, "f"),
    "l2_MB": ("l2_bytes", 1e6, "f"),
    "nvlink_GBps": ("nvlink_Bps", GB, "f"),
    "nvlink_domain": ("nvlink_domain", 1, "i"),
    "gemm_efficiency": ("gemm_efficiency", 1.0, "f"),
    "fp8_gemm_efficiency": ("fp8_gemm_efficiency", 1.0, "f0"),
    "fp4_gemm_efficiency": ("fp4_gemm_efficiency", 1.0, "f0"),
    "fp8_split_accumulation_slowdown": ("fp8_split_accumulation_slowdown", 1.0, "f"),
    "gemm_tile_m": ("gemm_tile_m", 1, "i"),
    "gemm_tile_n": ("gemm_tile_n", 1, "i"),
    "gemm_tile_sms": ("gemm_tile_sms", 1, "i"),
    "attention_fwd_efficiency": ("attention_fwd_efficiency", 1.0, "f"),
    "attention_bwd_efficiency": ("attention_bwd_efficiency", 1.0, "f"),
    "hbm_efficiency": ("hbm_efficiency", 1.0, "f"),
    "memory_op_efficiency": ("memory_op_efficiency", 1.0, "f"),
    "kernel_launch_us": ("kernel_launch_s", US, "f"),
    "nvlink_efficiency": ("nvlink_efficiency", 1.0, "f"),
    "nvls_algbw_GBps": ("nvls_algbw_Bps", GB, "f0"),
    "nvls_min_gpus": ("nvls_min_gpus", 1, "i0"),
    "nic_efficiency": ("nic_efficiency", 1.0, "f"),
    "comm_interference_nvlink": ("comm_interference_nvlink", 1.0, "f"),
    "comm_interference_net": ("comm_interference_net", 1.0, "f"),
    "comm_interference_p2p": ("comm_interference_p2p", 1.0, "f"),
    "cuda_context_GiB": ("cuda_context_bytes", GiB, "f"),
    "nccl_buffers_GiB": ("nccl_buffer_bytes", GiB, "f"),
}

_NODE_KEYS: dict[str, tuple[str, float, str]] = {
    "gpus_per_node": ("gpus_per_node", 1, "i"),
    "nics_per_node": ("nics_per_node", 1, "i"),
    "nic_Gbps": ("nic_Bps", gbps_to_Bps(1.0), "f"),
    "pcie_GBps": ("pcie_Bps", GB, "f"),
    "nvlink_latency_us": ("nvlink_latency_s", US, "f"),
    "net_hop_latency_us": ("net_hop_latency_s", US, "f"),
    "mesh_link_GBps": ("mesh_link_Bps", GB, "f0"),
    "host_copy_GBps": ("host_copy_Bps", GB, "f0"),
}
_NODE_STR_KEYS = ("gpu", "scaleup")
_INFO_KEYS = ("description",)  # informational, kept for tables, not part of the specs

_GPU_ALIASES = {
    "h100": "h100-sxm",
    "h100-sxm5": "h100-sxm",
    "h100-80gb": "h100-sxm",
    "a100": "a100-80gb",
    "a100-80g": "a100-80gb",
    "a100-40g": "a100-40gb",
    "h200-sxm": "h200",
    "h800-sxm": "h800",
}


def list_gpus() -> list[str]:
    """Names of the GPU profiles available (built-in and in the user directory: ``profile_paths``), sorted."""
    return names(ProfileKind.GPUS)


def list_nodes() -> list[str]:
    """Names of the node profiles available (built-in and in the user directory: ``profile_paths``), sorted."""
    return names(ProfileKind.NODES)


@functools.lru_cache(maxsize=256)
def _read_yaml(ref: ProfileRef) -> dict[str, Any]:
    """Read one profile file (cached on its reference); a malformed file raises ConfigError naming it."""
    file = str(ref)
    try:
        data = load_yaml(ref.read_text(), file)  # bounded: simtrain.spec.safe_yaml
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(Problem(file, f"cannot read: {exc}")) from exc
    if not isinstance(data, dict):
        raise ConfigError(Problem(file, f"expected a mapping of keys to values, got {type(data).__name__}"))
    return data


def _convert(
    file: str, data: dict[str, Any], keys: dict[str, tuple[str, float, str]], extra_ok: tuple[str, ...]
) -> tuple[dict[str, Any], list[Problem]]:
    """Convert unit-named YAML keys to SI fields; collect unknown keys and bad values as problems."""
    out: dict[str, Any] = {}
    problems: list[Problem] = []
    for key, value in data.items():
        where = f"{file}: {key}"
        if key in extra_ok:
            continue
        if key not in keys:
            problems.append(
                Problem(where, f"unknown key; valid keys: {', '.join(sorted(keys) + list(extra_ok))}")
            )
            continue
        field, scale, kind = keys[key]
        if field in out:
            problems.append(Problem(where, f"{field} given twice (use one of the unit-named keys)"))
            continue
        if value is None and kind in ("f0", "i0"):
            out[field] = 0 if kind == "i0" else 0.0
            continue
        if isinstance(value, bool) or not isinstance(value, int | float):
            problems.append(problem(where, value, "expected a number"))
            continue
        if kind.startswith("i"):
            if float(value) != int(value):
                problems.append(problem(where, value, "expected an integer"))
                continue
            out[field] = int(value)
        else:
            out[field] = float(value) * scale
    return out, problems


def _field_to_key(keys: dict[str, tuple[str, float, str]]) -> dict[str, str]:
    return {field: key for key, (field, _, _) in keys.items()}


@functools.lru_cache(maxsize=64)
def _load_gpu_cached(ref: ProfileRef) -> GpuSpec:
    file, name = str(ref), ref.name
    data = _read_yaml(ref)
    fields, problems = _convert(file, data, _GPU_KEYS, _INFO_KEYS)
    for req in ("hbm_GiB", "l2_MiB"):
        field = _GPU_KEYS[req][0]
        if field not in fields:
            problems.append(Problem(f"{file}: {req}", "missing (give it, or its decimal-unit twin)"))
    if problems:
        raise ConfigError(problems)
    try:
        return GpuSpec(name=name, **fields)
    except ValidationError as exc:
        raise ConfigError(pydantic_problems(exc, f"{file}: ", _field_to_key(_GPU_KEYS))) from exc


def load_gpu(name: str, *, path: str = "hardware.gpu") -> GpuSpec:
    """Load the GPU profile ``name`` (e.g. "h100-sxm", or a path to a YAML file), converted to SI.

    Unknown names raise ConfigError at ``path`` listing the valid names; a malformed file or an
    unknown key raises ConfigError naming the file and key.
    """
    return _load_gpu_cached(resolve(ProfileKind.GPUS, name, path, _GPU_ALIASES))


@functools.lru_cache(maxsize=64)
def _load_node_cached(ref: ProfileRef, gpu_ref: ProfileRef | None) -> NodeSpec:
    # keyed on the GPU's resolved file too: a user GPU file appearing later must not meet a stale node
    file, name = str(ref), ref.name
    data = _read_yaml(ref)
    numeric = {k: v for k, v in data.items() if k not in _NODE_STR_KEYS}
    fields, problems = _convert(file, numeric, _NODE_KEYS, _INFO_KEYS)
    if gpu_ref is None:
        problems.append(
            problem(f"{file}: gpu", data.get("gpu"), f"expected a GPU name; valid GPUs: {', '.join(list_gpus())}")
        )
    scaleup = data.get("scaleup", "nvswitch")
    if scaleup not in ("nvswitch", "mesh"):
        problems.append(problem(f"{file}: scaleup", scaleup, "valid: nvswitch, mesh"))
    if scaleup == "mesh" and not fields.get("mesh_link_Bps"):
        problems.append(Problem(f"{file}: mesh_link_GBps", "required (> 0) for scaleup: mesh"))
    if problems:
        raise ConfigError(problems)
    assert gpu_ref is not None
    gpu_spec = _load_gpu_cached(gpu_ref)
    try:
        return NodeSpec(name=name, gpu=gpu_spec, scaleup=scaleup, **fields)
    except ValidationError as exc:
        raise ConfigError(pydantic_problems(exc, f"{file}: ", _field_to_key(_NODE_KEYS))) from exc


def load_node(name: str, gpu: str | None = None, *, path: str = "hardware.node") -> NodeSpec:
    """Load the node profile ``name`` (e.g. "dgx-h100", or a path to a YAML file), converted to SI; ``gpu``
    (a GPU name or path) replaces its GPU.

    Unknown names raise ConfigError at ``path`` (or ``hardware.gpu``) listing the valid names.
    """
    ref = resolve(ProfileKind.NODES, name, path)
    gpu_name = gpu if gpu is not None else _read_yaml(ref).get("gpu")
    gpu_ref = None
    if isinstance(gpu_name, str):
        gpu_ref = resolve(ProfileKind.GPUS, gpu_name, "hardware.gpu" if gpu is not None else f"{ref}: gpu", _GPU_ALIASES)
    return _load_node_cached(ref, gpu_ref)


def build_cluster(
    node: str,
    n_nodes: int,
    gpu: str | None = None,
    nics_per_node: int | None = None,
    nic_Gbps: float | None = None,
    oversubscription: float = 1.0,
    nodes_per_leaf: int | None = None,
    net_hop_latency_us: float | None = None,
    gpus_per_node: int | None = None,
    host_copy_GBps: float | None = None,
) -> ClusterSpec:
    """Build a ClusterSpec of ``n_nodes`` nodes of profile ``node``.

    Optional overrides: ``gpu`` (profile name), ``gpus_per_node`` (at most the profile's: part of each node
    is used, its NICs in proportion), ``nics_per_node``, ``nic_Gbps`` (Gbit/s per NIC),
    ``oversubscription`` (>= 1), ``nodes_per_leaf`` (default 32), ``net_hop_latency_us`` (µs),
    ``host_copy_GBps`` (GPU <-> host copy rate per direction, GB/s).
    All problems are collected into one ConfigError with ``hardware.*`` paths.
    """
    node_spec = load_node(node, gpu=gpu)
    problems: list[Problem] = []
    if isinstance(n_nodes, bool) or not isinstance(n_nodes, int) or n_nodes < 1:
        problems.append(problem("hardware.n_nodes", n_nodes, "must be an integer >= 1"))
    if nics_per_node is not None and (not isinstance(nics_per_node, int) or nics_per_node < 1):
        problems.append(problem("hardware.nics_per_node", nics_per_node, "must be an integer >= 1"))
    if nic_Gbps is not None and not (isinstance(nic_Gbps, int | float) and nic_Gbps > 0):
        problems.append(problem("hardware.nic_Gbps", nic_Gbps, "must be > 0"))
    if not (isinstance(oversubscription, int | float) and oversubscription >= 1.0):
        problems.append(
            problem("hardware.oversubscription", oversubscription, "must be >= 1 (1 = non-blocking)")
        )
    if nodes_per_leaf is not None and (not isinstance(nodes_per_leaf, int) or nodes_per_leaf < 1):
        problems.append(problem("hardware.nodes_per_leaf", nodes_per_leaf, "must be an integer >= 1"))
    if net_hop_latency_us is not None and not (
        isinstance(net_hop_latency_us, int | float) and net_hop_latency_us >= 0
    ):
        problems.append(problem("hardware.net_hop_latency_us", net_hop_latency_us, "must be >= 0"))
    if gpus_per_node is not None and not (isinstance(gpus_per_node, int) and 1 <= gpus_per_node <= node_spec.gpus_per_node):
        problems.append(problem("hardware.gpus_per_node", gpus_per_node,
                                f"an integer from 1 to {node_spec.gpus_per_node} (node {node_spec.name})"))
    if host_copy_GBps is not None and not (isinstance(host_copy_GBps, int | float) and host_copy_GBps > 0):
        problems.append(problem("hardware.host_copy_GBps", host_copy_GBps, "must be > 0 (GB/s per direction)"))
    if problems:
        raise ConfigError(problems)
    if host_copy_GBps is not None:
        node_spec = node_spec.model_copy(update={"host_copy_Bps": float(host_copy_GBps) * GB})
    if gpus_per_node is not None and gpus_per_node != node_spec.gpus_per_node:
        # one NIC per GPU on every built-in node: the used GPUs keep theirs (at least one per node)
        used_nics = max(1, node_spec.nics_per_node * gpus_per_node // node_spec.gpus_per_node)
        node_spec = node_spec.model_copy(update={"gpus_per_node": gpus_per_node, "nics_per_node": used_nics})
    try:
        return ClusterSpec(
            node=node_spec,
            n_nodes=n_nodes,
            nics_per_node=nics_per_node if nics_per_node is not None else node_spec.nics_per_node,
            nic_Bps=gbps_to_Bps(nic_Gbps) if nic_Gbps is not None else node_spec.nic_Bps,
            oversubscription=float(oversubscription),
            nodes_per_leaf=nodes_per_leaf if nodes_per_leaf is not None else DEFAULT_NODES_PER_LEAF,
            net_hop_latency_s=(
                net_hop_latency_us * US if net_hop_latency_us is not None else node_spec.net_hop_latency_s
            ),
            nvlink_latency_s=node_spec.nvlink_latency_s,
        )
    except ValidationError as exc:
        raise ConfigError(pydantic_problems(exc, "hardware.")) from exc


def gpu_table() -> list[dict[str, Any]]:
    """One row per GPU profile with its headline numbers, in the display units the keys name."""
    rows = []
    for name in list_gpus():
        g = load_gpu(name)
        desc = _read_yaml(resolve(ProfileKind.GPUS, name, "hardware.gpu")).get("description", "")
        rows.append(
            {
                "name": name,
                "bf16_tflops": g.bf16_flops_per_s / TFLOPS,
                "fp8_tflops": g.fp8_flops_per_s / TFLOPS if g.has_fp8 else None,
                "fp4_tflops": g.fp4_flops_per_s / TFLOPS if g.has_fp4 else None,
                "hbm_GiB": g.hbm_bytes / GiB,
                "hbm_TBps": g.hbm_Bps / TB,
                "nvlink_GBps": g.nvlink_Bps / GB,
                "sm_count": g.sm_count,
                "gemm_efficiency": g.gemm_efficiency,
                "nvls": g.has_nvls,
                "description": desc,
            }
        )
    return rows


def node_table() -> list[dict[str, Any]]:
    """One row per node profile with its headline numbers, in the display units the keys name."""
    rows = []
    for name in list_nodes():
        n = load_node(name)
        desc = _read_yaml(resolve(ProfileKind.NODES, name, "hardware.node")).get("description", "")
        rows.append(
            {
                "name": name,
                "gpu": n.gpu.name,
                "gpus_per_node": n.gpus_per_node,
                "scaleup": n.scaleup,
                "nics_per_node": n.nics_per_node,
                "nic_Gbps": n.nic_Bps * 8 / 1e9,
                "node_bf16_pflops": n.gpus_per_node * n.gpu.bf16_flops_per_s / 1e15,
                "node_hbm_GiB": n.gpus_per_node * n.gpu.hbm_bytes / GiB,
                "description": desc,
            }
        )
    return rows

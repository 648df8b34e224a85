"""Hardware: GPU, node and cluster specs, the YAML profile loaders, and the cluster topology.

Profiles are ``gpus/<name>.yaml`` and ``nodes/<name>.yaml``, built into the package or in the user
directory (``simtrain/profile_paths.py`` says where and how names resolve), or given by path. Their
keys name their unit (``bf16_tflops``, ``hbm_GiB``, ``nvlink_GBps``, ``nic_Gbps``,
``kernel_launch_us``); they are converted to SI exactly once, here, at load. Every spec below is SI:
FLOP/s, bytes, bytes/s, seconds. Efficiencies are plain fractions.

The cluster is a rail-optimised two-level fat tree: every node has ``nics_per_node`` NICs ("rails");
NIC ``j`` of every node under leaf group ``k`` plugs into leaf switch ``leaf{j}.{k}``; all leaves go
up to one aggregated ``spine``. Inside a node GPUs talk through one aggregated NVSwitch (``nvsw{n}``)
or, for an Infinity-Fabric mesh, over direct GPU-GPU links.

Two views of the same fabric exist:

- :class:`Topology` answers ``route``/``edge`` queries in O(1) from vertex names, with no graph in
  memory, so it works at 16,384 GPUs and more.
- :func:`build_graph` materialises the full ``networkx.DiGraph`` with the same vertex names and edge
  attributes (``bandwidth_Bps``, ``latency_s``, ``link_class``), for full-mode simulation and plots.

This module and the collectives code are the only ones that import networkx.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Any, Literal

import networkx as nx
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from simtrain.errors import ConfigError, Problem, problem, pydantic_problems
from simtrain.profile_paths import ProfileKind, ProfileRef, names, resolve
from simtrain.safe_yaml import load_yaml
from simtrain.units import GB, TB, TFLOPS, US, GiB, MiB, gbps_to_Bps

__all__ = [
    "ClusterSpec",
    "EdgeAttrs",
    "GpuSpec",
    "LinkClass",
    "NodeSpec",
    "Topology",
    "build_cluster",
    "build_graph",
    "gpu_table",
    "list_gpus",
    "list_nodes",
    "load_gpu",
    "load_node",
    "node_table",
]

LinkClass = Literal["nvlink", "pcie", "net"]

#: Default number of nodes under one rail leaf switch. A 64-port NDR leaf (e.g. QM9700) in a
#: non-blocking rail-optimised fat tree uses 32 ports down (one per node on that rail) and 32 up.
DEFAULT_NODES_PER_LEAF = 32

_Frozen = ConfigDict(frozen=True, extra="forbid")


# --------------------------------------------------------------------------------------------------
# Specs
# --------------------------------------------------------------------------------------------------


class GpuSpec(BaseModel):
    """One accelerator, in SI units.

    Peaks are dense (no sparsity) FLOP/s; ``fp8_flops_per_s`` is 0.0 when the GPU has no FP8.
    ``hbm_bytes`` in bytes, ``hbm_Bps`` / ``nvlink_Bps`` / ``nvls_algbw_Bps`` in bytes/s
    (``nvlink_Bps`` per GPU per direction, aggregated over all its links; ``nvls_algbw_Bps`` is the
    NVLS AllReduce *algorithm* bandwidth, 0.0 when the GPU has no NVLS). ``l2_bytes`` in bytes
    (last-level cache). ``kernel_launch_s`` in seconds. ``cuda_context_bytes`` and
    ``nccl_buffer_bytes`` in bytes. The ``*_efficiency`` fields are achievable fractions of the
    corresponding peak; ``comm_interference_*`` are the fractional slowdowns of compute that
    overlaps communication on that link class.
    """

    model_config = _Frozen

    name: str
    bf16_flops_per_s: float = Field(gt=0)
    fp8_flops_per_s: float = Field(ge=0)
    tf32_flops_per_s: float = Field(gt=0)
    fp32_flops_per_s: float = Field(gt=0)
    hbm_bytes: float = Field(gt=0)
    hbm_Bps: float = Field(gt=0)
    sm_count: int = Field(gt=0)
    l2_bytes: float = Field(ge=0)
    nvlink_Bps: float = Field(gt=0)
    nvlink_domain: int = Field(default=8, ge=1)
    gemm_efficiency: float = Field(gt=0, le=1)
    fp8_gemm_efficiency: float = Field(default=0.0, ge=0, le=1)
    """Best-shape FP8 GEMM fraction of the FP8 peak (MAMF); 0.0 = not given, use ``gemm_efficiency``."""
    fp8_split_accumulation_slowdown: float = Field(default=1.0, ge=1)
    """Time of an FP8 GEMM that promotes its partial sums to FP32 (cuBLASLt without
    ``CUBLASLT_MATMUL_DESC_FAST_ACCUM``) over the same GEMM with fast accumulation; 1.0 where the FP8
    tensor cores accumulate in full FP32 (everything but Hopper)."""
    attention_fwd_efficiency: float = Field(gt=0, le=1)
    attention_bwd_efficiency: float = Field(gt=0, le=1)
    hbm_efficiency: float = Field(gt=0, le=1)
    memory_op_efficiency: float = Field(gt=0, le=1)
    kernel_launch_s: float = Field(ge=0)
    nvlink_efficiency: float = Field(gt=0, le=1)
    nvls_algbw_Bps: float = Field(ge=0)
    nvls_min_gpus: int = Field(ge=0)
    nic_efficiency: float = Field(gt=0, le=1)
    comm_interference_nvlink: float = Field(ge=0, lt=1)
    comm_interference_net: float = Field(ge=0, lt=1)
    comm_interference_p2p: float | None = Field(default=None, ge=0, lt=1)
    """Slowdown of compute while a pipeline send/recv is in flight; None = one SM's share
    (``1 / sm_count``: NCCL runs a send/recv as one small CTA per peer, NVIDIA/nccl#1433)."""
    comm_in_situ_slowdown: float = Field(default=0.0, ge=0)
    """Fractional slowdown of a collective that runs while this device computes (a calibrated profile's
    ``summary.comm_in_situ``): on a CPU, gloo's threads share the cores the training step keeps busy, so
    a DDP all-reduce beside the backward takes longer than alone; 0 in the built-in GPU profiles (NCCL
    runs on its own SMs)."""
    cuda_context_bytes: float = Field(ge=0)
    nccl_buffer_bytes: float = Field(ge=0)

    @property
    def has_fp8(self) -> bool:
        """True when the GPU has FP8 tensor cores."""
        return self.fp8_flops_per_s > 0

    @property
    def has_nvls(self) -> bool:
        """True when the GPU's switch supports NVLS (in-switch reduction)."""
        return self.nvls_algbw_Bps > 0

    def peak_flops_per_s(self, dtype: str) -> float:
        """Dense peak FLOP/s for ``dtype`` in {"bf16", "fp16", "fp8", "tf32", "fp32"}.

        Raises ConfigError for an unknown dtype or for fp8 on a GPU without FP8.
        """
        key = dtype.lower()
        if key in ("bf16", "fp16"):
            return self.bf16_flops_per_s
        if key == "fp8":
            if self.fp8_flops_per_s <= 0:
                raise ConfigError(problem("train.precision", dtype, f"{self.name} has no FP8; use bf16"))
            return self.fp8_flops_per_s
        if key == "tf32":
            return self.tf32_flops_per_s
        if key == "fp32":
            return self.fp32_flops_per_s
        raise ConfigError(problem("train.precision", dtype, "valid dtypes: bf16, fp16, fp8, tf32, fp32"))


class NodeSpec(BaseModel):
    """One server / scale-up domain, in SI units.

    ``nic_Bps`` is per NIC (line rate, bytes/s), ``pcie_Bps`` per GPU-NIC PCIe path per direction,
    ``mesh_link_Bps`` per GPU-GPU link per direction for ``scaleup == "mesh"`` (0.0 for NVSwitch).
    Latencies in seconds: ``nvlink_latency_s`` per scale-up hop, ``net_hop_latency_s`` per network
    link (NIC-leaf, leaf-spine).
    """

    model_config = _Frozen

    name: str
    gpu: GpuSpec
    gpus_per_node: int = Field(ge=1)
    scaleup: Literal["nvswitch", "mesh"]
    nics_per_node: int = Field(ge=1)
    nic_Bps: float = Field(gt=0)
    pcie_Bps: float = Field(gt=0)
    nvlink_latency_s: float = Field(ge=0)
    net_hop_latency_s: float = Field(ge=0)
    mesh_link_Bps: float = Field(default=0.0, ge=0)
    host_copy_Bps: float = Field(default=0.0, ge=0)
    """Achieved copy rate between one GPU and host memory per direction, bytes/s, all GPUs of the node
    copying at once (0: not given; ``host_link_Bps`` falls back to ``pcie_Bps``)."""

    @property
    def host_link_Bps(self) -> float:
        """Copy rate between one GPU and host memory per direction (bytes/s), for CPU activation
        offloading: ``host_copy_Bps``, or the GPU's PCIe path when the profile gives none."""
        return self.host_copy_Bps or self.pcie_Bps


class ClusterSpec(BaseModel):
    """A cluster of identical nodes on a rail-optimised two-level fat tree, in SI units.

    ``nic_Bps`` per NIC (bytes/s). ``oversubscription`` >= 1: each leaf's uplink capacity to the
    spine is its downlink capacity divided by it. ``nodes_per_leaf``: nodes under one rail leaf
    switch (one leaf per rail per group of that many nodes). Latencies in seconds.
    """

    model_config = _Frozen

    node: NodeSpec
    n_nodes: int = Field(ge=1)
    nics_per_node: int = Field(ge=1)
    nic_Bps: float = Field(gt=0)
    oversubscription: float = Field(default=1.0, ge=1.0)
    nodes_per_leaf: int = Field(default=DEFAULT_NODES_PER_LEAF, ge=1)
    net_hop_latency_s: float = Field(ge=0)
    nvlink_latency_s: float = Field(ge=0)

    @property
    def gpus_per_node(self) -> int:
        """GPUs in one node."""
        return self.node.gpus_per_node

    @property
    def n_gpus(self) -> int:
        """GPUs in the cluster."""
        return self.n_nodes * self.node.gpus_per_node

    @property
    def gpu(self) -> GpuSpec:
        """The GPU every node carries."""
        return self.node.gpu

    @property
    def n_leaf_groups(self) -> int:
        """Number of leaf groups (leaf switches per rail)."""
        return math.ceil(self.n_nodes / self.nodes_per_leaf)


# --------------------------------------------------------------------------------------------------
# Loading
# --------------------------------------------------------------------------------------------------

# yaml key -> (GpuSpec field, scale to SI, kind). kind: "f" float, "i" int, "f0" float with null -> 0,
# "i0" int with null -> 0.
_GPU_KEYS: dict[str, tuple[str, float, str]] = {
    "bf16_tflops": ("bf16_flops_per_s", TFLOPS, "f"),
    "fp8_tflops": ("fp8_flops_per_s", TFLOPS, "f0"),
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
    "fp8_split_accumulation_slowdown": ("fp8_split_accumulation_slowdown", 1.0, "f"),
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
        data = load_yaml(ref.read_text(), file)  # bounded: simtrain.safe_yaml
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


# --------------------------------------------------------------------------------------------------
# Topology
# --------------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class EdgeAttrs:
    """Attributes of one directed link: bandwidth (bytes/s, this direction), latency (s), class."""

    bandwidth_Bps: float
    latency_s: float
    link_class: LinkClass


_CLASS_RANK = {"nvlink": 0, "pcie": 1, "net": 2}


class Topology:
    """O(1) routing over a ClusterSpec's fabric, with no graph in memory.

    GPUs are ints ``0..n_gpus-1``; ``node = gpu // gpus_per_node``, ``local = gpu % gpus_per_node``.
    Vertex names: ``gpu{g}``, ``nvsw{n}`` (NVSwitch nodes only), ``nic{n}.{j}``, ``leaf{j}.{k}``
    (rail ``j``, leaf group ``k = node // nodes_per_leaf``), ``spine``. NIC ``j`` of a node serves the
    local GPUs with ``local * nics_per_node // gpus_per_node == j``.

    Edges (both directions): gpu-nvsw (``nvlink_Bps``, ``nvlink_latency_s``, "nvlink"); gpu-gpu in a
    mesh node (``mesh_link_Bps``, "nvlink"); gpu-nic (``pcie_Bps``, latency 0 — the NIC's own latency
    is in the network hop, "pcie"); nic-leaf (``nic_Bps``, ``net_hop_latency_s``, "net");
    leaf-spine (nodes under that leaf × ``nic_Bps`` / ``oversubscription``, ``net_hop_latency_s``, "net").
    """

    __slots__ = (
        "cluster",
        "n_gpus",
        "n_nodes",
        "gpus_per_node",
        "nics_per_node",
        "nodes_per_leaf",
        "n_leaf_groups",
        "mesh",
        "_nvlink",
        "_pcie",
        "_nic_leaf",
        "_leaf_spine",
    )

    def __init__(self, cluster: ClusterSpec):
        self.cluster = cluster
        node = cluster.node
        self.n_gpus = cluster.n_gpus
        self.n_nodes = cluster.n_nodes
        self.gpus_per_node = node.gpus_per_node
        self.nics_per_node = cluster.nics_per_node
        self.nodes_per_leaf = cluster.nodes_per_leaf
        self.n_leaf_groups = cluster.n_leaf_groups
        self.mesh = node.scaleup == "mesh"
        nvlink_bw = node.mesh_link_Bps if self.mesh else node.gpu.nvlink_Bps
        self._nvlink = EdgeAttrs(nvlink_bw, cluster.nvlink_latency_s, "nvlink")
        self._pcie = EdgeAttrs(node.pcie_Bps, 0.0, "pcie")
        self._nic_leaf = EdgeAttrs(cluster.nic_Bps, cluster.net_hop_latency_s, "net")
        self._leaf_spine = tuple(
            EdgeAttrs(
                self.nodes_in_leaf_group(k) * cluster.nic_Bps / cluster.oversubscription,
                cluster.net_hop_latency_s,
                "net",
            )
            for k in range(self.n_leaf_groups)
        )

    # -- coordinates ----------------------------------------------------------------------------
    def node_of(self, gpu: int) -> int:
        """Node index of ``gpu``."""
        return gpu // self.gpus_per_node

    def local_of(self, gpu: int) -> int:
        """Index of ``gpu`` inside its node."""
        return gpu % self.gpus_per_node

    def rail_of(self, gpu: int) -> int:
        """The NIC (rail) index ``gpu`` uses for inter-node traffic."""
        return (gpu % self.gpus_per_node) * self.nics_per_node // self.gpus_per_node

    def leaf_group_of_node(self, node: int) -> int:
        """Leaf group index of ``node``."""
        return node // self.nodes_per_leaf

    def nodes_in_leaf_group(self, k: int) -> int:
        """Number of nodes under leaf group ``k`` (the last group may be partial)."""
        return min(self.nodes_per_leaf, self.n_nodes - k * self.nodes_per_leaf)

    def nic_of(self, gpu: int) -> str:
        """Vertex name of the NIC ``gpu`` uses."""
        return f"nic{self.node_of(gpu)}.{self.rail_of(gpu)}"

    def _check_gpu(self, g: int) -> None:
        if not 0 <= g < self.n_gpus:
            raise IndexError(f"gpu {g} out of range 0..{self.n_gpus - 1}")

    # -- routes ---------------------------------------------------------------------------------
    def route(self, src: int, dst: int) -> tuple[tuple[str, str], ...]:
        """Directed edges from GPU ``src`` to GPU ``dst`` (empty when ``src == dst``).

        Same node: gpu→nvsw→gpu (or one mesh gpu→gpu edge). Different nodes: gpu→nic→leaf
        (→spine→leaf when the leaf groups or the rails differ)→nic→gpu.
        """
        self._check_gpu(src)
        self._check_gpu(dst)
        if src == dst:
            return ()
        gs, gd = f"gpu{src}", f"gpu{dst}"
        ns, nd = src // self.gpus_per_node, dst // self.gpus_per_node
        if ns == nd:
            if self.mesh:
                return ((gs, gd),)
            sw = f"nvsw{ns}"
            return ((gs, sw), (sw, gd))
        rs, rd = self.rail_of(src), self.rail_of(dst)
        ks, kd = ns // self.nodes_per_leaf, nd // self.nodes_per_leaf
        nic_s, nic_d = f"nic{ns}.{rs}", f"nic{nd}.{rd}"
        leaf_s, leaf_d = f"leaf{rs}.{ks}", f"leaf{rd}.{kd}"
        if leaf_s == leaf_d:
            return ((gs, nic_s), (nic_s, leaf_s), (leaf_s, nic_d), (nic_d, gd))
        return (
            (gs, nic_s),
            (nic_s, leaf_s),
            (leaf_s, "spine"),
            ("spine", leaf_d),
            (leaf_d, nic_d),
            (nic_d, gd),
        )

    def _parse(self, name: str) -> tuple[str, int, int]:
        try:
            if name.startswith("gpu"):
                g = int(name[3:])
                if 0 <= g < self.n_gpus:
                    return "gpu", g, 0
            elif name.startswith("nvsw"):
                n = int(name[4:])
                if not self.mesh and 0 <= n < self.n_nodes:
                    return "nvsw", n, 0
            elif name.startswith("nic"):
                a, b = name[3:].split(".")
                n, j = int(a), int(b)
                if 0 <= n < self.n_nodes and 0 <= j < self.nics_per_node:
                    return "nic", n, j
            elif name.startswith("leaf"):
                a, b = name[4:].split(".")
                j, k = int(a), int(b)
                if 0 <= j < self.nics_per_node and 0 <= k < self.n_leaf_groups:
                    return "leaf", j, k
            elif name == "spine":
                return "spine", 0, 0
        except ValueError:
            pass
        raise KeyError(f"no vertex {name!r} in this topology")

    def edge(self, u: str, v: str) -> EdgeAttrs:
        """Attributes of the directed edge ``u → v``; KeyError if there is no such edge."""
        ku, a1, b1 = self._parse(u)
        kv, a2, b2 = self._parse(v)
        kinds = (ku, kv)
        if kinds == ("gpu", "nvsw"):
            if self.node_of(a1) == a2:
                return self._nvlink
        elif kinds == ("nvsw", "gpu"):
            if self.node_of(a2) == a1:
                return self._nvlink
        elif kinds == ("gpu", "gpu"):
            if self.mesh and a1 != a2 and self.node_of(a1) == self.node_of(a2):
                return self._nvlink
        elif kinds == ("gpu", "nic"):
            if self.node_of(a1) == a2 and self.rail_of(a1) == b2:
                return self._pcie
        elif kinds == ("nic", "gpu"):
            if self.node_of(a2) == a1 and self.rail_of(a2) == b1:
                return self._pcie
        elif kinds == ("nic", "leaf"):
            if b1 == a2 and a1 // self.nodes_per_leaf == b2:
                return self._nic_leaf
        elif kinds == ("leaf", "nic"):
            if a1 == b2 and a2 // self.nodes_per_leaf == b1:
                return self._nic_leaf
        elif kinds == ("leaf", "spine"):
            return self._leaf_spine[b1]
        elif kinds == ("spine", "leaf"):
            return self._leaf_spine[b2]
        raise KeyError(f"no edge {u!r} -> {v!r} in this topology")

    def path_latency_s(self, path: tuple[tuple[str, str], ...]) -> float:
        """Sum of the edge latencies along ``path`` (seconds)."""
        return sum(self.edge(u, v).latency_s for u, v in path)

    def path_bandwidth_Bps(self, path: tuple[tuple[str, str], ...]) -> float:
        """Bottleneck bandwidth (bytes/s) along ``path``; inf for an empty path."""
        return min((self.edge(u, v).bandwidth_Bps for u, v in path), default=math.inf)

    def link_class_of(self, path: tuple[tuple[str, str], ...]) -> LinkClass:
        """The slowest link class on ``path``: "net" if any net edge, else "pcie", else "nvlink".

        An empty path (a GPU to itself) is "nvlink".
        """
        best: LinkClass = "nvlink"
        for u, v in path:
            cls = self.edge(u, v).link_class
            if _CLASS_RANK[cls] > _CLASS_RANK[best]:
                best = cls
        return best


def build_graph(cluster: ClusterSpec) -> nx.DiGraph:
    """The full fabric as a ``networkx.DiGraph``, with the vertex names and edge attributes of :class:`Topology`.

    Vertex attribute ``kind`` in {"gpu", "nvswitch", "nic", "leaf", "spine"}; edge attributes
    ``bandwidth_Bps`` (bytes/s), ``latency_s`` (s), ``link_class`` ("nvlink", "pcie", "net").
    """
    topo = Topology(cluster)
    G: nx.DiGraph = nx.DiGraph(name=f"{cluster.n_nodes}x{cluster.node.name}")
    gpn, npn, npl = topo.gpus_per_node, topo.nics_per_node, topo.nodes_per_leaf

    def attrs(e: EdgeAttrs) -> dict[str, Any]:
        return {"bandwidth_Bps": e.bandwidth_Bps, "latency_s": e.latency_s, "link_class": e.link_class}

    nvl, pcie, nicleaf = attrs(topo._nvlink), attrs(topo._pcie), attrs(topo._nic_leaf)

    G.add_nodes_from(
        (f"gpu{g}", {"kind": "gpu", "node": g // gpn, "local": g % gpn}) for g in range(topo.n_gpus)
    )
    G.add_nodes_from(
        (f"nic{n}.{j}", {"kind": "nic", "node": n, "rail": j})
        for n in range(topo.n_nodes)
        for j in range(npn)
    )
    G.add_nodes_from(
        (f"leaf{j}.{k}", {"kind": "leaf", "rail": j, "group": k})
        for j in range(npn)
        for k in range(topo.n_leaf_groups)
    )
    G.add_node("spine", kind="spine")

    edges: list[tuple[str, str, dict[str, Any]]] = []
    for n in range(topo.n_nodes):
        base = n * gpn
        if topo.mesh:
            for a in range(base, base + gpn):
                for b in range(base, base + gpn):
                    if a != b:
                        edges.append((f"gpu{a}", f"gpu{b}", nvl))
        else:
            sw = f"nvsw{n}"
            G.add_node(sw, kind="nvswitch", node=n)
            for g in range(base, base + gpn):
                edges.append((f"gpu{g}", sw, nvl))
                edges.append((sw, f"gpu{g}", nvl))
        for local in range(gpn):
            g, nic = base + local, f"nic{n}.{local * npn // gpn}"
            edges.append((f"gpu{g}", nic, pcie))
            edges.append((nic, f"gpu{g}", pcie))
        k = n // npl
        for j in range(npn):
            nic, leaf = f"nic{n}.{j}", f"leaf{j}.{k}"
            edges.append((nic, leaf, nicleaf))
            edges.append((leaf, nic, nicleaf))
    for j in range(npn):
        for k in range(topo.n_leaf_groups):
            ls = attrs(topo._leaf_spine[k])
            edges.append((f"leaf{j}.{k}", "spine", ls))
            edges.append(("spine", f"leaf{j}.{k}", ls))
    G.add_edges_from(edges)
    return G

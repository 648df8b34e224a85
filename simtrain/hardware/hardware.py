"""Hardware specs: GPU, node and cluster (``GpuSpec``, ``NodeSpec``, ``ClusterSpec``), all in SI units: FLOP/s,
bytes, bytes/s, seconds; efficiencies are plain fractions.

Profiles on disk and how they load are ``simtrain.hardware.load``; the fabric (routes, links, the
networkx graph) is ``simtrain.hardware.topology``.
"""

from __future__ import annotations

import math
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from simtrain.spec.errors import ConfigError, problem

__all__ = ["ClusterSpec", "DEFAULT_NODES_PER_LEAF", "GpuSpec", "LinkClass", "NodeSpec"]

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

    Peaks are dense (no sparsity) FLOP/s; ``fp8_flops_per_s`` is 0.0 when the GPU has no FP8, and
    ``fp4_flops_per_s`` 0.0 when it has no FP4 tensor cores (everything before Blackwell).
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
    fp4_flops_per_s: float = Field(default=0.0, ge=0)
    """Dense NVFP4 (E2M1 with E4M3 block scales) tensor-core peak, FLOP/s; 0.0 = no FP4 tensor cores."""
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
    fp4_gemm_efficiency: float = Field(default=0.0, ge=0, le=1)
    """Sustained NVFP4 GEMM fraction of the FP4 peak on a large back-to-back GEMM; 0.0 = not given, use
    ``fp8_gemm_efficiency`` (then ``gemm_efficiency``)."""
    fp8_split_accumulation_slowdown: float = Field(default=1.0, ge=1)
    """Time of an FP8 GEMM that promotes its partial sums to FP32 (cuBLASLt without
    ``CUBLASLT_MATMUL_DESC_FAST_ACCUM``) over the same GEMM with fast accumulation; 1.0 where the FP8
    tensor cores accumulate in full FP32 (everything but Hopper)."""
    gemm_tile_m: int = Field(default=128, gt=0)
    """Output rows of one GEMM tile (the cuBLAS/CUTLASS tile a GEMM's output is cut into): 128 on
    Ampere and Hopper; 256 on Blackwell, whose tcgen05 MMAs run as CTA pairs over two SMs."""
    gemm_tile_n: int = Field(default=128, gt=0)
    """Output columns of one GEMM tile (as ``gemm_tile_m``)."""
    gemm_tile_sms: int = Field(default=1, ge=1)
    """SMs that compute one output tile together: 1, or 2 for Blackwell's 2-SM (``cta_group::2``)
    kernels; the GPU runs ``sm_count // gemm_tile_sms`` tiles at once (``gemm_tile_slots``)."""
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
    runs on its own SMs). The engine adds it per second of compute that ran beside the collective (the
    calibration times the all-reduce beside GEMMs against alone), so one with idle cores beside it, as
    the last bucket's before the optimizer, takes its time alone."""
    step_time_cv: float = Field(default=0.0, ge=0, le=0.5)
    """Coefficient of variation of one rank's training-step time from step to step (standard deviation /
    median, dimensionless; a calibrated profile's ``summary.step_jitter.cv``): synchronised ranks wait
    for the slowest each step (``simtrain.engine.sync_wait``); 0 in the built-in GPU profiles."""
    step_time_ref_s: float = Field(default=0.0, ge=0, le=1e6)
    """Seconds of the step ``step_time_cv`` was measured on (a calibrated profile's
    ``summary.step_jitter.median_s``): work longer or shorter than it jitters by the square root of the
    ratio (``simtrain.engine.sync_wait``); 0: the cv applies to any work as it is."""
    cuda_context_bytes: float = Field(ge=0)
    nccl_buffer_bytes: float = Field(ge=0)

    @property
    def has_fp8(self) -> bool:
        """True when the GPU has FP8 tensor cores."""
        return self.fp8_flops_per_s > 0

    @property
    def has_fp4(self) -> bool:
        """True when the GPU has FP4 tensor cores (Blackwell and later)."""
        return self.fp4_flops_per_s > 0

    @property
    def gemm_tile_slots(self) -> int:
        """GEMM output tiles the GPU computes at once (one wave): ``sm_count // gemm_tile_sms``."""
        return max(1, self.sm_count // self.gemm_tile_sms)

    @property
    def has_nvls(self) -> bool:
        """True when the GPU's switch supports NVLS (in-switch reduction)."""
        return self.nvls_algbw_Bps > 0

    def peak_flops_per_s(self, dtype: str) -> float:
        """Dense peak FLOP/s for ``dtype`` in {"bf16", "fp16", "fp8", "fp4", "tf32", "fp32"}.

        Raises ConfigError for an unknown dtype, for fp8 on a GPU without FP8 or fp4 on one without FP4.
        """
        key = dtype.lower()
        if key in ("bf16", "fp16"):
            return self.bf16_flops_per_s
        if key == "fp8":
            if self.fp8_flops_per_s <= 0:
                raise ConfigError(problem("train.precision", dtype, f"{self.name} has no FP8; use bf16"))
            return self.fp8_flops_per_s
        if key == "fp4":
            if self.fp4_flops_per_s <= 0:
                valid = "bf16, fp16 or fp8" if self.has_fp8 else "bf16 or fp16"
                raise ConfigError(problem("train.precision", dtype,
                                          f"{self.name} has no FP4 tensor cores (Blackwell and later); use {valid}"))
            return self.fp4_flops_per_s
        if key == "tf32":
            return self.tf32_flops_per_s
        if key == "fp32":
            return self.fp32_flops_per_s
        raise ConfigError(problem("train.precision", dtype, "valid dtypes: bf16, fp16, fp8, fp4, tf32, fp32"))


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

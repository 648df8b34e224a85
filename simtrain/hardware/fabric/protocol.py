"""``Fabric``: what the engine, the comm planner, the collective algorithms and the role finder ask of a
cluster fabric. Two classes satisfy it: ``simtrain.hardware.topology.Topology`` (the rail-optimised fat
tree's closed-form compile, O(1) routes with no graph in memory) and
``simtrain.hardware.fabric.routing.GraphTopology`` (routing tables compiled from any fabric graph of the
schema in ``simtrain.hardware.fabric.schema``).

GPUs are ints ``0..n_gpus-1`` (the rank placement index, ``simtrain.plan.layout.place``); vertices are
strings (``gpu{g}`` for GPU ``g``); a route is a tuple of directed edges ``(u, v)``.
"""

from __future__ import annotations

from typing import Protocol

from simtrain.hardware.hardware import ClusterSpec, LinkClass
from simtrain.hardware.topology import EdgeAttrs

#: A route: the directed edges from one GPU to another, in order (empty from a GPU to itself).
Route = tuple[tuple[str, str], ...]


class Fabric(Protocol):
    """A cluster fabric as the simulator sees it: GPU coordinates, routes and link attributes."""

    @property
    def cluster(self) -> ClusterSpec:
        """The cluster whose GPUs the fabric joins (GPU spec, NCCL latency terms)."""

    @property
    def n_gpus(self) -> int:
        """GPUs in the fabric."""

    @property
    def n_nodes(self) -> int:
        """Nodes (scale-up domains sharing a host) in the fabric."""

    @property
    def gpus_per_node(self) -> int:
        """GPUs in one node."""

    @property
    def nics_per_node(self) -> int:
        """NICs (rails) in one node."""

    @property
    def nodes_per_leaf(self) -> int:
        """Nodes under one leaf switch group (symmetric mode's translations move by whole groups)."""

    @property
    def mesh(self) -> bool:
        """Whether the GPUs of a node are joined by direct GPU-GPU links (no NVSwitch)."""

    @property
    def rail_symmetric(self) -> bool:
        """Whether the fabric is the rail-optimised fat tree of its cluster with Topology's vertex names:
        NVLink and PCIe edges private to a GPU, network edges private to a rail, and a shift by whole
        leaf groups an automorphism. Symmetric mode's shortcuts (renaming a stage's flows, keeping only
        the representative's own edges, sharing only on a common rail) rely on it."""

    def node_of(self, gpu: int) -> int:
        """Node index of ``gpu``."""

    def local_of(self, gpu: int) -> int:
        """Index of ``gpu`` inside its node."""

    def rail_of(self, gpu: int) -> int:
        """The rail (NIC index in its node) ``gpu`` uses for inter-node traffic."""

    def nic_of(self, gpu: int) -> str:
        """Vertex name of the NIC ``gpu`` uses."""

    def leaf_group_of_node(self, node: int) -> int:
        """Leaf group index of ``node``."""

    def nvswitch_of(self, node: int) -> str | None:
        """Vertex name of ``node``'s NVSwitch (None for a mesh node): NVLink SHARP's reduction point."""

    def route(self, src: int, dst: int) -> Route:
        """Directed edges from GPU ``src`` to GPU ``dst`` (empty when ``src == dst``)."""

    def edge(self, u: str, v: str) -> EdgeAttrs:
        """Attributes of the directed edge ``u -> v``; KeyError if there is no such edge."""

    def path_latency_s(self, path: Route) -> float:
        """Sum of the edge latencies along ``path`` (seconds)."""

    def path_bandwidth_Bps(self, path: Route) -> float:
        """Bottleneck bandwidth (bytes/s) along ``path``; inf for an empty path."""

    def link_class_of(self, path: Route) -> LinkClass:
        """The slowest link class on ``path`` ("net" > "pcie" > "nvlink"); "nvlink" for an empty path."""

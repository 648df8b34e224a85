"""Pieces every fabric builder shares: a node's inside (GPUs, scale-up domain, NICs) and the switch tiers
above the leaves (spines, cores), in the fabric graph schema of ``simtrain.hardware.fabric``.

Units: bandwidths in bytes/s per direction, latencies in seconds. Every link is added in both directions
with the same attributes (full duplex).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import networkx as nx

from simtrain.hardware.hardware import ClusterSpec
from simtrain.spec.errors import ConfigError, problem

#: Switch-to-switch edges one builder may add (leaves x spines + spines x cores): a graph past it would
#: not fit in memory; real fabrics have at most a few million links.
MAX_SWITCH_EDGES = 5 * 10**7


@dataclass(frozen=True)
class Leaf:
    """One leaf switch of a builder: its vertex name, its attributes and its downlink capacity (bytes/s,
    the sum of the NIC links plugged into it)."""

    name: str
    attrs: dict[str, Any]
    down_Bps: float


def link(G: nx.DiGraph, u: str, v: str, bandwidth_Bps: float, latency_s: float, link_class: str) -> None:
    """Add the full-duplex link ``u <-> v`` (both directions, same attributes)."""
    attrs = {"bandwidth_Bps": bandwidth_Bps, "latency_s": latency_s, "link_class": link_class}
    G.add_edge(u, v, **attrs)
    G.add_edge(v, u, **dict(attrs))


def add_nodes(G: nx.DiGraph, cluster: ClusterSpec, node0: int, n_nodes: int, *, pxn: bool = False) -> None:
    """Add nodes ``node0 .. node0 + n_nodes - 1`` of ``cluster``: their GPUs (``gpu{g}``, global index),
    scale-up domain (NVSwitch star ``nvsw{n}`` or Infinity-Fabric mesh), NICs (``nic{n}.{j}``) and the
    GPU-NIC PCIe links, exactly as ``simtrain.hardware.topology.build_graph`` does.

    ``pxn``: also join every NIC of a node to its NVSwitch (PXN: a GPU reaches another rail's NIC through
    the NVLink domain and the peer GPU) at the NIC's PCIe bandwidth and the NVLink latency.
    """
    node = cluster.node
    gpn, npn = node.gpus_per_node, cluster.nics_per_node
    mesh = node.scaleup == "mesh"
    nvl_bw = node.mesh_link_Bps if mesh else node.gpu.nvlink_Bps
    nvl_lat = cluster.nvlink_latency_s
    for n in range(node0, node0 + n_nodes):
        base = n * gpn
        G.add_nodes_from(
            (f"gpu{g}", {"kind": "gpu", "node": n, "local": g - base}) for g in range(base, base + gpn)
        )
        G.add_nodes_from((f"nic{n}.{j}", {"kind": "nic", "node": n, "rail": j}) for j in range(npn))
        if mesh:
            for a in range(base, base + gpn):
                for b in range(base, base + gpn):
                    if a != b:
                        G.add_edge(
                            f"gpu{a}", f"gpu{b}", bandwidth_Bps=nvl_bw, latency_s=nvl_lat, link_class="nvlink"
                        )
        else:
            G.add_node(f"nvsw{n}", kind="nvswitch", node=n)
            for g in range(base, base + gpn):
                link(G, f"gpu{g}", f"nvsw{n}", nvl_bw, nvl_lat, "nvlink")
        for local in range(gpn):
            link(G, f"gpu{base + local}", f"nic{n}.{local * npn // gpn}", node.pcie_Bps, 0.0, "pcie")
        if pxn and not mesh:
            for j in range(npn):
                link(G, f"nvsw{n}", f"nic{n}.{j}", node.pcie_Bps, nvl_lat, "pcie")


def down_ports(radix: int, ratio: float) -> int:
    """Down ports of a ``radix``-port switch whose down:up capacity is ``ratio`` (at least 1)."""
    return max(1, math.floor(radix * ratio / (ratio + 1)))


def add_tiers(
    G: nx.DiGraph,
    groups: Sequence[Sequence[Leaf]],
    *,
    ratios: Sequence[float],
    n_spines: int | None,
    n_cores: int | None,
    groups_per_pod: int,
    latency_s: float,
    prefix: str,
    where: str,
    attrs: dict[str, Any] | None = None,
) -> list[str]:
    """Add the leaves of ``groups`` and the tiers above them; return the top tier's vertex names.

    Two tiers (``len(ratios) == 1``): every leaf to every spine (``{prefix}spine`` when aggregated, else
    ``{prefix}spine{s}``), each uplink ``down_Bps / ratios[0] / n_spines``. Three tiers: leaf groups chunked
    into pods of ``groups_per_pod``; pod ``p``'s leaves go up to its spines (``{prefix}spine{p}`` or
    ``{prefix}spine{p}.{s}``) as above, and every spine of the pod to every core (``{prefix}core`` or
    ``{prefix}core{c}``) with ``(pod's leaf uplinks) / ratios[1] / n_spines / n_cores``. ``where``: the
    config path named in errors; ``attrs``: extra attributes of every spine and core (a plane's index).
    """
    extra = attrs or {}
    spines = n_spines or 1
    cores = n_cores or 1
    n_leaves = sum(len(g) for g in groups)
    n_pods = math.ceil(len(groups) / groups_per_pod) if len(ratios) > 1 else 1
    if n_leaves * spines + n_pods * spines * cores > MAX_SWITCH_EDGES:
        raise ConfigError(
            problem(
                f"{where}.n_spines",
                n_spines,
                f"{n_leaves} leaves x {spines} spines is past {MAX_SWITCH_EDGES:,} links",
            )
        )
    for group in groups:
        G.add_nodes_from((leaf.name, leaf.attrs) for leaf in group)
    if len(ratios) == 1:
        names = [f"{prefix}spine"] if n_spines is None else [f"{prefix}spine{s}" for s in range(spines)]
        G.add_nodes_from((s, {"kind": "spine", **extra}) for s in names)
        for group in groups:
            for leaf in group:
                up = leaf.down_Bps / ratios[0]
                for s in names:
                    link(G, leaf.name, s, up / spines, latency_s, "net")
        return names
    core_names = [f"{prefix}core"] if n_cores is None else [f"{prefix}core{c}" for c in range(cores)]
    G.add_nodes_from((c, {"kind": "core", **extra}) for c in core_names)
    for p in range(n_pods):
        pod = groups[p * groups_per_pod : (p + 1) * groups_per_pod]
        names = (
            [f"{prefix}spine{p}"] if n_spines is None else [f"{prefix}spine{p}.{s}" for s in range(spines)]
        )
        G.add_nodes_from((s, {"kind": "spine", "pod": p, **extra}) for s in names)
        pod_up = 0.0
        for group in pod:
            for leaf in group:
                up = leaf.down_Bps / ratios[0]
                pod_up += up
                for s in names:
                    link(G, leaf.name, s, up / spines, latency_s, "net")
        for s in names:
            for c in core_names:
                link(G, s, c, pod_up / ratios[1] / spines / cores, latency_s, "net")
    return core_names

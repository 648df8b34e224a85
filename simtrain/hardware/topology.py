"""The cluster fabric: a rail-optimised two-level fat tree built from a ClusterSpec.

Every node has ``nics_per_node`` NICs ("rails"); NIC ``j`` of every node under leaf group ``k`` plugs into
leaf switch ``leaf{j}.{k}``; all leaves go up to one aggregated ``spine``. Inside a node GPUs talk through
one aggregated NVSwitch (``nvsw{n}``) or, for an Infinity-Fabric mesh, over direct GPU-GPU links.

Two views of the same fabric exist:

- :func:`build_graph` materialises the full ``networkx.DiGraph`` (the ``rail_optimised`` kind of
  ``hardware.fabric``; schema in ``simtrain.hardware.fabric.schema``).
- :class:`Topology` is its closed-form compile: it answers ``route``/``edge`` queries in O(1) from vertex
  names, with no graph in memory, so it works at 16,384 GPUs and more. It gives the same routes and edge
  attributes as ``GraphTopology(build_graph(cluster))`` (``simtrain.hardware.fabric.routing``, which
  routes over any fabric graph), for every GPU pair (tests/test_fabric_graph.py), and it is what the
  default fabric simulates on.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import networkx as nx

from simtrain.hardware.hardware import ClusterSpec, LinkClass

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
    """O(1) routing over a ClusterSpec's fabric, with no graph in memory: the closed-form compile of
    :func:`build_graph` (a ``simtrain.hardware.fabric.protocol.Fabric``).

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

    #: The rail-optimised fat tree with its own vertex names (``Fabric.rail_symmetric``).
    rail_symmetric = True

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

    def nvswitch_of(self, node: int) -> str | None:
        """Vertex name of ``node``'s NVSwitch, None for a mesh node."""
        return None if self.mesh else f"nvsw{node}"

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

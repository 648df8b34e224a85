"""Fabric builders: each turns a ``hardware.fabric`` spec and the cluster into a fabric graph
(``networkx.DiGraph`` with the schema of ``simtrain.hardware.fabric``).

Every builder keeps the node inside as ``simtrain.hardware.topology.build_graph`` has it (``gpu{g}``,
``nvsw{n}`` or a mesh, ``nic{n}.{j}`` with ``rail`` = the NIC's index in the node) and differs in the
switches: which leaf a NIC plugs into and the tiers above. Switch names (``{prefix}`` is ``s{i}.`` inside
site ``i`` of a multi-site fabric, else empty):

- ``rail_optimised``: ``leaf{j}.{k}`` (rail ``j``, leaf group ``k``), then the tiers below.
- ``fat_tree``: ``leaf{k}`` (all NICs of the nodes of group ``k``).
- ``multi_plane``: ``p{j}.leaf{k}`` and plane ``j``'s own tiers ``p{j}.spine...``.
- ``nvl_racks``: ``leaf{i}.{k}`` (tray rail ``i``, rack group ``k``) or ``leaf{k}`` (top of rack).
- tiers: ``spine`` / ``spine{s}`` (2 tiers); ``spine{p}`` / ``spine{p}.{s}`` and ``core`` / ``core{c}``
  (3 tiers, pod ``p``); see :func:`simtrain.hardware.fabric.builders_parts.add_tiers`.
- ``multi_site``: ``s{i}.gateway`` per site, joined pairwise by the inter-site links.

Several spines (``n_spines``) are separate vertices, each leaf holding one uplink to each with an equal
share of its uplink capacity: the routing spreads flows over them (ECMP) and one link can fail. Without
``n_spines`` one aggregated spine carries the summed capacity.
"""

from __future__ import annotations

import networkx as nx

from simtrain.hardware.fabric.builders_parts import Leaf, add_nodes, add_tiers, down_ports, link
from simtrain.hardware.hardware import ClusterSpec
from simtrain.hardware.topology import build_graph
from simtrain.spec.errors import ConfigError, problem
from simtrain.spec.fabric_spec import (
    FatTreeFabric,
    GraphFileFabric,
    MultiPlaneFabric,
    MultiSiteFabric,
    NvlRacksFabric,
    RailOptimisedFabric,
)

_WHERE = "hardware.fabric"

SiteSpec = RailOptimisedFabric | FatTreeFabric | MultiPlaneFabric | NvlRacksFabric


def build_fabric(spec: SiteSpec | MultiSiteFabric | GraphFileFabric, cluster: ClusterSpec) -> nx.DiGraph:
    """The fabric graph of ``spec`` for ``cluster`` (a graph file is read by the loader, not here).

    ``rail_optimised`` with no parameter is ``build_graph(cluster)`` itself (the fabric every default run
    simulates, byte for byte). A spec that does not fit the cluster raises ConfigError naming the field.
    """
    if isinstance(spec, RailOptimisedFabric) and spec.is_default():
        return build_graph(cluster)
    if isinstance(spec, GraphFileFabric):
        raise ConfigError(
            problem(f"{_WHERE}.kind", spec.kind, "a builder kind (a graph file is read by load_graph)")
        )
    G: nx.DiGraph = nx.DiGraph(name=f"{cluster.n_nodes}x{cluster.node.name} {spec.kind}")
    if isinstance(spec, MultiSiteFabric):
        _multi_site(G, spec, cluster)
    else:
        _site(G, spec, cluster, 0, cluster.n_nodes, "", _WHERE)
    return G


def _site(
    G: nx.DiGraph, spec: SiteSpec, cluster: ClusterSpec, node0: int, m: int, prefix: str, where: str
) -> list[str]:
    """Add nodes ``node0 .. node0 + m - 1`` and the switches of ``spec`` over them; the top tier's names."""
    if isinstance(spec, MultiPlaneFabric):
        return _multi_plane(G, spec, cluster, node0, m, prefix, where)
    add_nodes(G, cluster, node0, m)
    ratios = spec.ratios(cluster.oversubscription)
    nic = cluster.nic_Bps
    npn = cluster.nics_per_node
    groups: list[list[Leaf]] = []
    if isinstance(spec, RailOptimisedFabric):
        npl, per_group = cluster.nodes_per_leaf, npn
        pod = spec.groups_per_pod
        for k in range(-(-m // npl)):
            nodes = range(node0 + k * npl, node0 + min(m, (k + 1) * npl))
            groups.append(
                [
                    Leaf(f"{prefix}leaf{j}.{k}", {"kind": "leaf", "rail": j, "group": k}, len(nodes) * nic)
                    for j in range(npn)
                ]
            )
            for n in nodes:
                for j in range(npn):
                    link(G, f"nic{n}.{j}", f"{prefix}leaf{j}.{k}", nic, cluster.net_hop_latency_s, "net")
    elif isinstance(spec, FatTreeFabric):
        npl = spec.nodes_per_leaf or max(1, down_ports(spec.radix, ratios[0]) // npn)
        per_group, pod = 1, spec.leaves_per_pod
        for k in range(-(-m // npl)):
            nodes = range(node0 + k * npl, node0 + min(m, (k + 1) * npl))
            groups.append([Leaf(f"{prefix}leaf{k}", {"kind": "leaf", "group": k}, len(nodes) * npn * nic)])
            for n in nodes:
                for j in range(npn):
                    link(G, f"nic{n}.{j}", f"{prefix}leaf{k}", nic, cluster.net_hop_latency_s, "net")
    else:
        per_group, pod = _rack_leaves(G, spec, cluster, node0, m, prefix, ratios[0], groups)
    groups_per_pod = pod or max(1, down_ports(spec.radix, ratios[-1]) // per_group)
    return add_tiers(
        G,
        groups,
        ratios=ratios,
        n_spines=spec.n_spines,
        n_cores=spec.n_cores,
        groups_per_pod=groups_per_pod,
        latency_s=cluster.net_hop_latency_s,
        prefix=prefix,
        where=where,
    )


def tray_rails(cluster: ClusterSpec, gpus_per_tray: int) -> list[tuple[int, int]]:
    """``(tray, tray rail)`` of each NIC of a rack: its GPU's tray and its index among that tray's NICs."""
    gpn, npn = cluster.gpus_per_node, cluster.nics_per_node
    out: list[tuple[int, int]] = []
    seen: dict[int, int] = {}
    for j in range(npn):
        first_gpu = -(-j * gpn // npn)  # the lowest local GPU whose NIC is j (local * npn // gpn == j)
        tray = first_gpu // gpus_per_tray
        out.append((tray, seen.get(tray, 0)))
        seen[tray] = seen.get(tray, 0) + 1
    return out


def _rack_leaves(
    G: nx.DiGraph,
    spec: NvlRacksFabric,
    cluster: ClusterSpec,
    node0: int,
    m: int,
    prefix: str,
    ratio: float,
    groups: list[list[Leaf]],
) -> tuple[int, int | None]:
    """The leaves of an NVL-rack fabric (appended to ``groups``); ``(leaves per group, groups per pod)``."""
    nic, lat = cluster.nic_Bps, cluster.net_hop_latency_s
    trays = tray_rails(cluster, spec.gpus_per_tray)
    n_trays = max(t for t, _ in trays) + 1
    n_rails = max(i for _, i in trays) + 1
    for n in range(node0, node0 + m):
        for j, (t, i) in enumerate(trays):
            G.nodes[f"nic{n}.{j}"].update(tray=t, tray_rail=i)
    if spec.leaf == "rail":
        rpl = spec.racks_per_leaf or max(1, down_ports(spec.radix, ratio) // n_trays)
        for k in range(-(-m // rpl)):
            racks = range(node0 + k * rpl, node0 + min(m, (k + 1) * rpl))
            per_rail = [sum(1 for _, i in trays if i == r) for r in range(n_rails)]
            groups.append(
                [
                    Leaf(
                        f"{prefix}leaf{r}.{k}",
                        {"kind": "leaf", "rail": r, "group": k},
                        len(racks) * per_rail[r] * nic,
                    )
                    for r in range(n_rails)
                ]
            )
            for n in racks:
                for j, (_, i) in enumerate(trays):
                    link(G, f"nic{n}.{j}", f"{prefix}leaf{i}.{k}", nic, lat, "net")
        return n_rails, spec.groups_per_pod
    npn = cluster.nics_per_node
    rpl = spec.racks_per_leaf or max(1, down_ports(spec.radix, ratio) // npn)
    for k in range(-(-m // rpl)):
        racks = range(node0 + k * rpl, node0 + min(m, (k + 1) * rpl))
        groups.append([Leaf(f"{prefix}leaf{k}", {"kind": "leaf", "group": k}, len(racks) * npn * nic)])
        for n in racks:
            for j in range(npn):
                link(G, f"nic{n}.{j}", f"{prefix}leaf{k}", nic, lat, "net")
    return 1, spec.groups_per_pod


def _multi_plane(
    G: nx.DiGraph, spec: MultiPlaneFabric, cluster: ClusterSpec, node0: int, m: int, prefix: str, where: str
) -> list[str]:
    """Plane ``j``: the NICs ``j`` of all nodes on their own leaves and tiers; PXN edges inside nodes."""
    npn = cluster.nics_per_node
    if cluster.node.scaleup == "mesh" and npn > 1:
        raise ConfigError(
            problem(
                f"{where}.kind",
                spec.kind,
                f"a node with an NVSwitch: node {cluster.node.name!r} joins its GPUs by an Infinity-Fabric "
                "mesh, so traffic between two rails would have to transit a GPU (PXN); "
                "use rail_optimised or fat_tree",
            )
        )
    add_nodes(G, cluster, node0, m, pxn=True)
    ratios = spec.ratios(cluster.oversubscription)
    nic, lat, npl = cluster.nic_Bps, cluster.net_hop_latency_s, cluster.nodes_per_leaf
    top: list[str] = []
    for j in range(npn):
        groups: list[list[Leaf]] = []
        for k in range(-(-m // npl)):
            nodes = range(node0 + k * npl, node0 + min(m, (k + 1) * npl))
            groups.append(
                [
                    Leaf(
                        f"{prefix}p{j}.leaf{k}",
                        {"kind": "leaf", "rail": j, "group": k, "plane": j},
                        len(nodes) * nic,
                    )
                ]
            )
            for n in nodes:
                link(G, f"nic{n}.{j}", f"{prefix}p{j}.leaf{k}", nic, lat, "net")
        top += add_tiers(
            G,
            groups,
            ratios=ratios,
            n_spines=spec.n_spines,
            n_cores=spec.n_cores,
            groups_per_pod=spec.groups_per_pod or down_ports(spec.radix, ratios[-1]),
            latency_s=lat,
            prefix=f"{prefix}p{j}.",
            where=where,
            attrs={"plane": j},
        )
    return top


def _multi_site(G: nx.DiGraph, spec: MultiSiteFabric, cluster: ClusterSpec) -> None:
    """Sites of ``n_nodes / n_sites`` nodes in index order, a gateway each, gateways joined pairwise."""
    n = spec.n_sites
    if cluster.n_nodes % n:
        raise ConfigError(
            problem(
                f"{_WHERE}.n_sites",
                n,
                f"a divisor of hardware.n_nodes ({cluster.n_nodes}): nodes are split evenly across sites",
            )
        )
    m = cluster.n_nodes // n
    wan_Bps = spec.link_Gbps * 1e9 / 8
    for s in range(n):
        top = _site(G, spec.site, cluster, s * m, m, f"s{s}.", f"{_WHERE}.site")
        gw = f"s{s}.gateway"
        G.add_node(gw, kind="gateway", site=s)
        # The gateway link: the site's share of every inter-site link unless gateway_Gbps bounds it.
        up_Bps = wan_Bps * (n - 1) if spec.gateway_Gbps is None else spec.gateway_Gbps * 1e9 / 8 / len(top)
        for name in top:
            link(G, name, gw, up_Bps, cluster.net_hop_latency_s, "net")
    for a in range(n):
        for b in range(a + 1, n):
            link(G, f"s{a}.gateway", f"s{b}.gateway", wan_Bps, spec.latency_ms * 1e-3, "net")

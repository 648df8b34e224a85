"""The fabric as a graph (issue 28 part 1): GraphTopology routes over any schema graph, and on the
rail-optimised graph it is Topology (the graph's closed-form compile)."""

from __future__ import annotations

import random
from typing import Any

import networkx as nx
import pytest

from simtrain.hardware.fabric.routing import GraphTopology, ecmp_index
from simtrain.hardware.load import build_cluster
from simtrain.hardware.topology import Topology, build_graph

#: (node profile, nodes, build_cluster overrides): an H100 node, a mesh node, partial leaf groups,
#: oversubscription 2 with shared NICs, NVL72, an A100 node.
CLUSTERS: list[tuple[str, int, dict[str, Any]]] = [
    ("dgx-h100", 5, {"nodes_per_leaf": 2}),
    ("mi300x-8", 3, {}),
    ("dgx-h100", 4, {"oversubscription": 2.0, "nodes_per_leaf": 3, "nics_per_node": 4}),
    ("gb200-nvl72", 2, {}),
    ("dgx-a100", 3, {"nodes_per_leaf": 2}),
]


@pytest.mark.parametrize(("node", "n_nodes", "kw"), CLUSTERS)
def test_graph_routes_equal_topology_for_every_pair(node: str, n_nodes: int, kw: dict[str, Any]) -> None:
    c = build_cluster(node, n_nodes, **kw)
    topo, graph = Topology(c), GraphTopology(build_graph(c), c)
    assert (graph.n_gpus, graph.n_nodes, graph.gpus_per_node, graph.nics_per_node, graph.mesh) == (
        topo.n_gpus, topo.n_nodes, topo.gpus_per_node, topo.nics_per_node, topo.mesh)
    assert graph.rail_symmetric and graph.nodes_per_leaf == topo.nodes_per_leaf
    for a in range(c.n_gpus):
        assert (graph.node_of(a), graph.local_of(a), graph.rail_of(a), graph.nic_of(a)) == (
            topo.node_of(a), topo.local_of(a), topo.rail_of(a), topo.nic_of(a))
        for b in range(c.n_gpus):
            route = topo.route(a, b)
            assert graph.route(a, b) == route
            assert [graph.edge(*e) for e in route] == [topo.edge(*e) for e in route]
            assert graph.path_latency_s(route) == topo.path_latency_s(route)
            assert graph.link_class_of(route) == topo.link_class_of(route)
    for n in range(c.n_nodes):
        assert graph.nvswitch_of(n) == topo.nvswitch_of(n)


def test_graph_routes_equal_topology_on_random_pairs_of_16384_gpus() -> None:
    c = build_cluster("dgx-h100", 2048)
    topo, graph = Topology(c), GraphTopology(build_graph(c), c)
    rng = random.Random(28)
    for _ in range(300):
        a, b = rng.randrange(c.n_gpus), rng.randrange(c.n_gpus)
        route = topo.route(a, b)
        assert graph.route(a, b) == route
        assert [graph.edge(*e) for e in route] == [topo.edge(*e) for e in route]


def _duplex(edges: list[tuple[str, str, float]], latency_s: float = 1e-6) -> nx.DiGraph:
    g = nx.DiGraph()
    for u, v, bw in edges:
        cls = "pcie" if "nic" in u + v and ("gpu" in u or "gpu" in v) else "net"
        g.add_edge(u, v, bandwidth_Bps=bw, latency_s=latency_s, link_class=cls)
        g.add_edge(v, u, bandwidth_Bps=bw, latency_s=latency_s, link_class=cls)
    return g


def _two_spines() -> nx.DiGraph:
    """8 one-GPU nodes, one leaf per four, two equal spines: ECMP between the spines."""
    edges = [(f"gpu{g}", f"nic{g}", 50e9) for g in range(8)]
    edges += [(f"nic{g}", f"leaf{g // 4}", 50e9) for g in range(8)]
    edges += [(f"leaf{k}", f"spine{s}", 100e9) for k in range(2) for s in range(2)]
    g = _duplex(edges)
    for i in range(8):
        g.add_node(f"gpu{i}", kind="gpu", node=i, local=0)
        g.add_node(f"nic{i}", kind="nic", node=i, rail=0)
    for k in range(2):
        g.add_node(f"leaf{k}", kind="leaf")
        g.add_node(f"spine{k}", kind="spine")
    return g


def test_ecmp_spreads_pairs_over_equal_spines_deterministically() -> None:
    topo = GraphTopology(_two_spines())
    cross = [(a, b) for a in range(4) for b in range(4, 8)]
    spines = [topo.route(a, b)[2][1] for a, b in cross]
    assert set(spines) == {"spine0", "spine1"}  # the 16 cross pairs use both spines
    assert spines == [f"spine{ecmp_index(a, b, 2, 2)}" for a, b in cross]  # the documented hash, hop 2
    again = GraphTopology(_two_spines())
    assert all(topo.route(a, b) == again.route(a, b) for a in range(8) for b in range(8))
    assert all(len(topo.route(a, b)) == 6 for a, b in cross)
    assert topo.route(0, 1) == (("gpu0", "nic0"), ("nic0", "leaf0"), ("leaf0", "nic1"), ("nic1", "gpu1"))


def test_widest_of_the_shortest_routes_wins() -> None:
    """Two 4-hop routes between the leaves' GPUs: the one through the wider spine is taken."""
    g = _two_spines()
    g["leaf0"]["spine1"]["bandwidth_Bps"] = 10e9
    topo = GraphTopology(g)
    assert all(topo.route(a, b)[2][1] == "spine0" for a in range(4) for b in range(4, 8))


def test_ecmp_index_is_a_fixed_function() -> None:
    assert [ecmp_index(0, 1, h, 2) for h in range(4)] == [ecmp_index(0, 1, h, 2) for h in range(4)]
    assert {ecmp_index(a, b, 0, 4) for a in range(16) for b in range(16)} == {0, 1, 2, 3}

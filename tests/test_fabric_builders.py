"""Fabric builders (issue 28 part 2): each graph against closed forms computed here, independently of the
builder: vertex and edge counts, per-tier capacities (nodes x NICs x NIC bandwidth / ratio) and bisection
bandwidth by ``networkx.maximum_flow``."""

from __future__ import annotations

import math

import networkx as nx
import pytest

import simtrain
from simtrain.cost.collectives import effective_bandwidth, idle_time, plan_collective
from simtrain.engine.network import fluid_duration
from simtrain.hardware.fabric.builders import build_fabric, tray_rails
from simtrain.hardware.fabric.routing import GraphTopology
from simtrain.hardware.fabric.schema import checked
from simtrain.hardware.fabric.wiring import fabric_of
from simtrain.hardware.load import build_cluster
from simtrain.hardware.topology import Topology, build_graph
from simtrain.plan.load import load_config
from simtrain.spec.collective_kinds import CollectiveKind
from simtrain.spec.errors import ConfigError
from simtrain.spec.fabric_spec import (
    FatTreeFabric,
    MultiPlaneFabric,
    MultiSiteFabric,
    NvlRacksFabric,
    RailOptimisedFabric,
)

NIC = 50e9  # dgx-h100: 8 x 400 Gbit/s NICs = 50 GB/s each
EXAMPLE = "examples/llama3_8b_h100_fsdp.yaml"


def _same_graph(a: nx.DiGraph, b: nx.DiGraph) -> bool:
    """Same vertices, edges and attributes (the graph's own name aside)."""
    return dict(a.nodes(data=True)) == dict(b.nodes(data=True)) and {
        (u, v): d for u, v, d in a.edges(data=True)
    } == {(u, v): d for u, v, d in b.edges(data=True)}


def _bisection(G: nx.DiGraph, left: list[int], right: list[int], gpn: int) -> float:
    """Max flow (bytes/s) from the GPUs of nodes ``left`` to those of nodes ``right``."""
    H = nx.DiGraph()
    for u, v, d in G.edges(data=True):
        H.add_edge(u, v, capacity=d["bandwidth_Bps"])
    for n in left:
        for g in range(n * gpn, (n + 1) * gpn):
            H.add_edge("SRC", f"gpu{g}")  # no capacity attribute: unbounded
    for n in right:
        for g in range(n * gpn, (n + 1) * gpn):
            H.add_edge(f"gpu{g}", "DST")
    return float(nx.maximum_flow_value(H, "SRC", "DST"))


def _net_sum(G: nx.DiGraph, src_kind: str, dst_kind: str) -> float:
    """Summed bandwidth of the edges from ``src_kind`` to ``dst_kind`` vertices (bytes/s)."""
    kind = nx.get_node_attributes(G, "kind")
    return sum(
        d["bandwidth_Bps"] for u, v, d in G.edges(data=True) if kind[u] == src_kind and kind[v] == dst_kind
    )


# -- rail_optimised ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("node", "n", "kw"),
    [
        ("dgx-h100", 16, {}),
        ("dgx-h100", 10, {"nodes_per_leaf": 4, "oversubscription": 2.0}),
        ("mi300x-8", 3, {}),
        ("gb200-nvl72", 2, {}),
    ],
)
def test_rail_default_is_build_graph_and_the_generic_builder_agrees(node: str, n: int, kw: dict) -> None:
    c = build_cluster(node, n, **kw)
    assert nx.utils.graphs_equal(build_fabric(RailOptimisedFabric(), c), build_graph(c))
    # Given its parameters explicitly, the generic Clos builder builds the same fabric.
    explicit = RailOptimisedFabric(oversubscription=[c.oversubscription], n_spines=1)
    G = build_fabric(explicit, c)
    G = nx.relabel_nodes(G, {"spine0": "spine"})
    assert _same_graph(G, build_graph(c))


def test_only_the_parameterless_rail_fabric_is_the_closed_form_topology() -> None:
    c = build_cluster("dgx-h100", 4)
    assert isinstance(fabric_of(RailOptimisedFabric(), c), Topology)
    assert isinstance(fabric_of(RailOptimisedFabric(n_spines=2), c), GraphTopology)
    assert isinstance(fabric_of(FatTreeFabric(), c), GraphTopology)


def test_rail_with_spines_and_per_tier_ratio() -> None:
    c = build_cluster("dgx-h100", 16, nodes_per_leaf=8)
    G = build_fabric(RailOptimisedFabric(oversubscription=2, n_spines=4), c)
    leaves = [v for v, k in G.nodes(data="kind") if k == "leaf"]
    spines = [v for v, k in G.nodes(data="kind") if k == "spine"]
    assert len(leaves) == 8 * 2 and len(spines) == 4
    # Every leaf to every spine, each uplink a quarter of 8 nodes x 50 GB/s / 2.
    assert all(G.edges[leaf, s]["bandwidth_Bps"] == 8 * NIC / 2 / 4 for leaf in leaves for s in spines)
    assert _net_sum(G, "leaf", "spine") == pytest.approx(16 * 8 * NIC / 2)
    assert _bisection(G, list(range(8)), list(range(8, 16)), 8) == pytest.approx(8 * 8 * NIC / 2)


def test_rail_three_tiers_in_pods() -> None:
    c = build_cluster("dgx-h100", 8, nodes_per_leaf=2)
    G = build_fabric(RailOptimisedFabric(tiers=3, oversubscription=[1, 2], groups_per_pod=2), c)
    kinds = [k for _, k in G.nodes(data="kind")]
    # 8 rails x 4 leaf groups; one aggregated spine per pod of 2 groups; one aggregated core.
    assert (kinds.count("leaf"), kinds.count("spine"), kinds.count("core")) == (32, 2, 1)
    assert G.has_edge("leaf5.3", "spine1") and not G.has_edge("leaf5.3", "spine0")
    assert _net_sum(G, "spine", "core") == pytest.approx(8 * 8 * NIC / 2)
    # Pod against pod: the spine-to-core tier at 2:1; leaf group against leaf group inside a pod: 1:1.
    assert _bisection(G, [0, 1, 2, 3], [4, 5, 6, 7], 8) == pytest.approx(4 * 8 * NIC / 2)
    assert _bisection(G, [0, 1], [2, 3], 8) == pytest.approx(2 * 8 * NIC)


# -- fat_tree ---------------------------------------------------------------------------------------


def test_fat_tree_counts_and_links() -> None:
    c = build_cluster("dgx-h100", 16)
    G = build_fabric(FatTreeFabric(nodes_per_leaf=8, n_spines=4), c)
    kinds = [k for _, k in G.nodes(data="kind")]
    assert (kinds.count("gpu"), kinds.count("nvswitch"), kinds.count("nic")) == (128, 16, 128)
    assert (kinds.count("leaf"), kinds.count("spine")) == (2, 4)
    # Directed edges: gpu-nvsw, gpu-nic, nic-leaf (one per NIC), leaf-spine (2 x 4), each both ways.
    assert G.number_of_edges() == 2 * (128 + 128 + 128 + 2 * 4)
    # Every NIC of a node plugs into the node's leaf (not rail-optimised).
    assert all(G.has_edge(f"nic{n}.{j}", f"leaf{n // 8}") for n in range(16) for j in range(8))
    assert all(
        d["link_class"] == "net" and d["latency_s"] == 1e-6 for u, v, d in G.edges(data=True) if "leaf" in u
    )


def test_fat_tree_default_leaf_size_from_the_radix() -> None:
    c = build_cluster("dgx-h100", 16)
    # 64-port leaf: 32 ports down at 1:1 (4 nodes of 8 NICs), 42 at 2:1 (5 nodes).
    assert sum(1 for _, k in build_fabric(FatTreeFabric(), c).nodes(data="kind") if k == "leaf") == 4
    assert sum(
        1 for _, k in build_fabric(FatTreeFabric(oversubscription=2), c).nodes(data="kind") if k == "leaf"
    ) == math.ceil(16 / 5)


@pytest.mark.parametrize("ratio", [1.0, 2.0, 4.0])
def test_fat_tree_tier_capacity_and_bisection(ratio: float) -> None:
    c = build_cluster("dgx-h100", 16)
    G = build_fabric(FatTreeFabric(nodes_per_leaf=8, oversubscription=ratio), c)
    assert _net_sum(G, "leaf", "spine") == pytest.approx(16 * 8 * NIC / ratio)
    # Half the nodes against the other half: the leaf uplinks (8 nodes x 8 NICs / ratio) limit.
    assert _bisection(G, list(range(8)), list(range(8, 16)), 8) == pytest.approx(8 * 8 * NIC / ratio)
    # Inside one leaf nothing is oversubscribed: 4 nodes to 4 nodes at the NIC rate.
    assert _bisection(G, [0, 1, 2, 3], [4, 5, 6, 7], 8) == pytest.approx(4 * 8 * NIC)


def test_fat_tree_three_tiers() -> None:
    c = build_cluster("dgx-h100", 16)
    spec = FatTreeFabric(
        tiers=3, oversubscription=[2, 4], nodes_per_leaf=2, leaves_per_pod=4, n_spines=2, n_cores=3
    )
    G = build_fabric(spec, c)
    kinds = [k for _, k in G.nodes(data="kind")]
    assert (kinds.count("leaf"), kinds.count("spine"), kinds.count("core")) == (8, 2 * 2, 3)
    assert _net_sum(G, "leaf", "spine") == pytest.approx(16 * 8 * NIC / 2)
    assert _net_sum(G, "spine", "core") == pytest.approx(16 * 8 * NIC / 2 / 4)
    # Pod against pod (8 nodes each): the spine-to-core tier limits, 8 x 8 x NIC / 2 / 4.
    assert _bisection(G, list(range(8)), list(range(8, 16)), 8) == pytest.approx(8 * 8 * NIC / 8)
    # Inside a pod, leaf against leaf: the leaf tier, 2 nodes x 8 x NIC / 2.
    assert _bisection(G, [0, 1], [2, 3], 8) == pytest.approx(2 * 8 * NIC / 2)


# -- multi_plane ------------------------------------------------------------------------------------


def test_multi_plane_planes_are_separate_and_pxn_joins_them_inside_nodes() -> None:
    c = build_cluster("dgx-h100", 4, nodes_per_leaf=2)
    G = build_fabric(MultiPlaneFabric(), c)
    kinds = nx.get_node_attributes(G, "kind")
    switches = G.subgraph(v for v, k in kinds.items() if k in ("leaf", "spine"))
    # Eight planes, each two leaves and a spine, with no switch link between planes.
    planes = list(nx.weakly_connected_components(switches))
    assert len(planes) == 8 and all(len(p) == 3 for p in planes)
    assert all({G.nodes[v]["plane"] for v in p} == {int(next(iter(p))[1])} for p in planes)
    # Without the PXN edges (NVSwitch-NIC) a GPU of rail 0 cannot reach a GPU of rail 1 on another node.
    no_pxn = G.copy()
    no_pxn.remove_edges_from([(u, v) for u, v in G.edges if {kinds[u], kinds[v]} == {"nvswitch", "nic"}])
    no_gpu_transit = no_pxn.subgraph(v for v in G if kinds[v] != "gpu" or v in ("gpu0", "gpu9"))
    assert not nx.has_path(no_gpu_transit, "gpu0", "gpu9")
    assert nx.has_path(G.subgraph(v for v in G if kinds[v] != "gpu" or v in ("gpu0", "gpu9")), "gpu0", "gpu9")
    assert G.edges["nvsw0", "nic0.3"]["bandwidth_Bps"] == c.node.pcie_Bps
    # One plane's bisection: its leaf uplinks to its own spine (2 nodes x one NIC each side).
    assert _bisection(G, [0, 1], [2, 3], 8) == pytest.approx(2 * 8 * NIC)


def test_multi_plane_refuses_a_mesh_node() -> None:
    with pytest.raises(ConfigError, match="hardware.fabric.kind.*Infinity-Fabric mesh"):
        build_fabric(MultiPlaneFabric(), build_cluster("mi300x-8", 2))


# -- nvl_racks --------------------------------------------------------------------------------------


def test_nvl_racks_rail_leaves_per_tray_rail() -> None:
    c = build_cluster("gb200-nvl72", 4)
    G = build_fabric(NvlRacksFabric(racks_per_leaf=2), c)
    kinds = nx.get_node_attributes(G, "kind")
    leaves = sorted(v for v, k in kinds.items() if k == "leaf")
    # 4 tray rails x 2 rack groups; a leaf takes one NIC per tray of each of its 2 racks (2 x 18).
    assert leaves == sorted(f"leaf{i}.{k}" for i in range(4) for k in range(2))
    assert all(sum(1 for u in G.predecessors(leaf) if kinds[u] == "nic") == 36 for leaf in leaves)
    # GPU 4t + i sits in tray t and uses NIC 4t + i on tray rail i.
    assert G.nodes["nic1.13"]["tray"] == 3 and G.nodes["nic1.13"]["tray_rail"] == 1
    assert G.has_edge("nic1.13", "leaf1.0") and G.has_edge("nic2.13", "leaf1.1")
    # One NVLink domain of 72 GPUs per rack.
    assert sum(1 for v in G.successors("nvsw0") if kinds[v] == "gpu") == 72
    assert _bisection(G, [0, 1], [2, 3], 72) == pytest.approx(2 * 72 * c.nic_Bps)


def test_nvl_racks_top_of_rack_and_partial_racks() -> None:
    c = build_cluster("gb200-nvl72", 3, gpus_per_node=64)
    assert tray_rails(c, 4)[:6] == [(0, 0), (0, 1), (0, 2), (0, 3), (1, 0), (1, 1)]
    G = build_fabric(NvlRacksFabric(leaf="rack", oversubscription=2), c)
    leaves = [v for v, k in G.nodes(data="kind") if k == "leaf"]
    assert leaves == ["leaf0", "leaf1", "leaf2"]  # 64 NICs per rack: more than a leaf's 42 down ports
    assert _net_sum(G, "leaf", "spine") == pytest.approx(3 * 64 * c.nic_Bps / 2)


# -- multi_site -------------------------------------------------------------------------------------


def test_multi_site_split_and_inter_site_bisection() -> None:
    c = build_cluster("dgx-h100", 8, nodes_per_leaf=2)
    spec = MultiSiteFabric(n_sites=2, site=FatTreeFabric(nodes_per_leaf=2), link_Gbps=800, latency_ms=2)
    G = build_fabric(spec, c)
    assert G.edges["s0.gateway", "s1.gateway"] == {
        "bandwidth_Bps": 100e9,
        "latency_s": 2e-3,
        "link_class": "net",
    }
    # Nodes 0-3 in site 0, 4-7 in site 1, each site its own leaves.
    assert G.has_edge("nic3.0", "s0.leaf1") and G.has_edge("nic4.0", "s1.leaf0")
    # Site against site: one 800 Gbit/s link.
    assert _bisection(G, [0, 1, 2, 3], [4, 5, 6, 7], 8) == pytest.approx(100e9)
    # Inside a site the site's own fabric: 2 nodes x 8 NICs.
    assert _bisection(G, [0, 1], [2, 3], 8) == pytest.approx(2 * 8 * NIC)


def test_multi_site_three_sites_full_mesh() -> None:
    c = build_cluster("dgx-h100", 6)
    G = build_fabric(MultiSiteFabric(n_sites=3, link_Gbps=400), c)
    gws = [v for v, k in G.nodes(data="kind") if k == "gateway"]
    assert sorted(gws) == ["s0.gateway", "s1.gateway", "s2.gateway"]
    assert all(G.has_edge(a, b) for a in gws for b in gws if a != b)
    # Site 0 against sites 1 and 2: two links.
    assert _bisection(G, [0, 1], [2, 3, 4, 5], 8) == pytest.approx(2 * 50e9)


def test_multi_site_gateway_bounds_a_sites_inter_site_traffic() -> None:
    c = build_cluster("dgx-h100", 6)
    G = build_fabric(MultiSiteFabric(n_sites=3, link_Gbps=400, gateway_Gbps=600, site=FatTreeFabric(n_spines=3)), c)
    assert sum(G.edges[f"s0.spine{s}", "s0.gateway"]["bandwidth_Bps"] for s in range(3)) == pytest.approx(75e9)
    # Site 0 against sites 1 and 2: two 400 Gbit/s links, but 600 Gbit/s through its gateway.
    assert _bisection(G, [0, 1], [2, 3, 4, 5], 8) == pytest.approx(75e9)


def test_multi_site_needs_an_even_split() -> None:
    with pytest.raises(ConfigError, match=r"hardware.fabric.n_sites.*divisor of hardware.n_nodes \(7\)"):
        build_fabric(MultiSiteFabric(n_sites=2), build_cluster("dgx-h100", 7))


SMALL = [
    ("dgx-h100", 4, FatTreeFabric(nodes_per_leaf=2, n_spines=2)),
    ("dgx-h100", 4, FatTreeFabric(tiers=3, nodes_per_leaf=1, leaves_per_pod=2, n_spines=2, n_cores=2)),
    ("dgx-h100", 4, RailOptimisedFabric(oversubscription=2, n_spines=3)),
    ("dgx-h100", 4, MultiPlaneFabric(tiers=3, groups_per_pod=1)),
    ("mi300x-8", 2, FatTreeFabric()),
    ("gb200-nvl72", 2, NvlRacksFabric()),
    ("dgx-h100", 4, MultiSiteFabric(site=MultiPlaneFabric())),
]


@pytest.mark.parametrize(("node", "n", "spec"), SMALL, ids=[f"{s.kind}-{i}" for i, (_, _, s) in enumerate(SMALL)])
def test_every_pair_has_a_route_that_transits_no_gpu(node: str, n: int, spec) -> None:  # noqa: ANN001
    c = build_cluster(node, n)
    G = build_fabric(spec, c)
    assert checked(G, c) is not None  # the schema's own checks pass
    topo = GraphTopology(G, c)
    kinds = nx.get_node_attributes(G, "kind")
    step = 1 if c.n_gpus <= 32 else 7
    for a in range(0, c.n_gpus, step):
        for b in range(c.n_gpus):
            path = topo.route(a, b)
            assert all(G.has_edge(u, v) for u, v in path)
            assert all(kinds[v] != "gpu" for _, v in path[:-1])
            if path and c.node.scaleup == "nvswitch" and a // c.gpus_per_node == b // c.gpus_per_node:
                assert topo.link_class_of(path) == "nvlink"  # inside a node: never through a NIC


# -- collectives over the built graphs (GraphTopology routes) -------------------------------------------

S = 2.0**31  # bytes all-reduced per GPU of a node: NCCL's latency terms stay under 2 % of the time


def _ring_all_reduce(c, G: nx.DiGraph, nodes: list[int]) -> tuple[float, float]:  # noqa: ANN001
    """(flow time, latency) in seconds of NCCL's ring all-reduce of S x gpus_per_node bytes over the GPUs
    of ``nodes``."""
    topo = GraphTopology(G, c)
    gpn = c.gpus_per_node
    gpus = tuple(n * gpn + local for n in nodes for local in range(gpn))
    plan = plan_collective(CollectiveKind.ALL_REDUCE, gpus, S * gpn, topo, c.gpu, choice=("ring", "Simple"))

    def cap(e: tuple[str, str]) -> float:
        return effective_bandwidth(topo, c.gpu, e)

    t = idle_time(cap, plan.phases)
    # The engine's max-min fair fluid model gives the same time for these flows alone.
    fluid = sum(fluid_duration([(f.path, (1.0,) * len(f.path), f.nbytes, f.cap_Bps) for f in ph], cap) for ph in plan.phases)
    assert fluid == pytest.approx(t, rel=1e-9)
    return t, plan.latency_s


def test_a_long_inter_site_link_adds_its_latency_to_every_ring_step() -> None:
    """A ring all-reduce over two sites joined by a link of latency L: NCCL's latency model
    (collective_flows.ring_latency, after tuning.cc) has 2(n_nodes-1) inter-node steps, each paying the
    network latency twice with the Simple protocol; the long link adds L to that network latency, so the
    term grows by 2(n_nodes-1) x 2 x L over the same ring with a short link."""
    c = build_cluster("dgx-h100", 2)
    lat = {}
    for ms in (0.0, 5.0):
        topo = GraphTopology(build_fabric(MultiSiteFabric(n_sites=2, latency_ms=ms), c), c)
        plan = plan_collective(CollectiveKind.ALL_REDUCE, (0, 8), 1.0, topo, c.gpu, choice=("ring", "Simple"))
        lat[ms] = plan.latency_s
    assert lat[5.0] - lat[0.0] == pytest.approx(2 * (2 - 1) * 2 * 5e-3, rel=1e-3)  # less the switch hop the link counts as


@pytest.mark.parametrize("gpn", [1, 8])
@pytest.mark.parametrize("ratio", [1.0, 2.0, 4.0])
def test_all_reduce_across_an_oversubscribed_tier(gpn: int, ratio: float) -> None:
    """16 nodes under two leaves of a fat tree at ``ratio``:1 leaf-to-spine. A ring that alternates leaves
    crosses the spine tier at every hop, so each leaf's 8 x gpn outgoing NIC flows share its uplink of
    8 x gpn x NIC / ratio: each gets NIC / ratio, and the all-reduce of S x gpn bytes takes 2(P-1)/P x S /
    (eta NIC / ratio) (each GPU sends 1/gpn of its ring traffic through its NIC; eta the NIC protocol efficiency).
    The ring in node order crosses leaves at two hops only and runs at the NIC rate whatever the ratio."""
    c = build_cluster("dgx-h100", 16, gpus_per_node=gpn)
    G = build_fabric(FatTreeFabric(nodes_per_leaf=8, oversubscription=ratio), c)
    p = 16 * gpn
    eta_nic = c.gpu.nic_efficiency * NIC
    alternating = [n for i in range(8) for n in (i, i + 8)]
    t, lat = _ring_all_reduce(c, G, alternating)
    assert t == pytest.approx(2 * (p - 1) / p * S / (eta_nic / ratio), rel=1e-9)
    assert lat < 0.02 * t  # the stated tolerance: the closed form leaves out NCCL's per-step latency
    t_in_order, _ = _ring_all_reduce(c, G, list(range(16)))
    assert t_in_order == pytest.approx(2 * (p - 1) / p * S / eta_nic, rel=1e-9)
    # Four separate spines: ECMP hashes the flows over them, and a collision can only slow the ring.
    G4 = build_fabric(FatTreeFabric(nodes_per_leaf=8, oversubscription=ratio, n_spines=4), c)
    assert _ring_all_reduce(c, G4, alternating)[0] >= t * (1 - 1e-12)


@pytest.mark.parametrize("gpn", [1, 8])
def test_cross_site_ring_is_bounded_by_the_inter_site_link(gpn: int) -> None:
    """DP over 4 nodes, two per site, sites joined by one 100 Gbit/s link (12.5 GB/s each way). The ring
    crosses it once each way; the gpn flows crossing (one per GPU of the node at the edge, 1/gpn of its
    traffic each) share it: 2(P-1)/P x S x gpn / (eta B), slower than any NIC."""
    c = build_cluster("dgx-h100", 4, gpus_per_node=gpn)
    G = build_fabric(MultiSiteFabric(n_sites=2, link_Gbps=100, latency_ms=1), c)
    p = 4 * gpn
    t, lat = _ring_all_reduce(c, G, [0, 1, 2, 3])
    assert t == pytest.approx(2 * (p - 1) / p * S * gpn / (c.gpu.nic_efficiency * 12.5e9), rel=1e-9)
    # NCCL picks its fastest algorithm for the group: never slower than the ring.
    topo = GraphTopology(G, c)
    best = plan_collective(CollectiveKind.ALL_REDUCE, tuple(range(c.n_gpus)), S * gpn, topo, c.gpu)
    assert best.estimate_s <= t + lat


# -- config -----------------------------------------------------------------------------------------


def test_fabric_kinds_from_the_command_line() -> None:
    cfg = load_config(EXAMPLE, ["hardware.fabric.kind=fat_tree", "hardware.fabric.oversubscription=2"])
    assert cfg.hardware.fabric == FatTreeFabric(oversubscription=[2.0])
    cfg = load_config(EXAMPLE, ["hardware.fabric.kind=multi_site", "hardware.fabric.site=nvl_racks"])
    assert isinstance(cfg.hardware.fabric, MultiSiteFabric) and cfg.hardware.fabric.site == NvlRacksFabric()


@pytest.mark.parametrize(
    ("sets", "message"),
    [
        (["hardware.fabric.oversubscription=[2,1]"], "2 ratios; a 2-tier fabric has 1"),
        (
            ["hardware.fabric.oversubscription=0.5"],
            "oversubscription.0: 0.5: Input should be greater than or equal to 1",
        ),
        (["hardware.fabric.n_cores=2"], "n_cores 2 needs tiers: 3"),
        (
            ["hardware.fabric.n_spines=100000"],
            "n_spines: 100000: Input should be less than or equal to 10000",
        ),
    ],
)
def test_bad_fabric_parameters_are_named(sets: list[str], message: str) -> None:
    with pytest.raises(ConfigError, match="hardware.fabric") as err:
        load_config(EXAMPLE, ["hardware.fabric.kind=fat_tree", *sets])
    assert message in str(err.value)


# -- end to end: the engine through simtrain.simulate ------------------------------------------------

TINY = dict(name="tiny", n_layers=4, hidden=256, n_heads=4, ffn_hidden=1024, activation="gelu",
            norm="layernorm", position="rope", vocab=1024, tied_embeddings=False, linear_bias=False)


def _dp_all_reduce(hardware: dict, dp: int, mode: str) -> tuple[float, float]:
    """(seconds, bytes) of the tiny model's one gradient all-reduce over ``dp`` single-GPU nodes, not
    overlapped with backward, as the engine runs it."""
    cfg = dict(model=TINY, hardware=dict(node="dgx-h100", gpus_per_node=1, n_nodes=dp, **hardware),
               layout=dict(dp=dp, overlap_grad_reduce=False), train=dict(seq_len=512, global_batch_seqs=dp))
    res = simtrain.simulate(cfg, mode=mode, trace=True)
    (ev,) = [e for e in res.trace if e.rank == 0 and e.name == "dp.all_reduce"]
    assert res.breakdown_s["exposed_comm"]["dp"] == pytest.approx(ev.end_s - ev.start_s, rel=1e-6)
    return ev.end_s - ev.start_s, ev.op.comm_bytes


@pytest.mark.parametrize("mode", ["symmetric", "full"])
@pytest.mark.parametrize("ratio", [1.0, 2.0, 4.0])
def test_engine_all_reduce_across_an_oversubscribed_tier(ratio: float, mode: str) -> None:
    """16 nodes, one GPU and one 1 Gbit/s NIC each, every node under its own leaf at ``ratio``:1 (so every
    ring hop crosses the spine tier): the engine's all-reduce takes 2(P-1)/P x S / (eta NIC / ratio), plus
    NCCL's ring latency (under 1 % here: the stated tolerance)."""
    hw = dict(nic_Gbps=1, fabric=dict(kind="fat_tree", nodes_per_leaf=1, oversubscription=ratio))
    t, size = _dp_all_reduce(hw, 16, mode)
    eta_nic = build_cluster("dgx-h100", 1).gpu.nic_efficiency * 1e9 / 8
    assert t == pytest.approx(2 * 15 / 16 * size / (eta_nic / ratio), rel=0.01)


@pytest.mark.parametrize(
    ("dp", "mode"),
    [(2, "symmetric"), (2, "full"), (4, "symmetric"), (4, "full")],
)
def test_engine_cross_site_ring(dp: int, mode: str) -> None:
    """DP over two sites (dp / 2 nodes each) joined by one 0.1 Gbit/s link: the ring crosses it once each
    way, so the all-reduce takes 2(P-1)/P x S / (eta B), plus NCCL's ring latency (under 1 %) and the link's
    1 ms on each of the ring's 2(P-1) inter-node steps, twice with the Simple protocol (as in
    test_a_long_inter_site_link_adds_its_latency_to_every_ring_step). With 4 nodes
    rank 0's own ring flow stays inside site 0: symmetric mode must still see the link (on a general graph
    the representative carries its whole group's flows)."""
    hw = dict(fabric=dict(kind="multi_site", n_sites=2, link_Gbps=0.1, latency_ms=1))
    t, size = _dp_all_reduce(hw, dp, mode)
    eta_b = build_cluster("dgx-h100", 1).gpu.nic_efficiency * 0.1e9 / 8
    assert t == pytest.approx(2 * (dp - 1) / dp * size / eta_b + 2 * (dp - 1) * 2 * 1e-3, rel=0.01)

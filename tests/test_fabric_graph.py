"""The fabric as a graph (issue 28 part 1): GraphTopology routes over any schema graph, and on the
rail-optimised graph it is Topology (the graph's closed-form compile)."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import networkx as nx
import pytest

from simtrain import ConfigError, simulate
from simtrain.cli.main import main
from simtrain.hardware.fabric.routing import GraphTopology, ecmp_index
from simtrain.hardware.fabric.schema import checked
from simtrain.hardware.load import build_cluster
from simtrain.hardware.topology import Topology, build_graph
from simtrain.spec.load import load_config
from simtrain.studies.simulate import cluster_of

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


# -- closed forms on hand-made graphs -----------------------------------------------------------------

def _one_gpu_nodes(n: int, links: list[tuple[int, int]], link_Bps: float, link_lat_s: float) -> nx.DiGraph:
    """``n`` one-GPU nodes, each GPU behind its own NIC (PCIe 64 GB/s, latency 0); NICs joined by
    ``links`` (full duplex, ``link_Bps`` and ``link_lat_s`` each way)."""
    g = nx.DiGraph()
    for i in range(n):
        g.add_node(f"gpu{i}", kind="gpu", node=i, local=0)
        g.add_node(f"nic{i}", kind="nic", node=i, rail=0)
        for u, v in ((f"gpu{i}", f"nic{i}"), (f"nic{i}", f"gpu{i}")):
            g.add_edge(u, v, bandwidth_Bps=64e9, latency_s=0.0, link_class="pcie")
    for a, b in links:
        for u, v in ((f"nic{a}", f"nic{b}"), (f"nic{b}", f"nic{a}")):
            g.add_edge(u, v, bandwidth_Bps=link_Bps, latency_s=link_lat_s, link_class="net")
    return g


def _cluster_of_one_gpu_nodes(n: int) -> Any:
    return build_cluster("dgx-h100", n, gpus_per_node=1)


def test_send_over_one_10_GBps_link_takes_bytes_over_bandwidth_plus_latency() -> None:
    from simtrain.cost.collective_flows import BASE_LAT_US, INTER_LAT_US, US, effective_bandwidth, idle_time
    from simtrain.cost.collectives import plan_send

    c = _cluster_of_one_gpu_nodes(2)
    topo = GraphTopology(checked(_one_gpu_nodes(2, [(0, 1)], 10e9, 5e-6), c), c)
    size = 256 * 2**20
    plan = plan_send(0, 1, size, topo)
    (flow,), = plan.phases
    assert flow.path == (("gpu0", "nic0"), ("nic0", "nic1"), ("nic1", "gpu1"))
    assert plan.latency_s == pytest.approx((BASE_LAT_US["ring"]["Simple"] + INTER_LAT_US["ring"]["Simple"]) * US + 5e-6)
    wire_s = idle_time(lambda e: effective_bandwidth(topo, c.gpu, e), plan.phases)
    assert wire_s == pytest.approx(size / (10e9 * c.gpu.nic_efficiency), rel=1e-12)  # the 10 GB/s link binds


def test_ring_all_reduce_over_a_hand_built_ring_is_2_p_minus_1_over_p_s_over_b() -> None:
    """Four one-GPU nodes whose NICs form a ring: NCCL's ring puts one flow on each ring link per direction,
    2(p-1)/p x S bytes, so the all-reduce's flow time is 2(p-1)/p x S / (link x efficiency)."""
    from simtrain.cost.collective_flows import effective_bandwidth, idle_time
    from simtrain.cost.collectives import plan_collective
    from simtrain.lower.collective_kinds import CollectiveKind

    p, size, bw = 4, 64 * 2**20, 10e9
    c = _cluster_of_one_gpu_nodes(p)
    topo = GraphTopology(checked(_one_gpu_nodes(p, [(i, (i + 1) % p) for i in range(p)], bw, 1e-6), c), c)
    plan = plan_collective(CollectiveKind.ALL_REDUCE, tuple(range(p)), size, topo, c.gpu, choice=("ring", "Simple"))
    paths = {f.path for ph in plan.phases for f in ph}
    assert paths == {((f"gpu{i}", f"nic{i}"), (f"nic{i}", f"nic{(i + 1) % p}"), (f"nic{(i + 1) % p}", f"gpu{(i + 1) % p}"))
                     for i in range(p)}
    wire_s = idle_time(lambda e: effective_bandwidth(topo, c.gpu, e), plan.phases)
    assert wire_s == pytest.approx(2 * (p - 1) / p * size / (bw * c.gpu.nic_efficiency), rel=1e-12)


# -- end to end: the CLI, the Python API, both modes ---------------------------------------------------

ROOT = Path(__file__).resolve().parents[1]
EX_8B = str(ROOT / "examples" / "llama3_8b_h100_fsdp.yaml")


def _fabric_graph(config: str, overrides: list[str] | None = None) -> nx.DiGraph:
    return build_graph(cluster_of(load_config(config, overrides)))


def _step(capsys: Any, args: list[str]) -> float:
    assert main(args) == 0
    return float(json.loads(capsys.readouterr().out)["step_time_s"])


@pytest.mark.parametrize("fmt", ["graphml", "json"])
def test_cli_with_the_built_in_fabric_as_a_file_equals_the_default(tmp_path: Path, capsys: Any, fmt: str) -> None:
    graph = _fabric_graph(EX_8B)
    path = tmp_path / f"fabric.{fmt}"
    if fmt == "graphml":
        nx.write_graphml(graph, path)
    else:
        path.write_text(json.dumps(nx.node_link_data(graph, edges="edges")))
    default = _step(capsys, ["simulate", EX_8B, "--json"])
    assert _step(capsys, ["simulate", EX_8B, "--set", f"hardware.fabric={path}", "--json"]) == default


def test_python_fabric_argument_is_the_graph_simulated() -> None:
    graph = _fabric_graph(EX_8B)
    default = simulate(EX_8B).step_time_s
    assert simulate(EX_8B, fabric=graph).step_time_s == default
    slow = graph.copy()
    for _, _, d in slow.edges(data=True):
        if d["link_class"] == "nvlink":
            d["bandwidth_Bps"] /= 8  # an FSDP job on one node: its collectives ride NVLink
    result = simulate(EX_8B, fabric=slow)
    assert result.step_time_s > default
    assert any("rail-optimised" in n for n in result.notes)  # not the built-in fabric: symmetric mode says how


def _renamed(graph: nx.DiGraph) -> nx.DiGraph:
    """The same fabric with the spine renamed: no longer provably the rail-optimised one, so symmetric
    mode takes the general path (every group planned over the graph, whole routes weighted)."""
    return nx.relabel_nodes(graph, {"spine": "spine0"})


#: Example-sized cases reduced to run in seconds: (config, overrides, modes).
CASES: list[tuple[str, list[str], tuple[str, ...]]] = [
    (EX_8B, ["hardware.n_nodes=2", "layout.dp=16"], ("symmetric", "full")),
    (str(ROOT / "examples" / "mixtral_8x7b_h100.yaml"), ["train.global_batch_seqs=64"], ("symmetric", "full")),
    (str(ROOT / "examples" / "llama3_70b_h100.yaml"), ["train.global_batch_tokens=262144"], ("symmetric",)),
]


@pytest.mark.parametrize(("config", "overrides", "modes"), CASES, ids=["8b-2-nodes", "mixtral", "70b-pp"])
def test_graph_fabric_gives_the_topology_step_time_in_both_modes(config: str, overrides: list[str],
                                                                  modes: tuple[str, ...]) -> None:
    graph = _fabric_graph(config, overrides)
    for mode in modes:
        default = simulate(config, overrides, mode=mode).step_time_s
        assert simulate(config, overrides, mode=mode, fabric=graph).step_time_s == default
        assert simulate(config, overrides, mode=mode, fabric=_renamed(graph)).step_time_s == default


# -- bad graphs: exit 2 naming the file, the vertex or edge, the attribute --------------------------------

def _bad(tmp_path: Path, capsys: Any, graph_or_text: nx.DiGraph | str, suffix: str = ".graphml") -> str:
    path = tmp_path / f"bad{suffix}"
    if isinstance(graph_or_text, str):
        path.write_text(graph_or_text)
    else:
        nx.write_graphml(graph_or_text, path)
    assert main(["simulate", EX_8B, "--set", f"hardware.fabric={path}"]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and "hardware.fabric" in err and str(path) in err
    return err


def test_unreadable_and_malformed_files_exit_2_with_the_path(tmp_path: Path, capsys: Any) -> None:
    path = tmp_path / "none.graphml"
    assert main(["simulate", EX_8B, "--set", f"hardware.fabric={path}"]) == 2
    assert str(path) in capsys.readouterr().err
    assert str(tmp_path / "bad.graphml") in _bad(tmp_path, capsys, "<graphml><graph><node id='gpu0'")
    assert "well-formed node-link JSON" in _bad(tmp_path, capsys, "{\"nodes\": [", ".json")
    assert "well-formed node-link JSON" in _bad(tmp_path, capsys, "[1, 2]", ".json")
    bomb = "<?xml version='1.0'?><!DOCTYPE g [<!ENTITY a 'aaaa'>]><graphml>&a;</graphml>"
    assert "ENTITY" in _bad(tmp_path, capsys, bomb)


def test_schema_problems_name_vertex_edge_attribute_and_value(tmp_path: Path, capsys: Any) -> None:
    good = _fabric_graph(EX_8B)
    g = good.copy()
    g["gpu0"]["nvsw0"]["bandwidth_Bps"] = -1.0
    assert "edge 'gpu0' -> 'nvsw0'.bandwidth_Bps: -1.0 is not valid" in _bad(tmp_path, capsys, g)
    g = good.copy()
    g.nodes["spine"]["kind"] = "router"
    err = _bad(tmp_path, capsys, g)
    assert "vertex 'spine'.kind: 'router' is not valid" in err and "nvswitch" in err
    g = good.copy()
    g.remove_node("gpu3")
    assert "gpu3" in _bad(tmp_path, capsys, g)  # a gap in the GPU numbering
    g = good.copy()
    g.nodes["gpu5"]["local"] = 6
    assert "vertex 'gpu5'" in _bad(tmp_path, capsys, g)
    g = good.copy()
    for u, v in [("gpu7", "nvsw0"), ("gpu7", "nic0.7")]:
        g.remove_edge(u, v)
    assert "no route" in _bad(tmp_path, capsys, g)
    g = _one_gpu_nodes(8, [(i, (i + 1) % 8) for i in range(8)], 10e9, 1e-6)
    assert "GPUs per node: 1 is not valid; 8" in _bad(tmp_path, capsys, g)  # the node profile has 8 GPUs


def test_python_graph_problems_name_the_fabric_argument() -> None:
    g = _fabric_graph(EX_8B)
    g["nic0.0"]["leaf0.0"]["link_class"] = "infiniband"
    with pytest.raises(ConfigError, match=r"fabric: edge 'nic0.0' -> 'leaf0.0'.link_class: 'infiniband'"):
        simulate(EX_8B, fabric=g)


def test_search_estimator_on_the_graph_fabric_equals_the_default() -> None:
    from simtrain.hardware.fabric.wiring import fabric_of
    from simtrain.studies.estimate import Estimator

    path = str(ROOT / "examples" / "llama3_70b_h100.yaml")
    run = load_config(path)
    c = cluster_of(run)
    default = Estimator(run.model, c).estimate(run.layout, run.train).step_time_s
    on_graph = Estimator(run.model, c, fabric=fabric_of(run.hardware.fabric, c, build_graph(c)))
    assert on_graph.estimate(run.layout, run.train).step_time_s == default
    assert isinstance(on_graph.topo, GraphTopology)


def test_a_graph_file_is_read_once_per_process(tmp_path: Path) -> None:
    from simtrain.hardware.fabric import wiring
    from simtrain.spec.fabric_spec import GraphFileFabric

    c = build_cluster("dgx-h100", 1)
    path = tmp_path / "f.graphml"
    nx.write_graphml(build_graph(c), path)
    spec = GraphFileFabric(path=str(path))
    first = wiring.fabric_of(spec, c)
    assert wiring.fabric_of(spec, c) is first
    nx.write_graphml(_renamed(build_graph(c)), path)  # a changed file is read again
    again = wiring.fabric_of(spec, c)
    assert again is not first and isinstance(again, GraphTopology) and not again.rail_symmetric

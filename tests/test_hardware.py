"""Tests for simtrain.hardware.hardware: profiles, unit conversion, errors, topology and graph."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from simtrain.hardware import hardware as hw
from simtrain.hardware import load as hwl
from simtrain.hardware import topology
from simtrain.hardware.profile_paths import builtin_root, user_root
from simtrain.spec.errors import ConfigError
from simtrain.spec.units import GB, TB, TFLOPS, GiB, MiB

EXPECTED_GPUS = {"a100-40gb", "a100-80gb", "h100-sxm", "h800", "h200", "b200", "b300", "gb200", "gb300", "mi300x"}
EXPECTED_NODES = {
    "dgx-a100",
    "hgx-a100-40gb",
    "dgx-h100",
    "hgx-h100",
    "hgx-h800",
    "hgx-h200",
    "dgx-b200",
    "dgx-b300",
    "gb200-nvl72",
    "gb300-nvl72",
    "mi300x-8",
}


# -- profiles --------------------------------------------------------------------------------------


def test_profiles_present():
    assert set(hwl.list_gpus()) >= EXPECTED_GPUS
    assert set(hwl.list_nodes()) >= EXPECTED_NODES


@pytest.mark.parametrize("name", sorted(EXPECTED_GPUS))
def test_every_gpu_loads(name):
    g = hwl.load_gpu(name)
    assert g.name == name
    assert g.bf16_flops_per_s > 100 * TFLOPS
    assert g.hbm_bytes > 30 * GiB
    for eff in (g.gemm_efficiency, g.attention_fwd_efficiency, g.attention_bwd_efficiency, g.hbm_efficiency):
        assert 0 < eff <= 1
    assert g.attention_bwd_efficiency <= g.attention_fwd_efficiency
    if g.has_nvls:
        assert g.nvls_min_gpus >= 2


@pytest.mark.parametrize("name", sorted(EXPECTED_NODES))
def test_every_node_loads(name):
    n = hwl.load_node(name)
    assert n.name == name
    assert n.gpus_per_node >= 8
    assert n.nics_per_node >= 1
    if n.scaleup == "mesh":
        assert n.mesh_link_Bps > 0
    else:
        assert n.mesh_link_Bps == 0


def test_every_profile_file_cites_sources():
    root = builtin_root()
    files = [f for kind in ("gpus", "nodes") for f in (root / kind).iterdir() if f.name.endswith(".yaml")]
    assert len(files) >= len(EXPECTED_GPUS) + len(EXPECTED_NODES)
    for f in sorted(files, key=lambda f: f.name):
        for line in f.read_text(encoding="utf-8").splitlines():
            stripped = line.strip()
            if not stripped or stripped.startswith("#") or stripped.startswith("description"):
                continue
            if stripped.startswith(("gpu:", "scaleup:", "nvls_min_gpus: 0")):
                continue
            assert "#" in line, f"{f.name}: no source comment on {line!r}"


def test_datasheet_numbers():
    h100 = hwl.load_gpu("h100-sxm")
    assert h100.bf16_flops_per_s == pytest.approx(989e12)
    assert h100.fp8_flops_per_s == pytest.approx(1979e12)
    assert h100.hbm_Bps == pytest.approx(3.35e12)
    assert h100.hbm_bytes == pytest.approx(80 * 2**30)
    assert h100.nvlink_Bps == pytest.approx(450e9)
    assert h100.sm_count == 132
    assert h100.l2_bytes == pytest.approx(50 * MiB)
    assert h100.gemm_efficiency == pytest.approx(0.762)
    assert h100.nvls_algbw_Bps == pytest.approx(275e9)
    assert h100.kernel_launch_s == pytest.approx(4e-6)
    assert h100.cuda_context_bytes == pytest.approx(1.0 * GiB)

    a100 = hwl.load_gpu("a100-80gb")
    assert a100.bf16_flops_per_s == pytest.approx(312e12)
    assert a100.fp8_flops_per_s == 0.0
    assert not a100.has_fp8 and not a100.has_nvls
    assert a100.hbm_Bps == pytest.approx(2.039 * TB)
    assert hwl.load_gpu("a100-40gb").hbm_Bps == pytest.approx(1.555e12)

    mi = hwl.load_gpu("mi300x")
    assert mi.bf16_flops_per_s == pytest.approx(1307e12, rel=1e-3)
    assert mi.hbm_bytes == pytest.approx(192 * GiB)
    assert mi.hbm_Bps == pytest.approx(5.3e12)
    assert mi.nvls_algbw_Bps == 0.0

    assert hwl.load_gpu("h200").hbm_Bps == pytest.approx(4.8e12)
    assert hwl.load_gpu("h800").nvlink_Bps == pytest.approx(200 * GB)
    assert hwl.load_gpu("b200").bf16_flops_per_s == pytest.approx(2250e12)
    assert hwl.load_gpu("b200").nvls_algbw_Bps == pytest.approx(845e9 / 1.75, rel=1e-2)
    assert hwl.load_gpu("gb200").nvlink_domain == 72


def test_peak_flops_per_dtype():
    h100 = hwl.load_gpu("h100-sxm")
    assert h100.peak_flops_per_s("bf16") == h100.peak_flops_per_s("fp16") == pytest.approx(989e12)
    assert h100.peak_flops_per_s("fp8") == pytest.approx(1979e12)
    assert h100.peak_flops_per_s("tf32") == pytest.approx(495e12)
    assert h100.peak_flops_per_s("fp32") == pytest.approx(67e12)
    with pytest.raises(ConfigError):
        hwl.load_gpu("a100-80gb").peak_flops_per_s("fp8")
    with pytest.raises(ConfigError):
        h100.peak_flops_per_s("int4")


def test_unit_conversion_nic_and_latency():
    n = hwl.load_node("dgx-h100")
    assert n.nic_Bps == pytest.approx(50e9)  # 400 Gb/s
    assert hwl.load_node("dgx-a100").nic_Bps == pytest.approx(25e9)  # 200 Gb/s
    assert n.pcie_Bps == pytest.approx(63e9)
    assert n.nvlink_latency_s == pytest.approx(0.7e-6)
    assert n.net_hop_latency_s == pytest.approx(1.0e-6)
    assert hwl.load_node("mi300x-8").mesh_link_Bps == pytest.approx(64e9)
    c = hwl.build_cluster("dgx-h100", 2, nic_Gbps=800, net_hop_latency_us=2.5)
    assert c.nic_Bps == pytest.approx(100e9)
    assert c.net_hop_latency_s == pytest.approx(2.5e-6)


def test_gpu_override_and_aliases():
    n = hwl.load_node("dgx-h100", gpu="h200")
    assert n.gpu.name == "h200"
    assert hwl.load_gpu("H100").name == "h100-sxm"
    assert hwl.load_gpu("h100-sxm") is hwl.load_gpu("h100-sxm")  # cached


def test_unknown_names_raise_config_error():
    with pytest.raises(ConfigError) as ei:
        hwl.load_gpu("h900")
    p = ei.value.problems[0]
    assert p.path == "hardware.gpu"
    assert "h900" in p.message and "h100-sxm" in p.message and "mi300x" in p.message
    with pytest.raises(ConfigError) as ei:
        hwl.load_node("dgx-z100")
    p = ei.value.problems[0]
    assert p.path == "hardware.node" and "dgx-h100" in p.message
    with pytest.raises(ConfigError) as ei:
        hwl.build_cluster("dgx-h100", 4, gpu="nope")
    assert ei.value.problems[0].path == "hardware.gpu"


def test_build_cluster_collects_problems():
    with pytest.raises(ConfigError) as ei:
        hwl.build_cluster("dgx-h100", 0, oversubscription=0.5, nodes_per_leaf=0)
    paths = {p.path for p in ei.value.problems}
    assert {"hardware.n_nodes", "hardware.oversubscription", "hardware.nodes_per_leaf"} <= paths


def test_part_of_each_node_keeps_one_nic_per_used_gpu():
    # 64 of a GB200 NVL72 rack's 72 GPUs (16 of 18 trays), two racks: GPU 64 is the second rack's first
    c = hwl.build_cluster("gb200-nvl72", 2, gpus_per_node=64)
    assert (c.n_gpus, c.gpus_per_node, c.nics_per_node) == (128, 64, 64)
    t = topology.Topology(c)
    assert t.link_class_of(t.route(0, 63)) == "nvlink" and t.link_class_of(t.route(0, 64)) == "net"
    half = hwl.build_cluster("dgx-h100", 1, gpus_per_node=4)
    assert (half.n_gpus, half.nics_per_node) == (4, 4)
    with pytest.raises(ConfigError, match=r"hardware.gpus_per_node: 9 .*from 1 to 8"):
        hwl.build_cluster("dgx-h100", 1, gpus_per_node=9)


def _write(root: Path, kind: str, name: str, text: str) -> None:
    (root / kind).mkdir(parents=True, exist_ok=True)
    (root / kind / f"{name}.yaml").write_text(text)


def test_bad_files_name_file_and_key(tmp_path, monkeypatch):
    src = builtin_root() / "gpus" / "h100-sxm.yaml"
    _write(tmp_path, "gpus", "good", src.read_text())
    _write(tmp_path, "gpus", "typo", src.read_text() + "bf16_tflopz: 3\n")
    _write(tmp_path, "gpus", "broken", "bf16_tflops: [1, 2\n")
    _write(tmp_path, "gpus", "neg", src.read_text().replace("gemm_efficiency: 0.762", "gemm_efficiency: 1.5"))
    monkeypatch.setenv("SIMTRAIN_PROFILES_DIR", str(tmp_path))
    assert user_root() == tmp_path
    assert set(hwl.list_gpus()) == {"good", "typo", "broken", "neg"} | EXPECTED_GPUS | {"h100-sxm-96gb-500w"}
    assert hwl.load_gpu("good").bf16_flops_per_s == pytest.approx(989e12)
    with pytest.raises(ConfigError) as ei:
        hwl.load_gpu("typo")
    assert any("typo.yaml" in p.path and "bf16_tflopz" in p.path for p in ei.value.problems)
    with pytest.raises(ConfigError) as ei:
        hwl.load_gpu("broken")
    assert "broken.yaml" in ei.value.problems[0].path
    with pytest.raises(ConfigError) as ei:
        hwl.load_gpu("neg")
    assert any("gemm_efficiency" in p.path for p in ei.value.problems)


def test_tables():
    g = {r["name"]: r for r in hwl.gpu_table()}
    assert g["h100-sxm"]["bf16_tflops"] == pytest.approx(989)
    assert g["a100-80gb"]["fp8_tflops"] is None
    n = {r["name"]: r for r in hwl.node_table()}
    assert n["dgx-h100"]["gpus_per_node"] == 8 and n["dgx-h100"]["nic_Gbps"] == pytest.approx(400)
    assert n["gb200-nvl72"]["gpus_per_node"] == 72


# -- topology --------------------------------------------------------------------------------------


def small_cluster(oversubscription: float = 1.0) -> hw.ClusterSpec:
    return hwl.build_cluster(
        "dgx-h100", 4, nics_per_node=4, nodes_per_leaf=2, oversubscription=oversubscription
    )


def test_cluster_properties():
    c = small_cluster()
    assert c.n_gpus == 32 and c.gpus_per_node == 8 and c.n_leaf_groups == 2
    assert hwl.build_cluster("dgx-h100", 2).nodes_per_leaf == 32


def test_routes():
    t = topology.Topology(small_cluster())
    assert t.route(3, 3) == ()
    same_node = t.route(0, 5)
    assert same_node == (("gpu0", "nvsw0"), ("nvsw0", "gpu5"))
    assert t.link_class_of(same_node) == "nvlink"
    # gpu 0 (node 0, local 0) and gpu 8 (node 1, local 0): rail 0, leaf group 0
    same_leaf = t.route(0, 8)
    assert len(same_leaf) == 4
    assert same_leaf == (("gpu0", "nic0.0"), ("nic0.0", "leaf0.0"), ("leaf0.0", "nic1.0"), ("nic1.0", "gpu8"))
    assert t.link_class_of(same_leaf) == "net"
    assert t.path_latency_s(same_leaf) == pytest.approx(2e-6)
    # NIC j serves local GPUs with local*4//8 == j: locals 0,1 -> nic 0; 6,7 -> nic 3
    assert t.nic_of(1) == "nic0.0" and t.nic_of(7) == "nic0.3" and t.nic_of(15) == "nic1.3"
    # different leaf group (node 2)
    cross_leaf = t.route(0, 16)
    assert len(cross_leaf) == 6
    assert ("leaf0.0", "spine") in cross_leaf and ("spine", "leaf0.1") in cross_leaf
    # different rail, same leaf group also goes through the spine
    assert len(t.route(0, 8 + 7)) == 6
    assert t.path_latency_s(cross_leaf) == pytest.approx(4e-6)
    assert t.path_bandwidth_Bps(cross_leaf) == pytest.approx(50e9)
    with pytest.raises(IndexError):
        t.route(0, 32)
    with pytest.raises(KeyError):
        t.edge("gpu0", "nvsw1")
    with pytest.raises(KeyError):
        t.edge("gpu0", "nic0.1")


def test_mesh_routes():
    c = hwl.build_cluster("mi300x-8", 2)
    t = topology.Topology(c)
    r = t.route(0, 3)
    assert r == (("gpu0", "gpu3"),)
    assert t.edge("gpu0", "gpu3").bandwidth_Bps == pytest.approx(64e9)
    assert len(t.route(0, 8)) == 4
    with pytest.raises(KeyError):
        t.edge("gpu0", "nvsw0")


def _check_graph_agrees(c: hw.ClusterSpec) -> None:
    t = topology.Topology(c)
    G = topology.build_graph(c)
    for src in range(c.n_gpus):
        for dst in range(c.n_gpus):
            for u, v in t.route(src, dst):
                assert G.has_edge(u, v), (u, v)
                d = G.edges[u, v]
                e = t.edge(u, v)
                assert d["bandwidth_Bps"] == e.bandwidth_Bps
                assert d["latency_s"] == e.latency_s
                assert d["link_class"] == e.link_class
    # and every graph edge is known to Topology with the same attributes
    for u, v, d in G.edges(data=True):
        e = t.edge(u, v)
        assert (d["bandwidth_Bps"], d["latency_s"], d["link_class"]) == (
            e.bandwidth_Bps,
            e.latency_s,
            e.link_class,
        )
    kinds = {d["kind"] for _, d in G.nodes(data=True)}
    assert kinds <= {"gpu", "nvswitch", "nic", "leaf", "spine"}


def test_graph_route_agreement():
    _check_graph_agrees(small_cluster(oversubscription=2.0))
    _check_graph_agrees(hwl.build_cluster("mi300x-8", 3, nodes_per_leaf=2))
    _check_graph_agrees(hwl.build_cluster("dgx-a100", 5, nodes_per_leaf=2, nics_per_node=2))


def test_graph_shape():
    G = topology.build_graph(small_cluster())
    assert sum(1 for _, d in G.nodes(data=True) if d["kind"] == "gpu") == 32
    assert sum(1 for _, d in G.nodes(data=True) if d["kind"] == "nvswitch") == 4
    assert sum(1 for _, d in G.nodes(data=True) if d["kind"] == "nic") == 16
    assert sum(1 for _, d in G.nodes(data=True) if d["kind"] == "leaf") == 8


def test_oversubscription_halves_uplinks():
    t1 = topology.Topology(small_cluster(1.0))
    t2 = topology.Topology(small_cluster(2.0))
    up1 = t1.edge("leaf0.0", "spine").bandwidth_Bps
    up2 = t2.edge("leaf0.0", "spine").bandwidth_Bps
    assert up1 == pytest.approx(2 * 50e9)  # 2 nodes under the leaf x 400 Gb/s
    assert up2 == pytest.approx(up1 / 2)
    assert t2.edge("spine", "leaf1.0").bandwidth_Bps == pytest.approx(up1 / 2)
    # NIC links unchanged
    assert t2.edge("nic0.0", "leaf0.0").bandwidth_Bps == pytest.approx(50e9)


def test_partial_last_leaf_group():
    t = topology.Topology(hwl.build_cluster("dgx-h100", 5, nodes_per_leaf=2))
    assert t.n_leaf_groups == 3
    assert t.edge("leaf0.2", "spine").bandwidth_Bps == pytest.approx(50e9)


def test_large_cluster_routes_fast():
    c = hwl.build_cluster("dgx-h100", 2048)
    assert c.n_gpus == 16384
    t0 = time.perf_counter()
    t = topology.Topology(c)
    for src in range(0, c.n_gpus, 7):
        path = t.route(src, (src * 7919 + 13) % c.n_gpus)
        t.path_latency_s(path)
    assert time.perf_counter() - t0 < 2.0
    assert len(t.route(0, c.n_gpus - 1)) == 6


def test_large_graph_builds():
    c = hwl.build_cluster("dgx-h100", 2048)
    t0 = time.perf_counter()
    G = topology.build_graph(c)
    assert time.perf_counter() - t0 < 15.0
    assert G.number_of_nodes() == 16384 + 2048 + 16384 + 8 * 64 + 1

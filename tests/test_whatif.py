"""What-ifs (``whatif``, issue 28 part 3) against closed forms: a slow GPU in data and pipeline
parallelism, a slow node, background traffic on the network, a failed leaf uplink, bad names."""

from __future__ import annotations

import json
import subprocess
import sys

import networkx as nx
import pytest

from simtrain.cost.collectives import plan_send
from simtrain.engine.engine import Engine
from simtrain.hardware.fabric.perturb import PerturbedFabric, cut_off_gpus, gpu_speeds
from simtrain.hardware.fabric.routing import GraphTopology
from simtrain.hardware.load import build_cluster
from simtrain.hardware.topology import Topology, build_graph
from simtrain.lower.ops import OpKind, Program, Stream
from simtrain.plan.layout import RankGrid
from simtrain.plan.schedules import Action, build_schedule
from simtrain.spec.collective_kinds import ALL_REDUCE, SEND
from simtrain.spec.config import LayoutConfig
from simtrain.spec.errors import ConfigError
from simtrain.spec.whatif_spec import WhatIfSpec
from simtrain.studies.simulate import simulate

HOP_SLACK = 1e-3  # s: pipeline-send latencies (~13 us a hop, a few dozen hops) on steps of > 10 s


def _quiet_gpu(cluster):  # type: ignore[no-untyped-def]
    """The cluster's GPU with no compute slowdown while communication is in flight (exact compute times)."""
    return cluster.gpu.model_copy(update={"comm_interference_nvlink": 0.0, "comm_interference_net": 0.0,
                                          "comm_interference_p2p": 0.0})


# -- a slow GPU in data parallelism --------------------------------------------------------------


def _dp_program(tf: float, tb: float, opt: float, nbytes: float) -> list[Program]:
    """Forward, backward, the gradient all-reduce (after the backward), the optimizer (after it)."""
    p = Program(0)
    p.add(OpKind.COMPUTE, Stream.COMPUTE, "F", category="fwd", duration_s=tf)
    b = p.add(OpKind.COMPUTE, Stream.COMPUTE, "B", category="bwd", duration_s=tb)
    ar = p.add(OpKind.COLLECTIVE, Stream.DP, "ar", category="comm", deps=(b.idx,), coll=ALL_REDUCE, axis="dp",
               comm_bytes=nbytes)
    p.add(OpKind.COMPUTE, Stream.COMPUTE, "opt", category="optimizer", duration_s=opt, deps=(ar.idx,))
    return [p]


@pytest.mark.parametrize("slow_rank", [0, 5])
def test_slow_gpu_in_data_parallelism_closed_form(slow_rank: int) -> None:
    """dp=8 on one node, one GPU at 0.9x: its compute takes exactly 1/0.9 as long; the others wait for it
    at the all-reduce, so the step is its compute / 0.9 plus the all-reduce (exposed: it starts after the
    backward) plus its optimizer / 0.9."""
    tf, tb, opt, nbytes = 1.0, 2.0, 0.25, 4e9
    cl = build_cluster("dgx-h100", 1)
    gpu, grid, topo = _quiet_gpu(cl), RankGrid(LayoutConfig(dp=8)), Topology(cl)
    base = Engine(_dp_program(tf, tb, opt, nbytes), grid, topo, gpu, symmetric=False).run()
    allreduce = base.step_time_s - (tf + tb + opt)
    assert allreduce > 0.01  # 4 GB over NVLink: a visible term
    res = Engine(_dp_program(tf, tb, opt, nbytes), grid, topo, gpu, symmetric=False, speed={slow_rank: 0.9}).run()
    slow = res.stats[slow_rank].busy
    assert slow["fwd"] == pytest.approx(tf / 0.9, rel=1e-12)
    assert slow["bwd"] == pytest.approx(tb / 0.9, rel=1e-12)
    assert slow["optimizer"] == pytest.approx(opt / 0.9, rel=1e-12)
    for r in res.ranks:
        if r != slow_rank:
            assert res.stats[r].busy["bwd"] == pytest.approx(tb, rel=1e-12)  # the others keep their speed ...
            assert res.stats[r].exposed["dp"] == pytest.approx(allreduce + (tf + tb) * (1 / 0.9 - 1), rel=1e-9)
    assert res.step_time_s == pytest.approx((tf + tb + opt) / 0.9 + allreduce, rel=1e-12)  # ... and wait
    assert res.critical_rank() == slow_rank


# -- a slow GPU in one pipeline stage -------------------------------------------------------------


def _pipeline(kind: str, p: int, m: int, tf: float, tb: float) -> list[Program]:
    """One compute op per schedule action (F: tf, B: tb) and a 1-byte send to the next stage."""
    sched = build_schedule(kind, p, m, 1)
    progs = [Program(s) for s in range(p)]
    sends: dict[tuple[int, Action], int] = {}
    computes: dict[tuple[int, Action], int] = {}
    for s in range(p):
        for a in sched[s]:
            op = progs[s].add(OpKind.COMPUTE, Stream.COMPUTE, f"{a.kind}{a.microbatch}",
                              category="fwd" if a.kind == "F" else "bwd", duration_s=tf if a.kind == "F" else tb,
                              microbatch=a.microbatch, chunk=0)
            computes[(s, a)] = op.idx
            dst = s + 1 if a.kind == "F" else s - 1
            if 0 <= dst < p:
                send = progs[s].add(OpKind.SEND, Stream.PP, f"send.{a.kind}", category="comm", deps=(op.idx,),
                                    coll=SEND, axis="pp", comm_bytes=1.0, peer_stage=dst, microbatch=a.microbatch,
                                    chunk=0)
                sends[(s, a)] = send.idx
    for s in range(p):
        for a in sched[s]:
            src = s - 1 if a.kind == "F" else s + 1
            if 0 <= src < p:
                progs[s].ops[computes[(s, a)]].remote = (src, sends[(src, Action(a.kind, a.microbatch, 0))])
    return progs


@pytest.mark.parametrize("kind", ["gpipe", "1f1b"])
@pytest.mark.parametrize("slow_stage", [0, 1, 2, 3])
def test_slow_gpu_in_one_pipeline_stage_closed_form(kind: str, slow_stage: int) -> None:
    """pp=4, dp=2, m=8: one GPU of stage k at speed f makes its stage the bottleneck (F' = F/f, B' = B/f).

    GPipe: with stage times F_s + B_s the makespan is sum_s (F_s + B_s) + (m - 1)(max F + max B)
    = (p - 1)(F + B) + m (F + B) / f, wherever the slow stage is.
    1F1B: stage k keeps p - k micro-batches in flight; its first backward returns F' + R after its first
    forward, R = (p - 1 - k)(F + B) the stages after it, while it ran p - k forwards: it idles
    R - (p - k - 1) F'; after its last forward it idles R - (p - k - 1) B' (the cool-down backwards);
    with k (F + B) of fill and drain before and after it: k (F + B) + m (F + B) / f
    + (p - 1 - k)(F + B)(2 - 1/f) (both idles positive: F + B >= B / f). The other data-parallel
    replica's pipeline runs at full speed: (p - 1 + m)(F + B)."""
    p, m, tf, tb, f = 4, 8, 1.0, 2.0, 0.8
    cl = build_cluster("dgx-h100", 1)
    grid = RankGrid(LayoutConfig(pp=p, dp=8 // p))
    slow = next(r for r in range(grid.world_size) if grid.stage_of(r) == slow_stage)
    res = Engine(_pipeline(kind, p, m, tf, tb), grid, Topology(cl), _quiet_gpu(cl), symmetric=False,
                 speed={slow: f}).run()
    k, fb = slow_stage, tf + tb
    if kind == "gpipe":
        expected = (p - 1) * fb + m * fb / f
    else:
        assert fb >= tb / f
        expected = k * fb + m * fb / f + (p - 1 - k) * fb * (2 - 1 / f)
    assert res.step_time_s == pytest.approx(expected, abs=HOP_SLACK)
    assert res.step_time_s >= expected
    assert res.stats[slow].busy["fwd"] == pytest.approx(m * tf / f, rel=1e-12)
    replica = [r for r in res.ranks if r not in grid.group("pp", slow)]  # the other pipeline
    assert len(replica) == p
    assert max(res.stats[r].end_s for r in replica) == pytest.approx((p - 1 + m) * (tf + tb), abs=HOP_SLACK)


# -- through simulate: slow node, critical rank, the summary, fallback, refusal -------------------

_SMALL = {
    "name": "whatif-small",
    "model": {"preset": "llama3-8b", "n_layers": 4},
    "hardware": {"node": "dgx-h100", "n_nodes": 1},
    "layout": {"dp": 8},
    "train": {"seq_len": 2048, "micro_batch_size": 1, "global_batch_seqs": 16},
}


def test_slow_node_is_all_its_gpus_slow_and_the_summary() -> None:
    node = simulate(_SMALL, ["whatif.slow_nodes={node0: 0.9}"])
    each = simulate(_SMALL, ["whatif.slow_gpus={" + ", ".join(f"node0/gpu{i}: 0.9" for i in range(8)) + "}"])
    assert node.step_time_s == each.step_time_s
    assert node.breakdown_s == each.breakdown_s
    one = simulate(_SMALL, ["whatif.slow_gpus={gpu5: 0.9}"])
    w = one.whatif
    assert w is not None and one.mode == "full"
    assert w["critical_rank"] == 5 and w["critical_gpu"] == "node0/gpu5 (gpu5)" and w["critical_speed"] == 0.9
    assert w["bottleneck_rank"] == 5 and w["bottleneck_gpu"] == "node0/gpu5 (gpu5)"  # ends last, computes longest
    assert w["baseline_step_time_s"] == simulate(_SMALL, mode="full").step_time_s
    assert w["step_time_s"] == one.step_time_s
    assert w["cost_s"] == pytest.approx(one.step_time_s - w["baseline_step_time_s"], rel=1e-12) and w["cost_s"] > 0
    # the slow rank's compute: every compute op 1/0.9 as long, up to the slowdown while the overlapped
    # gradient all-reduce runs (it overlaps a different share of the stretched backward; exact above)
    base_compute = simulate(_SMALL, mode="full").breakdown_s["compute"]
    assert one.breakdown_s["compute"] == pytest.approx(base_compute / 0.9, rel=1e-2)
    assert node.step_time_s >= one.step_time_s
    assert any("full mode" in n and "gpu5" in n for n in one.notes)  # symmetric asked: fell back, said so
    assert "whatif" in one.to_dict() and "whatif" not in simulate(_SMALL).to_dict()


def test_symmetric_mode_refused_for_a_large_world() -> None:
    big = {**_SMALL, "hardware": {"node": "dgx-h100", "n_nodes": 128}, "layout": {"dp": 1024},
           "train": {"seq_len": 2048, "micro_batch_size": 1, "global_batch_seqs": 1024}}
    with pytest.raises(ConfigError) as exc:
        simulate(big, ["whatif.slow_gpus={gpu5: 0.9}"])
    assert exc.value.problems[0].path == "sim.mode" and "1024" in str(exc.value)


def test_determinism() -> None:
    over = ["whatif.slow_gpus={node0/gpu3: 0.85}", "whatif.background={net: 0.2}"]
    a, b = simulate(_SMALL, over), simulate(_SMALL, over)
    assert json.dumps(a.to_dict(), sort_keys=True) == json.dumps(b.to_dict(), sort_keys=True)


# -- background traffic on the network -----------------------------------------------------------


def _net_allreduce(fabric, cl):  # type: ignore[no-untyped-def]
    """A 1 GB all-reduce between GPU 0 and GPU 8 (dp=2 across two nodes, tp=8 inside): NIC-bound."""
    p = Program(0)
    p.add(OpKind.COLLECTIVE, Stream.DP, "ar", category="comm", coll=ALL_REDUCE, axis="dp", comm_bytes=1e9)
    return Engine([p], RankGrid(LayoutConfig(tp=8, dp=2)), fabric, _quiet_gpu(cl), symmetric=False).run()


@pytest.mark.parametrize("share", [0.25, 0.5])
def test_background_on_net_stretches_a_net_bound_allreduce(share: float) -> None:
    """Other traffic taking share s of every network link leaves 1 - s: the bandwidth part of a NIC-bound
    all-reduce takes 1/(1 - s) as long, its latency stays."""
    cl = build_cluster("dgx-h100", 2)
    base = _net_allreduce(Topology(cl), cl)
    (plan,) = [p for k, p in base.plans.items() if k[1] == (0, 8)]
    res = _net_allreduce(PerturbedFabric(Topology(cl), cl, WhatIfSpec(background={"net": share})), cl)
    (plan2,) = [p for k, p in res.plans.items() if k[1] == (0, 8)]
    assert (plan2.algorithm, plan2.protocol, plan2.latency_s) == (plan.algorithm, plan.protocol, plan.latency_s)
    wire = base.step_time_s - plan.latency_s
    assert res.step_time_s - plan.latency_s == pytest.approx(wire / (1 - share), rel=1e-9)
    tier = _net_allreduce(PerturbedFabric(Topology(cl), cl, WhatIfSpec(background={"nic_leaf": share})), cl)
    assert tier.step_time_s == pytest.approx(res.step_time_s, rel=1e-12)  # the only net tier it crosses


# -- a failed leaf uplink ------------------------------------------------------------------------


def _two_spines(cl, second_Bps: float) -> nx.DiGraph:  # type: ignore[no-untyped-def]
    """Today's fabric with a second spine ``spine2`` joined to every leaf by ``second_Bps`` links."""
    g = build_graph(cl)
    g.add_node("spine2", kind="spine")
    for leaf in [v for v, k in g.nodes(data="kind") if k == "leaf"]:
        for e in ((leaf, "spine2"), ("spine2", leaf)):
            g.add_edge(*e, bandwidth_Bps=second_Bps, latency_s=cl.net_hop_latency_s, link_class="net")
    return g


def _cross_leaf_sends(fabric, cl, nbytes: float):  # type: ignore[no-untyped-def]
    """pp=2 over 4 nodes in two leaf groups: each stage-0 rank sends ``nbytes`` to its stage-1 peer (two
    nodes' rail-j GPUs to the other leaf group: two flows on each leaf uplink)."""
    p0, p1 = Program(0), Program(1)
    send = p0.add(OpKind.SEND, Stream.PP, "send", category="comm", coll=SEND, axis="pp", comm_bytes=nbytes,
                  peer_stage=1)
    p1.add(OpKind.COMPUTE, Stream.COMPUTE, "C", duration_s=1e-6, remote=(0, send.idx))
    return Engine([p0, p1], RankGrid(LayoutConfig(tp=8, dp=2, pp=2)), fabric, _quiet_gpu(cl), symmetric=False).run()


@pytest.mark.parametrize("fabric", ["topology", "graph"])
def test_failed_leaf_uplink_moves_the_traffic_to_the_other_spine(fabric: str) -> None:
    """Leaf uplinks of 25 GB/s to ``spine`` (2 nodes x 50 GB/s / 4) and 10 GB/s to ``spine2``. Two flows
    per leaf cross to the other leaf group, over ``spine`` (the route: the widest) at 12.5 GB/s each. With
    the ``leaf0.0 -> spine`` link down, rail 0's two flows take ``spine2``: 5 GB/s each, the time
    latency + B / (5 GB/s x NIC efficiency); the other rails keep their route. The wrapped fabric is
    today's closed-form Topology (the graph adds the second spine) or the graph's own GraphTopology."""
    cl = build_cluster("dgx-h100", 4, oversubscription=4.0, nodes_per_leaf=2)
    nbytes, second = 1e9, 10e9
    graph = _two_spines(cl, second)
    eff = cl.gpu.nic_efficiency
    base = Topology(cl) if fabric == "topology" else GraphTopology(graph, cl)
    intact = PerturbedFabric(base, cl, WhatIfSpec(), graph=graph)
    down = PerturbedFabric(base, cl, WhatIfSpec(failed_links=["leaf0.0->spine"]), graph=graph)
    assert intact.route(0, 16) == Topology(cl).route(0, 16)
    detour = down.route(0, 16)
    assert ("leaf0.0", "spine2") in detour and ("leaf0.0", "spine") not in detour and len(detour) == 6
    assert down.route(1, 17) == Topology(cl).route(1, 17)  # rail 1 is untouched
    assert ("spine", "leaf0.0") not in down.route(16, 0)  # both directions are down
    lat = plan_send(0, 16, nbytes, down).latency_s
    assert lat == plan_send(0, 16, nbytes, intact).latency_s  # same hop count
    before = _cross_leaf_sends(intact, cl, nbytes)
    uplink = 2 * cl.nic_Bps / 4
    assert before.step_time_s == pytest.approx(lat + nbytes / (uplink / 2 * eff) + 1e-6, rel=1e-9)
    after = _cross_leaf_sends(down, cl, nbytes)
    assert after.step_time_s == pytest.approx(lat + nbytes / (second / 2 * eff) + 1e-6, rel=1e-9)


def test_a_failure_with_no_detour_names_the_gpus_it_cuts_off() -> None:
    cl = build_cluster("dgx-h100", 4, nodes_per_leaf=2)
    fabric = PerturbedFabric(Topology(cl), cl, WhatIfSpec(failed_links=["leaf3.0->spine"]))
    assert cut_off_gpus(fabric.graph, fabric._down) == [3, 11]  # rail 3 of nodes 0 and 1
    with pytest.raises(ConfigError) as exc:
        fabric.route(3, 19)
    msg = str(exc.value)
    assert exc.value.problems[0].path == "whatif.failed_links"
    assert "leaf3.0->spine" in msg and "node0/gpu3 (gpu3)" in msg and "node1/gpu3 (gpu11)" in msg
    assert fabric.route(3, 11) == Topology(cl).route(3, 11)  # inside the leaf group: unaffected
    nic = PerturbedFabric(Topology(cl), cl, WhatIfSpec(failed_links=["nic2.5"]))
    assert cut_off_gpus(nic.graph, nic._down) == [21]


# -- names -----------------------------------------------------------------------------------------


def test_gpu_speeds_by_name() -> None:
    cl = build_cluster("dgx-h100", 4)
    spec = WhatIfSpec(slow_gpus={"node3/gpu5": 0.85, "gpu1": 0.5}, slow_nodes={"node0": 0.8})
    speeds = gpu_speeds(spec, cl)
    assert speeds[29] == 0.85 and speeds[1] == pytest.approx(0.4) and speeds[0] == 0.8 and len(speeds) == 9


@pytest.mark.parametrize("setting,path,words", [
    ('whatif.slow_gpus={"node3/gpu5": 0.85}', "whatif.slow_gpus.node3/gpu5", "n in 0..0"),
    ('whatif.slow_gpus={"gpu8": 0.85}', "whatif.slow_gpus.gpu8", "gpu0..gpu7"),
    ('whatif.slow_gpus={"node0/gpu9": 0.85}', "whatif.slow_gpus.node0/gpu9", "0..7"),
    ('whatif.slow_gpus={"gpu1": 0.85, "node0/gpu1": 0.9}', "whatif.slow_gpus.node0/gpu1", "named once"),
    ('whatif.slow_gpus={"rank3": 0.85}', "whatif.slow_gpus", "node{n}/gpu{l}"),
    ('whatif.slow_gpus={"gpu3": 1.5}', "whatif.slow_gpus.gpu3", "less than or equal to 1"),
    ('whatif.slow_gpus={"gpu3": 0}', "whatif.slow_gpus.gpu3", "greater than 0"),
    ("whatif.slow_nodes={node2: 0.5}", "whatif.slow_nodes.node2", "node0..node0"),
    ('whatif.slow_links={"nic0.0->leaf1.0": 0.5}', "whatif.slow_links.nic0.0->leaf1.0", "nic0.0->leaf0.0"),
    ('whatif.slow_links={"nic9.0": 0.5}', "whatif.slow_links.nic9.0", "nic0.0 .. nic0.7"),
    ('whatif.failed_links=["gpu0->nvsw0"]', "whatif.failed_links", "NVLink"),
    ("whatif.background={spine_core: 0.3}", "whatif.background.spine_core", "leaf_spine"),
    ("whatif.background={wan: 0.3}", "whatif.background", "nic_leaf"),
    ("whatif.background={net: 1.0}", "whatif.background.net", "less than 1"),
])
def test_bad_names_exit_2_with_the_path_and_what_is_valid(setting: str, path: str, words: str) -> None:
    with pytest.raises(ConfigError) as exc:
        simulate(_SMALL, [setting])
    assert any(p.path == path and words in p.message for p in exc.value.problems), str(exc.value)


def test_every_bad_name_at_once() -> None:
    with pytest.raises(ConfigError) as exc:
        simulate(_SMALL, ['whatif={slow_gpus: {gpu9: 0.9}, slow_links: {nic0.9: 0.5}, background: {spine_core: 0.1}}'])
    assert {p.path for p in exc.value.problems} == {"whatif.slow_gpus.gpu9", "whatif.slow_links.nic0.9",
                                                    "whatif.background.spine_core"}


def test_cli_whatif(tmp_path) -> None:  # type: ignore[no-untyped-def]
    cfg = tmp_path / "small.json"
    cfg.write_text(json.dumps(_SMALL))
    run = [sys.executable, "-m", "simtrain.cli", "simulate", str(cfg), "--set", 'whatif.slow_gpus={"node0/gpu5": 0.85}']
    out = subprocess.run([*run, "--json"], capture_output=True, text=True, check=True)
    w = json.loads(out.stdout)["whatif"]
    assert w["critical_gpu"] == "node0/gpu5 (gpu5)" and w["cost_s"] > 0
    table = subprocess.run(run, capture_output=True, text=True, check=True).stdout
    assert "critical rank 5 on node0/gpu5 (gpu5)" in table and "bottleneck    rank 5 on node0/gpu5" in table
    bad = subprocess.run([*run[:-1], 'whatif.slow_gpus={"node3/gpu5": 0.85}'], capture_output=True, text=True)
    assert bad.returncode == 2 and "whatif.slow_gpus.node3/gpu5" in bad.stderr and "Traceback" not in bad.stderr


# -- end to end on a fabric graph ------------------------------------------------------------------

_FOUR_NODES = {
    "name": "whatif-graph",
    "model": {"preset": "llama3-8b", "n_layers": 4},
    "hardware": {"node": "dgx-h100", "n_nodes": 4, "nodes_per_leaf": 2, "oversubscription": 4},
    "layout": {"tp": 8, "pp": 2, "dp": 2},
    "train": {"seq_len": 2048, "micro_batch_size": 1, "global_batch_seqs": 8},
    "sim": {"mode": "full"},
}


def test_failed_uplink_on_a_graph_fabric_end_to_end(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """simulate(cfg, fabric=G) on today's fabric plus a second, slower spine: with leaf0.0's uplink to the
    first spine down, the pipeline sends of rail 0 between the leaf groups take the second spine and the
    step slows; on today's fabric (one spine) the same failure has no detour and exits 2 through the CLI,
    naming the GPUs cut off (rail 0 of nodes 0 and 1)."""
    from simtrain.plan.load import load_config
    from simtrain.studies.simulate import cluster_of

    cl = cluster_of(load_config(_FOUR_NODES))
    graph = _two_spines(cl, 1e9)
    failed = ['whatif.failed_links=["leaf0.0->spine"]']
    r = simulate(_FOUR_NODES, failed, fabric=graph)
    w = r.whatif
    assert w is not None and w["baseline_step_time_s"] == simulate(_FOUR_NODES, fabric=graph).step_time_s
    assert w["cost_s"] > 0
    assert simulate(_FOUR_NODES, failed, fabric=graph).to_dict() == r.to_dict()  # deterministic
    path = tmp_path / "today.graphml"
    nx.write_graphml(build_graph(cl), path)
    cfg = tmp_path / "four.json"
    cfg.write_text(json.dumps(_FOUR_NODES))
    bad = subprocess.run([sys.executable, "-m", "simtrain.cli", "simulate", str(cfg), "--set",
                          f"hardware.fabric={path}", "--set", failed[0]], capture_output=True, text=True)
    assert bad.returncode == 2 and "Traceback" not in bad.stderr, bad.stderr
    assert "whatif.failed_links" in bad.stderr and "node0/gpu0 (gpu0)" in bad.stderr and "node1/gpu0 (gpu8)" in bad.stderr

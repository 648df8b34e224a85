"""Collective kinds as an enum with typed options, and the registry of collective algorithms."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import pytest

from simtrain.cli.main import main
from simtrain.cost.collective_algorithms import (
    ALGORITHMS,
    AlgorithmRegistry,
    FlowAlgorithm,
    Group,
    node_hit_probability,
)
from simtrain.cost.collective_flows import Phases, route_flow
from simtrain.cost.collectives import (
    choose_plan,
    collective_candidates,
    effective_bandwidth,
    plan_collective,
    unit_idle_times,
)
from simtrain.cost.cost_pass import lower
from simtrain.cost.costs import ComputeCostModel
from simtrain.engine.trace import to_chrome_trace
from simtrain.hardware.calibrated import busbw_factor
from simtrain.hardware.hardware import GpuSpec
from simtrain.hardware.load import build_cluster, load_gpu
from simtrain.hardware.profile import load_profile
from simtrain.hardware.topology import Topology
from simtrain.lower.ops import CommOp
from simtrain.plan.load import load_config
from simtrain.spec.collective_kinds import (
    ALL_GATHER,
    ALL_REDUCE,
    ALL_TO_ALL,
    Collective,
    CollectiveKind,
    NodeLimited,
)
from simtrain.spec.errors import ConfigError
from simtrain.studies.simulate import simulate

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE_PROFILE = ROOT / "simtrain" / "data" / "hardware_profiles" / "calibrated" / "example-cpu" / "profile.yaml"
CPU_CONFIG = ROOT / "tests" / "calibration" / "data" / "cpu_llama.yaml"

# a shrunk MoE: 16 experts top-2 over EP16 on two 8-GPU nodes, DeepEP dispatch (deduplicated all-to-all)
MOE = dict(name="moe-small", n_layers=2, hidden=1024, n_heads=8, n_kv_heads=4, ffn_hidden=2048,
           activation="swiglu", norm="rmsnorm", position="rope", vocab=4096, tied_embeddings=False,
           linear_bias=False, moe=dict(n_experts=16, top_k=2, ffn_hidden=2048))
DEEPEP = dict(model=MOE, hardware=dict(n_nodes=2), layout=dict(dp=16, ep=16, ep_dispatcher="deepep"),
              train=dict(seq_len=1024, global_batch_seqs=16))
COST = ComputeCostModel(load_gpu("h100-sxm"), "bf16")


@pytest.mark.parametrize("kind", list(CollectiveKind))
def test_every_kind_round_trips_through_its_string(kind: CollectiveKind) -> None:
    assert CollectiveKind(kind.value) is kind
    assert str(kind) == f"{kind}" == kind.value == json.loads(json.dumps(kind))
    assert Collective.of(kind.value) == Collective.of(kind) == Collective(kind)
    assert str(Collective(kind)) == kind.value  # op names and traces print the kind as before
    assert {kind.value: 1}.get(kind) == 1  # a table keyed by the string finds the enum and back
    assert kind.value in CollectiveKind.names()


def test_unknown_kinds_and_misplaced_options_are_refused() -> None:
    with pytest.raises(ValueError, match="all_to_all_nodes_4_8_256"):
        Collective.of("all_to_all_nodes_4_8_256")  # the old packed name is not a kind
    with pytest.raises(ValueError, match="all_reduce"):
        Collective(CollectiveKind.ALL_REDUCE, NodeLimited(4, 8, 256))
    with pytest.raises(ValueError, match="top_k"):
        NodeLimited(4, 0, 256)
    limited = Collective(CollectiveKind.ALL_TO_ALL, NodeLimited(4, 8, 256))
    assert limited.node_limited == NodeLimited(4, 8, 256) and limited != ALL_TO_ALL and ALL_TO_ALL.node_limited is None
    assert hash(limited) == hash(Collective(CollectiveKind.ALL_TO_ALL, NodeLimited(4, 8, 256)))  # a cache key


def test_no_collective_is_named_by_packing_its_parameters() -> None:
    """The node-limited all-to-all's options travel as a typed object: no module of simtrain builds or
    parses a name with the parameters in it."""
    offenders = []
    for path in sorted((ROOT / "simtrain").rglob("*.py")):
        text = path.read_text()
        if "all_to_all_nodes_" in text:
            offenders.append(f"{path.name}: all_to_all_nodes_")
        if path.name.startswith("collective") and re.search(r"""\.split\(\s*["']_["']""", text):
            offenders.append(f"{path.name}: split('_')")
    assert offenders == []


def test_node_limited_options_survive_lowering_to_the_engine_and_the_trace() -> None:
    run = load_config(DEEPEP)
    lowered = lower(run, COST)
    limited = {op.coll for prog in lowered.programs for op in prog.ops
               if isinstance(op, CommOp) and op.coll is not None and op.coll.node_limited is not None}
    assert limited == {Collective(CollectiveKind.ALL_TO_ALL, NodeLimited(max_nodes=0, top_k=2, n_experts=16))}
    res = simulate(run, trace=True)
    events = [e for e in res.trace if isinstance(e.op, CommOp) and e.op.coll in limited]
    assert events and {e.algorithm for e in events} == {"node_limited/Simple"}  # the engine planned it so
    chrome = to_chrome_trace(events, {r: 0 for r in {e.rank for e in events}})
    args = [ev["args"] for ev in chrome["traceEvents"] if ev.get("ph") == "X"]
    assert args and all(a["collective"] == "all_to_all" and a["algorithm"] == "node_limited/Simple"
                        and a["node_limited"] == {"max_nodes": 0, "top_k": 2, "n_experts": 16} for a in args)
    json.dumps(chrome)  # every value of the trace is plain JSON


def test_plain_ep_dispatch_stays_a_plain_all_to_all() -> None:
    run = load_config({**DEEPEP, "layout": dict(dp=16, ep=16, ep_dispatcher="alltoall")})
    colls = {op.coll for prog in lower(run, COST).programs for op in prog.ops if isinstance(op, CommOp) and op.coll is not None}
    assert ALL_TO_ALL in colls and all(c.node_limited is None for c in colls)


def test_registry_lists_the_algorithms_in_nccls_order() -> None:
    assert ALGORITHMS.names() == ("p2p", "pairwise", "node_limited", "ring", "tree", "hier2d", "nvls", "measured")
    with pytest.raises(ValueError, match="already registered"):
        AlgorithmRegistry([*ALGORITHMS, next(iter(ALGORITHMS))])


@pytest.mark.parametrize(("coll", "cluster", "n_nodes", "p", "expected"), [
    (ALL_REDUCE, "dgx-h100", 2, 16, ["ring/LL", "ring/LL128", "ring/Simple", "tree/LL", "tree/LL128", "tree/Simple",
                                     "hier2d/Simple"]),
    (ALL_REDUCE, "dgx-h100", 1, 8, ["ring/LL", "ring/LL128", "ring/Simple", "nvls/Simple"]),
    (ALL_GATHER, "dgx-h100", 2, 16, ["ring/LL", "ring/LL128", "ring/Simple"]),
    (ALL_TO_ALL, "dgx-h100", 2, 16, ["pairwise/Simple"]),
    (Collective(CollectiveKind.ALL_TO_ALL, NodeLimited(0, 8, 128)), "dgx-h100", 2, 16, ["node_limited/Simple"]),
    (Collective(CollectiveKind.ALL_TO_ALL, NodeLimited(0, 8, 128)), "dgx-h100", 1, 8, ["pairwise/Simple"]),
    (Collective(CollectiveKind.RING_SHIFT), "dgx-h100", 2, 16, ["p2p/Simple"]),
])
def test_candidates_per_kind(coll: Collective, cluster: str, n_nodes: int, p: int, expected: list[str]) -> None:
    c = build_cluster(cluster, n_nodes)
    cands = collective_candidates(coll, tuple(range(p)), Topology(c), c.gpu)
    assert [f"{x.algorithm}/{x.protocol}" for x in cands] == expected


def test_one_phases_object_per_flow_pattern() -> None:
    """Ring and tree share the ring's flows (one idle-network evaluation); each protocol scales them."""
    c = build_cluster("dgx-h100", 2)
    cands = collective_candidates(ALL_REDUCE, tuple(range(16)), Topology(c), c.gpu)
    assert len({id(x.base_phases) for x in cands}) == 2  # ring+tree, hier2d
    assert [x.wire_factor for x in cands[:3]] == [2.0, 128.0 / 120.0, 1.0]


def test_kinds_without_an_algorithm_are_an_error() -> None:
    c = build_cluster("dgx-h100", 1)
    with pytest.raises(ValueError, match="no registered collective algorithm runs a broadcast"):
        collective_candidates(CollectiveKind.BROADCAST, (0, 1), Topology(c), c.gpu)


class _Teleport(FlowAlgorithm):
    """A toy all-gather: one flow per GPU to its neighbour, and no latency at all."""

    name = "teleport"

    def applies(self, coll: Collective, group: Group, topo: Topology, gpu: GpuSpec) -> bool:
        return coll.kind is CollectiveKind.ALL_GATHER

    def phases(self, coll: Collective, group: Group, topo: Topology, gpu: GpuSpec) -> Phases:
        g = group.gpus
        return (tuple(route_flow(topo, a, g[(i + 1) % len(g)], 1.0 / len(g)) for i, a in enumerate(g)),)

    def latency_s(self, coll: Collective, group: Group, protocol: str) -> float:
        return 0.0


def test_a_registered_algorithm_is_considered_and_chosen_when_fastest() -> None:
    c = build_cluster("dgx-h100", 1)
    topo, gpus, S = Topology(c), tuple(range(8)), 1024.0
    local = AlgorithmRegistry([*ALGORITHMS, _Teleport()])
    assert local.names()[-1] == "teleport" and "teleport" not in ALGORITHMS.names()  # the default is untouched
    cands = collective_candidates(ALL_GATHER, gpus, topo, c.gpu, registry=local)
    assert [x.algorithm for x in cands] == ["ring", "ring", "ring", "teleport"]
    cap = lambda e: effective_bandwidth(topo, c.gpu, e)  # noqa: E731
    plan = choose_plan(cands, unit_idle_times(cands, cap), S)
    nvlink = cap(("gpu0", "nvsw0"))
    assert plan.algorithm == "teleport" and plan.estimate_s == pytest.approx(S / 8 / nvlink, rel=1e-12)
    assert collective_candidates(ALL_REDUCE, gpus, topo, c.gpu, registry=local) == \
        collective_candidates(ALL_REDUCE, gpus, topo, c.gpu)  # other kinds: as before


def test_plans_closed_forms_through_the_typed_api() -> None:
    """A one-node ring all-gather: latency + (p-1)/p S / B (Table B); the node-limited all-to-all over 8
    nodes with at most 4 per token sends S/k x 4/8 to each of 7 rail peers."""
    c = build_cluster("dgx-h100", 1)
    topo, S = Topology(c), 256 * 2**20
    plan = plan_collective(ALL_GATHER, tuple(range(8)), S, topo, c.gpu)
    nvlink = effective_bandwidth(topo, c.gpu, ("gpu0", "nvsw0"))
    assert plan.algorithm == "ring" and plan.estimate_s == pytest.approx(plan.latency_s + 7 / 8 * S / nvlink, rel=1e-9)
    c8 = build_cluster("hgx-h800", 8)
    topo8 = Topology(c8)
    limited = plan_collective(Collective(CollectiveKind.ALL_TO_ALL, NodeLimited(4, 8, 256)), tuple(range(64)), S,
                              topo8, c8.gpu)
    nic = effective_bandwidth(topo8, c8.gpu, ("nic0.0", "leaf0.0"))
    assert limited.algorithm == "node_limited"
    assert limited.estimate_s == pytest.approx(limited.latency_s + 7 * S / 8 * node_hit_probability(8, 8, 256, 4) / nic,
                                               rel=1e-6)


def test_busbw_factor_by_kind() -> None:
    assert busbw_factor(CollectiveKind.ALL_REDUCE, 8) == 2 * 7 / 8
    assert busbw_factor(CollectiveKind.ALL_TO_ALL, 8) == 7 / 8
    assert busbw_factor(CollectiveKind.BROADCAST, 8) == busbw_factor(CollectiveKind.SEND, 2) == 1.0


def test_profile_kinds_load_as_the_enum() -> None:
    prof = load_profile(str(EXAMPLE_PROFILE))
    kinds = {k for k, _, _ in prof.collectives.curves}
    assert kinds and all(isinstance(k, CollectiveKind) for k in kinds)
    assert CollectiveKind.ALL_REDUCE in kinds


def test_unknown_kind_in_a_profile_names_the_file_and_the_valid_kinds(tmp_path: Path,
                                                                      capsys: pytest.CaptureFixture[str]) -> None:
    text = EXAMPLE_PROFILE.read_text()
    assert "- collective: all_to_all\n" in text
    bad = tmp_path / "bad-kinds" / "profile.yaml"
    bad.parent.mkdir()
    bad.write_text(text.replace("- collective: all_to_all\n", "- collective: all_to_all_nodes_4_8_256\n", 1))
    with pytest.raises(ConfigError) as err:
        load_profile(str(bad))
    msg = str(err.value)
    assert str(bad.resolve()) in msg or str(bad) in msg
    assert "collective" in msg and "'all_to_all_nodes_4_8_256'" in msg
    assert CollectiveKind.names() in msg
    assert main(["simulate", str(CPU_CONFIG), "--set", f"hardware.profile={bad}"]) == 2
    err_text = capsys.readouterr().err
    assert "all_to_all_nodes_4_8_256" in err_text and "Traceback" not in err_text


def test_calibration_parses_its_collectives_list() -> None:
    pytest.importorskip("torch")
    import argparse

    from calibration.collectives import COLLECTIVES, _kinds, _parser, collective_plan

    assert _kinds("all_reduce,send") == (CollectiveKind.ALL_REDUCE, CollectiveKind.SEND)
    with pytest.raises(argparse.ArgumentTypeError, match="'ring_shift' not measurable.*all_reduce"):
        _kinds("all_reduce,ring_shift")
    args = _parser().parse_args(["--out", "x", "--device", "cpu", "--collectives", "all_gather,send"])
    plan = collective_plan(args, 2, 2)
    assert {p["collective"] for _, p in plan} == {"all_gather", "send"}
    assert all(type(p["collective"]) is str for _, p in plan)  # the journal keeps the string names
    assert _parser().parse_args(["--out", "x", "--device", "cpu"]).collectives == COLLECTIVES
    assert math.isclose(busbw_factor(CollectiveKind(plan[0][1]["collective"]), 2), 0.5)


def test_a_measured_curve_stands_for_plain_collectives_only() -> None:
    """A calibrated profile times the plain torch collective: its all-to-all curve replaces the pairwise
    plan, but not the deduplicated (node-limited) all-to-all's."""
    from types import SimpleNamespace

    from simtrain.cost.collective_algorithms import MeasuredTable
    from simtrain.cost.collective_flows import MeasuredCandidate
    from simtrain.hardware.calibrated import CollectiveTable, Curve

    c = build_cluster("dgx-h100", 2)
    topo, gpus = Topology(c), tuple(range(16))
    table = CollectiveTable({(CollectiveKind.ALL_TO_ALL, 16, 2): Curve((1.0, 2.0), (1e-5, 2e-5), 0.0, 1e5)})
    measured_gpu = SimpleNamespace(collectives=table)
    group = Group.of(topo, gpus)
    limited = Collective(CollectiveKind.ALL_TO_ALL, NodeLimited(0, 8, 128))
    algo = MeasuredTable()
    assert algo.applies(ALL_TO_ALL, group, topo, measured_gpu)  # type: ignore[arg-type]
    assert not algo.applies(limited, group, topo, measured_gpu)  # type: ignore[arg-type]
    assert not algo.applies(ALL_REDUCE, group, topo, measured_gpu)  # not measured
    pairwise = collective_candidates(ALL_TO_ALL, gpus, topo, c.gpu)
    (cand,) = algo.candidates(ALL_TO_ALL, group, topo, measured_gpu, pairwise)  # type: ignore[arg-type]
    assert isinstance(cand, MeasuredCandidate) and cand.latency_s == 1e-5 and cand.base_phases is pairwise[0].base_phases

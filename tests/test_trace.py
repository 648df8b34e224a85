"""The Chrome trace (simtrain.engine.trace) against the Trace Event Format: required keys per phase, microsecond
timestamps, memory counters per stage, flow arrows from each pipeline send to its receive, collective
metadata, gzip."""

from __future__ import annotations

import gzip
import json
import math
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest

from simtrain.cli.main import main
from simtrain.engine.results import StepResult
from simtrain.engine.trace import GiB, to_chrome_trace, write_chrome_trace
from simtrain.studies.simulate import simulate

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = str(ROOT / "examples" / "llama3_70b_h100.yaml")
SMALL_PP: dict[str, Any] = {
    "name": "trace-test", "model": {"preset": "llama3-8b", "n_layers": 4},
    "hardware": {"node": "dgx-h100", "n_nodes": 1}, "layout": {"tp": 2, "pp": 2, "dp": 2},
    "train": {"seq_len": 1024, "global_batch_seqs": 8},
}
# Trace Event Format: the keys each phase must carry (besides "ph")
REQUIRED = {"X": ("name", "ts", "dur", "pid", "tid"), "C": ("name", "ts", "pid", "args"),
            "s": ("name", "cat", "id", "ts", "pid", "tid"), "f": ("name", "cat", "id", "ts", "pid", "tid"),
            "M": ("name", "pid", "args")}


def validate_trace(data: dict[str, Any]) -> list[str]:
    """Every way ``data`` breaks the Trace Event Format (or this trace's promises); [] when none."""
    bad: list[str] = []
    events = data.get("traceEvents")
    if not isinstance(events, list):
        return ["no traceEvents list"]
    slices: dict[tuple[int, int], list[tuple[float, float]]] = defaultdict(list)
    for e in events:
        ph = e.get("ph")
        if ph not in REQUIRED:
            bad.append(f"unknown phase {ph!r}")
            continue
        missing = [k for k in REQUIRED[ph] if k not in e]
        if missing:
            bad.append(f"{ph} event without {', '.join(missing)}: {e}")
            continue
        if not isinstance(e.get("pid"), int) or ("tid" in e and not isinstance(e["tid"], int)):
            bad.append(f"pid/tid not integers: {e}")
        if "ts" in e and not (isinstance(e["ts"], int | float) and math.isfinite(e["ts"]) and e["ts"] >= 0):
            bad.append(f"bad ts: {e}")
        if ph == "X":
            if not e["dur"] >= 0:
                bad.append(f"negative duration: {e}")
            slices[(e["pid"], e["tid"])].append((e["ts"], e["ts"] + e["dur"]))
        if ph == "C":
            values = list(e["args"].values())
            if not values or not all(isinstance(v, int | float) and math.isfinite(v) and v >= 0 for v in values):
                bad.append(f"counter values must be non-negative numbers: {e}")
        if ph == "f" and e.get("bp") != "e":
            bad.append(f"flow finish not bound to its enclosing slice: {e}")
    flows: dict[Any, dict[str, list[dict[str, Any]]]] = defaultdict(lambda: {"s": [], "f": []})
    for e in events:
        if e.get("ph") in ("s", "f"):
            flows[e["id"]][e["ph"]].append(e)
            if not any(a <= e["ts"] <= b for a, b in slices[(e["pid"], e["tid"])]):
                bad.append(f"flow event outside every slice of its thread: {e}")
    for fid, ends in flows.items():
        if len(ends["s"]) != 1 or len(ends["f"]) != 1:
            bad.append(f"flow {fid}: {len(ends['s'])} starts and {len(ends['f'])} finishes")
        elif ends["s"][0]["ts"] > ends["f"][0]["ts"]:
            bad.append(f"flow {fid} finishes before it starts")
    return bad


def _events(data: dict[str, Any], ph: str) -> list[dict[str, Any]]:
    return [e for e in data["traceEvents"] if e["ph"] == ph]


def check_result_trace(r: StepResult, data: dict[str, Any]) -> None:
    """The facts every trace of a pipelined step must show."""
    assert validate_trace(data) == []
    spans = _events(data, "X")
    # microseconds: the last op ends at the step time
    assert max(e["ts"] + e["dur"] for e in spans) == pytest.approx(r.step_time_s * 1e6, rel=1e-9)
    # every send has exactly one flow starting inside it, finishing on the peer's process, one stage away
    # (or on its own stage: DualPipeV's turn at the bottom of the V)
    sends = [e for e in spans if "to_rank" in e["args"]]
    starts, finishes = _events(data, "s"), {e["id"]: e for e in _events(data, "f")}
    assert sends and len(starts) == len(sends)
    for s in starts:
        send = next(x for x in sends if x["pid"] == s["pid"] and x["tid"] == s["tid"]
                    and x["ts"] <= s["ts"] <= x["ts"] + x["dur"])
        f = finishes[s["id"]]
        assert f["pid"] == send["args"]["to_rank"] and r.stage_of[f["pid"]] == send["args"]["to_stage"]
        assert abs(r.stage_of[f["pid"]] - r.stage_of[s["pid"]]) <= 1
        recv = next(x for x in spans if x["pid"] == f["pid"] and x["tid"] == f["tid"]
                    and x["ts"] <= f["ts"] <= x["ts"] + x["dur"])
        assert recv["args"]["from_rank"] == s["pid"]
        assert recv["ts"] >= send["ts"] + send["dur"] - 1e-6  # the receiver starts once the send is done
    # collectives: group (axis, size, ranks), algorithm and bytes
    colls = [e for e in spans if "collective" in e["args"]]
    assert colls
    for e in colls:
        a = e["args"]
        assert a["bytes"] > 0 and "/" in a["algorithm"]
        assert e["pid"] in a["group"]["ranks"] and len(a["group"]["ranks"]) == a["group"]["size"]
        axis = a["group"]["axis"]
        if axis in ("tp", "dp"):
            assert a["group"]["size"] == r.layout[axis]
    # memory counters: one track per stage; its top is the stage's ledger peak (before fragmentation)
    counters = _events(data, "C")
    for m in r.memory:
        values = [c["args"][f"stage {m.stage}"] for c in counters if f"stage {m.stage}" in c["args"]]
        assert values
        frag = m.components["fragmentation"]
        assert max(values) * GiB == pytest.approx(m.peak_bytes - frag, rel=1e-12)
        first = next(c for c in counters if f"stage {m.stage}" in c["args"])
        assert first["ts"] == 0.0 and first["pid"] == min(rk for rk, s in r.stage_of.items() if s == m.stage)


def test_cli_gzip_trace_symmetric(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Interleaved 1F1B (pp 2, vpp 5), symmetric mode, through the CLI to a .json.gz."""
    path = tmp_path / "t.json.gz"
    assert main(["simulate", EXAMPLE, "--set", "train.global_batch_tokens=262144", "--trace", str(path)]) == 0
    assert f"trace written to {path}" in capsys.readouterr().out
    raw = path.read_bytes()
    assert raw[:2] == b"\x1f\x8b"  # the gzip magic
    data = json.loads(gzip.decompress(raw))
    r = simulate(EXAMPLE, ["train.global_batch_tokens=262144"], trace=True)
    check_result_trace(r, data)
    # deterministic: the same step writes the same bytes
    again = tmp_path / "again.json.gz"
    write_chrome_trace(again, r.trace, r.stage_of, r.memory)
    assert again.read_bytes() == raw


def test_full_mode_trace_every_rank() -> None:
    """Full mode: every rank is a process; each stage's sends reach their counterpart on the next stage."""
    r = simulate(SMALL_PP, mode="full", trace=True)
    data = to_chrome_trace(r.trace, r.stage_of, r.memory)
    check_result_trace(r, data)
    assert {e["pid"] for e in _events(data, "X")} == set(range(8))
    for s in _events(data, "s"):
        f = next(e for e in _events(data, "f") if e["id"] == s["id"])
        assert f["pid"] - s["pid"] in (4, -4)  # pp is the outermost axis: tp 2 x dp 2 = 4 ranks per stage


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b", "zb_h1", "interleaved_1f1b", "dualpipe", "dualpipev"])
def test_every_schedule_pairs_its_sends(schedule: str) -> None:
    """Each pipeline schedule: every send's arrow ends at the op that waits for it."""
    cfg = {**SMALL_PP, "model": {"preset": "llama3-8b", "n_layers": 8},
           "layout": {**SMALL_PP["layout"], "schedule": schedule, "vpp": 2 if schedule == "interleaved_1f1b" else 1}}
    r = simulate(cfg, trace=True)
    data = to_chrome_trace(r.trace, r.stage_of, r.memory)
    check_result_trace(r, data)
    pairs = {(e["pid"], f["pid"]) for e in _events(data, "s") for f in _events(data, "f") if f["id"] == e["id"]}
    # forward sends go down the pipeline and backward ones up; DualPipe(V) also the other way round
    assert {(0, 4), (4, 0)} <= pairs
    if schedule == "dualpipev":
        assert (4, 4) in pairs  # the V turns on the last stage: a send to itself


def test_moe_collectives_carry_metadata() -> None:
    """Expert-parallel all-to-alls name their group and algorithm too."""
    cfg = {"name": "moe-trace", "model": {"preset": "mixtral-8x7b", "n_layers": 2},
           "hardware": {"node": "dgx-h100", "n_nodes": 1}, "layout": {"tp": 1, "pp": 2, "dp": 4, "ep": 4},
           "train": {"seq_len": 1024, "global_batch_seqs": 8}}
    r = simulate(cfg, trace=True)
    data = to_chrome_trace(r.trace, r.stage_of, r.memory)
    check_result_trace(r, data)
    a2a = [e for e in _events(data, "X") if e["args"].get("collective") == "all_to_all"]
    assert a2a and all(e["args"]["group"]["size"] == 4 and e["args"]["group"]["axis"].startswith("ep") for e in a2a)


def test_trace_without_memory_has_no_counters() -> None:
    """The old call (events and stages only) still works: no counter track."""
    r = simulate(SMALL_PP, trace=True)
    data = to_chrome_trace(r.trace, r.stage_of)
    assert validate_trace(data) == [] and not _events(data, "C") and _events(data, "s")


def test_validator_catches_broken_traces() -> None:
    """The validator itself: a flow without its finish, a negative counter, a missing key."""
    ok = {"ph": "X", "name": "a", "ts": 0.0, "dur": 2.0, "pid": 0, "tid": 0}
    assert validate_trace({"traceEvents": [ok]}) == []
    lone = {"ph": "s", "name": "x", "cat": "pp", "id": 1, "ts": 1.0, "pid": 0, "tid": 0}
    assert any("1 starts and 0 finishes" in p for p in validate_trace({"traceEvents": [ok, lone]}))
    neg = {"ph": "C", "name": "m", "ts": 0.0, "pid": 0, "args": {"stage 0": -1.0}}
    assert any("non-negative" in p for p in validate_trace({"traceEvents": [neg]}))
    no_dur = {k: v for k, v in ok.items() if k != "dur"}
    assert any("without dur" in p for p in validate_trace({"traceEvents": [no_dur]}))

"""Random inputs for simtrain's fuzz campaign, shared by ``tests/test_fuzz.py`` and ``benchmarks/fuzz.py``.

Every generator takes a ``random.Random`` and returns plain data, so a case is reproducible from
its seed alone (``case_rng(seed, index)``) and hypothesis can drive the same generators through
``st.randoms()``. Two kinds of case:

- ``config``: a random RunConfig dict over every pipeline schedule, axis (dp/tp/pp/vpp/cp/ep/etp,
  sequence parallel, ZeRO 0-3, FSDP full/hybrid, recompute modes, CPU activation offload), software
  stack, precision and node type, on dense and MoE presets shrunk to a few layers so each
  simulation is fast. Outcome: a clean refusal (``ConfigError``/``InfeasibleLayout``) or a
  ``StepResult`` that passes :func:`invariant_breaks`.
- ``cli``: an argv for ``simtrain.cli.main.main`` plus files to write first (malformed config files,
  ``--set`` strings, CSVs for ``validate``, tables for ``report``). Outcome: exit 0, or exit 2 with a
  message on stderr naming a field or the file, no traceback, within 10 s of CPU time (:func:`cli_breaks`).

``KNOWN_OPEN`` lists the bugs issue 31 already reports (fixed in other branches), ``FOUND_BY_FUZZ``
the ones this campaign found (both in ``benchmarks/fuzz_known.py``); a failure one of their lines
matches is counted as ``known`` rather than as a new break. The lead removes each line once its fix
is merged.
"""

from __future__ import annotations

import base64
import math
import random
from pathlib import Path
from typing import Any

import yaml

from benchmarks.fuzz_known import FOUND_BY_FUZZ as FOUND_BY_FUZZ  # re-exported: the runners' one import
from benchmarks.fuzz_known import KNOWN_OPEN as KNOWN_OPEN
from benchmarks.fuzz_known import KnownBug as KnownBug
from benchmarks.fuzz_known import known_bug as known_bug
from benchmarks.fuzz_known import known_hang as known_hang
from simtrain.hardware.load import list_nodes
from simtrain.plan.schedules import SCHEDULES
from simtrain.spec.stacks import STACKS

ROOT = Path(__file__).resolve().parents[1]
PUBLISHED_RUNS = ROOT.parent / "shared" / "validation" / "published_runs.csv"
"""The validation CSV whose columns ``validate`` reads (/work/shared/validation; may be absent)."""

SCHEDULE_CHOICES = ("auto", *SCHEDULES)
STACK_CHOICES = tuple(STACKS)
NODE_CHOICES = tuple(list_nodes())
PRECISIONS = ("bf16", "fp16", "fp8")
DENSE_PRESETS = ("llama3-8b", "llama2-13b", "gpt3-175b", "gpt-1.7b", "llama3.1-405b")
MOE_PRESETS = ("mixtral-8x7b", "deepseek-v3", "qwen3-30b-a3b", "gpt-oss-120b")
STATIC_KEYS = ("weights", "grads", "optimizer", "comm_buffers", "workspace", "context")
"""Memory components held for the whole step (``StageMemory.components``)."""

MALFORMED_TIMEOUT_S = 10.0
CASE_TIMEOUT_S = 30.0


# -- random run configurations -------------------------------------------------------------------


def case_rng(seed: int, index: int) -> random.Random:
    """The generator of case ``index`` of campaign ``seed`` (independent of every other case)."""
    return random.Random(f"simtrain-fuzz:{seed}:{index}")


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def _layer_count(rng: random.Random, pp: int, vpp: int) -> int:
    """Layers for ``pp`` stages of ``vpp`` chunks: mostly enough for them (at most 16), sometimes any."""
    if rng.random() < 0.1:
        return rng.choice([1, 2, 3, 4, 6, 8])
    return min(16, max(1, rng.choice([pp, 2 * pp, pp * vpp, pp * vpp + 1, pp * vpp - 2, 2 * pp * vpp, pp + 3])))


def _model(rng: random.Random, n_layers: int, moe: bool) -> dict[str, Any]:
    """A preset shrunk to ``n_layers`` (dense or MoE) or a small model spelled out field by field."""
    pick = rng.random()
    if pick < 0.55 and not moe:
        return {"preset": rng.choice(DENSE_PRESETS), "n_layers": n_layers}
    if pick < 0.75 and moe:
        name = rng.choice(MOE_PRESETS)
        out: dict[str, Any] = {"preset": name, "n_layers": n_layers}
        if name == "deepseek-v3" and rng.random() < 0.5:
            out["mtp_depth"] = 0
        return out
    heads = rng.choice([4, 8, 16, 32])
    kv = rng.choice([h for h in (1, 2, 4, 8, 16, 32) if h <= heads and heads % h == 0])
    gpt = rng.random() < 0.4
    model: dict[str, Any] = dict(
        name="fuzz", n_layers=n_layers, hidden=rng.choice([256, 512, 1024, 2048]),
        n_heads=heads, n_kv_heads=None if gpt else kv, ffn_hidden=rng.choice([512, 1024, 1376, 2048, 4096]),
        activation="gelu" if gpt else "swiglu", norm="layernorm" if gpt else "rmsnorm",
        position=rng.choice(["rope", "learned", "alibi"]), max_position=rng.choice([2048, 4096, 8192]),
        vocab=rng.choice([1000, 1024, 4096, 32000, 50257]), tied_embeddings=rng.random() < 0.3, linear_bias=gpt,
    )
    if moe:
        experts = rng.choice([4, 8, 16, 64])
        model["moe"] = dict(n_experts=experts, top_k=rng.choice([k for k in (1, 2, 4, 8) if k <= experts]),
                            ffn_hidden=rng.choice([256, 512, 1024]), n_shared_experts=rng.choice([0, 0, 1]),
                            first_k_dense=rng.choice([0, 0, 1]))
    return model


def _degrees(rng: random.Random, moe: bool) -> dict[str, int]:
    tp = rng.choice([1, 1, 2, 4, 8])
    cp = rng.choice([1, 1, 1, 2, 4])
    pp = rng.choice([1, 1, 2, 2, 4, 8])
    dp = rng.choice([1, 1, 2, 4, 8, 16])
    out = dict(tp=tp, cp=cp, pp=pp, dp=dp)
    if moe:
        if tp > 1 and rng.random() < 0.3:
            out["etp"] = rng.choice(_divisors(tp))
        plane = tp * cp * dp // out.get("etp", tp)
        out["ep"] = rng.choice(_divisors(plane)) if rng.random() < 0.9 else rng.choice([2, 4, 8])
    return out


def random_config(rng: random.Random) -> dict[str, Any]:
    """A random RunConfig dict: mostly valid, sometimes violating a cross-field rule on purpose."""
    moe = rng.random() < 0.45
    deg = _degrees(rng, moe)
    world = deg["tp"] * deg["cp"] * deg["pp"] * deg["dp"]
    node = rng.choice(NODE_CHOICES)
    per_node = 72 if "nvl72" in node else 8
    hardware: dict[str, Any] = {"node": node}
    if world % per_node == 0:
        hardware["n_nodes"] = world // per_node
    elif world < per_node or rng.random() < 0.5:
        gpn = max(d for d in _divisors(world) if d <= per_node)
        hardware.update(n_nodes=world // gpn, gpus_per_node=gpn)
    else:
        hardware["n_nodes"] = max(1, world // per_node)  # a mismatch: must be refused
    if rng.random() < 0.15:
        hardware["oversubscription"] = rng.choice([1.0, 2.0, 4.0])
    if rng.random() < 0.1:
        hardware["nic_Gbps"] = rng.choice([100.0, 200.0, 800.0])
    if rng.random() < 0.1:
        hardware["nodes_per_leaf"] = rng.choice([1, 2, 4])
    if rng.random() < 0.05:
        hardware["gpu"] = rng.choice(["h100-sxm", "a100-80gb", "h200", "b200", "mi300x"])

    schedule = rng.choice(SCHEDULE_CHOICES)
    if deg["pp"] == 1 and rng.random() < 0.8:
        schedule = rng.choice(["auto", "1f1b", "gpipe"])
    vpp = 1
    if deg["pp"] > 1 and schedule == "interleaved_1f1b":
        vpp = rng.choice([2, 3, 4])
    elif deg["pp"] > 1 and schedule == "auto":
        vpp = rng.choice([1, 2, 3, 4])
    if rng.random() < 0.05:
        vpp = rng.choice([2, 4])  # possibly invalid on purpose
    model = _model(rng, _layer_count(rng, deg["pp"], vpp), moe)
    layout: dict[str, Any] = dict(deg, vpp=vpp, schedule=schedule)
    layout["sequence_parallel"] = deg["tp"] > 1 and (moe or rng.random() < 0.6)
    shard = rng.random()
    if shard < 0.2:
        layout["fsdp"] = "full"
    elif shard < 0.3 and deg["dp"] > 1:
        layout["fsdp"] = "hybrid"
        layout["fsdp_shard_size"] = rng.choice(_divisors(deg["dp"]))
    else:
        layout["zero_stage"] = rng.choice([0, 1, 1, 2, 3])
    rec = rng.choice(["none", "none", "selective", "full", "op_sac"])
    layout["recompute"] = rec
    if rec == "selective" and rng.random() < 0.5:
        layout["recompute_modules"] = rng.sample(["core_attn", "layernorm", "mla_up_proj", "act"], rng.randint(1, 3))
    if rec == "full" and rng.random() < 0.4:
        layout["recompute_layers"] = rng.choice([0, 1, 2])
    if deg["pp"] == 1 and rec == "none" and rng.random() < 0.3:
        layout["offload_activation_layers"] = rng.choice([1, 2, 3])
    if deg["cp"] > 1:
        layout["cp_comm"] = rng.choice(["p2p", "all_gather", "a2a"])
    if moe:
        layout["ep_comm_overlap"] = rng.random() < 0.3
        layout["ep_dispatcher"] = rng.choice(["auto", "alltoall", "deepep"])
    for flag in ("overlap_grad_reduce", "overlap_param_gather", "tp_comm_overlap"):
        if rng.random() < 0.3:
            layout[flag] = rng.random() < 0.5
    if rng.random() < 0.1:
        layout["fsdp_prefetch_layers"] = rng.choice([0, 1, 2])
    if rng.random() < 0.05:
        layout["order"] = rng.sample(["tp", "cp", "ep", "dp", "pp"], 5)

    mbs = rng.choice([1, 1, 2, 4])
    pp = deg["pp"]
    m = rng.choice([1, 2, pp, 2 * pp, 2 * pp + 2, 3 * pp, 4 * pp, 8])
    if schedule in ("dualpipe", "dualpipev") and rng.random() < 0.8:
        m = rng.choice([2 * pp, 2 * pp + 2, 4 * pp])
    seq = rng.choice([256, 512, 1024, 2048, 4096])
    precision = rng.choice(PRECISIONS)
    train: dict[str, Any] = dict(seq_len=seq, micro_batch_size=mbs, precision=precision,
                                 stack=rng.choice(STACK_CHOICES))
    if rng.random() < 0.5:
        train["global_batch_seqs"] = m * mbs * deg["dp"]
    else:
        train["global_batch_tokens"] = m * mbs * deg["dp"] * seq
    if precision == "fp8":
        train["fp8_recipe"] = rng.choice(["delayed", "current", "blockwise"])
    if deg["pp"] > 1 and rng.random() < 0.25:  # synchronous pipeline exchanges: off in every preset
        train["stack"] = {"preset": train["stack"], "synchronous_p2p": rng.choice(["one_chunk", "all"])}
    if rng.random() < 0.3:
        train["grad_dtype"] = rng.choice(["fp32", "bf16"])
    if rng.random() < 0.2:
        train["attention_kernel"] = "unfused"
    if rng.random() < 0.2:
        train["optimizer"] = rng.choice(["adam", "sgd"])
    if rng.random() < 0.1:
        train["dropout"] = rng.random() < 0.5
    if moe and rng.random() < 0.3:
        train["moe_routing"] = "skewed"
        train["moe_hot_expert_load"] = rng.choice([1.0, 1.5, 2.0, 4.0])
    if moe and rng.random() < 0.15:
        train["moe_capacity_factor"] = rng.choice([1.0, 1.25, 2.0])
    sim: dict[str, Any] = {}
    if world <= 32 and rng.random() < 0.15:
        sim["mode"] = "full"
    if rng.random() < 0.15:
        sim["steady_state"] = False
    if rng.random() < 0.1:
        sim["fragmentation_ratio"] = rng.choice([0.0, 0.1, 0.5])
    return dict(name="fuzz", model=model, hardware=hardware, layout=layout, train=train, sim=sim)


# -- invariants of a result ----------------------------------------------------------------------


def invariant_breaks(cfg: dict[str, Any], res: Any, closed_form_rel: float = 0.01) -> list[str]:
    """The invariants a StepResult of ``cfg`` breaks (empty when it is sane).

    0 < MFU <= HFU <= 1; finite positive step time; breakdown parts >= 0 adding up to the step time;
    tokens/s x step time = the batch; one memory entry per stage, each peak > 0 and >= its static
    memory (and the memory timeline's floor), equal to the closed-form peak within ``closed_form_rel``.
    """
    out: list[str] = []
    t = res.step_time_s
    if not (math.isfinite(t) and t > 0):
        return [f"step_time_s={t!r} is not finite and positive"]
    if not 0 < res.mfu <= res.hfu * (1 + 1e-9) <= 1 + 1e-9:
        out.append(f"mfu={res.mfu!r} hfu={res.hfu!r}: not 0 < mfu <= hfu <= 1")
    bd = res.breakdown_s
    parts = {k: v for k, v in bd.items() if k != "exposed_comm"}
    parts.update({f"exposed_comm.{k}": v for k, v in bd["exposed_comm"].items()})
    neg = {k: v for k, v in parts.items() if not (math.isfinite(v) and v >= -1e-9 * t)}
    if neg:
        out.append(f"breakdown parts negative or not finite: {neg}")
    total = sum(parts.values())
    if not math.isclose(total, t, rel_tol=1e-6, abs_tol=1e-9):
        out.append(f"breakdown sums to {total!r}, step_time_s={t!r}")
    if not math.isclose(res.tokens_per_s * t, res.global_batch_tokens, rel_tol=1e-9):
        out.append(f"tokens_per_s x step_time = {res.tokens_per_s * t!r} != global_batch_tokens")
    pp = cfg.get("layout", {}).get("pp", 1)
    if len(res.memory) != pp:
        out.append(f"{len(res.memory)} memory entries for pp={pp}")
    for m in res.memory:
        static = sum(m.components.get(k, 0.0) for k in STATIC_KEYS)
        if not (math.isfinite(m.peak_bytes) and m.peak_bytes > 0):
            out.append(f"stage {m.stage}: peak_bytes={m.peak_bytes!r}")
        elif m.peak_bytes < static * (1 - 1e-12):
            out.append(f"stage {m.stage}: peak {m.peak_bytes!r} below its static memory {static!r}")
        if m.timeline and min(v for _, v in m.timeline) < static * (1 - 1e-12) - 1:
            out.append(f"stage {m.stage}: memory timeline dips below the static memory {static!r}")
        if not math.isclose(m.peak_bytes, m.closed_form_peak_bytes, rel_tol=closed_form_rel):
            out.append(f"stage {m.stage}: engine peak {m.peak_bytes:.6g} vs closed form "
                       f"{m.closed_form_peak_bytes:.6g} (> {100 * closed_form_rel:g} % apart)")
    return out


# -- malformed command lines ---------------------------------------------------------------------

EXAMPLE_TEXT = """\
name: fuzz-base
model: {preset: llama3-8b, n_layers: 4}
hardware: {node: dgx-h100, n_nodes: 1}
layout: {tp: 2, pp: 2, dp: 2, sequence_parallel: true, zero_stage: 1}
train: {seq_len: 1024, micro_batch_size: 1, global_batch_seqs: 8}
"""
"""A small valid config the malformed cases start from."""

SET_KEYS = ("layout.tp", "layout.pp", "layout.dp", "layout.cp", "layout.vpp", "layout.schedule", "layout.recompute",
            "layout.sequence_parallel", "layout.zero_stage", "layout.order", "train.seq_len", "train.precision",
            "train.global_batch_tokens", "train.global_batch_seqs", "train.stack", "hardware.node",
            "hardware.n_nodes", "model", "model.n_layers", "model.hidden", "sim.mode", "sim.seed",
            "sim.variability", "sim.variability.gpu_speed_cv", "sim.variability.samples", "name", "bogus.key")
ODD_VALUES = ("", "[", "]", "{", "{a: 1", "!!python/object:os.system", "&a [*a]", "*x", "- 1\n- 2", "1e400", "-1",
              "0", "nan", ".inf", "true", "null", "~", "'x", '"', "3.5", "0x10", "1_000", "[1, 2]", "{tp: 2}",
              "\x00", "\udcff", "ÿ", "4Mi", "1.5M", "99999999999999999999", "-0", "yes", "%", "@", "`", "|\n  x")


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def _alias_bomb(depth: int = 9) -> bytes:
    lines = ['a0: &a0 ["x", "x", "x", "x", "x", "x", "x", "x", "x"]']
    for i in range(1, depth):
        lines.append(f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 9) + "]")
    lines.append(f"model: *a{depth - 1}")
    return ("\n".join(lines) + "\n").encode()


def _malformed_config_bytes(rng: random.Random) -> tuple[str, bytes, str]:
    """(suffix, contents, label) of a broken config file."""
    base = EXAMPLE_TEXT.encode()
    kind = rng.choice(["random_bytes", "truncated", "bit_flip", "wrong_type", "unknown_key", "empty", "top_scalar",
                       "top_list", "non_utf8", "alias_bomb", "bad_json", "deep_nest", "tab_indent"])
    if kind == "random_bytes":
        return ".yaml", bytes(rng.randrange(256) for _ in range(rng.randint(1, 400))), kind
    if kind == "truncated":
        return ".yaml", base[: rng.randint(1, len(base) - 1)], kind
    if kind == "bit_flip":
        data = bytearray(base)
        for _ in range(rng.randint(1, 6)):
            data[rng.randrange(len(data))] = rng.choice(b"{}[]:,&*!|>'\"#-?% \t\n")
        return ".yaml", bytes(data), kind
    if kind in ("wrong_type", "unknown_key"):
        cfg = yaml.safe_load(EXAMPLE_TEXT)
        section = rng.choice(["layout", "train", "hardware", "model", "sim"])
        target = cfg.setdefault(section, {})
        key = rng.choice(["tp", "pp", "seq_len", "n_nodes", "node", "mode", "precision", "hidden"])
        if kind == "unknown_key":
            key = "not_a_field_" + str(rng.randrange(100))
        target[key] = rng.choice(["x", -3, 0, 1.5, None, [1, 2], {"a": 1}, "4Mi", 10**30, True, ""])
        return ".yaml", yaml.safe_dump(cfg).encode(), kind
    if kind == "empty":
        return ".yaml", b"", kind
    if kind == "top_scalar":
        return ".yaml", rng.choice([b"3\n", b"hello\n", b"null\n", b"~\n"]), kind
    if kind == "top_list":
        return ".yaml", b"- model: llama3-8b\n", kind
    if kind == "non_utf8":
        return ".yaml", base.replace(b"fuzz-base", b"fuzz-\xff\xfe-base"), kind
    if kind == "alias_bomb":
        return ".yaml", _alias_bomb(), kind
    if kind == "bad_json":
        return ".json", b'{"model": "llama3-8b", "layout": {"tp": 2,,}', kind
    if kind == "deep_nest":
        return ".yaml", b"model: " + b"[" * 2000 + b"]" * 2000 + b"\n", kind
    return ".yaml", base.replace(b"layout:", b"\tlayout:"), kind


CSV_BAD = ("", "x", "-1", "0", "1e300", "nan", "inf", "1000000007", "3.5", "yes", "H100, H100", '"', "\u00ff",
           "-0.0", "   ", "NaN", "99999999999999999999")


def _read_published_rows() -> tuple[list[str], list[list[str]]]:
    import csv

    if not PUBLISHED_RUNS.is_file():
        return [], []
    with PUBLISHED_RUNS.open(newline="", encoding="utf-8") as fh:
        rows = list(csv.reader(fh))
    return rows[0], rows[1:]


_CSV_CACHE: tuple[list[str], list[list[str]]] | None = None


def _published() -> tuple[list[str], list[list[str]]]:
    global _CSV_CACHE
    if _CSV_CACHE is None:
        _CSV_CACHE = _read_published_rows()
    return _CSV_CACHE


SMALL_ROW_GPUS = 64
SMALL_ROW_LAYERS = 40
"""Rows of the published CSV kept for mutation: at most this many GPUs and layers (fast to simulate)."""


def _malformed_validate_csv(rng: random.Random) -> tuple[bytes, str]:
    """(contents, label) of a CSV for ``simtrain validate``: published rows with cells broken."""
    import csv
    import io

    header, rows = _published()
    kind = rng.choice(["empty", "header_only", "garbage", "mutated", "mutated", "mutated", "missing_column",
                       "non_utf8", "huge_gpus"])
    if kind == "empty" or not header:
        return b"", "empty"
    def cell(r: list[str], col: str) -> int:
        v = r[header.index(col)]
        return int(v) if v.isdigit() else 10**9

    small = [r for r in rows if cell(r, "n_gpus") <= SMALL_ROW_GPUS and cell(r, "n_layers") <= SMALL_ROW_LAYERS
             and r[header.index("simulatable")] in ("yes", "mostly")] or rows[:3]
    picked = [list(rng.choice(small))]
    buf = io.StringIO()
    w = csv.writer(buf)
    if kind == "header_only":
        w.writerow(header)
    elif kind == "garbage":
        buf.write("".join(rng.choice("a,b\n\"'; 1") for _ in range(rng.randint(1, 200))))
    elif kind == "missing_column":
        drop = rng.randrange(len(header))
        w.writerow([h for i, h in enumerate(header) if i != drop])
        w.writerows([[c for i, c in enumerate(r) if i != drop] for r in picked])
    elif kind == "huge_gpus":
        row = picked[0]
        for col in ("n_gpus", "dp", "global_batch_seqs"):
            row[header.index(col)] = rng.choice(["1000000007", "10000000000", "123456789012"])
        w.writerow(header)
        w.writerow(row)
    else:
        row = picked[0]
        for _ in range(rng.randint(1, 3)):
            row[rng.randrange(len(header))] = rng.choice(CSV_BAD)
        w.writerow(header)
        w.writerow(row)
    data = buf.getvalue().encode("utf-8", "surrogateescape")
    if kind == "non_utf8":
        w.writerow(header)
        w.writerow(picked[0])
        data = buf.getvalue().encode() + b"\xff\xfe\x00bad\n"
    return data, kind


REPORT_COLUMNS = ("model", "n_gpus", "layout.tp", "layout.pp", "layout.dp", "mfu", "step_time_s", "fits",
                  "peak_memory_bytes", "error", "time_to_train_s", "train.global_batch_tokens", "memory_json")


def _malformed_report_table(rng: random.Random) -> tuple[str, bytes, str]:
    """(suffix, contents, label) of a table for ``simtrain report``."""
    kind = rng.choice(["empty", "header_only", "random_columns", "random_columns", "garbage", "bad_suffix",
                       "non_utf8"])
    if kind == "empty":
        return ".csv", b"", kind
    if kind == "garbage":
        return ".csv", bytes(rng.randrange(256) for _ in range(rng.randint(1, 300))), kind
    if kind == "bad_suffix":
        return ".txt", b"a,b\n1,2\n", kind
    cols = rng.sample(REPORT_COLUMNS, rng.randint(1, len(REPORT_COLUMNS)))
    lines = [",".join(cols)]
    if kind != "header_only":
        for _ in range(rng.randint(1, 5)):
            lines.append(",".join(rng.choice(["1", "0.5", "x", "", "true", "-3", "nan", "1e400", "{}", "8"])
                                  for _ in cols))
    data = ("\n".join(lines) + "\n").encode()
    if kind == "non_utf8":
        data += b"\xff\xfe\n"
    return ".csv", data, kind


def random_cli_case(rng: random.Random) -> dict[str, Any]:
    """A malformed command line: ``{"kind": "cli", "label", "argv", "files": {name: base64}}``.

    ``argv`` names the files by their bare names; the runner writes them into a fresh folder and
    runs there (``run_cli_case``).
    """
    what = rng.choice(["config", "config", "set", "set", "validate", "report", "path"])
    files: dict[str, str] = {}
    if what == "config":
        suffix, data, label = _malformed_config_bytes(rng)
        files["cfg" + suffix] = _b64(data)
        argv = ["simulate", "cfg" + suffix]
    elif what == "set":
        files["cfg.yaml"] = _b64(EXAMPLE_TEXT.encode())
        sets = []
        for _ in range(rng.randint(1, 3)):
            form = rng.random()
            key = rng.choice(SET_KEYS)
            if form < 0.1:
                sets.append(rng.choice(["", "=", "=3", "layout.tp", "layout..tp=2", ".=1", "layout.tp.x=3",
                                        "layout.=2", " =1"]))
            else:
                sets.append(f"{key}={rng.choice(ODD_VALUES)}")
        label = "set"
        argv = ["simulate", "cfg.yaml"] + [x for s in sets for x in ("--set", s)]
    elif what == "validate":
        data, label = _malformed_validate_csv(rng)
        files["runs.csv"] = _b64(data)
        argv = ["validate", "runs.csv", "--workers", "1"]
    elif what == "report":
        suffix, data, label = _malformed_report_table(rng)
        files["table" + suffix] = _b64(data)
        argv = ["report", "table" + suffix, "--md", "out.md"]
    else:
        label = "path"
        argv = rng.choice([["simulate", "missing.yaml"], ["simulate", "."], ["validate", "missing.csv"],
                           ["report", "missing.parquet"], ["simulate", ""], ["run", "missing.yaml"]])
    return {"kind": "cli", "label": f"{what}:{label}", "argv": argv, "files": files}


def cli_breaks(argv: list[str], files: dict[str, str], rc: int, stderr: str, cpu_s: float) -> list[str]:
    """What is wrong with the outcome of a malformed command line (empty when it is clean). ``cpu_s``: the CPU
    seconds the command took (its process's CPU time, not wall time: on a shared machine a refusal that takes
    0.5 s of CPU read 17 s of wall time at load 10, and an unbounded run is unbounded in CPU time too)."""
    out = []
    if rc not in (0, 2):
        out.append(f"exit code {rc} (expected 0 or 2)")
    if "Traceback" in stderr:
        out.append("traceback on stderr")
    if rc == 2:
        names = [*files, *(a for a in argv if a and not a.startswith("-"))]
        if not stderr.strip():
            out.append("exit 2 without a message")
        elif not ("." in stderr or "--" in stderr or any(n in stderr for n in names) or ":" in stderr):
            out.append(f"message names no field or file: {stderr.strip()[:200]!r}")
    if rc == 0:
        sets = [argv[i + 1] for i, a in enumerate(argv[:-1]) if a == "--set"]
        for s in sets:
            key, _, raw = s.partition("=")
            if key.strip() in BOOL_INT_KEYS and isinstance(_yaml_or_none(raw), bool):
                out.append(f"boolean accepted for the integer field {key.strip()} ({s!r})")
    limit = CASE_TIMEOUT_S if rc == 0 else MALFORMED_TIMEOUT_S  # a valid input simulates; a refusal is quick
    if cpu_s > limit:
        out.append(f"took {cpu_s:.1f} s of CPU (> {limit:g} s) for exit code {rc}")
    return out


def _yaml_or_none(raw: str) -> Any:
    try:
        return yaml.safe_load(raw)
    except yaml.YAMLError:
        return None


BOOL_INT_KEYS = ("layout.tp", "layout.pp", "layout.dp", "layout.cp", "layout.vpp", "layout.zero_stage",
                 "train.seq_len", "hardware.n_nodes", "model.n_layers", "model.hidden", "train.global_batch_seqs")
"""Integer fields a YAML boolean must not pass for (``--set layout.tp=true`` is not tp=1)."""

def random_case(rng: random.Random, malformed_share: float = 0.2) -> dict[str, Any]:
    """One campaign case: a random config (``{"kind": "config", "config": ...}``) or a malformed CLI."""
    if rng.random() < malformed_share:
        return random_cli_case(rng)
    return {"kind": "config", "config": random_config(rng)}


# -- running one case ----------------------------------------------------------------------------


def run_config_case(cfg: dict[str, Any], check_determinism: bool = False) -> dict[str, Any]:
    """Simulate ``cfg``: ``{"outcome": "ok" | "refused" | "crash" | "invariant", "detail", "wall_s"}``."""
    import json
    import time
    import traceback

    from simtrain.spec.errors import ConfigError, InfeasibleLayout
    from simtrain.studies.simulate import simulate

    start = time.perf_counter()
    try:
        res = simulate(cfg)
    except (ConfigError, InfeasibleLayout) as exc:
        detail = str(exc)
        outcome = "refused" if detail.strip() else "crash"
        return {"outcome": outcome, "detail": detail[:500], "wall_s": time.perf_counter() - start}
    except Exception:  # noqa: BLE001 - any other exception is what the campaign looks for
        return {"outcome": "crash", "detail": traceback.format_exc(limit=-4)[-1500:],
                "wall_s": time.perf_counter() - start}
    wall = time.perf_counter() - start
    breaks = invariant_breaks(cfg, res)
    if check_determinism and not breaks:
        again = simulate(cfg)
        if json.dumps(again.to_dict(timeline=True)) != json.dumps(res.to_dict(timeline=True)):
            breaks.append("same input twice gave different JSON")
    return {"outcome": "invariant" if breaks else "ok", "detail": "; ".join(breaks)[:1500], "wall_s": wall,
            "step_time_s": res.step_time_s, "mfu": res.mfu}


def run_cli_case(case: dict[str, Any], workdir: Path) -> dict[str, Any]:
    """Write the case's files into ``workdir`` and run ``simtrain.cli.main.main`` there, in this process."""
    import contextlib
    import io
    import os
    import time
    import traceback

    from simtrain.cli.main import main

    workdir.mkdir(parents=True, exist_ok=True)
    for name, data in case["files"].items():
        (workdir / name).write_bytes(base64.b64decode(data))
    err, out = io.StringIO(), io.StringIO()
    cwd = os.getcwd()
    start, cpu0 = time.perf_counter(), time.process_time()
    crash = ""
    try:
        os.chdir(workdir)
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(out):
            try:
                rc = main(list(case["argv"]))
            except SystemExit as exc:  # argparse's usage errors exit 2 by themselves
                rc = exc.code if isinstance(exc.code, int) else 1
            except Exception:  # noqa: BLE001 - an escaped exception is a traceback for the user
                crash = traceback.format_exc(limit=-4)
                rc = -1
    finally:
        os.chdir(cwd)
    wall, cpu = time.perf_counter() - start, time.process_time() - cpu0
    if crash:
        return {"outcome": "crash", "detail": crash[-1500:], "wall_s": wall, "rc": rc}
    breaks = cli_breaks(case["argv"], case["files"], rc, err.getvalue(), cpu)
    return {"outcome": "invariant" if breaks else ("refused" if rc == 2 else "ok"),
            "detail": "; ".join(breaks) or err.getvalue().strip()[:300], "wall_s": wall, "rc": rc}

"""Cells of a published-run CSV: reading the file, numbers from free text (the first number, an assumption when
the cell held more), and the loosely written GPU, precision, recompute and sharding cells; every gap or
loose reading is one line in the row's assumptions (simtrain.validation.csv_runs assembles the rows)."""

from __future__ import annotations

import csv
import math
import re
from pathlib import Path
from types import MappingProxyType
from typing import Any

from simtrain.spec.errors import ConfigError, Problem
from simtrain.spec.limits import (
    MAX_BATCH_TOKENS,
    MAX_GPUS,
    MAX_HEADS,
    MAX_LAYERS,
    MAX_MICRO_BATCH,
    MAX_SEQ_LEN,
    MAX_VOCAB,
    MAX_WIDTH,
)
from simtrain.spec.stacks import SoftwareStack

#: Columns a file must have to be read at all (everything else is optional).
REQUIRED_COLUMNS = ("run_id",)


#: The largest value of each integer column (``simtrain.spec.limits``): a cell past it is a typo, and the row
#: becomes an error row naming the column rather than a prediction whose error spoils the summary.
COLUMN_LIMITS = MappingProxyType({
    "n_gpus": MAX_GPUS, "gpus_per_node": MAX_GPUS, "tp": MAX_GPUS, "pp": MAX_GPUS, "dp": MAX_GPUS, "cp": MAX_GPUS,
    "ep": MAX_GPUS, "vp": MAX_LAYERS, "n_layers": MAX_LAYERS, "cpu_offload_layers": MAX_LAYERS,
    "hidden": MAX_WIDTH, "ffn_hidden": MAX_WIDTH, "moe_ffn_hidden": MAX_WIDTH, "n_heads": MAX_HEADS,
    "n_kv_heads": MAX_HEADS, "moe_experts": MAX_HEADS, "moe_topk": MAX_HEADS, "vocab": MAX_VOCAB,
    "seq_len": MAX_SEQ_LEN, "micro_batch": MAX_MICRO_BATCH, "global_batch_seqs": MAX_BATCH_TOKENS,
    "global_batch_tokens": MAX_BATCH_TOKENS, "grad_accum": MAX_BATCH_TOKENS,
})


#: Measured quantities that must be positive when given (a zero or negative time is a typo).
_POSITIVE_COLUMNS = ("step_time_s", "peak_mem_gib", "tokens_per_s_per_gpu")


_NUMBER = re.compile(r"[-+]?\d[\d,]*(?:\.\d+)?(?:[eE][-+]?\d+)?\s*([kKmMbB]\b)?")


_SUFFIX = {"k": 1e3, "m": 1e6, "b": 1e9}


class NotSimulatable(Exception):
    """A row lacks a field the simulation needs; ``field`` names the CSV column."""

    def __init__(self, field_name: str, why: str = ""):
        self.field = field_name
        super().__init__(f"{field_name}{': ' + why if why else ''}")


def read_rows(path: str | Path) -> list[dict[str, str]]:
    """Read a CSV file into dicts of stripped strings; ConfigError for a missing file or column."""
    p = Path(path)
    if p.is_dir():
        raise ConfigError(Problem("file", f"{str(p)!r} is a directory, not a CSV file"))
    if not p.is_file():
        raise ConfigError(Problem("file", f"not found: {str(p)!r}"))
    try:
        with p.open(newline="", encoding="utf-8-sig") as fh:  # -sig: a spreadsheet's byte-order mark
            reader = csv.DictReader(fh)
            columns = [c.strip() for c in reader.fieldnames or []]
            missing = [c for c in REQUIRED_COLUMNS if c not in columns]
            if missing:
                raise ConfigError(Problem("file", f"{str(p)!r} lacks the column(s) {', '.join(missing)}"))
            rows = [_stripped(row, p, reader.line_num) for row in reader]
    except (UnicodeDecodeError, csv.Error) as exc:
        raise ConfigError(Problem("file", f"{str(p)!r} is not a readable CSV: {exc}")) from None
    if not rows:  # nothing to predict: a summary of no runs has no statistics to give
        raise ConfigError(Problem("file", f"{str(p)!r} has a header but no rows; add one row per measured run"))
    return rows


def _stripped(row: dict[str | None, Any], path: Path, line: int) -> dict[str, str]:
    """A DictReader row as stripped strings; ConfigError for a row with more cells than the header
    (DictReader files the surplus under the key None)."""
    if row.get(None):
        raise ConfigError(Problem("file", f"{str(path)!r} line {line} has more cells than the header's "
                                          f"{len(row) - 1} columns"))
    return {(k or "").strip(): (v or "").strip() for k, v in row.items() if k is not None}


def _blank(text: str | None) -> bool:
    return text is None or text.strip().lower() in ("", "nan", "none", "null", "-", "n/a", "?")


def number(row: dict[str, str], col: str, notes: list[str]) -> float | None:
    """The first number in ``row[col]`` (None when blank); a note when the cell held more than a number."""
    text = row.get(col)
    if _blank(text):
        return None
    assert text is not None
    match = _NUMBER.search(text)
    if match is None:
        notes.append(f"{col}: {text!r} holds no number; treated as missing")
        return None
    value = float(match.group(0).rstrip("kKmMbB ").replace(",", ""))
    if match.group(1):
        value *= _SUFFIX[match.group(1).lower()]
    if match.group(0).strip() != text.strip():
        notes.append(f"{col}: read {value:g} from {text!r}")
    return value


def integer(row: dict[str, str], col: str, notes: list[str]) -> int | None:
    """An integer cell (None when blank); a non-integral number is rounded with a note; a value past the
    column's ``COLUMN_LIMITS`` (or not finite) is a ConfigError naming the column."""
    value = number(row, col, notes)
    if value is None:
        return None
    limit = COLUMN_LIMITS.get(col)
    if not math.isfinite(value):
        raise ConfigError(Problem(col, f"{row.get(col)!r} is not a finite number"))
    if limit is not None and abs(value) > limit:
        raise ConfigError(Problem(col, f"{row.get(col)!r} is not valid; at most {limit:,} (simtrain.spec.limits: no real "
                                       "run comes near it)"))
    if value != int(value):
        notes.append(f"{col}: {value:g} rounded to {round(value)}")
    return round(value)


def count(row: dict[str, str], col: str, notes: list[str]) -> int | None:
    """A cell that counts something (GPUs, ranks, layers, tokens): a positive integer, None when blank;
    zero or a negative number is an error naming the column, never a silent default."""
    value = integer(row, col, notes)
    if value is not None and value < 1:
        raise ConfigError(Problem(col, f"{row.get(col)!r}: must be a positive integer (or blank if unknown)"))
    return value


def text(row: dict[str, str], col: str) -> str:
    """The cell as lower-case text ('' when blank)."""
    value = row.get(col)
    return "" if _blank(value) else str(value).strip().lower()


_SOURCES: tuple[tuple[str, str], ...] = (
    (r"torchtitan", "torchtitan"),
    (r"megatron-bridge", "Megatron-Bridge"),
    (r"nemo.*performance_summary|performance_summary.*nemo", "NeMo 24.07"),
    (r"korthikanti", "Korthikanti 2022"),
    (r"cases_april2021|sc'?21|narayanan", "Megatron-LM SC'21"),
    (r"megatron-lm readme 'training speed|model_table", "Megatron-LM H100 (2024)"),
    (r"llm-foundry|mosaicml", "MosaicML llm-foundry"),
    (r"bigscience|bloom", "BLOOM"),
    (r"moe/readme|deepseek-v3-gb200", "Megatron-Core MoE"),
)


#: A NeMo container release ("NeMo 25.11 container") in a row's source or source_ref: the releases of one
#: source (Megatron-Bridge's performance tables) are summarised apart, since their software differs.
_RELEASE = re.compile(r"nemo (\d\d\.\d\d) container")


def source_label(row: dict[str, str]) -> str:
    """A short label for the row's source (for per-source summaries); the cell's start when unknown."""
    raw = row.get("source", "") or ""
    low = raw.lower()
    for pattern, label in _SOURCES:
        if re.search(pattern, low):
            release = _RELEASE.search(f"{low} {(row.get('source_ref', '') or '').lower()}")
            return f"{label} {release.group(1)}" if label == "Megatron-Bridge" and release else label
    return raw.split("(")[0].strip()[:40] or "unknown"


# (pattern on the lower-cased gpu cell, GPU profile, node profile); first match wins.
_GPUS: tuple[tuple[str, str, str], ...] = (
    (r"gb300", "gb300", "gb300-nvl72"),
    (r"gb200", "gb200", "gb200-nvl72"),
    (r"b300", "b300", "dgx-b300"),
    (r"b200", "b200", "dgx-b200"),
    (r"h200", "h200", "hgx-h200"),
    (r"h800", "h800", "hgx-h800"),
    (r"h100.*(96\s*gb|500\s*w)", "h100-sxm-96gb-500w", "dgx-h100"),
    (r"h100", "h100-sxm", "dgx-h100"),
    (r"a100.*40\s*gb", "a100-40gb", "hgx-a100-40gb"),
    (r"a100", "a100-80gb", "dgx-a100"),
    (r"mi300x", "mi300x", "mi300x-8"),
)


DEFAULT_GPU = ("h100-sxm", "dgx-h100")


# GPUs without a profile, mapped to the profile of the nearest part (same family or generation) and named
# in the row's assumptions: (pattern, GPU profile, node profile, why that one).
_NEAREST: tuple[tuple[str, str, str, str], ...] = (
    (r"a800", "a100-80gb", "dgx-a100", "an export A100 80GB whose NVLink is capped at 400 GB/s"),
    (r"h20\b", "h800", "hgx-h800", "an export Hopper on the same board, but with far less compute: "
     "expect the prediction to be too fast"),
    (r"v100|p100|volta|pascal|t4\b|turing", "a100-40gb", "hgx-a100-40gb",
     "older than every profile; the oldest one: expect the prediction to be too fast"),
    (r"mi2\d0|mi3[0-5]\d", "mi300x", "mi300x-8", "AMD Instinct"),
    (r"\ba(?:10g?|30|40)\b|a[456]000|rtx|geforce|\bl40s?\b|\bl4\b|ada\b|ampere", "a100-40gb", "hgx-a100-40gb",
     "a PCIe Ampere / Ada card with less memory bandwidth and no NVSwitch; the nearest data-centre part: "
     "expect the prediction to be too fast"),
)


def parse_gpu(cell: str) -> tuple[str, str, str | None]:
    """(GPU profile, node profile, assumption or None) for a free-text ``gpu`` cell."""
    low = cell.strip().lower()
    for pattern, gpu, node in _GPUS:
        if re.search(pattern, low):
            note = None
            if gpu == "a100-80gb" and "80" not in low:
                note = f"gpu {cell!r}: memory size not stated; A100 80GB assumed"
            elif gpu == "h100-sxm" and ("pcie" in low or "nvl" in low):
                note = f"gpu {cell!r}: no profile for this H100 variant; H100 SXM assumed"
            elif "pcie" in low or re.search(r"\bnvl\b(?!\s*72)", low):
                note = (f"gpu {cell!r}: no profile for the PCIe part (lower power cap, no NVSwitch); the SXM "
                        f"profile {gpu} assumed: expect the prediction to be too fast")
            return gpu, node, note
    for pattern, gpu, node, why in _NEAREST:
        if re.search(pattern, low):
            return gpu, node, f"gpu {cell!r} has no profile: nearest profile {gpu} ({why})"
    what = f"gpu {cell!r} has no profile" if low else "gpu not given"
    return DEFAULT_GPU[0], DEFAULT_GPU[1], f"{what}: nearest default {DEFAULT_GPU[0]} ({DEFAULT_GPU[1]} node)"


def parse_precision(cell: str, stack: SoftwareStack, has_fp8: bool,
                    has_fp4: bool = False) -> tuple[str, str, list[str]]:
    """(precision, fp8 recipe, assumptions) for a free-text ``precision`` cell; ``has_fp8`` / ``has_fp4``:
    whether the row's GPU has FP8 / FP4 tensor cores."""
    low = cell.strip().lower()
    notes: list[str] = []
    if not low:
        return "bf16", stack.fp8_recipe, ["precision not given: bf16 assumed"]
    if re.search(r"fp4|float4", low):
        if has_fp4:
            # NVFP4 (Transformer Engine NVFP4BlockScaling, the recipe Megatron-Bridge's "nvfp4" compute dtype
            # selects) is modelled as such; MXFP4 (32-element blocks, E8M0 scales) runs on the same FP4
            # tensor cores with a scale byte per 32 elements instead of 16
            if "mxfp4" in low:
                return "fp4", stack.fp8_recipe, [f"precision {cell!r}: MXFP4 simulated as NVFP4 (16-element "
                                                 "blocks: 1/32 B more scale traffic per element)"]
            return "fp4", stack.fp8_recipe, notes
        if not has_fp8:
            return "bf16", stack.fp8_recipe, [f"precision {cell!r} on a GPU without FP8 or FP4: bf16 simulated"]
        # a GPU without FP4 tensor cores cannot run the row as stated; the nearest it can run is block-scaled FP8
        return "fp8", "blockwise", [f"precision {cell!r} on a GPU without FP4 tensor cores: block-scaled FP8 "
                                    "simulated"]
    if "fp8" in low or "float8" in low or "mxfp8" in low:
        if not has_fp8:
            return "bf16", stack.fp8_recipe, [f"precision {cell!r} on a GPU without FP8: bf16 simulated"]
        if re.search(r"\bmx|mxfp8|fp8-mx", low):
            return "fp8", "blockwise", [f"precision {cell!r}: MXFP8 (1x32 blocks) simulated as block-wise scaling"]
        if re.search(r"\bcs\b|fp8-cs|current|tensorwise|dynamic", low):
            return "fp8", "current", notes
        if re.search(r"block", low):
            return "fp8", "blockwise", notes
        if re.search(r"delayed|hybrid", low):
            return "fp8", "delayed", notes
        if "float8 linears" in low:
            return "fp8", "current", [f"precision {cell!r}: torchtitan float8 default = tensorwise dynamic "
                                      "(current) scaling"]
        return "fp8", stack.fp8_recipe, [f"precision {cell!r}: recipe not stated; stack default "
                                         f"{stack.fp8_recipe!r}"]
    if "fp16" in low and "bf16" not in low:
        return "fp16", stack.fp8_recipe, notes
    if "fp16" in low:
        notes.append(f"precision {cell!r}: bf16 simulated (same tensor-core peak as fp16)")
    elif "bf16" not in low:
        notes.append(f"precision {cell!r} not recognised: bf16 assumed")
    return "bf16", stack.fp8_recipe, notes


def parse_recompute(cell: str, stack_name: str = "") -> tuple[str, list[str]]:
    """(layout.recompute, assumptions) for a free-text ``recompute`` cell."""
    low = cell.strip().lower()
    if not low:
        return "none", ["recompute not given: none assumed"]
    if low.startswith(("none", "no ", "off", "false", "disabled")) or low in ("no", "0"):
        return "none", []
    if "full" in low or re.search(r"checkpoint|\bac\b", low):
        return "full", []
    if low.startswith(("yes", "true", "on", "enabled")) or low == "1":
        return "full", [f"recompute {cell!r}: full recompute assumed (every layer re-runs its forward)"]
    if "sac" in low or "op-level" in low or "per-op" in low or "op " in low or "(op)" in low:
        # torchtitan selective_ac_option "op": layout.recompute op_sac (simtrain.lower.memory.op_sac_linears)
        return "op_sac", []
    if "selective" in low:
        modules, module_notes = recompute_modules_of(cell)
        if "attention" in low or "core" in low or low == "selective" or modules:
            return "selective", module_notes
        return "selective", [f"recompute {cell!r}: simulated as attention-core selective recompute"]
    return "none", [f"recompute {cell!r} not recognised: none assumed"]


# Megatron-core --recompute-modules names (and their spellings in write-ups) -> layout.recompute_modules
_RECOMPUTE_MODULES = (("core_attn", r"core_attn|attention"), ("layernorm", r"layernorm|\bnorm"),
                      ("mla_up_proj", r"mla_up_proj|up_proj"), ("act", r"moe_act|\bact\b|swiglu|activation"))


def recompute_modules_of(cell: str) -> tuple[tuple[str, ...], list[str]]:
    """(layout.recompute_modules, assumptions) named in a selective ``recompute`` cell: () when it names
    none; modules simtrain does not model (Megatron's ``mlp``, ``moe``, ``shared_experts``) are named
    in the assumptions."""
    low = cell.lower()
    found = tuple(m for m, pattern in _RECOMPUTE_MODULES if re.search(pattern, low))
    missing = [m for m in ("mlp", "moe", "shared_experts") if re.search(rf"(?<![\w_]){m}(?![\w_])", low)]
    notes = [f"recompute {cell!r}: {', '.join(missing)} not simulated (kept)"] if missing and found else []
    return found, notes


#: A ZeRO stage written out: "ZeRO-3", "zero3", "ZeRO stage 3", "DeepSpeed stage 2".
_ZERO_STAGE = re.compile(r"\b(?:zero|stage)[\s_-]*(?:stage[\s_-]*)?([0-3])\b")


#: A hybrid-shard group written out: "shard 8", "dp_shard=8", "shard_size 8", "8-way shard".
_SHARD_GROUP = re.compile(r"(?:shard(?:[\s_-]*(?:size|group|degree))?[\s=:]*(\d+))|(?:(\d+)[\s-]*way[\s-]*shard)")


#: Two degrees multiplied, as torchtitan names HSDP's mesh: (dp_replicate, dp_shard), "2x64".
_TWO_DEGREES = re.compile(r"(\d+)\s*[x\u00d7*]\s*(\d+)")


def parse_sharding(cell: str, stack: SoftwareStack, dp: int | None = None) -> tuple[dict[str, Any], list[str]]:
    """Layout fields (fsdp / zero_stage / fsdp_shard_size) for a ``zero_fsdp`` cell, and the assumptions made.

    ``dp``: the row's data-parallel degree, which a hybrid-shard group must divide.
    """
    low = cell.strip().lower()
    if not low:
        if stack.zero_stage:
            return {"zero_stage": stack.zero_stage}, [f"zero_fsdp not given: stack {stack.name} default ZeRO-"
                                                      f"{stack.zero_stage} (distributed optimizer)"]
        return {}, []
    notes = []
    if "float8 all-gather" in low:
        notes.append("FSDP float8 all-gather not modelled (parameters gathered in bf16)")
    if "hybrid" in low or "hsdp" in low:
        return _hybrid_shard(cell, low, dp, notes)
    if "shard_grad_op" in low:
        return {"zero_stage": 2}, notes
    if "fsdp" in low or "full_shard" in low or "zero-infinity" in low or "zero++" in low:
        return {"fsdp": "full"}, notes
    if stage := _ZERO_STAGE.search(low):
        n = int(stage.group(1))
        return ({"fsdp": "full"} if n == 3 else {"zero_stage": n}), notes
    if "distributed optimizer" in low:
        return {"zero_stage": 1}, notes
    if "ddp" in low or "none" in low or low in ("no", "off", "0"):
        return {}, notes
    return {"zero_stage": stack.zero_stage}, [f"zero_fsdp {cell!r} not recognised: stack default "
                                              f"ZeRO-{stack.zero_stage}"]


def _hybrid_shard(cell: str, low: str, dp: int | None, notes: list[str]) -> tuple[dict[str, Any], list[str]]:
    """HSDP / hybrid shard: parameters sharded within groups of the size the cell names, replicated across."""
    size: int | None = None
    if named := _SHARD_GROUP.search(low):
        size = int(named.group(1) or named.group(2))
    elif pair := _TWO_DEGREES.search(low):
        size = int(pair.group(2))
        notes.append(f"zero_fsdp {cell!r}: read as replicate {pair.group(1)} x shard {size} (torchtitan's "
                     "(dp_replicate, dp_shard) mesh order)")
    if size is None or (dp is not None and (size > dp or dp % size)):
        why = "group size not given" if size is None else f"shard group {size} does not divide dp={dp}"
        notes.append(f"zero_fsdp {cell!r}: hybrid shard {why}; full shard simulated")
        return {"fsdp": "full"}, notes
    if size == dp:
        return {"fsdp": "full"}, notes
    return {"fsdp": "hybrid", "fsdp_shard_size": size}, notes


def is_visible(row: dict[str, str]) -> bool:
    """Rows counted in the accuracy targets: ``simulatable`` = yes or mostly."""
    return text(row, "simulatable").startswith(("yes", "mostly"))

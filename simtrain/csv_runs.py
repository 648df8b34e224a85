"""Published-run CSV rows -> RunConfig: robust parsing of the free-text cells, every gap named.

A row of ``published_runs.csv`` (columns described in ``validation/README.md``) becomes a
:class:`ParsedRow`: the RunConfig to simulate (or the missing field that makes it not simulatable),
the measured step time and peak memory, and the list of assumptions made to fill gaps. Nothing is
guessed silently: every default taken, every free-text cell read loosely, every GPU, framework or
recipe mapped to a nearest documented profile is one line in ``assumptions``.

Numeric cells may hold text ("2M (approx)", "up to 147", "47 (README: ...)"): the first number is
read and, when the cell held more than a number, an assumption says so.

Beyond ``published_runs.csv``'s columns, an optional ``cpu_offload_layers`` column gives the
transformer layers whose activations the run offloaded to CPU memory (Megatron
``cpu_offloading_num_layers``; ``layout.offload_activation_layers``).
"""

from __future__ import annotations

import csv
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any

from pydantic import ValidationError

from simtrain.config import RunConfig
from simtrain.errors import ConfigError, Problem, pydantic_problems
from simtrain.limits import (
    MAX_BATCH_TOKENS,
    MAX_GPUS,
    MAX_HEADS,
    MAX_LAYERS,
    MAX_MICRO_BATCH,
    MAX_SEQ_LEN,
    MAX_VOCAB,
    MAX_WIDTH,
)
from simtrain.model import ModelSpec, list_presets, preset
from simtrain.stacks import SoftwareStack, stack_from_text

#: Columns a file must have to be read at all (everything else is optional).
REQUIRED_COLUMNS = ("run_id",)

#: The largest value of each integer column (``simtrain.limits``): a cell past it is a typo, and the row
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


@dataclass(slots=True)
class ParsedRow:
    """One CSV row turned into what the simulator and the comparison need.

    Times in seconds, memory in bytes. ``run`` is None when the row is not simulatable.
    """

    run_id: str
    source: str
    gpu_type: str
    n_gpus: int | None
    run: RunConfig | None
    status: str
    assumptions: list[str] = field(default_factory=list)
    measured_step_time_s: float | None = None
    measured_peak_mem_bytes: float | None = None
    measured_tokens_per_s_per_gpu: float | None = None
    source_mfu_pct: float | None = None
    source_hfu_pct: float | None = None
    peak_tflops_used: float | None = None
    flop_convention: str | None = None
    visible: bool = False


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


# ---- cells --------------------------------------------------------------------------------------

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
        raise ConfigError(Problem(col, f"{row.get(col)!r} is not valid; at most {limit:,} (simtrain.limits: no real "
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


# ---- source, GPU, precision, recompute ------------------------------------------------------------

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


def parse_precision(cell: str, stack: SoftwareStack, has_fp8: bool) -> tuple[str, str, list[str]]:
    """(precision, fp8 recipe, assumptions) for a free-text ``precision`` cell."""
    low = cell.strip().lower()
    notes: list[str] = []
    if not low:
        return "bf16", stack.fp8_recipe, ["precision not given: bf16 assumed"]
    if re.search(r"fp4|float4", low):
        if not has_fp8:
            return "bf16", stack.fp8_recipe, [f"precision {cell!r} on a GPU without FP8 or FP4: bf16 simulated"]
        # NVFP4 recipes (Megatron-Bridge / Transformer Engine) quantise in 16-element blocks; the nearest
        # modelled precision is block-scaled FP8, which misses FP4's doubled tensor-core rate
        return "fp8", "blockwise", [f"precision {cell!r}: FP4 simulated as block-scaled FP8 (FP4 tensor-core "
                                    "rate not modelled: expect the prediction to be too slow)"]
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
        # torchtitan selective_ac_option "op": layout.recompute op_sac (simtrain.memory.op_sac_linears)
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


# ---- the model ------------------------------------------------------------------------------------

# Touvron et al. 2023; Llama 3 herd 2024: SwiGLU, RMSNorm, RoPE, untied, no biases. Modern MoE families
# (Mixtral, DBRX, DeepSeek, Qwen-MoE, Kimi) build their blocks the same way (Jiang et al. 2024 Mixtral
# sec. 2; DeepSeek-V3 report sec. 2.1).
_LLAMA_STYLE: Mapping[str, Any] = MappingProxyType(dict(activation="swiglu", norm="rmsnorm", position="rope",
                                                        tied_embeddings=False, linear_bias=False))


def _family(name: str) -> dict[str, Any]:
    """Architecture defaults of a model family named in the ``model`` cell (documented per family)."""
    low = name.lower()
    if "llama" in low or "mistral" in low or "qwen" in low:
        return dict(_LLAMA_STYLE)
    if "mpt" in low:
        # llm-foundry MPT yamls (validation README): GELU 4h, LayerNorm without bias, ALiBi, tied, no biases
        return dict(activation="gelu", norm="layernorm", position="alibi", tied_embeddings=True, linear_bias=False)
    if "bloom" in low:
        # BLOOM paper (BigScience 2022): GELU, LayerNorm, ALiBi, tied embeddings, biases
        return dict(activation="gelu", norm="layernorm", position="alibi", tied_embeddings=True, linear_bias=True)
    if "nemotron" in low:
        # Nemotron-4 report (2024): squared-ReLU MLP (two matrices, costed as GELU), LayerNorm, RoPE, untied
        return dict(activation="gelu", norm="layernorm", position="rope", tied_embeddings=False, linear_bias=False)
    # GPT-2/3 and the Megatron GPT family: GELU, LayerNorm, learned positions, tied, biases
    return dict(activation="gelu", norm="layernorm", position="learned", tied_embeddings=True, linear_bias=True)


def _norm_name(name: str) -> str:
    return re.sub(r"[^a-z0-9.]", "", name.lower().replace("llama-", "llama"))


#: The architecture columns a dense model needs (n_kv_heads is optional).
ARCH_COLUMNS = ("n_layers", "hidden", "n_heads", "ffn_hidden", "vocab")


def build_model(row: dict[str, str], seq_len: int, notes: list[str]) -> ModelSpec:
    """The ModelSpec of a row: a preset whose shape matches the architecture columns (their values win
    where they differ), else the columns with the family defaults of the model name."""
    name = row.get("model", "") or "model"
    if text(row, "moe_experts") or text(row, "moe_topk"):
        return _with_mtp(_moe_model(row, name, notes), name, notes)
    dims = {}
    for col in ARCH_COLUMNS:
        value = count(row, col, notes)
        if value is None:
            return _preset_by_name(name, col, _given_dims(row), seq_len, notes)
        dims[col] = value
    kv_text = text(row, "n_kv_heads")
    kv = integer(row, "n_kv_heads", notes) if kv_text and kv_text[0].isdigit() else None
    base = _matching_preset(name, dims, kv)
    fields: dict[str, Any]
    if base is not None:
        fields = base.model_dump()
        changed = [f"{k} {fields[k]}->{v}" for k, v in dims.items() if fields[k] != v]
        notes.append(f"model: preset {base.name}" + (f" with the row's {', '.join(changed)}" if changed else ""))
        fields.update(dims)
    else:
        fam = _family(name)
        notes.append(f"model {name!r}: built from the architecture columns with family defaults "
                     f"({fam['activation']}, {fam['norm']}, {fam['position']} positions, "
                     f"{'tied' if fam['tied_embeddings'] else 'untied'} embeddings"
                     f"{', biases' if fam['linear_bias'] else ''})")
        fields = {"name": name, **dims, **fam}
        if kv is None and not kv_text:
            notes.append("n_kv_heads not given: multi-head attention (= n_heads) assumed")
    fields["n_kv_heads"] = kv if kv is not None else fields.get("n_kv_heads")
    fields["max_position"] = max(int(fields.get("max_position") or 0), seq_len)
    return _model_spec(fields)


def _model_spec(fields: dict[str, Any]) -> ModelSpec:
    """The ModelSpec of a row's fields; a ConfigError naming the ``model.`` field that is invalid."""
    try:
        return ModelSpec(**fields)
    except ValidationError as exc:
        raise ConfigError(pydantic_problems(exc, "model.")) from None


def _given_dims(row: dict[str, str]) -> dict[str, int]:
    """The architecture columns a row gives (blank or unreadable ones left out)."""
    scratch: list[str] = []
    return {c: v for c in ARCH_COLUMNS if (v := integer(row, c, scratch)) is not None}


def _preset_by_name(name: str, missing: str, given: dict[str, int], seq_len: int, notes: list[str]) -> ModelSpec:
    """The preset the model cell names, for a row without all its architecture columns, when the columns
    it gives agree with it (``missing`` is the first absent one: NotSimulatable when no preset has that
    name, punctuation and case aside, or a given column disagrees)."""
    want = _loose(name)
    for key in list_presets():
        m = preset(key)
        if _loose(key) == want and all(getattr(m, c) == v for c, v in given.items()):
            notes.append(f"model: preset {key} by its name ({missing} and other architecture columns not given)"
                         if given else f"model: preset {key} by its name (architecture columns not given)")
            return m.model_copy(update={"max_position": max(m.max_position or 0, seq_len)})
    raise NotSimulatable(missing, f"architecture column missing and no preset named {name!r} matches the others")


def _matching_preset(name: str, dims: dict[str, int], kv: int | None) -> ModelSpec | None:
    """The preset with the row's layers, hidden and heads (and kv heads when given); the name breaks ties."""
    want = _norm_name(name)
    best: tuple[int, ModelSpec] | None = None
    for key in list_presets():
        m = preset(key)
        if m.moe is not None or (m.n_layers, m.hidden, m.n_heads) != (dims["n_layers"], dims["hidden"], dims["n_heads"]):
            continue
        if kv is not None and m.kv_heads != kv:
            continue
        score = 2 if _norm_name(key) == want else 1 if _norm_name(key) in want or want in _norm_name(key) else 0
        if best is None or score > best[0]:
            best = (score, m)
    return None if best is None else best[1]


def _moe_model(row: dict[str, str], name: str, notes: list[str]) -> ModelSpec:
    """MoE rows: the preset named by the model cell (MoE presets carry routing details the CSV lacks)."""
    want = _norm_name(name)
    for key in list_presets():
        m = preset(key)
        if m.moe is None:
            continue
        k = _norm_name(key)
        if k == want or k in want or want.replace("_", "") in k or _loose(k) == _loose(want):
            notes.append(f"model: MoE preset {key} (routing, shared experts and dense layers from its HF config)")
            return m
    return _moe_from_columns(row, name, notes)


#: The columns a MoE model without a preset is built from (ffn_hidden and n_kv_heads are optional).
MOE_COLUMNS = ("n_layers", "hidden", "n_heads", "vocab", "moe_experts", "moe_topk", "moe_ffn_hidden")


def _moe_from_columns(row: dict[str, str], name: str, notes: list[str]) -> ModelSpec:
    """A MoE model no preset names, from the architecture and MoE columns: every layer MoE, no shared
    experts, Llama-style blocks (each assumption named)."""
    dims: dict[str, int] = {}
    for col in MOE_COLUMNS:
        value = count(row, col, notes)
        if value is None:
            raise NotSimulatable(col, f"no MoE preset matches {name!r} and the {col} column is blank")
        dims[col] = value
    kv = integer(row, "n_kv_heads", notes) if text(row, "n_kv_heads")[:1].isdigit() else None
    ffn = count(row, "ffn_hidden", notes) or dims["moe_ffn_hidden"]
    notes.append(f"model {name!r}: no MoE preset; built from the architecture and MoE columns (every layer MoE, "
                 "no shared experts, SwiGLU experts, RMSNorm, RoPE, untied embeddings, no biases"
                 f"{'' if kv is not None else ', multi-head attention'})")
    fields = dict(name=name, n_layers=dims["n_layers"], hidden=dims["hidden"], n_heads=dims["n_heads"],
                  n_kv_heads=kv, ffn_hidden=ffn, vocab=dims["vocab"], **_LLAMA_STYLE,
                  moe=dict(n_experts=dims["moe_experts"], top_k=dims["moe_topk"], ffn_hidden=dims["moe_ffn_hidden"]))
    return _model_spec(fields)


#: Multi-token prediction named in a model cell (Megatron-Bridge: "DeepSeekV3 (w/o MTP)", "(w/ MTP)").
_NO_MTP = re.compile(r"\b(?:w/o|without|no)\s*mtp\b")
_MTP = re.compile(r"\b(?:w/|with)\s*mtp\b")


def _with_mtp(model: ModelSpec, name: str, notes: list[str]) -> ModelSpec:
    """The model with the MTP depth its cell states: none for "w/o MTP", the preset's (at least 1) for
    "w/ MTP"; unchanged when the cell says nothing."""
    low = name.lower()
    if _NO_MTP.search(low) and model.mtp_depth:
        notes.append(f"model {name!r}: multi-token prediction off (preset depth {model.mtp_depth})")
        return model.model_copy(update={"mtp_depth": 0})
    if _MTP.search(low) and not model.mtp_depth:
        notes.append(f"model {name!r}: one multi-token prediction module (DeepSeek-V3's depth)")
        return model.model_copy(update={"mtp_depth": 1})
    return model


def _loose(name: str) -> str:
    return re.sub(r"[^a-z0-9]", "", name.lower().split("(")[0])


# ---- the row ------------------------------------------------------------------------------------

def parse_row(row: dict[str, str]) -> ParsedRow:
    """Turn one CSV row into a ParsedRow; a missing needed field gives status ``not simulatable: <field>``,
    an inconsistent row ``error: <message>``. Never raises for bad cells."""
    notes: list[str] = []
    run_id = row.get("run_id", "") or "?"
    gpu, node, gpu_note = parse_gpu(row.get("gpu", "") or "")
    out = ParsedRow(run_id=run_id, source=source_label(row), gpu_type=gpu, n_gpus=None, run=None, status="ok",
                    assumptions=notes, visible=is_visible(row))
    if gpu_note:
        notes.append(gpu_note)
    out.flop_convention = " ".join(filter(None, (row.get("flop_convention"), row.get("tflops_kind")))) or None
    try:
        _measured(row, out, notes)
        out.n_gpus = count(row, "n_gpus", notes)
        out.run = _run_config(row, out, gpu, node, notes)
    except NotSimulatable as exc:
        out.status = f"not simulatable: {exc.field}"
    except ConfigError as exc:
        out.status = "error: " + "; ".join(str(p) for p in exc.problems)
    except (ValueError, ArithmeticError) as exc:  # a malformed cell the checks above did not foresee
        out.status = f"error: {exc}"
    return out


def _measured(row: dict[str, str], out: ParsedRow, notes: list[str]) -> None:
    """The row's measured values; a zero, negative or infinite time, memory or throughput is a
    ConfigError naming the column (the row becomes an error row, not a wild percentage error)."""
    for col in _POSITIVE_COLUMNS:
        value = number(row, col, [])
        if value is not None and not (0 < value < math.inf):
            raise ConfigError(Problem(col, f"{row.get(col)!r} is not valid; a positive measured value (or blank)"))
    out.measured_step_time_s = number(row, "step_time_s", notes)
    mem_gib = number(row, "peak_mem_gib", notes)
    out.measured_peak_mem_bytes = mem_gib * 1024.0**3 if mem_gib else None
    out.measured_tokens_per_s_per_gpu = number(row, "tokens_per_s_per_gpu", notes)
    out.source_mfu_pct = number(row, "mfu_pct", notes)
    out.source_hfu_pct = number(row, "hfu_pct", notes)
    out.peak_tflops_used = number(row, "peak_tflops_used", notes)


def _run_config(row: dict[str, str], out: ParsedRow, gpu: str, node: str, notes: list[str]) -> RunConfig:
    from simtrain.hardware_load import load_gpu, load_node
    from simtrain.load import load_config

    stack, stack_note = stack_from_text(row.get("framework"), row.get("source"))
    if stack_note:
        notes.append(stack_note)
    if out.n_gpus is None:
        out.n_gpus = _smallest_world(row, notes)
    seq = count(row, "seq_len", notes)
    if seq is None:
        raise NotSimulatable("seq_len")
    model = build_model(row, seq, notes)
    layout = _layout(row, stack, out.n_gpus, notes)
    train = _train(row, stack, layout, seq, load_gpu(gpu).has_fp8, notes)
    if model.activation == "gelu" and re.search(r"mpt|bloom", (row.get("model") or "").lower()):
        train["dropout"] = False
        notes.append("dropout off (MPT and BLOOM train without dropout)")
    hardware = _hardware(row, gpu, node, load_node(node).gpus_per_node, out.n_gpus, notes)
    return load_config({"name": out.run_id, "model": model, "hardware": hardware, "layout": layout,
                        "train": train})


def _smallest_world(row: dict[str, str], notes: list[str]) -> int:
    """The GPU count of a row that gives its layout but not ``n_gpus``: tp x pp x cp x dp, with dp the
    row's or the fewest that hold its expert parallelism (ep / cp: experts fold over dp x cp with
    expert TP 1), named in the assumptions; NotSimulatable without tp and pp."""
    tp, pp = count(row, "tp", notes), count(row, "pp", notes)
    if tp is None or pp is None:
        raise NotSimulatable("n_gpus", "neither the GPU count nor the layout (tp, pp) is given")
    cp, ep = count(row, "cp", notes) or 1, count(row, "ep", notes) or 1
    dp = count(row, "dp", notes) or max(1, -(-ep // cp))
    n = tp * pp * cp * dp
    notes.append(f"n_gpus not given: {n} assumed, the smallest world that holds the layout "
                 f"(tp {tp} x pp {pp} x cp {cp} x dp {dp})")
    return n


def _layout(row: dict[str, str], stack: SoftwareStack, n_gpus: int, notes: list[str]) -> dict[str, Any]:
    cp = count(row, "cp", notes) or 1
    ep = count(row, "ep", notes) or 1
    dp = count(row, "dp", notes)
    tp = count(row, "tp", notes)
    pp = count(row, "pp", notes)
    if tp is None:
        tp = _missing_degree("tp", n_gpus, (pp or 1) * cp, dp, notes)
    if pp is None:
        pp = _missing_degree("pp", n_gpus, tp * cp, dp, notes)
    derived = n_gpus // (tp * pp * cp) if n_gpus % (tp * pp * cp) == 0 else None
    if dp is None or (derived is not None and dp != derived):
        if derived is None:
            raise NotSimulatable("dp", f"n_gpus={n_gpus} is not a multiple of tp*pp*cp={tp * pp * cp}")
        if dp is not None:
            notes.append(f"dp {dp} inconsistent with n_gpus/(tp*pp*cp) = {derived}; {derived} used")
        dp = derived
    lay: dict[str, Any] = {"tp": tp, "pp": pp, "cp": cp, "dp": dp, "ep": ep}
    lay.update(_expert_tp(tp, cp * dp, ep, notes))
    said = f"{text(row, 'framework')} {text(row, 'notes')}"
    if ep > 1 and re.search(r"deep-?ep|hybrid-?ep", said):
        lay["ep_dispatcher"] = "deepep"
        notes.append("DeepEP/HybridEP named: tokens cross the network once per remote node (ep_dispatcher deepep)")
    if ep > 1 and re.search(r"a2a[ _-]?overlap|\b(?:ep|all-?to-?all)[ _-]?(?:comm[ _-]?)?overlap", said):
        lay["ep_comm_overlap"] = True
        notes.append("all-to-all overlap named (Megatron moe_a2a_overlap): dispatch and combine overlapped with "
                     "computation (ep_comm_overlap)")
    vp = integer(row, "vp", notes)
    framework = text(row, "framework")
    if vp and vp > 1:
        lay["vpp"] = vp
    if "interleaved" in framework:
        lay["schedule"] = "interleaved_1f1b"
        if not vp or vp == 1:
            lay["vpp"] = 2
            notes.append("interleaved 1F1B without a VP degree: 2 stages per rank assumed (torchtitan default)")
    elif "1f1b" in framework:
        lay["schedule"] = "1f1b"
    sp = text(row, "seq_parallel")
    if sp in ("on", "yes", "true", "1"):
        # Megatron-LM turns sequence parallelism off at TP 1, where it has nothing to split (arguments.py)
        lay["sequence_parallel"] = tp > 1
        if tp == 1:
            notes.append("seq_parallel on at tp 1: a no-op (Megatron turns it off)")
    elif sp in ("off", "no", "false", "0"):
        lay["sequence_parallel"] = False
    else:
        lay["sequence_parallel"] = stack.sequence_parallel and tp > 1
        if tp > 1:
            notes.append(f"seq_parallel not given: {'on' if lay['sequence_parallel'] else 'off'} (stack {stack.name})")
    lay.update(_recompute(row, stack, lay, notes))
    lay.update(_offload(row, notes))
    shard, shard_notes = parse_sharding(row.get("zero_fsdp", "") or "", stack, lay.get("dp"))
    lay.update(shard)
    notes.extend(shard_notes)
    if tp > 1:
        lay["tp_comm_overlap"] = _tp_overlap(row, stack, notes)
    return lay


def _offload(row: dict[str, str], notes: list[str]) -> dict[str, Any]:
    """Layout fields for the optional ``cpu_offload_layers`` column (Megatron ``cpu_offloading_num_layers``:
    transformer layers whose activations are offloaded to CPU memory); blank or absent: none."""
    layers = integer(row, "cpu_offload_layers", notes)
    if layers is None or layers == 0:
        return {}
    if layers < 0:
        raise ConfigError(Problem("cpu_offload_layers", f"{layers}: must be a layer count >= 0 (or blank)"))
    notes.append(f"activations of the first {layers} layers offloaded to CPU memory (cpu_offload_layers)")
    return {"offload_activation_layers": layers}


def _missing_degree(col: str, n_gpus: int, others: int, dp: int | None, notes: list[str]) -> int:
    """A blank tp or pp: what the GPU count leaves for it once dp and the other degrees are given, else 1."""
    if dp is not None and n_gpus % (others * dp) == 0:
        degree = n_gpus // (others * dp)
        notes.append(f"{col} not given: {degree} = n_gpus / the other degrees")
        return degree
    notes.append(f"{col} not given: 1 assumed")
    return 1


def _expert_tp(tp: int, data: int, ep: int, notes: list[str]) -> dict[str, Any]:
    """``{"etp": 1}`` when the row's EP does not fold over a stage with expert TP = tp (Megatron's default)
    but does with expert TP 1: Megatron-core's MoE parallel folding sets expert TP apart from attention
    TP (Liu et al. 2025, arXiv 2504.14960), and published Megatron MoE layouts such as TP2 EP32 over
    32 ranks per stage run ETP 1 (NVIDIA Megatron-MoE-ModelZoo best_practice/Qwen3 table)."""
    plane = tp * data
    if ep <= 1 or tp <= 1 or plane % (ep * tp) == 0 or plane % ep != 0:
        return {}
    notes.append(f"expert TP not given: ep x tp = {ep} x {tp} does not fold over tp x cp x dp = {plane}; "
                 "etp 1 assumed (Megatron MoE parallel folding)")
    return {"etp": 1}


#: A FLOP convention that counts the activation-recompute forward (Narayanan et al. SC'21:
#: 96BslH^2(1 + s/6h + V/16lh) "incl. activation-recompute forward"): the run recomputed.
_COUNTS_RECOMPUTE = r"(?<!no )(?:incl\.?|includes|counts?|counted)\s+(?:the\s+)?(?:activation[- ])?recompute"


def _recompute(row: dict[str, str], stack: SoftwareStack, lay: dict[str, Any],
                notes: list[str]) -> dict[str, Any]:
    """Layout fields for the ``recompute`` cell; a blank cell in a row whose FLOP convention counts the
    recompute forward is full recompute (named), else none."""
    cell = row.get("recompute", "") or ""
    said = f"{text(row, 'flop_convention')} {text(row, 'tflops_kind')}"
    if _blank(cell) and re.search(_COUNTS_RECOMPUTE, said):
        notes.append("recompute not given: full assumed (the row's FLOP convention counts the recompute forward)")
        return {"recompute": "full"}
    recompute, rec_notes = parse_recompute(cell, stack.name)
    notes.extend(rec_notes)
    if recompute == "full":
        return {"recompute": "full", **_recomputed_share(row, cell, lay, notes)}
    modules = recompute_modules_of(cell)[0]
    return {"recompute": recompute, **({"recompute_modules": modules} if recompute == "selective" and modules else {})}


def _pipeline_chunks(lay: dict[str, Any]) -> int:
    """Model chunks over the pipeline: pp stages x virtual stages per rank."""
    return int(lay["pp"] * (lay.get("vpp") or 1))


def _recomputed_share(row: dict[str, str], cell: str, lay: dict[str, Any], notes: list[str]) -> dict[str, Any]:
    """``recompute_layers`` for a full-recompute cell that names part of the layers: "every 2nd layer"
    (torchtitan's ``selective_ac_option`` = 2), "12 of 48 layers", "4 layers per stage" (Megatron's
    ``--recompute-num-layers`` with the block method: per pipeline-stage chunk)."""
    low = cell.lower()
    if "uniform" in low:  # Megatron's uniform method: every layer, checkpointed in groups of N
        return {}
    per_chunk = -(-(count(row, "n_layers", []) or 0) // _pipeline_chunks(lay))
    if every := re.search(r"every\s*(?:(\d+)(?:st|nd|rd|th)?|other)\s*layers?", low):
        share = 1 / int(every.group(1) or 2)
    elif part := re.search(r"(\d+)\s*(?:/|of)\s*(\d+)\s*layers?", low):
        share = int(part.group(1)) / max(int(part.group(2)), 1)
    elif fixed := re.search(r"(\d+)\s*layers?", low):
        notes.append(f"recompute {cell!r}: {fixed.group(1)} layers of each pipeline-stage chunk (Megatron's "
                     "--recompute-num-layers, block method)")
        return {"recompute_layers": int(fixed.group(1))}
    else:
        return {}
    if not per_chunk:
        notes.append(f"recompute {cell!r}: n_layers not given; every layer recomputed")
        return {}
    layers = min(per_chunk, max(0, round(share * per_chunk)))
    notes.append(f"recompute {cell!r}: {layers} of each chunk's {per_chunk} layers recomputed")
    return {"recompute_layers": layers}


def _tp_overlap(row: dict[str, str], stack: SoftwareStack, notes: list[str]) -> bool:
    framework = text(row, "framework")
    if "asynctp" in framework or "async tp" in framework:
        return True
    if "vanillatp" in framework or "vanilla tp" in framework:
        return False
    if "tp-comm-overlap" in text(row, "notes"):
        return True
    notes.append(f"TP comm overlap not stated: {'on' if stack.tp_comm_overlap else 'off'} (stack {stack.name})")
    return stack.tp_comm_overlap


def _train(row: dict[str, str], stack: SoftwareStack, lay: dict[str, Any], seq: int, has_fp8: bool,
           notes: list[str]) -> dict[str, Any]:
    gbs = count(row, "global_batch_seqs", notes)
    if gbs is None:
        tokens = count(row, "global_batch_tokens", notes)
        if tokens is None:
            raise NotSimulatable("global_batch_seqs")
        gbs = max(tokens // seq, 1)
    mbs = count(row, "micro_batch", notes)
    if mbs is None:
        mbs = 1
        notes.append("micro_batch not given: 1 assumed")
    stages = _pipeline_chunks(lay)
    if stack.pp_microbatches_equal_pp and lay["pp"] > 1 and mbs % stages == 0:
        notes.append(f"micro_batch {mbs} is the local batch; split into {stages} micro-batches of "
                     f"{mbs // stages}, one per pipeline stage (torchtitan pipeline_parallel_microbatches default)")
        mbs //= stages
    precision, recipe, prec_notes = parse_precision(row.get("precision", "") or "", stack, has_fp8)
    notes.extend(prec_notes)
    train: dict[str, Any] = {"seq_len": seq, "micro_batch_size": mbs, "global_batch_seqs": gbs,
                             "precision": precision, "stack": stack.name,
                             "attention_kernel": "unfused" if stack.attention == "unfused" else "flash"}
    if precision == "fp8":
        train["fp8_recipe"] = recipe
    if "pure" in text(row, "zero_fsdp"):
        train["grad_dtype"] = "bf16"  # Composer mixed_precision=PURE reduces gradients in bf16
    return train


def _gpus_per_node(n_gpus: int, node_gpus: int) -> int | None:
    """GPUs used per node: all of them when ``n_gpus`` fills whole nodes; all ``n_gpus`` on one node when
    they fit in one; on a rack-scale NVLink domain (GB200 NVL72: 18 trays of 4 GPUs), the fewest domains
    that hold them, filled equally in whole trays (64 GPUs of a rack; 128 as 2 x 64). None otherwise."""
    if n_gpus % node_gpus == 0:
        return node_gpus
    if n_gpus < node_gpus:
        return n_gpus
    if node_gpus > 8:
        # the fewest domains d >= n / node_gpus that split n_gpus into equal whole trays is the largest
        # multiple of 4 GPUs per domain, at most node_gpus, that divides n_gpus: at most node_gpus / 4 tries
        for per_domain in range(node_gpus - node_gpus % 4, 0, -4):
            if n_gpus % per_domain == 0:
                return per_domain
    return None


def _used_per_node(row: dict[str, str], node: str, node_gpus: int, n_gpus: int, notes: list[str]) -> int:
    """GPUs per node the row runs on: its ``gpus_per_node`` when smaller nodes of the same GPU (4-GPU
    A100/H100 nodes of many HPC centres), else ``_gpus_per_node``; every departure from the node profile
    named in ``notes``."""
    gpn = count(row, "gpus_per_node", notes)
    if gpn is not None and gpn < node_gpus <= 8 and n_gpus % gpn == 0:
        used: int | None = gpn
        notes.append(f"gpus_per_node {gpn}: nodes of {gpn} GPUs, as node profile {node} with {gpn} of its "
                     f"{node_gpus} GPUs and their NICs")
    else:
        if gpn is not None and gpn != node_gpus:
            notes.append(f"gpus_per_node {gpn}: the NVLink domain of node profile {node} is {node_gpus} GPUs"
                         + (f" ({gpn} is a compute tray's)" if node_gpus > 8 and node_gpus % gpn == 0 else ""))
        used = _gpus_per_node(n_gpus, node_gpus)
    if used is None:
        raise NotSimulatable("n_gpus", f"{n_gpus} is not a whole number of {node_gpus}-GPU nodes")
    if used != node_gpus and used != gpn:
        notes.append(f"n_gpus {n_gpus} on {node} nodes of {node_gpus}: {n_gpus // used} node(s) of {used} GPUs "
                     "each assumed" + (" (whole 4-GPU trays per NVLink domain)" if node_gpus > 8 else ""))
    return used


def _hardware(row: dict[str, str], gpu: str, node: str, node_gpus: int, n_gpus: int,
              notes: list[str]) -> dict[str, Any]:
    from simtrain.hardware_load import load_node

    hw: dict[str, Any] = {"node": node}
    if load_node(node).gpu.name != gpu:
        hw["gpu"] = gpu
    used = _used_per_node(row, node, node_gpus, n_gpus, notes)
    if used != node_gpus:
        hw["gpus_per_node"] = used
    hw["n_nodes"] = n_gpus // used
    inter = text(row, "inter_node")
    match = re.search(r"(\d+(?:\.\d+)?)\s*gb(?:it)?(?:p|/)s", inter)
    if match and "per node" in inter:
        hw["nic_Gbps"] = float(match.group(1)) / used
        hw["nics_per_node"] = used
        notes.append(f"inter_node {inter!r}: {used} NICs of {hw['nic_Gbps']:g} Gb/s per node assumed")
    elif match:
        hw["nic_Gbps"] = float(match.group(1))
    elif "omni-path" in inter or "opa" in inter:
        links = re.search(r"(\d+)\s*opa", inter)
        hw["nics_per_node"] = int(links.group(1)) if links else 4
        hw["nic_Gbps"] = 100.0  # Intel Omni-Path 100 Series: 100 Gb/s per port
        notes.append(f"inter_node {inter!r}: {hw['nics_per_node']} x 100 Gb/s Omni-Path ports, modelled as NICs")
    elif hw["n_nodes"] > 1:
        notes.append(f"inter_node not given: node profile {node} NICs")
    if "roce" in inter:
        notes.append("RoCE assumed to reach InfiniBand per-NIC bandwidth")
    return hw

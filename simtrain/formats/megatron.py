"""Megatron-LM / NeMo command-line arguments to and from a RunConfig.

``read_megatron`` takes the text of a launch script (``--flag value`` pairs as pasted, with ``\\`` line
continuations, ``#`` comments, ``NAME=value`` shell variables used as ``$NAME``/``${NAME}``, and the
``torchrun`` flags before the training script) and maps every flag it knows onto RunConfig's fields;
the rest are listed in ``Imported.unknown`` (not fatal). Writing is ``simtrain.formats.megatron_export``.

Flag names, defaults and meanings are Megatron-LM's ``megatron/training/arguments.py`` (NVIDIA/Megatron-LM,
core_r0.13): the FFN width defaults to 4h (SwiGLU: int(8h/3 / 64) * 64), ``--group-query-attention``
enables ``--num-query-groups``, ``--moe-layer-freq`` is an int or a Python list expression (``[0]*3+[1]*58``),
``--overlap-grad-reduce``/``--overlap-param-gather`` are off unless given, dropout defaults to 0.1,
``--recompute-method block`` recomputes the first ``--recompute-num-layers`` layers of each stage chunk
while ``uniform`` recomputes every layer. The vocabulary is padded to a multiple of
``--make-vocab-size-divisible-by`` (128) x TP (``megatron/training/tokenizer/tokenizer.py``
``_vocab_size_with_padding``).
"""

from __future__ import annotations

import math
import re
import shlex
from collections.abc import Callable
from pathlib import Path
from typing import Any

from simtrain.formats.common import (
    Imported,
    base_data,
    data_parallel,
    finish,
    hardware_data,
    merge,
    model_layers,
    read_text,
    world_size,
)
from simtrain.spec.config import RunConfig
from simtrain.spec.errors import ConfigError, Problem, problem

__all__ = ["parse_args", "read_megatron", "read_megatron_file"]

#: Flags that never take a value (store_true / store_false in arguments.py, and torchrun's).
SWITCHES = frozenset({
    "--sequence-parallel", "--use-distributed-optimizer", "--tp-comm-overlap", "--overlap-grad-reduce",
    "--overlap-param-gather", "--bf16", "--fp16", "--swiglu", "--untie-embeddings-and-output-weights",
    "--group-query-attention", "--use-flash-attn", "--disable-bias-linear", "--add-qkv-bias", "--qk-layernorm",
    "--use-rotary-position-embeddings", "--multi-latent-attention", "--moe-router-enable-expert-bias",
    "--cross-entropy-loss-fusion", "--grad-reduce-in-bf16", "--cpu-offloading", "--use-torch-fsdp2",
    "--moe-grouped-gemm", "--moe-enable-deepep", "--use-mcore-models",
    "--no-masked-softmax-fusion", "--no-bias-gelu-fusion", "--no-bias-swiglu-fusion", "--no-rope-fusion",
    "--no-gradient-accumulation-fusion", "--use-cpu-initialization", "--mock-data",
    "--no-async-tensor-model-parallel-allreduce", "--standalone", "--no-load-optim", "--no-load-rng",
    "--manual-gc", "--log-throughput", "--overlap-moe-expert-parallel-comm", "--delay-wgrad-compute",
})  # fmt: skip

#: Known flags that change no step time or memory: data, checkpoints, logging, optimizer hyperparameters.
IGNORED_PREFIXES = ("--data-", "--split", "--save", "--load", "--log", "--tensorboard", "--wandb", "--eval",
                    "--lr", "--min-lr", "--weight-decay", "--clip-grad", "--adam-", "--init-method", "--seed",
                    "--train-iters", "--train-samples", "--exit-", "--tokenizer-model", "--vocab-file",
                    "--merge-file", "--norm-epsilon", "--rotary-", "--rope-", "--use-checkpoint", "--ckpt-",
                    "--dist-ckpt", "--distributed-backend", "--timing-", "--profile", "--moe-aux-loss",
                    "--moe-z-loss", "--moe-router-load-balancing", "--moe-router-dtype", "--moe-router-pre-softmax",
                    "--moe-router-score-function", "--moe-router-topk-scaling", "--moe-grouped-gemm",
                    "--moe-permute-fusion", "--attention-softmax-in-fp32", "--no-", "--use-mcore",
                    "--transformer-impl", "--mock-data", "--use-cpu-init", "--manual-gc", "--distributed-timeout",
                    "--standalone", "--master", "--node-rank", "--rdzv", "--position-embedding-type",
                    "--use-rotary-position-embeddings", "--use-flash-attn", "--moe-enable-deepep",
                    "--accumulate-allreduce", "--async-", "--untie-", "--swiglu", "--delay-wgrad",
                    "--overlap-moe-expert", "--moe-shared-expert-overlap")  # fmt: skip

_VAR = re.compile(r"\$\{(\w+)\}|\$(\w+)")
_ASSIGN = re.compile(r"^\s*(?:export\s+)?([A-Za-z_]\w*)=([^\s()]*)\s*$")
_FREQ_TERM = re.compile(r"^\[\s*([01](?:\s*,\s*[01])*)\s*\]\s*\*\s*(\d+)$")
#: ``--recompute-modules`` values and simtrain's ``layout.recompute_modules`` names (the others are not modelled).
RECOMPUTE_MODULES = {"core_attn": "core_attn", "layernorm": "layernorm", "mla_up_proj": "mla_up_proj",
                      "moe_act": "act"}  # fmt: skip


def parse_args(text: str) -> dict[str, list[str]]:
    """``{flag: values}`` of a pasted launch script (last occurrence wins; switches have no values).

    Comments and line continuations are removed, ``NAME=value`` assignments are substituted for
    ``$NAME``/``${NAME}``, ``--flag=value`` is split, a flag's values end at the end of its line, and
    words that follow no flag (``torchrun``, ``pretrain_gpt.py``, array brackets) are dropped.
    """
    variables: dict[str, str] = {}
    lines = []
    for raw in text.replace("\\\n", " ").splitlines():
        try:
            tokens = shlex.split(raw, comments=True)
        except ValueError as exc:
            raise ConfigError(Problem("megatron", f"cannot read the line {raw.strip()!r}: {exc}")) from None
        line = " ".join(shlex.quote(t) for t in tokens)
        match = _ASSIGN.match(line)
        if match:
            variables[match.group(1)] = _VAR.sub(lambda m: variables.get(m.group(1) or m.group(2), m.group(0)),
                                                 match.group(2))  # fmt: skip
            continue
        lines.append(line)
    joined = _VAR.sub(lambda m: variables.get(m.group(1) or m.group(2), m.group(0)), "\n".join(lines))
    out: dict[str, list[str]] = {}
    flag: str | None = None
    tokens = [t for line in joined.splitlines() for t in [*shlex.split(line), "\n"]]
    for token in tokens:
        if token in ("\n", "(", ")"):  # a flag's values end with its line (continuations are joined above)
            flag = None
            continue
        if token == "\\" or token.endswith("=("):
            continue
        if token.startswith("--"):
            name, eq, value = token.partition("=")
            flag = name.replace("_", "-")
            out[flag] = [value] if eq else []
            if flag in SWITCHES:
                flag = None
        elif flag is not None:
            out[flag].append(token)
    return out


class _Args:
    """Typed access to parsed flags; records which flags were used and collects every bad value."""

    def __init__(self, flags: dict[str, list[str]]):
        self.flags = flags
        self.used: set[str] = set()
        self.problems: list[Problem] = []

    def has(self, flag: str) -> bool:
        self.used.add(flag)
        return flag in self.flags

    def text(self, flag: str) -> str | None:
        self.used.add(flag)
        values = self.flags.get(flag)
        if values is None:
            return None
        if len(values) != 1:
            self.problems.append(problem(flag, " ".join(values), "exactly one value"))
            return None
        return values[0]

    def values(self, flag: str) -> list[str]:
        self.used.add(flag)
        return self.flags.get(flag) or []

    def num(self, flag: str, kind: Callable[[str], Any] = int) -> Any:
        raw = self.text(flag)
        if raw is None:
            return None
        try:
            return kind(raw)
        except ValueError:
            self.problems.append(problem(flag, raw, "an integer" if kind is int else "a number"))
            return None


def _moe_layer_freq(raw: str, n_layers: int, args: _Args) -> list[int] | int | None:
    """``--moe-layer-freq``: an int N (every N-th layer) or a 0/1 list, as a literal or ``[0]*3+[1]*58``."""
    text = raw.strip().strip("()").replace(" ", "")
    if text.isdigit():
        return int(text)
    pattern: list[int] = []
    for term in text.split("+"):
        match = _FREQ_TERM.match(term)
        if match:
            pattern += [int(v) for v in match.group(1).split(",")] * int(match.group(2))
        elif re.fullmatch(r"\[[01](,[01])*\]", term):
            pattern += [int(v) for v in term.strip("[]").split(",")]
        else:
            pattern = []
            break
    if len(pattern) != n_layers:
        args.problems.append(problem("--moe-layer-freq", raw, f"an integer, or a 0/1 list of {n_layers} entries "
                                                              "(e.g. [0]*3+[1]*58)"))
        return None
    return pattern


def _pad_vocab(vocab: int, divisible_by: int, tp: int) -> int:
    """Megatron's padded vocabulary: the next multiple of divisible_by x tp (tokenizer.py)."""
    multiple = divisible_by * tp
    return math.ceil(vocab / multiple) * multiple


def _model(args: _Args, base_model: Any, tp: int, notes: list[str]) -> Any:
    """The ``model`` section from the model flags; the base config's model when there are none."""
    if not args.has("--num-layers") and not args.has("--hidden-size"):
        if base_model is None:
            args.problems.append(Problem("--num-layers", "the arguments give no model (--num-layers, --hidden-size, "
                                                         "...); pass --hf-config, a preset (--model) or a base config"))
        return base_model
    n_layers, hidden, heads = args.num("--num-layers"), args.num("--hidden-size"), args.num("--num-attention-heads")
    for flag, value in (("--num-layers", n_layers), ("--hidden-size", hidden), ("--num-attention-heads", heads)):
        if value is None and flag in args.flags:
            continue
        if value is None:
            args.problems.append(Problem(flag, "required model flag is missing"))
    if n_layers is None or hidden is None or heads is None:
        return None
    swiglu = args.has("--swiglu")
    ffn = args.num("--ffn-hidden-size")
    if ffn is None:  # arguments.py: SwiGLU keeps the 4h MLP's parameters, rounded down to a multiple of 64
        ffn = int(4 * hidden * 2 / 3 / 64) * 64 if swiglu else 4 * hidden
    vocab = args.num("--vocab-size")
    tokenizer = args.text("--tokenizer-type")
    if vocab is None and tokenizer == "GPT2BPETokenizer":
        vocab = 50257  # GPT-2's BPE vocabulary (gpt2-vocab.json)
    if vocab is None:
        args.problems.append(Problem("--vocab-size", f"required to size the embedding (tokenizer {tokenizer!r} is "
                                                     "not read); give --vocab-size"))
        return None
    divisible = args.num("--make-vocab-size-divisible-by") or 128
    padded = _pad_vocab(vocab, divisible, tp)
    if padded != vocab:
        notes.append(f"--vocab-size {vocab} padded to {padded} (multiple of {divisible} x TP {tp}, as Megatron does)")
    position = args.text("--position-embedding-type") or "learned_absolute"
    if args.has("--use-rotary-position-embeddings"):
        position = "rope"
    positions = {"learned_absolute": "learned", "rope": "rope", "yarn": "rope", "mrope": "rope", "none": "alibi"}
    if position not in positions:
        args.problems.append(problem("--position-embedding-type", position, f"one of {', '.join(positions)}"))
        position = "rope"
    norm = args.text("--normalization") or "LayerNorm"
    if norm not in ("LayerNorm", "RMSNorm"):
        args.problems.append(problem("--normalization", norm, "LayerNorm or RMSNorm"))
    seq = args.num("--seq-length")
    groups = args.num("--num-query-groups")  # used only with --group-query-attention (arguments.py)
    kv_channels = args.num("--kv-channels")  # default hidden / heads: stored as head_dim None
    model: dict[str, Any] = {
        "name": "megatron", "n_layers": n_layers, "hidden": hidden, "n_heads": heads, "ffn_hidden": ffn,
        "n_kv_heads": groups if args.has("--group-query-attention") else None,
        "head_dim": None if kv_channels == hidden // heads else kv_channels,
        "activation": "swiglu" if swiglu else "gelu",
        "norm": "rmsnorm" if norm == "RMSNorm" else "layernorm", "position": positions[position],
        "vocab": padded, "max_position": args.num("--max-position-embeddings") or seq or 4096,
        "tied_embeddings": not args.has("--untie-embeddings-and-output-weights"),
        "linear_bias": not args.has("--disable-bias-linear"), "qkv_bias": args.has("--add-qkv-bias"),
        "qk_norm": args.has("--qk-layernorm"), "mtp_depth": args.num("--mtp-num-layers") or 0,
    }  # fmt: skip
    if args.has("--multi-latent-attention"):
        model["mla"] = {"q_lora_rank": args.num("--q-lora-rank"), "kv_lora_rank": args.num("--kv-lora-rank") or 512,
                        "qk_nope_head_dim": args.num("--qk-head-dim") or 128,
                        "qk_rope_head_dim": args.num("--qk-pos-emb-head-dim") or 64,
                        "v_head_dim": args.num("--v-head-dim") or 128}  # fmt: skip
        model["head_dim"], model["n_kv_heads"] = None, None  # MLA: keys and values per query head
    experts = args.num("--num-experts")
    if experts:
        model["moe"] = _moe(args, experts, ffn, n_layers)
    return model


def _moe(args: _Args, experts: int, ffn: int, n_layers: int) -> dict[str, Any]:
    """The ``moe`` section from the ``--moe-*`` flags."""
    moe_ffn = args.num("--moe-ffn-hidden-size") or ffn
    moe: dict[str, Any] = {"n_experts": experts, "top_k": args.num("--moe-router-topk") or 2, "ffn_hidden": moe_ffn,
                           "router_bias": args.has("--moe-router-enable-expert-bias"),
                           "n_group": args.num("--moe-router-num-groups") or 1,
                           "topk_group": args.num("--moe-router-group-topk") or 1}  # fmt: skip
    shared = args.num("--moe-shared-expert-intermediate-size")
    if shared:  # one shared MLP of this width: n_s experts of the routed width when it is a multiple of it
        if shared % moe_ffn == 0:
            moe["n_shared_experts"] = shared // moe_ffn
        else:
            moe["n_shared_experts"], moe["shared_ffn_hidden"] = 1, shared
    freq_raw = args.text("--moe-layer-freq")
    freq = _moe_layer_freq(freq_raw, n_layers, args) if freq_raw is not None else None
    if isinstance(freq, int):
        moe["layer_freq"] = freq
    elif isinstance(freq, list):
        first = next((i for i, v in enumerate(freq) if v), n_layers)
        moe["first_k_dense"] = first
        moe["dense_layers"] = [i for i in range(first, n_layers) if not freq[i]]
    return moe


def _layout(args: _Args, world: int, n_layers: int | None, notes: list[str]) -> dict[str, Any]:
    """The ``layout`` section from the parallelism, recompute and overlap flags."""
    tp, pp = args.num("--tensor-model-parallel-size") or 1, args.num("--pipeline-model-parallel-size") or 1
    cp, ep = args.num("--context-parallel-size") or 1, args.num("--expert-model-parallel-size") or 1
    # --num-virtual-stages-per-pipeline-rank (Megatron-LM 2025), --virtual-pipeline-model-parallel-size (NeMo,
    # Megatron-Bridge), or --num-layers-per-virtual-pipeline-stage (every Megatron-LM release).
    vpp = args.num("--num-virtual-stages-per-pipeline-rank") or args.num("--virtual-pipeline-model-parallel-size")
    per_virtual = args.num("--num-layers-per-virtual-pipeline-stage")
    if per_virtual and n_layers:
        if n_layers % (pp * per_virtual):
            args.problems.append(problem("--num-layers-per-virtual-pipeline-stage", per_virtual,
                                         f"a divisor of num_layers / pp = {n_layers} / {pp}"))  # fmt: skip
        else:
            vpp = n_layers // (pp * per_virtual)
    layout: dict[str, Any] = {
        "tp": tp, "pp": pp, "cp": cp, "ep": ep, "vpp": vpp or 1, "etp": args.num("--expert-tensor-parallel-size"),
        "dp": data_parallel(world, tp * pp * cp, "--tensor-model-parallel-size", "tp x pp x cp"),
        "sequence_parallel": args.has("--sequence-parallel"),
        "zero_stage": 1 if args.has("--use-distributed-optimizer") else 0,
        "overlap_grad_reduce": args.has("--overlap-grad-reduce"),
        "overlap_param_gather": args.has("--overlap-param-gather"), "tp_comm_overlap": args.has("--tp-comm-overlap"),
        "cp_comm": args.text("--cp-comm-type") or "p2p",
    }  # fmt: skip
    if args.has("--use-torch-fsdp2"):
        layout["fsdp"], layout["zero_stage"] = "full", 0
    granularity = args.text("--recompute-granularity")
    if granularity == "selective":
        mods = [m for v in args.values("--recompute-modules") for m in v.split()] or ["core_attn"]
        unknown = [m for m in mods if m not in RECOMPUTE_MODULES]
        if unknown:
            notes.append(f"--recompute-modules {' '.join(unknown)}: not modelled, left out")
        layout["recompute"] = "selective"
        layout["recompute_modules"] = [RECOMPUTE_MODULES[m] for m in mods if m in RECOMPUTE_MODULES]
    elif granularity == "full":
        layout["recompute"] = "full"
        method, count = args.text("--recompute-method") or "uniform", args.num("--recompute-num-layers")
        if method == "block":  # the first `count` layers of each chunk; uniform: every layer, in groups
            layout["recompute_layers"] = count
        elif method != "uniform":
            args.problems.append(problem("--recompute-method", method, "uniform or block"))
    elif granularity is not None:
        args.problems.append(problem("--recompute-granularity", granularity, "full or selective"))
    dispatcher = args.text("--moe-token-dispatcher-type")
    if dispatcher is not None:
        kinds = {"alltoall": "alltoall", "flex": "deepep", "allgather": "alltoall"}
        if dispatcher not in kinds:
            args.problems.append(problem("--moe-token-dispatcher-type", dispatcher, "alltoall, flex or allgather"))
        else:
            layout["ep_dispatcher"] = kinds[dispatcher]
            if dispatcher == "allgather":
                notes.append("--moe-token-dispatcher-type allgather is simulated as alltoall")
    if args.has("--cpu-offloading"):
        layout["offload_activation_layers"] = args.num("--cpu-offloading-num-layers") or 1
    return layout


def _train(args: _Args, dp: int) -> dict[str, Any]:
    """The ``train`` section from the batch, precision and fusion flags."""
    train: dict[str, Any] = {
        "seq_len": args.num("--seq-length") or 4096, "micro_batch_size": args.num("--micro-batch-size") or 1,
        # arguments.py: the global batch defaults to micro-batch x data-parallel size (one micro-batch per step)
        "global_batch_seqs": args.num("--global-batch-size") or (args.num("--micro-batch-size") or 1) * dp,
        "precision": "fp16" if args.has("--fp16") and not args.has("--bf16") else "bf16",
        "grad_dtype": "bf16" if args.has("--grad-reduce-in-bf16") else "fp32",
        # megatron-te differs from megatron-core by the fused cross-entropy only (simtrain.spec.stacks).
        "stack": "megatron-te" if args.has("--cross-entropy-loss-fusion") else "megatron-core",
    }  # fmt: skip
    bucket = args.num("--ddp-bucket-size")  # parameters per DDP bucket (arguments.py; None: Megatron's default)
    if bucket is not None:
        if bucket <= 0:
            args.problems.append(problem("--ddp-bucket-size", bucket, "a positive number of parameters"))
        else:
            train["stack"] = {"preset": train["stack"], "megatron_bucket_params": bucket}
    fp8 = args.text("--fp8-format")
    if fp8 is not None:
        train["precision"] = "fp8"
        recipe = args.text("--fp8-recipe") or "delayed"
        recipes = {"delayed": "delayed", "tensorwise": "current", "blockwise": "blockwise"}
        if recipe not in recipes:
            args.problems.append(problem("--fp8-recipe", recipe, "delayed, tensorwise or blockwise (mxfp8 is "
                                                                 "not modelled)"))  # fmt: skip
        else:
            train["fp8_recipe"] = recipes[recipe]
    if args.text("--fp4-format") is not None:  # arguments.py: --fp4-format e2m1, --fp4-recipe nvfp4 (default)
        train["precision"] = "fp4"
        if (args.text("--fp4-recipe") or "nvfp4") != "nvfp4":
            args.problems.append(problem("--fp4-recipe", args.text("--fp4-recipe"), "nvfp4 (the one FP4 recipe "
                                                                                    "modelled)"))
    dropouts = [args.num(f, float) for f in ("--attention-dropout", "--hidden-dropout")]
    # arguments.py: both default to 0.1, so dropout is on unless both are given as 0.
    train["dropout"] = any(d is None or d > 0 for d in dropouts)
    backend = args.text("--attention-backend")
    if backend == "unfused":
        train["attention_kernel"] = "unfused"
    capacity = args.num("--moe-expert-capacity-factor", float)
    if capacity:
        train["moe_capacity_factor"] = capacity
    optimizer = args.text("--optimizer") or "adam"
    if optimizer not in ("adam", "sgd"):
        args.problems.append(problem("--optimizer", optimizer, "adam or sgd"))
    else:
        train["optimizer"] = "adamw" if optimizer == "adam" else "sgd"  # Megatron's adam is AdamW
    return train


def read_megatron(text: str, *, base: RunConfig | dict[str, Any] | str | Path | None = None,
                  node: str | None = None, n_nodes: int | None = None, name: str | None = None,
                  model: Any = None) -> Imported:
    """A RunConfig from Megatron-LM / NeMo launch arguments.

    Args:
        text: the pasted arguments (a launch script or a part of it).
        base: a config whose hardware, model (when the arguments have no model flags), sim and run
            sections are kept; its layout and train sections are replaced by the arguments'.
        node: node preset (``hardware.node``), over the base's.
        n_nodes: number of nodes, over the base's (default: torchrun's ``--nnodes`` in the text, else 1).
        name: the run's name (default: the base's, else "megatron").
        model: a model (preset name, ``{"hf_config": path}``, ModelSpec or dict) used instead of the flags'.

    Raises:
        ConfigError: every bad value, with its flag (or RunConfig path after mapping).
    """
    flags = parse_args(text)
    args = _Args(flags)
    notes: list[str] = []
    data = base_data(base)
    per_node = args.num("--nproc-per-node")
    nodes = n_nodes if n_nodes is not None else args.num("--nnodes")
    hw = hardware_data(data, node, nodes, per_node if per_node and "gpus_per_node" not in data.get("hardware", {})
                       and per_node != node_gpus(data, node) else None)  # fmt: skip
    tp = args.num("--tensor-model-parallel-size") or 1
    chosen = model if model is not None else _model(args, data.get("model"), tp, notes)
    if model is not None:
        for flag in flags:
            if flag in _MODEL_FLAGS:
                args.used.add(flag)
    n_layers = model_layers(chosen)
    if args.problems:
        raise ConfigError(args.problems)
    layout = _layout(args, world_size(hw), n_layers, notes)
    train = _train(args, layout["dp"])
    if args.problems:
        raise ConfigError(args.problems)
    data.update(name=name or data.get("name") or "megatron", model=chosen, hardware=hw)
    merge(data, "layout", layout)
    merge(data, "train", train)
    unknown: list[str] = []
    ignored: list[str] = []
    for flag in flags:
        if flag in args.used or flag in ("--nnodes", "--nproc-per-node", "--nproc_per_node"):
            continue
        (ignored if flag.startswith(IGNORED_PREFIXES) or flag in SWITCHES else unknown).append(flag)
    return finish(data, unknown, ignored, notes)


def read_megatron_file(path: str | Path, **kwargs: Any) -> Imported:
    """``read_megatron`` of a file's text; without a name or base the run is named after the file."""
    text, stem = read_text(path, "megatron")
    if kwargs.get("name") is None and kwargs.get("base") is None:
        kwargs["name"] = stem
    return read_megatron(text, **kwargs)


_MODEL_FLAGS = frozenset({
    "--num-layers", "--hidden-size", "--ffn-hidden-size", "--num-attention-heads", "--num-query-groups",
    "--group-query-attention", "--kv-channels", "--swiglu", "--normalization", "--position-embedding-type",
    "--use-rotary-position-embeddings", "--vocab-size", "--tokenizer-type", "--make-vocab-size-divisible-by",
    "--max-position-embeddings", "--untie-embeddings-and-output-weights", "--disable-bias-linear", "--add-qkv-bias",
    "--qk-layernorm", "--mtp-num-layers", "--multi-latent-attention", "--q-lora-rank", "--kv-lora-rank",
    "--qk-head-dim", "--qk-pos-emb-head-dim", "--v-head-dim", "--num-experts", "--moe-router-topk",
    "--moe-ffn-hidden-size", "--moe-router-enable-expert-bias", "--moe-router-num-groups", "--moe-router-group-topk",
    "--moe-shared-expert-intermediate-size", "--moe-layer-freq",
})  # fmt: skip


def node_gpus(data: dict[str, Any], node: str | None) -> int:
    """GPUs per node of ``node`` (else of the config dict's hardware section)."""
    from simtrain.hardware.load import load_node

    hw = data.get("hardware") or {}
    return load_node(node or hw.get("node", "dgx-h100"), hw.get("gpu") if node is None else None).gpus_per_node

"""User-facing run configuration: one pydantic schema for files, dicts and Python code.

``load_config`` accepts a ``RunConfig``, a dict or a path (YAML/JSON) plus dotted ``--set``
overrides, and returns a validated ``RunConfig``. Every problem is collected with its dotted path
into one ``ConfigError``: pydantic's schema errors first, then the cross-field checks of
``check_run`` (TP divides heads, world size equals the product of degrees, ...).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any, Literal, get_args, get_origin

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, PrivateAttr, field_validator

# Count: a whole number, never a boolean (YAML's ``true`` would otherwise read as 1) nor a float with a
# fraction (simtrain.spec.batch.whole_number)
from simtrain.spec.batch import Count, RunSpec, parse_count
from simtrain.spec.errors import ConfigError, Problem
from simtrain.spec.fabric_spec import FabricSpec, RailOptimisedFabric
from simtrain.spec.hf_config import from_hf_config
from simtrain.spec.limits import MAX_BATCH_TOKENS, MAX_GPUS, MAX_LAYERS, MAX_MICRO_BATCH, MAX_SEQ_LEN
from simtrain.spec.model import ModelSpec, preset
from simtrain.spec.safe_yaml import load_yaml, read_document
from simtrain.spec.schedule_names import SCHEDULE_NAMES, ScheduleKind
from simtrain.spec.stacks import DEFAULT_STACK, SoftwareStack, StackOverride, resolve_stack, stack_choice
from simtrain.spec.variability_spec import VariabilitySpec
from simtrain.spec.whatif_spec import WhatIfSpec

# use_attribute_docstrings: each field's docstring is its description in the JSON Schema (simtrain schema).
#: Data-parallel bucket size when neither the layout nor the stack sets one, MiB (simtrain's default before
#: the stacks' own rules; PyTorch DDP's ``bucket_cap_mb`` is 25) [assumed].
DEFAULT_BUCKET_MiB = 40.0

_STRICT = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False, use_attribute_docstrings=True)

Axis = Literal["tp", "cp", "ep", "dp", "pp"]

#: A parallel degree or GPU count: at most ``MAX_GPUS`` (``simtrain.spec.limits``).
Degree = Annotated[Count, Field(gt=0, le=MAX_GPUS)]
#: A layer count of a layout switch (recompute, offload, prefetch): at most ``MAX_LAYERS``.
Layers = Annotated[Count, Field(ge=0, le=MAX_LAYERS)]


def _schedule_name(value: str) -> str:
    """``auto`` or the name of a registered pipeline schedule (``simtrain.spec.schedule_names.SCHEDULE_NAMES``)."""
    if value != "auto" and value not in SCHEDULE_NAMES:
        raise ValueError(f"not a pipeline schedule; valid: {', '.join(('auto', *SCHEDULE_NAMES.names()))}")
    return str(value)  # a ScheduleKind given from Python is stored as its plain name


def _schedule_enum(schema: dict[str, Any]) -> None:
    schema["enum"] = ["auto", *SCHEDULE_NAMES.names()]


#: ``layout.schedule``: a plain string (so YAML, JSON and dumps read and write the names as before)
#: checked against the accepted schedule names (``SCHEDULE_NAMES``), which the JSON Schema lists as an enum.
ScheduleName = Annotated[str, AfterValidator(_schedule_name), Field(json_schema_extra=_schedule_enum)]


class HardwareConfig(BaseModel):
    """Which cluster to simulate: a node preset times ``n_nodes`` on a rail-optimised fat tree."""

    model_config = _STRICT
    node: str = "dgx-h100"
    """Node preset name (``simtrain hardware`` lists them)."""
    gpu: str | None = None
    """GPU preset overriding the node's own GPU."""
    n_nodes: Degree = 1
    """Number of nodes in the cluster."""
    gpus_per_node: Degree | None = None
    """GPUs used in each node, when fewer than the node preset has: a job on part of a node, or on whole
    trays of a rack-scale NVLink domain (64 GPUs of a GB200 NVL72 rack); NICs scale with it."""
    nics_per_node: Count | None = Field(None, gt=0, le=MAX_GPUS)
    """Scale-out NICs per node, replacing the node profile's (None: the profile's)."""
    nic_Gbps: float | None = Field(None, gt=0)
    """Bandwidth of one NIC in Gbit/s (as sold)."""
    oversubscription: float = Field(1.0, ge=1.0)
    """Leaf-to-spine oversubscription ratio (1 = non-blocking)."""
    nodes_per_leaf: Degree | None = None
    """Nodes under one leaf switch of the fat tree (None: the node profile's)."""
    net_hop_latency_us: float | None = Field(None, ge=0)
    """Latency of one network switch hop, microseconds (None: the node profile's)."""
    fabric: FabricSpec = RailOptimisedFabric()
    """The network joining the nodes (``simtrain.spec.fabric_spec``): a kind with its parameters, or a graph
    file; default the rail-optimised two-level fat tree."""
    host_copy_GBps: float | None = Field(None, gt=0)
    """Copy rate between one GPU and host memory per direction, GB/s, replacing the node profile's (CPU
    activation offloading; e.g. 128 for a PCIe Gen6 x16 what-if)."""
    profile: str | None = None
    """Calibrated profile name (reserved for calibration; not used yet)."""


class LayoutConfig(BaseModel):
    """The parallel layout: degrees, sharding, schedule, recompute and overlap switches."""

    model_config = _STRICT
    dp: Degree = 1
    """Data-parallel degree (model replicas, or FSDP/ZeRO shards)."""
    tp: Degree = 1
    """Tensor-parallel degree (Megatron ``--tensor-model-parallel-size``)."""
    pp: Degree = 1
    """Pipeline-parallel degree: pipeline stages."""
    cp: Degree = 1
    """Context-parallel degree: ranks splitting each sequence."""
    ep: Degree = 1
    """Expert-parallel degree (MoE): ranks the routed experts are spread over; folds over dp x cp x tp."""
    vpp: Count = Field(1, gt=0, le=MAX_LAYERS)
    """Virtual pipeline stages (model chunks) per pipeline rank; > 1 means interleaved 1F1B."""
    sequence_parallel: bool = False
    """Megatron sequence parallelism: norms and dropout run on sequence shards of the TP group (needs tp > 1)."""
    zero_stage: Literal[0, 1, 2, 3] = 0
    """ZeRO stage: 1 shards the optimizer state over dp (Megatron's distributed optimizer), 2 also the
    gradients, 3 also the parameters."""
    fsdp: Literal["none", "full", "hybrid"] = "none"
    """FSDP sharding: ``full`` is ZeRO-3 over all of dp; ``hybrid`` shards within ``fsdp_shard_size``."""
    fsdp_shard_size: Degree | None = None
    """With ``fsdp: hybrid``: ranks each parameter is sharded over (replicated across the rest of dp)."""
    order: tuple[Axis, ...] = ("tp", "cp", "ep", "dp", "pp")
    """Rank-grid axes from innermost (fastest-varying rank) to outermost; TP innermost lands on NVLink."""
    schedule: ScheduleName = "auto"
    """Pipeline schedule (simtrain.plan.schedules): GPipe, 1F1B, interleaved 1F1B (vpp > 1), zero-bubble ZB-H1,
    DualPipe (DeepSeek-V3; two chunks per rank) or DualPipeV; ``auto``: interleaved when vpp > 1."""
    recompute: Literal["none", "selective", "full", "op_sac"] = "none"
    """Activation recompute: ``none``; ``selective`` (Megatron-core ``--recompute-granularity selective``,
    what ``recompute_modules`` names); ``full`` (each layer keeps its input and re-runs its forward in
    backward; ``recompute_layers`` limits it); ``op_sac`` (torchtitan's op-level selective activation
    checkpointing, ``mode: selective, selective_ac_option: op``: saves the outputs of every second
    matmul, of attention and of TP reduce-scatters, recomputes the rest; ``simtrain.lower.memory``)."""
    recompute_modules: tuple[Literal["core_attn", "layernorm", "mla_up_proj", "act"], ...] = ("core_attn",)
    """With ``selective``: what is recomputed instead of saved (Megatron-core ``--recompute-modules``):
    unfused attention's softmax (``core_attn``), the norms (``layernorm``), MLA's up-projections
    (``mla_up_proj``) and the MLP/expert activation (``act``; DeepSeek-V3 sec. 3.3.2 recomputes
    RMSNorm, the MLA up-projections and SwiGLU)."""
    recompute_layers: Layers | None = None
    """With ``full``: how many layers per stage chunk recompute (None = all)."""
    offload_activation_layers: Layers = 0
    """CPU activation offloading (Megatron-core ``--cpu-offloading`` with ``--cpu-offloading-num-layers``,
    activations only; Transformer Engine's ``get_cpu_offload_context``): the saved activations of the first
    this-many transformer layers are copied to host memory after their forward and back before their
    backward, on copy streams beside compute (``simtrain.lower.offload``). Megatron-core allows it only with
    pp = 1, no recompute and fewer layers than the model has."""
    overlap_grad_reduce: bool = True
    """Overlap the data-parallel gradient reduction with backward (Megatron ``--overlap-grad-reduce``)."""
    overlap_param_gather: bool = True
    """Overlap the ZeRO/distributed-optimizer parameter all-gather with forward (``--overlap-param-gather``)."""
    tp_comm_overlap: bool = False
    """Overlap TP collectives with GEMMs (Megatron ``--tp-comm-overlap``; torchtitan async TP)."""
    grad_bucket_MiB: float | None = Field(None, gt=0)
    """Gradient bucket size of the data-parallel reduction (and of ZeRO-1/2's overlapped parameter all-gather),
    MiB. None: the stack's rule (``train.stack.dp.megatron_buckets``: Megatron-core's ``max(40M, 1M x dp)``
    parameters on the first stage's first chunk, one bucket elsewhere), else ``DEFAULT_BUCKET_MiB``."""
    fsdp_prefetch_layers: Layers = 1
    """FSDP: layers whose parameters are all-gathered ahead of use."""
    cp_comm: Literal["p2p", "all_gather", "a2a"] = "p2p"
    """Context-parallel attention (Megatron ``--cp-comm-type``): ``p2p`` ring attention (KV blocks
    passed around the CP ring, overlapped with attention blocks), ``all_gather`` of K and V before
    attention (Llama 3 paper sec. 3.3.2), ``a2a`` all-to-all of heads (DeepSpeed-Ulysses)."""
    etp: Degree | None = None
    """Expert tensor parallelism: TP degree inside each expert (Megatron ``--expert-tensor-parallel-size``;
    None = tp, Megatron's default). Must divide tp."""
    ep_comm_overlap: bool = False
    """Overlap MoE token dispatch/combine all-to-alls with computation (shared experts, attention of
    another micro-batch); DualPipe always overlaps them."""
    ep_dispatcher: Literal["auto", "alltoall", "deepep"] = "auto"
    """MoE token dispatcher: ``alltoall`` sends each of a token's top-k copies to its expert's GPU (NCCL
    all-to-all; Megatron ``--moe-token-dispatcher-type alltoall``); ``deepep`` sends a token once to each
    remote node holding one of its experts, whose rail peer forwards the copies over NVLink (DeepEP /
    HybridEP: Megatron ``flex`` dispatcher); ``auto``: deepep when routing is node-limited (DeepSeek-V3,
    which trains with DeepEP), else alltoall."""

    @property
    def world_size(self) -> int:
        """Number of ranks: the product of the degrees (ep folds over dp x cp x tp)."""
        return self.dp * self.tp * self.pp * self.cp

    @property
    def shard_stage(self) -> int:
        """Effective ZeRO stage: FSDP full/hybrid shard parameters, like ZeRO-3."""
        return 3 if self.fsdp != "none" else self.zero_stage

    @property
    def data_degree(self) -> int:
        """Ranks holding the same (non-expert) parameters: dp x cp (Megatron reduces gradients and
        shards the distributed optimizer over the data-parallel-with-CP group)."""
        return self.dp * self.cp

    @property
    def expert_tp(self) -> int:
        """Expert tensor-parallel degree: ``etp``, or tp when unset (Megatron's default)."""
        return self.etp or self.tp

    @property
    def expert_data_degree(self) -> int:
        """Ranks of a stage holding the same experts: tp x cp x dp / (ep x etp) (Megatron-core's expert mesh)."""
        return self.tp * self.data_degree // (self.ep * self.expert_tp)

    @property
    def data_axis(self) -> str:
        """Process-group axis of gradient reduction and ZeRO sharding: ``dp``, or ``dp_cp`` with CP."""
        return "dp_cp" if self.cp > 1 else "dp"

    @property
    def resolved_schedule(self) -> str:
        """The pipeline schedule actually used (``auto``: interleaved when vpp > 1)."""
        if self.schedule != "auto":
            return self.schedule
        return (ScheduleKind.INTERLEAVED_1F1B if self.vpp > 1 else ScheduleKind.ONE_F_ONE_B).value


class TrainConfig(BaseModel):
    """The batch: sequence length, micro-batch and the global batch in tokens (or sequences)."""

    model_config = _STRICT
    seq_len: Count = Field(4096, gt=0, le=MAX_SEQ_LEN)
    """Sequence length, tokens."""
    micro_batch_size: Count = Field(1, gt=0, le=MAX_MICRO_BATCH)
    """Sequences per micro-batch on each data-parallel rank."""
    global_batch_tokens: Count | None = Field(None, gt=0, le=MAX_BATCH_TOKENS)
    """Tokens per optimizer step: an integer, or a number with a decimal (K, M, G: 10^3, 10^6, 10^9) or
    binary (Ki, Mi, Gi: 2^10, 2^20, 2^30) suffix, e.g. "4M" = 4,000,000 or "4Mi" = 4,194,304 (the
    "4M-token batch" of the Llama papers); ``simtrain.spec.batch.parse_count``."""
    global_batch_seqs: Count | None = Field(None, gt=0, le=MAX_BATCH_TOKENS)
    """Sequences per optimizer step (give this or ``global_batch_tokens``)."""
    optimizer: Literal["adamw", "adam", "sgd"] = "adamw"
    """Optimizer, for its state memory and step time (Adam/AdamW: two fp32 moments per parameter)."""
    precision: Literal["bf16", "fp16", "fp8", "fp4"] = "bf16"
    """Dtype of the linear-layer GEMMs; ``fp8`` keeps attention, norms and the optimizer in BF16. ``fp4`` is
    NVFP4 training (Transformer Engine ``NVFP4BlockScaling``, Megatron ``--fp4-format e2m1 --fp4-recipe
    nvfp4``; Blackwell and later): the transformer blocks' linear-layer GEMMs (fprop, dgrad, wgrad) in FP4
    with E4M3 scales per 16 elements, the rest as with ``fp8``."""
    fp8_recipe: Literal["delayed", "current", "blockwise"] = "delayed"
    """FP8 scaling (with precision=fp8): per-tensor delayed or current scaling (Transformer Engine), or
    DeepSeek-V3's block-wise scaling (1x128 activation tiles, 128x128 weight blocks)."""
    moe_routing: Literal["balanced", "skewed"] = "balanced"
    """Token routing over experts: balanced (every expert gets top_k*tokens/experts), or skewed (one hot
    expert gets ``moe_hot_expert_load`` times the mean, the rest share what is left)."""
    moe_hot_expert_load: float = Field(1.0, ge=1.0)
    """With skewed routing: the hottest expert's load as a multiple of the mean load."""
    moe_capacity_factor: float | None = Field(None, gt=0)
    """Expert capacity as a multiple of the mean load; tokens beyond it are dropped (None = dropless)."""
    grad_dtype: Literal["fp32", "bf16"] | None = None
    """Gradient accumulation buffer and data-parallel reduction dtype; None: the stack's default
    (``SoftwareStack.grad_dtype``: bf16 for NeMo / Megatron-Bridge performance recipes, fp32 for
    Megatron-LM's main_grad and the others)."""
    attention_kernel: Literal["flash", "unfused"] = "flash"
    """Attention kernel: fused FlashAttention (no score matrix in memory) or unfused softmax(QK^T)V."""
    dropout: bool | None = None
    """Dropout masks kept for backward; None = on for GPT-style (GELU) models, off for Llama-style."""
    stack: str | StackOverride = DEFAULT_STACK
    """Software stack (``simtrain.spec.stacks``): a preset name, megatron-te, megatron-te-2024, megatron-core,
    megatron-legacy, torchtitan-eager, torchtitan-compile, torchtitan-compile-2024, composer-fsdp, deepspeed,
    pytorch-eager; or a preset with fields overridden, ``{preset: torchtitan-compile, attn: {kernel: fa3}, cpu_launch_s:
    2.0e-6}`` (``StackOverride``): kernel fusion, CPU launch cost, FlashAttention 2 or 3, FP8, TP, FSDP,
    pipeline runtime and optimizer behaviour. ``stack_spec`` is the stack it stands for."""

    @field_validator("global_batch_tokens", mode="before")
    @classmethod
    def _token_count(cls, value: Any) -> Any:
        """Human token counts ("4M", "4Mi", "16Mi", "1.5M"; ``simtrain.spec.batch.parse_count``, which also
        takes B and T, as ``run:`` counts do) to a whole number of tokens."""
        valid = ("give a whole number of tokens: an integer, or a number with a suffix K, M, G (x 10^3, 10^6, "
                 "10^9) or Ki, Mi, Gi (x 2^10, 2^20, 2^30), e.g. 4M = 4,000,000 or 4Mi = 4,194,304")
        if isinstance(value, bool):
            raise ValueError(f"not a token count; {valid}")
        count = parse_count(value) if isinstance(value, str) else value
        if isinstance(value, str) and not isinstance(count, float):
            raise ValueError(f"not a token count; {valid}")
        if isinstance(count, float):
            if not count.is_integer():
                raise ValueError(f"is {count:,} tokens, not a whole number; {valid}")
            return int(count)
        return count

    @field_validator("stack", mode="before")
    @classmethod
    def _known_stack(cls, value: Any) -> Any:
        return stack_choice(value)

    @property
    def stack_spec(self) -> SoftwareStack:
        """The software stack this run uses: the preset with any overrides applied."""
        return resolve_stack(self.stack)

    @property
    def stack_name(self) -> str:
        """The stack's preset name (an overridden stack's preset)."""
        return self.stack.preset if isinstance(self.stack, StackOverride) else self.stack

    @property
    def grad_bytes(self) -> float:
        """Bytes per gradient element: ``grad_dtype``, or the stack's default when it is None."""
        dtype = self.grad_dtype or self.stack_spec.grad_dtype
        return 4.0 if dtype == "fp32" else 2.0

    @property
    def global_batch_seqs_resolved(self) -> int:
        """Sequences per optimizer step (tokens / seq_len when given in tokens)."""
        if self.global_batch_seqs is not None:
            return self.global_batch_seqs
        assert self.global_batch_tokens is not None
        return self.global_batch_tokens // self.seq_len


class SimConfig(BaseModel):
    """How to simulate: symmetric (one rank per stage) or full (every rank)."""

    model_config = _STRICT
    mode: Literal["symmetric", "full"] = "symmetric"
    """``symmetric``: one rank per pipeline stage stands for its peers; ``full``: every rank is simulated."""
    fragmentation_ratio: float = Field(0.05, ge=0, le=1)
    """Allocator slack as a fraction of the allocated peak (playbook: a few % to ~15 %)."""
    seed: int = Field(0, ge=0)
    """Random seed of what the simulation draws (``variability``): the same seed gives the same numbers."""
    variability: VariabilitySpec | None = None
    """GPU-to-GPU speed variability: draw every GPU's speed, simulate a step per draw, report the step
    time's percentiles (``simtrain.studies.variability``); None: the nominal step only."""
    steady_state: bool = True
    """Long gradient accumulation: simulate three short runs a pipeline period apart and extend the
    last by the identical periods it lacks (``simtrain.engine.steady``; checked, else every micro-batch is
    simulated). False: simulate every micro-batch. A trace always simulates every micro-batch."""


class RunConfig(BaseModel):
    """Everything needed to simulate one training step."""

    model_config = _STRICT
    name: str = "run"
    """Run name, shown in results."""
    model: ModelSpec
    """The model: a preset name (``simtrain models``), ``{preset: name, ...field overrides}``,
    ``{hf_config: path}`` (a Hugging Face config.json or its folder), or every ModelSpec field."""
    hardware: HardwareConfig = HardwareConfig()
    """The cluster."""
    layout: LayoutConfig = LayoutConfig()
    """The parallel layout."""
    train: TrainConfig = TrainConfig()
    """The batch, precision and software stack."""
    sim: SimConfig = SimConfig()
    """How to simulate."""
    run: RunSpec | None = None
    """Whole run: token budget, batch-size schedule, price (``simtrain run``; see ``simtrain.spec.batch``)."""
    whatif: WhatIfSpec = WhatIfSpec()
    """Asymmetric perturbations: slow GPUs or nodes, slow or failed links, background traffic (full mode)."""
    # what load_config filled in or changed (a token batch rounded to whole micro-batches: simtrain.spec.load);
    # private, so it is no field of a config file and model_dump leaves it out
    _assumptions: tuple[str, ...] = PrivateAttr(default=())

    @property
    def assumptions(self) -> tuple[str, ...]:
        """What ``load_config`` assumed or changed to make this config valid, one sentence each (``simulate``
        copies them into ``StepResult.notes``); () for a config taken as given."""
        return self._assumptions

    def with_assumptions(self, *notes: str) -> RunConfig:
        """A copy of this config with ``notes`` added to its ``assumptions``."""
        out = self.model_copy()
        out._assumptions = (*self._assumptions, *notes)
        return out

    @field_validator("model", mode="before")
    @classmethod
    def _resolve_model(cls, value: Any) -> Any:
        """Accept a preset name, ``{preset: name, ...overrides}``, ``{hf_config: path}`` or fields."""
        if isinstance(value, str):
            return _unwrap(lambda: preset(value))
        if isinstance(value, dict) and "preset" in value:
            base = _unwrap(lambda: preset(str(value["preset"])))
            extra = {k: v for k, v in value.items() if k != "preset"}
            # a dict, not a ModelSpec: pydantic then checks the overrides with their paths (model.n_layers)
            return {**base.model_dump(), **extra} if extra else base
        if isinstance(value, dict) and "hf_config" in value:
            if not isinstance(value["hf_config"], str):
                raise ValueError(f"hf_config {value['hf_config']!r} is not valid; give the path of a Hugging Face "
                                 "config.json or of its folder")
            return _unwrap(lambda: from_hf_config(value["hf_config"], name=value.get("name")))
        return value


def _unwrap(build: Any) -> Any:
    """Turn a ConfigError from a preset/HF lookup into a ValueError pydantic attaches a path to."""
    try:
        return build()
    except ConfigError as exc:
        raise ValueError("; ".join(p.message if p.path else str(p) for p in exc.problems)) from None


def read_config_file(path: str | Path) -> dict[str, Any]:
    """Read a YAML or JSON config file into a dict (``simtrain.spec.safe_yaml``: size, alias and depth limits);
    a missing, unreadable or malformed file raises ConfigError."""
    p = Path(path)
    data = read_document(p, "config")
    if not isinstance(data, dict):
        kind = "nothing" if data is None else f"a {type(data).__name__}"
        raise ConfigError(Problem("config", f"{str(p)!r} must hold a mapping at the top level (name:, model:, "
                                            f"hardware:, ...), not {kind}"))
    base = p.resolve().parent
    model = data.get("model")
    if isinstance(model, dict) and isinstance(model.get("hf_config"), str):
        hf = Path(model["hf_config"])
        data["model"] = {**model, "hf_config": str(hf if hf.is_absolute() else base / hf)}
    return data


def apply_overrides(data: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """Apply ``a.b.c=value`` overrides (value parsed as YAML) to a nested dict copy.

    A dotted override into a model given as a preset name (``model: llama3-8b`` with
    ``model.n_layers=40``) turns the model into ``{preset: llama3-8b, n_layers: 40}``.
    """
    try:
        out = json.loads(json.dumps(data, default=_jsonable))
    except (TypeError, ValueError, RecursionError) as exc:  # a dict source holding what no config holds
        raise ConfigError(Problem("config", f"not a config of plain values: {exc}")) from None
    problems = []
    for item in overrides:
        key, sep, raw = item.partition("=")
        if not sep or not key.strip():
            problems.append(Problem("--set", f"{item!r} is not of the form dotted.key=value"))
            continue
        parts = key.strip().split(".")
        if not all(parts):
            problems.append(Problem("--set", f"{key.strip()!r} has an empty part; give a dotted path like layout.tp"))
            continue
        try:
            value = load_yaml(raw, f"--set {key.strip()}") if raw.strip() else raw
        except ConfigError as exc:
            problems += exc.problems
            continue
        if parts[0] == "model" and len(parts) > 1 and isinstance(out.get("model"), str):
            out["model"] = {"preset": out["model"]}  # a preset name becomes {preset: name, ...overrides}
        if parts[:2] == ["train", "stack"] and len(parts) > 2 and isinstance(out.get("train"), dict):
            out["train"]["stack"] = _stack_mapping(out["train"].get("stack"))  # likewise a stack preset name
        node = out
        for i, part in enumerate(parts[:-1]):
            if node.get(part) is None:
                node[part] = {}
            if not isinstance(node[part], dict):
                problems.append(Problem(".".join(parts[:i + 1]), f"cannot set {key.strip()!r}: "
                                                                 f"{node[part]!r} is not a mapping"))
                break
            node = node[part]
        else:
            node[parts[-1]] = value
    if problems:
        raise ConfigError(problems)
    return out


def _stack_mapping(stack: Any) -> Any:
    """``train.stack`` as a mapping that dotted overrides go into: a preset name ``n`` -> ``{preset: n}``."""
    return {"preset": stack} if isinstance(stack, str) else stack


def _jsonable(obj: Any) -> Any:
    if isinstance(obj, BaseModel):
        return obj.model_dump()
    if isinstance(obj, tuple):
        return list(obj)
    raise TypeError(f"cannot serialise {type(obj).__name__}")


def _int_annotation(annotation: Any) -> bool:
    """Whether a field's annotation takes integers (``int``, ``int | None``, a Literal of ints)."""
    if annotation is int:
        return True
    args = get_args(annotation)
    if get_origin(annotation) is Literal:
        return any(isinstance(a, int) and not isinstance(a, bool) for a in args)
    return any(_int_annotation(a) for a in args)


def _models_in(annotation: Any) -> list[type[BaseModel]]:
    """The pydantic models a field's annotation holds (itself, in an Optional, or as tuple items)."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    return [m for a in get_args(annotation) for m in _models_in(a)]


def bool_count_problems(schema: type[BaseModel], data: Any, path: str = "") -> list[Problem]:
    """Booleans given for integer fields anywhere in ``data`` (a dict for ``schema``), each with its dotted
    path. Python counts ``True`` as 1, so pydantic would read ``n_layers: true`` or ``tp: yes`` as 1;
    this walks the schemas simtrain does not define with ``Count`` (the model's) as well as its own."""
    out: list[Problem] = []
    todo: list[tuple[type[BaseModel], Any, str]] = [(schema, data, path)]
    while todo:
        cls, node, where = todo.pop()
        if not isinstance(node, dict):
            continue
        for key, value in node.items():
            info = cls.model_fields.get(key) if isinstance(key, str) else None
            if info is None:
                continue
            dotted = f"{where}{key}"
            if isinstance(value, bool) and _int_annotation(info.annotation):
                out.append(Problem(dotted, f"{value!r}: a yes/no value is not a count; give a whole number"))
            for sub in _models_in(info.annotation):
                if isinstance(value, dict):
                    todo.append((sub, value, f"{dotted}."))
                elif isinstance(value, list | tuple):
                    todo += [(sub, item, f"{dotted}[{i}].") for i, item in enumerate(value)]
    return out

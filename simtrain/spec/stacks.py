"""Software stack presets, and a run's stack: a preset name or a preset with fields overridden.

The named stacks (``STACKS``) are presets of :class:`simtrain.spec.stack_spec.SoftwareStack`, the spec whose
fields (grouped by concern, each documented with its source) say what a framework changes about the cost
of a run. Each preset is defined once, from the spec's defaults (fused kernels, FlashAttention-3, no
overlap features: Megatron-like) or from another preset, by the fields it changes (:func:`derive`).

``train.stack`` names a preset (``megatron-te``) or overrides any of its fields (:class:`StackOverride`)::

    train:
      stack: {preset: torchtitan-compile, attn: {kernel: fa3}, cpu_launch_s: 2.0e-6}

Fields are given by group (``attn: {kernel: fa3}``, ``fusion: {norm: {kernels: 3}}``) or by their flat
name (``attention: fa3``, ``tp_async_grad_allreduce: false``; ``stack_spec.FLAT_FIELDS``); ``--set
train.stack.attention=fa2`` does the same from the command line. A fusion given in part (``{kernels: 3}``)
keeps the preset's other value. The row defaults (``defaults``: ZeRO stage, sequence parallelism, TP
overlap, FP8 recipe, micro-batch split) are what a published row inherits; a run config states them in
its layout and train sections, so an override of one is refused with the field to set instead. :func:`resolve_stack` turns either form into the
stack every part of simtrain uses (``TrainConfig.stack_spec``). ``simtrain validate`` picks a preset
from a row's ``framework`` cell with :func:`stack_from_text`.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from functools import lru_cache
from typing import Any

from pydantic import (
    BaseModel,
    ConfigDict,
    PrivateAttr,
    ValidationError,
    field_validator,
    model_serializer,
    model_validator,
)
from pydantic_core import InitErrorDetails, PydanticCustomError

from simtrain.spec.errors import ConfigError, problem
from simtrain.spec.stack_spec import (
    COMPILED_REDUCTION,
    EAGER_ACT,
    EAGER_CP_MERGE,
    EAGER_LOSS,
    EAGER_NORM,
    EAGER_ROPE,
    FLAT_FIELDS,
    FUSED,
    GROUPS,
    MEGATRON_FUSED_LOSS,
    MEGATRON_UNFUSED_LOSS,
    ROW_DEFAULT_FIELDS,
    US,
    AttentionSpec,
    DataParallelSpec,
    Fp8Spec,
    FsdpSpec,
    FusionSpec,
    LaunchSpec,
    MoeSpec,
    OpFusion,
    PipelineSpec,
    SoftwareStack,
    TensorParallelSpec,
)

__all__ = ["DEFAULT_STACK", "FLAT_FIELDS", "GROUPS", "STACKS", "OpFusion", "SoftwareStack",
           "StackOverride", "derive", "get_stack", "override_names", "resolve_stack", "stack_choice",
           "stack_from_text"]

DEFAULT_STACK = "megatron-te"


#: The groups a run config may override (``StackOverride``): all but the row defaults, which it states itself.
OVERRIDABLE: tuple[str, ...] = tuple(g for g in GROUPS if g != "defaults")


def nest_changes(changes: Mapping[str, Any],
                 groups: tuple[str, ...] = GROUPS) -> tuple[dict[str, Any], list[InitErrorDetails]]:
    """Field changes given by group (``{"dp": {"grad_dtype": "bf16"}}``) or flat name (``{"grad_dtype":
    "bf16"}``) as one nested dict by group, and an error for each unknown name (with the valid names), field
    given twice, or field outside ``groups`` (a row default, ``ROW_DEFAULT_FIELDS``: what to set instead). A
    model value (an ``OpFusion``) stands for all its fields."""
    nested: dict[str, Any] = {}
    errors: list[InitErrorDetails] = []
    for key, value in changes.items():
        group_of = FLAT_FIELDS[key][0] if isinstance(key, str) and key in FLAT_FIELDS else key
        if group_of == "defaults" and "defaults" not in groups:
            instead = (ROW_DEFAULT_FIELDS[key] if key in ROW_DEFAULT_FIELDS else
                       ", ".join(ROW_DEFAULT_FIELDS[f] for f in ROW_DEFAULT_FIELDS))
            errors.append(_error("stack_row_default", f"{key}: a default for published rows (simtrain validate), "
                                 f"not a stack override; a run config states it itself: set {instead}",
                                 (str(key),), value))
        elif key in groups and isinstance(value, Mapping):
            errors += _unknown_keys(SoftwareStack.model_fields[key].annotation, value, (key,))
            for sub, v in value.items():
                _put(nested, (key, sub), v, (key, sub), errors)
        elif key in groups and isinstance(value, BaseModel):
            for sub in value.model_fields_set:
                _put(nested, (key, sub), getattr(value, sub), (key, sub), errors)
        elif isinstance(key, str) and key in FLAT_FIELDS:
            group, sub = FLAT_FIELDS[key]
            cls = type(getattr(SoftwareStack.model_fields[group].default, sub))
            if isinstance(cls, type) and issubclass(cls, BaseModel) and isinstance(value, Mapping):
                errors += _unknown_keys(cls, value, (key,))
            _put(nested, (group, sub), value, (key,), errors)
        elif key in groups:  # not a mapping: the group's model says what it wants
            nested[key] = value
        else:
            errors.append(_error("unknown_stack_field", f"unknown stack field {key!r}; valid: preset, a group ("
                                 f"{', '.join(groups)}) or a field's flat name ("
                                 f"{', '.join(f for f, (g, _) in FLAT_FIELDS.items() if g in groups)})",
                                 (str(key),), value))
    return nested, errors


def _put(nested: dict[str, Any], where: tuple[str, str], value: Any, loc: tuple[str, ...],
         errors: list[InitErrorDetails]) -> None:
    group = nested.setdefault(where[0], {})
    if not isinstance(group, dict):
        return
    if where[1] in group:
        errors.append(_error("stack_field_twice", f"{where[0]}.{where[1]} is given twice (by group and by flat "
                                                  "name); give it once", loc, value))
    group[where[1]] = value.model_dump() if isinstance(value, BaseModel) else value


def _unknown_keys(cls: Any, data: Mapping[str, Any], loc: tuple[str, ...]) -> list[InitErrorDetails]:
    """An error for each key of ``data`` that is not a field of the model ``cls`` (nested models too)."""
    if not (isinstance(cls, type) and issubclass(cls, BaseModel)):
        return []
    out: list[InitErrorDetails] = []
    for key, value in data.items():
        info = cls.model_fields.get(key) if isinstance(key, str) else None
        if info is None:
            out.append(_error("unknown_stack_field", f"unknown field of {'.'.join(loc)}; valid: "
                                                     f"{', '.join(cls.model_fields)}", (*loc, str(key)), value))
        elif isinstance(value, Mapping):
            out += _unknown_keys(info.annotation, value, (*loc, key))
    return out


def _error(kind: str, message: str, loc: tuple[str, ...], value: Any) -> InitErrorDetails:
    # braces would be read as the error template's placeholders
    text = message.replace("{", "(").replace("}", ")")
    return InitErrorDetails(type=PydanticCustomError(kind, text), loc=loc, input=value)


def _merge(base: Mapping[str, Any], changes: Mapping[str, Any]) -> dict[str, Any]:
    """``base`` (a stack's dump) with ``changes`` (nested by group) merged in, mappings key by key."""
    out = dict(base)
    for key, value in changes.items():
        if isinstance(value, BaseModel):
            value = value.model_dump()
        out[key] = _merge(out[key], value) if isinstance(value, Mapping) and isinstance(out.get(key), Mapping) \
            else value
    return out


def derive(base: SoftwareStack | None, name: str, description: str, **changes: Any) -> SoftwareStack:
    """A stack named ``name``: ``base`` (None: the spec's defaults) with ``changes`` (by group or flat name,
    as ``StackOverride`` takes them) applied. Raises ValueError on an unknown field or a bad value."""
    nested, errors = nest_changes(changes)
    if errors:
        raise ValueError("; ".join(f"{'.'.join(map(str, e['loc']))}: {e['type']}" for e in errors))
    start = base.model_dump() if base is not None else {}
    return SoftwareStack.model_validate(_merge({**start, "name": name, "description": description}, nested))


# Synchronous pipeline exchanges (pipeline.synchronous_p2p) stay off in the Megatron presets, though Megatron
# runs them: Megatron-core's non-interleaved 1F1B ("one_chunk": batch_p2p_comm and batch_p2p_sync both on),
# Megatron-LM 2020-2022 every schedule ("all": its _communicate called torch.cuda.synchronize() after each
# batch_isend_irecv unconditionally). Turned on, they made the in-sample published runs better (median 8.29 ->
# 7.94 %) but not the out-of-sample Megatron-Bridge runs they touch (6 rows: 3 better, 3 worse, mean |error|
# +0.37 points; the frozen hold-out has none), so by issue 29's rule they are a switch a user turns on
# (train.stack.synchronous_p2p), not a preset default.

#: CPU issue time per kernel of Megatron-core (with Transformer Engine, apex or DeepSpeed): it runs eager
#: PyTorch, one Python module call or op per kernel, ~5-10 us per op (reference hardware-collectives-memory.md
#: sec. 3 "Isolation vs in situ"), as the other eager stacks here; a TE-era torch.nn.Linear forward measured
#: 13.5 us of CPU on an H100 DGX host (NVIDIA/TransformerEngine#2053) and TE modules are at parity with it
#: since TE's CPU-overhead work (TransformerEngine#2126) [rule of thumb]. The CPU runs ahead of the GPU, so
#: it costs only where kernels are shorter than their issue or after a host sync (simtrain.cost.host).
MEGATRON_CPU_LAUNCH_S = 8 * US


# What every torchtitan stack shares: FSDP2 (its copies, stages kept unsharded under PP, fp32 master shards
# and a root kept gathered), torch pipelining (local batch split into pp micro-batches), DTensor TP with FP8
# all-gathers, torch ring attention, the foreach AdamW.
_TORCHTITAN: Mapping[str, Any] = {
    "fusion": {"attn_merge": EAGER_CP_MERGE}, "attn": {"torch_ring": True}, "fp8": {"tp_gather": True},
    "tp": {"dtensor": True}, "fsdp": {"reshard_under_pp": False, "param_copies": True, "pytorch": True},
    "pipeline": {"torch_pipelining": True}, "dp": {"foreach_optimizer": True},
    "defaults": {"pp_microbatches_equal_pp": True}}


def _presets() -> dict[str, SoftwareStack]:
    """The built-in stacks, each defined once (from the spec's defaults or from another preset)."""
    out: dict[str, SoftwareStack] = {}

    def add(stack: SoftwareStack) -> None:
        out[stack.name] = stack

    add(derive(
        None, "megatron-te", "Megatron-Core / NeMo with Transformer Engine (fused LayerNorm-GEMM, fused "
        "SwiGLU/RoPE/cross-entropy, cuDNN fused attention, distributed optimizer, TP comm overlap, bf16 "
        "gradient reduction); NeMo performance recipes",
        attention="cudnn", fp8_recipe="delayed", tp_comm_overlap=True, zero_stage=1,
        cpu_launch_s=MEGATRON_CPU_LAUNCH_S, grad_norm_sync=True, loss_check_sync=True, grouped_gemm_per_expert=True,
        tp_async_grad_allreduce=True, grad_dtype="bf16", fp8_weight_cache=True, loss=MEGATRON_FUSED_LOSS,
        moe_probs_all_to_all=True, megatron_buckets=True))
    add(derive(
        out["megatron-te"], "megatron-core", "Megatron-LM / Megatron-Core training scripts with Transformer "
        "Engine, as megatron-te but with the cross-entropy unfused (--cross-entropy-loss-fusion is off unless "
        "asked)",
        # Megatron-LM's main_grad: fp32 unless --grad-reduce-in-bf16 (dp.grad_dtype)
        # the Megatron-Core of the rows it stands for (r0.8-0.9, 2024) weighs the routing probabilities at
        # the unpermutation (MoE probabilities' all-to-all from v0.13: stack_groups.MoeSpec)
        loss=MEGATRON_UNFUSED_LOSS, grad_dtype="fp32", moe_probs_all_to_all=False))
    # NeMo of 2023-2024 (NeMo 1.x with NeMo-Framework-Launcher's hydra configs, NeMo 2.0's first recipes)
    # reduced gradients in fp32; megatron-te's bf16 is what Megatron-Bridge's performance recipes set
    # (``cfg.ddp.grad_reduce_in_fp32 = False``) [src]:
    # - NeMo 1.x, Megatron-core's distributed optimizer: megatron_base_model.py
    #   ``setup_mcore_distributed_parallel`` passes ``grad_reduce_in_fp32=(optim.get('grad_sync_dtype',
    #   'fp32') == 'fp32')``, and the launcher's configs (conf/training/llama/llama3_1_8b.yaml etc.) set no
    #   ``grad_sync_dtype``;
    # - NeMo 1.x, ``distributed_fused_adam`` (apex DistributedFusedAdam, the launcher's llama3_1_70b.yaml):
    #   ``grad_sync_dtype`` defaults to the optimizer state's dtype, fp32;
    # - NeMo 2.0: recipes/precision/mixed_precision.py ``bf16_mixed`` sets ``grad_reduce_in_fp32=True``.
    add(derive(
        out["megatron-te"], "megatron-te-2024", "NeMo of 2023-2024 (NeMo 1.x with the NeMo Framework Launcher's "
        "configs, NeMo 2.0's first recipes): as megatron-te but with the gradients reduced in fp32 (NeMo's "
        "default grad_sync_dtype / grad_reduce_in_fp32; Megatron-Core before 0.13: the MoE routing "
        "probabilities stay on the sending rank)",
        grad_dtype="fp32", moe_probs_all_to_all=False))
    # Megatron legacy kernels (apex fused LayerNorm, fused bias-GELU, fused scale-mask-softmax): fused, but
    # without FlashAttention (Megatron-LM 2021-2022; Korthikanti et al. 2022 sec. 5).
    add(derive(
        None, "megatron-legacy", "Megatron-LM 2021-2022 (apex fused LayerNorm, fused bias-GELU, fused "
        "scale-mask-softmax, no FlashAttention, no distributed optimizer)",
        attention="unfused", zero_stage=0, cpu_launch_s=MEGATRON_CPU_LAUNCH_S, grad_norm_sync=True,
        loss_check_sync=True, tp_async_grad_allreduce=True, loss=MEGATRON_UNFUSED_LOSS))
    add(derive(
        None, "torchtitan-eager", "torchtitan with FSDP2 in eager mode (unfused RMSNorm/RoPE/SwiGLU, SDPA "
        "FlashAttention-2, tensorwise dynamic float8)",
        **_TORCHTITAN, norm=EAGER_NORM, rope=EAGER_ROPE, activation=EAGER_ACT, loss=EAGER_LOSS, attention="fa2",
        fp8_recipe="current", cpu_launch_s=8 * US, eager_loss=True))
    add(derive(
        out["torchtitan-eager"], "torchtitan-compile", "torchtitan with FSDP2 and per-block torch.compile "
        "(Inductor-fused elementwise ops, SDPA FlashAttention-2, tensorwise dynamic float8 with fused casts); "
        "the loss is compiled too (torchtitan 2025: build_cross_entropy_loss compiles it with the model)",
        norm=COMPILED_REDUCTION, rope=FUSED, activation=FUSED, loss=COMPILED_REDUCTION, cpu_launch_s=4 * US,
        eager_loss=False, compiled_blocks=True))
    add(derive(
        out["torchtitan-compile"], "torchtitan-compile-2024", "torchtitan of 2024 with FSDP2 and per-block "
        "torch.compile; the loss ran eager (train.py: 'compiling loss function causes CUDA errors, turning off "
        "for now')",
        loss=EAGER_LOSS, eager_loss=True))
    add(derive(
        None, "composer-fsdp", "MosaicML Composer / llm-foundry with PyTorch FSDP (FlashAttention-2, "
        "low-precision LayerNorm, eager elementwise ops)",
        norm=OpFusion(bytes_factor=3.0, kernels=4), activation=OpFusion(bytes_factor=2.0, kernels=2),
        loss=EAGER_LOSS, attention="fa2", cpu_launch_s=8 * US, fsdp_flat_grads=True, torch_fsdp=True))
    add(derive(
        None, "deepspeed", "Megatron-DeepSpeed (Megatron's fused kernels, no FlashAttention, DeepSpeed ZeRO "
        "and pipeline engine; sequence parallelism is opt-in there (--sequence-parallel), and BigScience's "
        "fork that trained BLOOM (tr11 launch script) has none)",
        attention="unfused", zero_stage=1, cpu_launch_s=MEGATRON_CPU_LAUNCH_S, sequence_parallel=False,
        zero1_grad_all_reduce=True, pp_dp_overlap=False, fp32_grad_accumulation_pass=True,
        loss=MEGATRON_UNFUSED_LOSS))
    add(derive(
        None, "pytorch-eager", "generic eager PyTorch (DDP/FSDP, unfused elementwise ops, SDPA "
        "FlashAttention-2)",
        norm=EAGER_NORM, rope=EAGER_ROPE, activation=EAGER_ACT, loss=EAGER_LOSS, attention="fa2",
        fp8_recipe="current", cpu_launch_s=8 * US, sequence_parallel=False, eager_loss=True, ddp_grad_passes=3,
        ddp_first_bucket_MiB=1.0, attn_merge=EAGER_CP_MERGE, torch_cp=True, fsdp_flat_grads=True,
        torch_fsdp=True))
    return out


#: The presets by name (``train.stack``).
STACKS: Mapping[str, SoftwareStack] = _presets()


def _known(name: str) -> str:
    key = name.strip().lower()
    if key not in STACKS:
        raise ValueError(f"unknown software stack; known stacks: {', '.join(STACKS)}")
    return key


class StackOverride(BaseModel):
    """A preset with some fields overridden: ``{preset: name, <group>: {field: value}, <flat name>: value}``.

    Only the fields given are overrides (``overrides()``); the rest are the preset's. Dumps as the preset
    name and the overrides by group, which validates back to an equal override."""

    model_config = ConfigDict(frozen=True, extra="forbid", use_attribute_docstrings=True)
    preset: str = DEFAULT_STACK
    """The preset the overrides apply to (``simtrain.spec.stacks.STACKS``)."""
    fusion: FusionSpec | None = None
    """Fusion of the memory-bound ops (the fields given replace the preset's)."""
    attn: AttentionSpec | None = None
    """Attention kernel and context-parallel ring (the fields given replace the preset's)."""
    fp8: Fp8Spec | None = None
    """FP8 policy (the fields given replace the preset's)."""
    tp: TensorParallelSpec | None = None
    """Tensor-parallel behaviour (the fields given replace the preset's)."""
    fsdp: FsdpSpec | None = None
    """ZeRO-3 / FSDP behaviour (the fields given replace the preset's)."""
    pipeline: PipelineSpec | None = None
    """Pipeline runtime (the fields given replace the preset's)."""
    dp: DataParallelSpec | None = None
    """Data-parallel and optimizer behaviour (the fields given replace the preset's)."""
    moe: MoeSpec | None = None
    """Expert-parallel token dispatch (the fields given replace the preset's)."""
    launch: LaunchSpec | None = None
    """Host launch cost (the fields given replace the preset's)."""
    _key: str = PrivateAttr("")

    @model_validator(mode="before")
    @classmethod
    def _nest(cls, value: Any) -> Any:
        """Flat names into their groups; unknown names refused with the valid ones."""
        if not isinstance(value, Mapping):
            return value
        rest = {k: v for k, v in value.items() if k != "preset"}
        nested, errors = nest_changes(rest, OVERRIDABLE)
        if errors:
            raise ValidationError.from_exception_data("StackOverride", errors)
        return {"preset": value["preset"], **nested} if "preset" in value else nested

    @field_validator("preset")
    @classmethod
    def _known_preset(cls, value: str) -> str:
        return _known(value)

    def model_post_init(self, context: Any, /) -> None:
        # identity is what was given: a field set to its class default still overrides the preset's value
        self._key = json.dumps(self.dump(), sort_keys=True)

    def overrides(self) -> dict[str, Any]:
        """The fields given, nested by group (``{"tp": {"dtensor": False}}``)."""
        out: dict[str, Any] = {}
        for group in OVERRIDABLE:
            spec = getattr(self, group)
            if spec is not None and group in self.model_fields_set:
                given = spec.model_dump(mode="json", exclude_unset=True)
                if given:
                    out[group] = given
        return out

    @model_serializer(mode="plain")
    def dump(self) -> dict[str, Any]:
        """The preset name and the overrides by group."""
        return {"preset": self.preset, **self.overrides()}

    def __repr_args__(self) -> Any:
        # the overrides only: the groups' other fields are the preset's, not the defaults a full repr shows
        return list(self.dump().items())

    def __hash__(self) -> int:
        return hash(self._key)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, StackOverride) and self._key == other._key


def override_names() -> list[str]:
    """The flat names a StackOverride takes besides its fields (every field outside the row defaults)."""
    return [flat for flat, (group, _) in FLAT_FIELDS.items() if group in OVERRIDABLE]


def stack_choice(value: Any) -> str | StackOverride:
    """A ``train.stack`` value as stored: a preset name (lower case), or a StackOverride when fields are
    overridden (``{preset: name}`` alone is the name). ValueError for an unknown preset or a value of
    another kind; a ValidationError with the field's path for a bad override."""
    if isinstance(value, str):
        return _known(value)
    if isinstance(value, Mapping):
        value = StackOverride.model_validate(dict(value))
    if isinstance(value, StackOverride):
        return value if value.overrides() else value.preset
    raise ValueError(f"not a software stack; give a preset name ({', '.join(STACKS)}) or a preset with fields "
                     "overridden, {preset: name, group: {field: value}, flat_name: value}")


@lru_cache(maxsize=256)
def _resolve(ref: StackOverride) -> SoftwareStack:
    base = STACKS[ref.preset]
    changes = ref.overrides()
    what = ", ".join(f"{g}.{k}={v!r}" for g, fields in changes.items() for k, v in fields.items())
    return SoftwareStack.model_validate(_merge({**base.model_dump(), "description": f"{base.description}; "
                                                f"overridden: {what}"}, changes))


def resolve_stack(choice: str | StackOverride) -> SoftwareStack:
    """The stack a ``train.stack`` value stands for: the preset, with any overrides applied."""
    if isinstance(choice, StackOverride):
        return _resolve(choice)
    return get_stack(choice)


def get_stack(name: str | StackOverride, path: str = "train.stack") -> SoftwareStack:
    """The stack registered as ``name`` (or a StackOverride resolved); ConfigError at ``path`` listing the
    valid names otherwise."""
    if isinstance(name, StackOverride):
        return _resolve(name)
    stack = STACKS.get(str(name).strip().lower())
    if stack is None:
        raise ConfigError(problem(path, name, f"known stacks: {', '.join(STACKS)}"))
    return stack


# (pattern on the lower-cased framework text, stack name); first match wins.
_FRAMEWORK_PATTERNS: tuple[tuple[str, str], ...] = (
    (r"torchtitan.*(compile)", "torchtitan-compile"),
    (r"torchtitan", "torchtitan-eager"),
    (r"composer|llm-foundry|mosaic", "composer-fsdp"),
    (r"deepspeed", "deepspeed"),
    (r"megatron-lm \((20(19|20|21|22))\)|megatron-lm 20(19|20|21|22)", "megatron-legacy"),
    (r"^(?!.*(nemo|bridge)).*(megatron-core|megatron-lm|mcore)", "megatron-core"),
    (r"nemo|megatron|mcore|transformer engine|\bte\b", "megatron-te"),
    (r"fsdp|pytorch|torch|ddp|metaseq", "pytorch-eager"),
)


#: NeMo dated before Megatron-Bridge (a 23.xx or 24.xx container, or NeMo 1.x's launcher), and not Bridge:
#: ``megatron-te-2024``.
_NEMO_2024 = re.compile(r"^(?!.*bridge).*nemo.*(\b2[34]\.\d\d\b|launcher)")


def stack_from_text(text: str | None, version: str | None = None) -> tuple[SoftwareStack, str | None]:
    """The stack a free-text ``framework`` cell names, and an assumption when it had to guess.

    ``version`` is free text that may date the framework (a row's ``source``): torchtitan with
    torch.compile dated 2024 is ``torchtitan-compile-2024`` (its loss was not compiled yet); NeMo dated
    23.xx or 24.xx, or run by NeMo 1.x's launcher, is ``megatron-te-2024`` (fp32 gradient reduction).
    Returns the matching stack and None, or the default stack and the assumption made.
    """
    raw = (text or "").strip()
    low = raw.lower()
    if low:
        for pattern, name in _FRAMEWORK_PATTERNS:
            if re.search(pattern, low):
                if name == "torchtitan-compile" and re.search(r"\b2024|2024\d\d", (version or "").lower()):
                    return STACKS["torchtitan-compile-2024"], None
                if name == "megatron-te" and _NEMO_2024.search(f"{low} {(version or '').lower()}"):
                    return STACKS["megatron-te-2024"], None
                stack = STACKS[name]
                if name == "torchtitan-eager" and "eager" not in low:
                    return stack, f"framework {raw!r}: torchtitan without torch.compile assumed eager"
                return stack, None
    default = STACKS[DEFAULT_STACK]
    what = f"framework {raw!r} has no profile" if low else "framework not given"
    return default, f"{what}: default stack {DEFAULT_STACK} ({default.description.split(' (')[0]})"

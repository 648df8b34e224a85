"""The software stack as a spec: presets equal to the old registry, overrides through the config, the CLI's
``--set`` and the Python API, their errors, and their serialisation."""

from __future__ import annotations

import json
import pickle
from pathlib import Path
from typing import Any

import pytest
import yaml

from simtrain.cli.main import main
from simtrain.lower.stack_rules import optimizer_bytes_per_param
from simtrain.plan.load import load_config
from simtrain.spec.errors import ConfigError
from simtrain.spec.schema import run_config_schema
from simtrain.spec.stack_spec import FLAT_FIELDS, GROUPS, ROW_DEFAULT_FIELDS, OpFusion, SoftwareStack
from simtrain.spec.stacks import STACKS, StackOverride, get_stack, resolve_stack, stack_choice
from simtrain.studies.estimate import Estimator
from simtrain.studies.simulate import cluster_of, simulate
from simtrain.studies.sweep import sweep

#: Every preset's 43 fields as the SoftwareStack dataclass held them before the spec (written by that code; each field added since carries the value its commit gave it).
GOLDEN = json.loads((Path(__file__).parent / "data" / "stack_presets.json").read_text())

TINY = dict(name="tiny", n_layers=4, hidden=1024, n_heads=8, n_kv_heads=8, ffn_hidden=2816, activation="swiglu",
            norm="rmsnorm", position="rope", vocab=8192, tied_embeddings=False, linear_bias=False)


def _cfg(stack: Any, **layout: Any) -> dict[str, Any]:
    """A small TP=4 x DP=2 run on one H100 node (no sequence parallelism unless asked); 8k tokens, so the
    GPU work outlasts the CPU's issue of it (at 2k the step is bound by the host)."""
    return dict(name="stack", model=TINY, hardware=dict(node="dgx-h100", n_nodes=1),
                layout=dict(dict(tp=4, dp=2), **layout),
                train=dict(seq_len=8192, global_batch_seqs=8, micro_batch_size=1, stack=stack))


def _plain(value: Any) -> Any:
    return value.model_dump() if isinstance(value, OpFusion) else value


# -- presets -----------------------------------------------------------------------------------------

def test_every_preset_equals_the_old_stack_field_by_field() -> None:
    assert set(STACKS) == set(GOLDEN)
    for name, fields in GOLDEN.items():
        stack = STACKS[name]
        assert len(fields) == 44
        for field, value in fields.items():
            assert _plain(getattr(stack, field)) == value, f"{name}.{field}"


def test_each_field_has_one_flat_name_and_a_description() -> None:
    nested = {(g, f) for g in GROUPS for f in type(getattr(STACKS["megatron-te"], g)).model_fields}
    assert sorted(FLAT_FIELDS.values()) == sorted(nested)  # one flat name per field, every field named
    assert set(FLAT_FIELDS) | {"name", "description"} == set(GOLDEN["megatron-te"])
    for stack in STACKS.values():
        for flat, (group, field) in FLAT_FIELDS.items():
            assert getattr(stack, flat) == getattr(getattr(stack, group), field)
    for group in GROUPS:
        for name, info in type(getattr(STACKS["deepspeed"], group)).model_fields.items():
            assert info.description and len(info.description) > 20, f"{group}.{name}"


def _differ(a: SoftwareStack, b: SoftwareStack) -> set[str]:
    return {flat for flat in FLAT_FIELDS if _plain(getattr(a, flat)) != _plain(getattr(b, flat))}


def test_derived_presets_differ_from_their_base_by_the_fields_they_name() -> None:
    assert _differ(STACKS["megatron-core"], STACKS["megatron-te"]) == {"loss", "grad_dtype", "moe_probs_all_to_all"}
    assert _differ(STACKS["megatron-te-2024"], STACKS["megatron-te"]) == {"grad_dtype", "moe_probs_all_to_all"}
    assert STACKS["megatron-te-2024"].grad_dtype == "fp32" and STACKS["megatron-te"].grad_dtype == "bf16"
    assert _differ(STACKS["torchtitan-compile-2024"], STACKS["torchtitan-compile"]) == {"loss", "eager_loss"}
    assert _differ(STACKS["torchtitan-compile"], STACKS["torchtitan-eager"]) == {
        "norm", "rope", "activation", "loss", "cpu_launch_s", "eager_loss", "compiled_blocks"}


# -- serialisation -----------------------------------------------------------------------------------

@pytest.mark.parametrize("given", ["deepspeed", " DeepSpeed ", {"preset": "deepspeed"}])
def test_a_preset_without_overrides_is_the_bare_name(given: Any) -> None:
    run = load_config(_cfg(given))
    assert run.train.stack == "deepspeed"
    assert run.train.stack_spec is STACKS["deepspeed"]
    assert run.model_dump(mode="json")["train"]["stack"] == "deepspeed"
    default = _cfg("unused")
    del default["train"]["stack"]
    assert load_config(default).model_dump()["train"]["stack"] == "megatron-te"


def test_overrides_dump_as_the_preset_and_the_fields_given_and_round_trip_through_yaml(tmp_path: Path) -> None:
    given = {"preset": "torchtitan-compile", "attention": "fa3", "fusion": {"norm": {"kernels": 3}},
             "dp": {"grad_dtype": "bf16"}}
    run = load_config(_cfg(given))
    dumped = run.model_dump(mode="json")
    assert dumped["train"]["stack"] == {"preset": "torchtitan-compile", "fusion": {"norm": {"kernels": 3}},
                                        "attn": {"kernel": "fa3"}, "dp": {"grad_dtype": "bf16"}}
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(dumped))
    again = load_config(path)
    assert again.train.stack == run.train.stack and hash(again.train.stack) == hash(run.train.stack)
    assert again.train.stack_spec == run.train.stack_spec
    assert again.model_dump(mode="json") == dumped
    assert pickle.loads(pickle.dumps(run)).train.stack_spec == run.train.stack_spec


def test_an_override_changes_what_it_names_and_nothing_else() -> None:
    base = STACKS["torchtitan-compile"]
    spec = load_config(_cfg({"preset": "torchtitan-compile", "attention": "fa3", "fusion": {"norm": {"kernels": 3}},
                             "dp": {"grad_dtype": "bf16"}})).train.stack_spec
    assert _differ(spec, base) == {"attention", "norm", "grad_dtype"}
    assert spec.attention == "fa3" and spec.grad_dtype == "bf16"
    # a fusion given in part keeps the preset's other value: torch.compile's norm moves 1x its bytes
    assert spec.norm == OpFusion(bytes_factor=base.norm.bytes_factor, kernels=3)
    assert spec.name == "torchtitan-compile" and "overridden" in spec.description


def test_override_identity_is_what_was_given_not_the_values_it_holds() -> None:
    # both hold TensorParallelSpec(dtensor=False, async_grad_allreduce=False); only the first overrides dtensor
    a = stack_choice({"preset": "torchtitan-eager", "tp": {"dtensor": False}})
    b = stack_choice({"preset": "torchtitan-eager", "tp": {"async_grad_allreduce": False}})
    assert isinstance(a, StackOverride) and isinstance(b, StackOverride)
    assert a != b
    assert resolve_stack(a).dtensor_tp is False
    assert resolve_stack(b).dtensor_tp is True
    assert get_stack(a) == resolve_stack(a)


# -- overrides take effect -------------------------------------------------------------------------

def test_async_grad_allreduce_off_exposes_more_tp_time() -> None:
    """Without sequence parallelism Megatron-core all-reduces a column-parallel layer's input gradient beside
    its wgrad GEMM; turned off, the all-reduce runs after the layer's backward, exposed."""
    on = simulate(_cfg("megatron-te"))
    off = simulate(_cfg({"preset": "megatron-te", "tp_async_grad_allreduce": False}))
    assert off.breakdown_s["exposed_comm"]["tp"] > on.breakdown_s["exposed_comm"]["tp"]
    assert off.step_time_s > on.step_time_s


def test_fa2_makes_attention_compute_slower_on_hopper_in_the_engine_and_the_estimate() -> None:
    fa3, fa2 = load_config(_cfg("megatron-te")), load_config(_cfg({"preset": "megatron-te", "attention": "fa2"}))
    assert simulate(fa2).breakdown_s["compute"] > simulate(fa3).breakdown_s["compute"]
    est = Estimator(fa3.model, cluster_of(fa3))
    assert est.estimate(fa2.layout, fa2.train).step_time_s > est.estimate(fa3.layout, fa3.train).step_time_s


def test_grad_dtype_override_reaches_memory_and_the_optimizer() -> None:
    core = load_config(_cfg("megatron-core")).train
    bf16 = load_config(_cfg({"preset": "megatron-core", "grad_dtype": "bf16"})).train
    assert (core.grad_bytes, bf16.grad_bytes) == (4.0, 2.0)
    assert optimizer_bytes_per_param(core, core.stack_spec) - optimizer_bytes_per_param(bf16, bf16.stack_spec) == 2.0


def _simulate_json(tmp_path: Path, capsys: pytest.CaptureFixture[str], *sets: str) -> dict[str, Any]:
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(_cfg("megatron-te")))
    capsys.readouterr()
    args = ["simulate", str(path), "--json"]
    for s in sets:
        args += ["--set", s]
    assert main(args) == 0
    return json.loads(capsys.readouterr().out)


def test_cli_set_overrides_a_stack_field_by_flat_or_nested_name(tmp_path: Path,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    fa3 = _simulate_json(tmp_path, capsys)
    flat = _simulate_json(tmp_path, capsys, "train.stack.attention=fa2")
    nested = _simulate_json(tmp_path, capsys, "train.stack.attn.kernel=fa2")
    assert flat["breakdown_s"]["compute"] > fa3["breakdown_s"]["compute"]
    assert flat == nested
    python = simulate(_cfg({"preset": "megatron-te", "attention": "fa2"})).to_dict()
    assert json.loads(json.dumps(python)) == flat


# -- errors ----------------------------------------------------------------------------------------

@pytest.mark.parametrize(("setting", "path", "words"), [
    ("train.stack.fused_norm=true", "train.stack.fused_norm", ["valid:", "tp_async_grad_allreduce"]),
    ("train.stack.tp.overlap=true", "train.stack.tp.overlap", ["valid:", "async_grad_allreduce"]),
    ("train.stack.preset=nemo", "train.stack.preset", ["'nemo'", "megatron-te"]),
    ("train.stack=nemo", "train.stack", ["'nemo'", "known stacks"]),
    ("train.stack.attention=fa4", "train.stack.attn.kernel", ["'fa4'", "fa3"]),
    ("train.stack.fusion.norm.kernels=0", "train.stack.fusion.norm.kernels", ["0", "greater than or equal to 1"]),
    ("train.stack.ddp_grad_passes=true", "train.stack.dp.grad_passes", ["not a count"]),
    ("train.stack.tp_comm_overlap=false", "train.stack.tp_comm_overlap", ["layout.tp_comm_overlap"]),
    ("train.stack.zero_stage=1", "train.stack.zero_stage", ["layout.zero_stage"]),
])
def test_a_bad_stack_override_exits_2_naming_the_field(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                       setting: str, path: str, words: list[str]) -> None:
    cfg = tmp_path / "run.yaml"
    cfg.write_text(yaml.safe_dump(_cfg("megatron-te")))
    assert main(["simulate", str(cfg), "--set", setting]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    line = next((ln for ln in err.splitlines() if f"{path}:" in ln), None)
    assert line is not None, err
    for word in words:
        assert word in line, line


def test_a_bad_stack_in_python_is_a_config_error_with_its_path() -> None:
    with pytest.raises(ConfigError) as exc:
        load_config(_cfg({"preset": "megatron-te", "fsdp": {"reshard": False}}))
    assert [p.path for p in exc.value.problems] == ["train.stack.fsdp.reshard"]
    assert "reshard_under_pp" in exc.value.problems[0].message
    with pytest.raises(ConfigError, match=r"train\.stack\.launch: 5: "):
        load_config(_cfg({"preset": "megatron-te", "launch": 5}))
    with pytest.raises(ConfigError, match=r"train\.stack: 5: not a software stack"):
        load_config(_cfg(5))


# -- schema ----------------------------------------------------------------------------------------

def test_schema_lists_presets_groups_and_flat_names() -> None:
    schema = run_config_schema()
    stack = schema["$defs"]["TrainConfig"]["properties"]["stack"]
    assert stack["anyOf"][0]["enum"] == list(STACKS)
    override = schema["$defs"]["StackOverride"]["properties"]
    assert override["preset"]["enum"] == list(STACKS)
    assert {"fusion", "attn", "fp8", "tp", "fsdp", "pipeline", "dp", "launch"} <= set(override)
    assert "attention" in override and "cpu_launch_s" in override
    assert not set(ROW_DEFAULT_FIELDS) & set(override)  # row defaults: the run config states them itself
    assert "default" not in schema["$defs"]["TensorParallelSpec"]["properties"]["dtensor"]  # the preset's


def test_the_readme_override_example_runs() -> None:
    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text(encoding="utf-8")
    section = readme[readme.index("#### `train.stack`: presets and overrides"):]
    block = section[section.index("```yaml\n") + 8:section.index("```\n", section.index("```yaml\n") + 8)]
    train = yaml.safe_load(block)["train"]
    run = load_config(_cfg(train["stack"]))
    assert run.train.stack_spec.attention == "fa3" and run.train.stack_spec.cpu_launch_s == 2.0e-6
    assert run.train.stack_spec.compiled_blocks  # the rest is torchtitan-compile's


def test_a_sweep_grid_takes_a_stack_field_by_flat_name() -> None:
    table = sweep(_cfg("megatron-te"), {"train.stack.attention": ["fa3", "fa2"]}, workers=1, whole_run=False)
    fa3, fa2 = table.to_dict("records")
    assert fa2["compute_s"] > fa3["compute_s"]
    assert (fa2["train.stack.preset"], fa2["train.stack.attn.kernel"]) == ("megatron-te", "fa2")
    with pytest.raises(ConfigError, match="'tp_comm_overlap' is not a field of train.stack"):
        sweep(_cfg("megatron-te"), {"train.stack.tp_comm_overlap": [True, False]}, workers=1)


@pytest.mark.parametrize("name", ["torchtitan-eager", "pytorch-eager", "composer-fsdp", "torchtitan-compile", "megatron-te"])
def test_expert_and_shared_activations_take_the_stacks_activation_fusion(name: str) -> None:
    """A routed or shared expert's activation is the dense MLP's op on other rows: the same fusion (eager
    stacks run it unfused); the experts' permutations stay one fused pass whatever the stack."""
    stack = STACKS[name]
    for kernel in ("expert.act", "expert.act.bwd", "expert.act.recompute", "shared.act", "shared.act.bwd"):
        assert stack.fusion_of(kernel) == stack.fusion_of("act") == stack.activation
    for kernel in ("expert.sort_chunks", "expert.unsort_chunks", "expert.sort_map"):
        assert stack.fusion_of(kernel).bytes_factor == 1.0 and stack.fusion_of(kernel).kernels == 1
    if name in ("torchtitan-eager", "pytorch-eager"):
        assert stack.activation.bytes_factor > 1.0  # the case this guards: eager SwiGLU is several passes

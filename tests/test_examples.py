"""Every config under examples/ runs through the CLI and gives a sane result."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from simtrain.cli.main import main
from simtrain.hardware.load import build_cluster
from simtrain.plan.load import load_config

EXAMPLES = sorted((Path(__file__).resolve().parent.parent / "examples").glob("*.yaml"))

# GPU counts stated in the examples' comments (nodes x 8 GPUs); the 405B one is the Llama 3 paper's 16,384.
EXPECTED_GPUS: dict[str, int] = {
    "llama3_8b_h100_fsdp.yaml": 8,
    "llama3_70b_h100.yaml": 64,
    "gpt3_175b_a100.yaml": 1024,
    "llama3_405b_h100.yaml": 16384,
    "llama3_405b_cp16_h100.yaml": 16384,
    "mixtral_8x7b_h100.yaml": 64,
    "deepseek_v3_h800.yaml": 2048,
    "llama3_70b_gb200_offload.yaml": 64,
}


def test_examples_found() -> None:
    assert EXAMPLES, "no examples/*.yaml found"
    assert set(EXPECTED_GPUS) <= {p.name for p in EXAMPLES}


@pytest.mark.parametrize("path", EXAMPLES, ids=[p.stem for p in EXAMPLES])
def test_example_simulates(path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["simulate", str(path), "--json"])
    out, err = capsys.readouterr()
    assert code == 0, err
    result = json.loads(out)

    assert result["step_time_s"] > 0
    assert 0 < result["mfu"] <= 1
    assert 0 < result["hfu"] <= 1

    run = load_config(path)
    hw = run.hardware
    cluster_gpus = build_cluster(hw.node, hw.n_nodes, gpu=hw.gpu, gpus_per_node=hw.gpus_per_node).n_gpus
    assert result["n_gpus"] == run.layout.world_size == cluster_gpus
    if path.name in EXPECTED_GPUS:
        assert result["n_gpus"] == EXPECTED_GPUS[path.name]


def test_offload_example_fits_only_with_its_offloading(capsys: pytest.CaptureFixture[str]) -> None:
    """Megatron-Bridge's GB200 70B FSDP recipe offloads 40 layers' activations: without them the step
    does not fit a GB200's 186 GiB; with them it does, and the copies barely show in the step time."""
    path = Path(__file__).resolve().parent.parent / "examples" / "llama3_70b_gb200_offload.yaml"
    results = []
    for n in (40, 0):
        assert main(["simulate", str(path), "--json", "--set", f"layout.offload_activation_layers={n}"]) == 0
        results.append(json.loads(capsys.readouterr().out))
    offloaded, resident = results
    assert offloaded["fits"] and not resident["fits"]
    assert 0 < offloaded["breakdown_s"]["offload"] < 0.01 * offloaded["step_time_s"]
    assert offloaded["step_time_s"] == pytest.approx(resident["step_time_s"], rel=0.01)

"""A global batch quoted in tokens is rounded to the nearest whole number of micro-batches per data-parallel
rank and named in the assumptions (issue 29 part 4), through load_config, simulate and the CLI (validate's
rows: tests/validation/test_unprofiled_and_token_rows.py).

The rule (simtrain.spec.load.round_token_batch): U = seq_len x micro_batch_size x dp tokens; a batch of T
tokens that is not a multiple of U becomes k x U with k = floor(T / U + 1/2), at least 1; a tie goes to the
larger batch. Each case below is that closed form worked by hand.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from simtrain.cli.main import main
from simtrain.plan.load import load_config
from simtrain.spec.errors import ConfigError
from simtrain.studies.simulate import simulate

TINY = dict(name="tiny", n_layers=2, hidden=256, n_heads=4, ffn_hidden=1024, activation="gelu", norm="layernorm",
            position="rope", vocab=1024, tied_embeddings=False, linear_bias=False)


def _cfg(tokens: Any, mbs: int = 1, dp: int = 8, seq_len: int = 512) -> dict[str, Any]:
    return dict(model=TINY, hardware=dict(n_nodes=1, gpus_per_node=dp), layout=dict(dp=dp),
                train=dict(seq_len=seq_len, micro_batch_size=mbs, global_batch_tokens=tokens))


# (tokens given, micro_batch_size, dp, tokens simulated): U = 512 x mbs x dp
CASES = [
    (10_000, 1, 8, 8_192),     # U = 4,096: 10,000 / U = 2.44 -> 2 units
    (6_144, 1, 8, 8_192),      # exactly 1.5 units: a tie goes to the larger batch
    (14_336, 1, 8, 16_384),    # 3.5 units -> 4
    (10_239, 1, 8, 8_192),     # 2.4998 units -> 2
    (1_000, 1, 8, 4_096),      # 0.24 units rounds to 0: at least one micro-batch per rank
    (5_000, 1, 8, 4_096),      # not even whole sequences (9.77 of 512): 1.22 units -> 1
    (20_000, 2, 8, 16_384),    # U = 8,192: 2.44 -> 2
]


@pytest.mark.parametrize(("tokens", "mbs", "dp", "want"), CASES)
def test_token_batch_rounds_to_the_nearest_whole_micro_batches(tokens: int, mbs: int, dp: int, want: int) -> None:
    run = load_config(_cfg(tokens, mbs, dp))
    assert run.train.global_batch_tokens == want
    assert run.train.global_batch_seqs_resolved % (mbs * dp) == 0
    (note,) = run.assumptions
    assert f"train.global_batch_tokens {tokens:,}" in note and f"rounded to the nearest such batch, {want:,} tokens" in note
    assert "a tie goes to the larger batch" in note


def test_16m_tokens_at_8192_per_sequence() -> None:
    """The issue's example: "16M" tokens (16,000,000, 1,953.125 sequences of 8,192) on dp 6 with micro-batch 1:
    U = 49,152 tokens, 16,000,000 / U = 325.52 -> 326 micro-batches per rank, 1,956 sequences."""
    run = load_config(dict(_cfg("16M", 1, 6, seq_len=8192), model={**TINY, "n_heads": 4}))
    assert run.train.global_batch_tokens == 326 * 6 * 8192 == 16_023_552
    assert run.train.global_batch_seqs_resolved == 1_956
    assert "1,956 sequences, 326 micro-batches per rank" in run.assumptions[0]


def test_a_valid_token_batch_is_taken_as_given() -> None:
    run = load_config(_cfg(8_192))
    assert run.train.global_batch_tokens == 8_192 and run.assumptions == ()


def test_a_batch_in_sequences_is_still_checked_as_given() -> None:
    cfg = _cfg(None)
    cfg["train"] = {**cfg["train"], "global_batch_tokens": None, "global_batch_seqs": 12}
    with pytest.raises(ConfigError) as err:
        load_config(cfg)
    assert err.value.problems[0].path == "train.global_batch_seqs"


def test_simulate_names_the_rounding_in_its_notes_and_simulates_the_rounded_batch() -> None:
    r = simulate(_cfg(10_000))
    assert r.global_batch_tokens == 8_192 and r.microbatches == 2
    assert any("rounded to the nearest such batch, 8,192 tokens" in n for n in r.notes)
    assert r.step_time_s == simulate(_cfg(8_192)).step_time_s


def test_cli_simulates_a_rounded_batch(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(_cfg(6_144)))
    assert main(["simulate", str(path), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["global_batch_tokens"] == 8_192
    assert any("train.global_batch_tokens 6,144" in n for n in out["notes"])


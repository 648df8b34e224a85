"""Pipeline schedules as data: completeness, ordering and in-flight counts."""

from __future__ import annotations

from collections import Counter

import pytest

from simtrain.config import load_config
from simtrain.errors import ConfigError
from simtrain.schedules import build_schedule, gpipe, interleaved_1f1b, max_in_flight, one_f_one_b

CASES = [(1, 1), (1, 4), (2, 2), (2, 5), (4, 1), (4, 3), (4, 8), (8, 16), (3, 7)]
INTERLEAVED = [(2, 2, 2), (2, 4, 3), (4, 4, 2), (4, 8, 2), (4, 12, 3), (8, 16, 2), (3, 6, 4)]


def _check_complete(sched, p: int, m: int, v: int) -> None:
    assert len(sched) == p
    for acts in sched:
        counts = Counter(acts)
        expected = {(k, i, c) for k in "FB" for i in range(m) for c in range(v)}
        assert {(a.kind, a.microbatch, a.chunk) for a in acts} == expected
        assert all(n == 1 for n in counts.values())
        pos = {(a.kind, a.microbatch, a.chunk): i for i, a in enumerate(acts)}
        for i in range(m):
            for c in range(v):
                assert pos[("F", i, c)] < pos[("B", i, c)]


@pytest.mark.parametrize("p,m", CASES)
def test_gpipe_complete(p: int, m: int) -> None:
    sched = gpipe(p, m)
    _check_complete(sched, p, m, 1)
    assert all(max_in_flight(acts) == m for acts in sched)


@pytest.mark.parametrize("p,m", CASES)
def test_1f1b_complete_and_in_flight(p: int, m: int) -> None:
    sched = one_f_one_b(p, m)
    _check_complete(sched, p, m, 1)
    for s, acts in enumerate(sched):
        assert max_in_flight(acts) == min(p - s, m)
        # backward of each stage runs micro-batches in order
        assert [a.microbatch for a in acts if a.kind == "B"] == list(range(m))


@pytest.mark.parametrize("p,m,v", INTERLEAVED)
def test_interleaved_complete(p: int, m: int, v: int) -> None:
    sched = interleaved_1f1b(p, m, v)
    _check_complete(sched, p, m, v)
    for s, acts in enumerate(sched):
        # Megatron warm-up: (p - s - 1) * 2 + (v - 1) * p virtual micro-batches, then one more F
        assert max_in_flight(acts) == min((p - s - 1) * 2 + (v - 1) * p + 1, m * v)
        # forwards of a micro-batch go through the chunks in order, backwards in reverse
        for i in range(m):
            fch = [a.chunk for a in acts if a.kind == "F" and a.microbatch == i]
            bch = [a.chunk for a in acts if a.kind == "B" and a.microbatch == i]
            assert fch == list(range(v))
            assert bch == list(reversed(range(v)))


@pytest.mark.parametrize("p,m,v", [(4, 6, 2), (2, 3, 2), (4, 2, 2), (8, 12, 3)])
def test_interleaved_requires_multiple_of_p(p: int, m: int, v: int) -> None:
    with pytest.raises(ValueError, match="multiple"):
        interleaved_1f1b(p, m, v)


def test_interleaved_batch_rule_is_validated() -> None:
    tiny = dict(name="t", n_layers=8, hidden=256, n_heads=4, ffn_hidden=1024, activation="gelu",
                norm="layernorm", position="rope", vocab=1024, tied_embeddings=False, linear_bias=False)
    cfg = dict(model=tiny, layout=dict(pp=4, dp=2, vpp=2), train=dict(seq_len=512, global_batch_seqs=12))
    with pytest.raises(ConfigError) as exc:
        load_config(cfg)
    assert any(p.path == "train.global_batch_seqs" and "multiple" in p.message for p in exc.value.problems)
    cfg["train"]["global_batch_seqs"] = 16
    assert load_config(cfg).layout.vpp == 2


def test_build_schedule_dispatch() -> None:
    assert build_schedule("gpipe", 2, 3) == gpipe(2, 3)
    assert build_schedule("1f1b", 2, 3) == one_f_one_b(2, 3)
    assert build_schedule("interleaved_1f1b", 2, 4, 2) == interleaved_1f1b(2, 4, 2)
    with pytest.raises(ValueError):
        build_schedule("zb-h1", 2, 3)


def test_1f1b_holds_fewer_than_gpipe() -> None:
    p, m = 4, 16
    assert max(max_in_flight(a) for a in one_f_one_b(p, m)) == p
    assert max(max_in_flight(a) for a in gpipe(p, m)) == m

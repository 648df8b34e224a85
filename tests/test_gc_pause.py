"""``gc_paused``: the cyclic collector is off inside the block, and its earlier state comes back after it."""

from __future__ import annotations

import gc
from pathlib import Path

import pytest

import simtrain.studies.simulate as simulate_module
from simtrain.engine.gc_pause import gc_paused
from simtrain.studies.simulate import simulate

EXAMPLE = str(Path(__file__).resolve().parents[1] / "examples" / "llama3_8b_h100_fsdp.yaml")


def test_off_inside_restored_after_even_on_error() -> None:
    assert gc.isenabled()
    with gc_paused():
        assert not gc.isenabled()
        with gc_paused():  # nested: still off, and the outer block's state is not touched
            assert not gc.isenabled()
        assert not gc.isenabled()
    assert gc.isenabled()
    with pytest.raises(RuntimeError), gc_paused():
        raise RuntimeError("boom")
    assert gc.isenabled()


def test_a_caller_that_turned_it_off_keeps_it_off() -> None:
    gc.disable()
    try:
        with gc_paused():
            pass
        assert not gc.isenabled()
    finally:
        gc.enable()


def test_lowering_runs_with_the_collector_off(monkeypatch: pytest.MonkeyPatch) -> None:
    """The lowering and cost pass (millions of objects on a long pipeline step) run inside the pause too."""
    seen = []
    real = simulate_module.lower

    def lower(*args, **kw):  # type: ignore[no-untyped-def]
        seen.append(gc.isenabled())
        return real(*args, **kw)

    monkeypatch.setattr(simulate_module, "lower", lower)
    simulate(EXAMPLE)
    assert seen and not any(seen)
    assert gc.isenabled()

"""Short layout labels shared by search, sweep reports and the fidelity page.

One label names every parallel axis, so that the degrees multiply to the GPU count at a glance:
``tp4 cp2 pp2 vpp8 dp4`` (64 GPUs), with ``ep``/``etp`` for mixture-of-experts layouts, then the
ZeRO stage or FSDP sharding, the micro-batch size, the memory lever (recompute or CPU offload) and a
pipeline schedule other than ``auto``. Missing values are left out (a table may lack a column).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any


def _value(values: Mapping[str, Any], key: str) -> Any:
    """``values[key]``, or None when absent, None or NaN (pandas' empty cell)."""
    v = values.get(key)
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return None
    return v


def _num(v: Any) -> str:
    """4.0 -> '4' (tables read back from CSV hold floats), other values as text."""
    if isinstance(v, float) and v.is_integer():
        return str(int(v))
    return str(v)


def layout_label(values: Mapping[str, Any], prefix: str = "", micro_batch_size: Any = None) -> str:
    """Label of a layout given as a mapping of its fields (``tp``, ``cp``, ...), or of a table row whose
    columns carry ``prefix`` (``layout.``); ``micro_batch_size`` when not among the values.

    Always ``tp cp pp vpp dp`` (when present); ``ep`` (and ``etp``) when the layout has experts
    (ep > 1 or etp set); ``zero<k>``; ``fsdp-<kind>`` (and its shard size); ``mbs<n>``; recompute
    other than none (``full(2)``: 2 layers per chunk), ``offload(<layers>)``; the schedule unless ``auto``.
    """
    def get(key: str) -> Any:
        return _value(values, prefix + key)

    parts: list[str] = []
    for axis in ("tp", "cp"):
        if (v := get(axis)) is not None:
            parts.append(f"{axis}{_num(v)}")
    ep, etp = get("ep"), get("etp")
    if (ep is not None and float(ep) > 1) or etp is not None:
        parts.append(f"ep{_num(ep if ep is not None else 1)}" + (f" etp{_num(etp)}" if etp is not None else ""))
    for axis in ("pp", "vpp", "dp"):
        if (v := get(axis)) is not None:
            parts.append(f"{axis}{_num(v)}")
    fsdp = get("fsdp")
    if fsdp and fsdp != "none":
        shard = get("fsdp_shard_size")
        parts.append(f"fsdp-{fsdp}" + (f"({_num(shard)})" if shard is not None else ""))
    elif (zero := get("zero_stage")) is not None:
        parts.append(f"zero{_num(zero)}")
    mbs = micro_batch_size if micro_batch_size is not None else _value(values, "micro_batch_size")
    if mbs is not None:
        parts.append(f"mbs{_num(mbs)}")
    rec, layers = get("recompute"), get("recompute_layers")
    offload = get("offload_activation_layers")
    if offload is not None and float(offload) > 0:
        parts.append(f"offload({_num(offload)})")
    elif rec is not None and rec != "none":
        parts.append(f"{rec}({_num(layers)})" if layers is not None and float(layers) > 0 else str(rec))
    sched = get("schedule")
    if sched and sched != "auto":
        parts.append(str(sched))
    return " ".join(parts)

"""``whatif``: asymmetric perturbations of the cluster a run is simulated on (issue 28 part 3).

Real clusters are not uniform: one GPU runs hot and clocks down, a node's PCIe switch is degraded, a NIC
or cable is slow or down, other jobs load a network tier. A ``whatif`` section asks how much one step of
the run would lose to that. It needs every rank simulated (full mode; ``simtrain.studies.whatif``), and
the result names the critical rank and the step time with and without the perturbation.

Names (checked here for their form; against the cluster, with the valid ranges, when the run is
simulated: ``simtrain.hardware.fabric.perturb.check``):

- a GPU: ``node{n}/gpu{l}`` (node index ``n``, index ``l`` inside the node) or ``gpu{g}`` (global GPU
  index, the fabric graph's vertex name; rank ``r`` runs on GPU ``r``);
- a node: ``node{n}``;
- a link: ``u->v`` in fabric vertex names (``nic3.1->leaf1.0``; the physical link, both directions), or
  one vertex (``nic3.1``: every link at it, both directions);
- a tier: a link class (``nvlink``, ``pcie``, ``net``) or the kinds of a link's two ends joined by ``_``
  in the fabric's order (``gpu_nvswitch``, ``gpu_nic``, ``nic_leaf``, ``leaf_spine``, ``spine_core``).

Every factor is dimensionless: a speed factor is the share of its nominal speed a GPU keeps (0.85: each
compute op takes 1/0.85 as long); a link factor the share of its bandwidth it keeps; a background share
the fraction of a tier's bandwidth other traffic takes (0.3: this job gets 70 %).
"""

from __future__ import annotations

import re
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, field_validator

_STRICT = ConfigDict(extra="forbid", frozen=True)

GPU_NAME = re.compile(r"^(?:node(\d+)/gpu(\d+)|gpu(\d+))$")
"""``node{n}/gpu{l}`` (groups 1, 2) or ``gpu{g}`` (group 3)."""
NODE_NAME = re.compile(r"^node(\d+)$")
LINK_SEP = "->"

#: Link classes of the fabric graph schema (``simtrain.hardware.fabric``).
LINK_CLASSES = ("nvlink", "pcie", "net")
#: Vertex kinds of the fabric graph schema, in the order a tier name lists its two ends.
VERTEX_KINDS = ("gpu", "nvswitch", "nic", "leaf", "spine", "core", "gateway", "storage")

Speed = Annotated[float, Field(gt=0, le=1)]
Share = Annotated[float, Field(ge=0, lt=1)]


def tier_name(kind_a: str, kind_b: str) -> str:
    """The tier of a link between vertices of kinds ``kind_a`` and ``kind_b`` (``nic_leaf``)."""
    order = {k: i for i, k in enumerate(VERTEX_KINDS)}
    a, b = sorted((kind_a, kind_b), key=lambda k: (order.get(k, len(order)), k))
    return f"{a}_{b}"


def _check_names(names: dict[str, float] | list[str], pattern: re.Pattern[str] | None, what: str) -> None:
    for name in names:
        if pattern is not None and not pattern.match(name):
            raise ValueError(f"{name!r} is not {what}")
        if pattern is None:
            u, sep, v = name.partition(LINK_SEP)
            if not u.strip() or (sep and not v.strip()) or LINK_SEP in v:
                raise ValueError(f"{name!r} is not {what}")


_LINK_WHAT = "a link 'u->v' in fabric vertex names (nic3.1->leaf1.0) or one vertex (nic3.1: all its links)"


class WhatIfSpec(BaseModel):
    """Perturbations of the cluster (``whatif``); empty: none (the default)."""

    model_config = _STRICT
    slow_gpus: dict[str, Speed] = {}
    """GPU -> speed factor in (0, 1]: every compute op of that GPU takes 1/factor as long. GPU names
    ``node{n}/gpu{l}`` or ``gpu{g}``."""
    slow_nodes: dict[str, Speed] = {}
    """Node (``node{n}``) -> speed factor in (0, 1] of all its GPUs (with ``slow_gpus``, the two multiply)."""
    slow_links: dict[str, Speed] = {}
    """Link ``u->v`` or vertex (all its links) -> bandwidth factor in (0, 1], both directions."""
    failed_links: list[str] = []
    """Links ``u->v`` or vertices (all their links) that are down, both directions: routes avoid them
    where the fabric has another path, else the run is refused naming the GPUs cut off."""
    background: dict[str, Share] = {}
    """Tier or link class -> share in [0, 1) of its bandwidth other jobs' traffic takes."""

    @field_validator("slow_gpus")
    @classmethod
    def _gpu_names(cls, value: dict[str, float]) -> dict[str, float]:
        _check_names(value, GPU_NAME, "a GPU name: node{n}/gpu{l} (node index, index in the node) or gpu{g} "
                                      "(global index)")
        return value

    @field_validator("slow_nodes")
    @classmethod
    def _node_names(cls, value: dict[str, float]) -> dict[str, float]:
        _check_names(value, NODE_NAME, "a node name node{n} (node index)")
        return value

    @field_validator("slow_links")
    @classmethod
    def _link_names(cls, value: dict[str, float]) -> dict[str, float]:
        _check_names(value, None, _LINK_WHAT)
        return value

    @field_validator("failed_links")
    @classmethod
    def _failed_names(cls, value: list[str]) -> list[str]:
        _check_names(value, None, _LINK_WHAT)
        if len(set(value)) != len(value):
            raise ValueError(f"{value!r} names a link twice")
        return value

    @field_validator("background")
    @classmethod
    def _tiers(cls, value: dict[str, float]) -> dict[str, float]:
        kinds = set(VERTEX_KINDS)
        for name in value:
            a, _, b = name.partition("_")
            if name not in LINK_CLASSES and not (a in kinds and b in kinds and tier_name(a, b) == name):
                valid = ", ".join(LINK_CLASSES + tuple(tier_name(a, b) for a, b in _TIERS))
                raise ValueError(f"{name!r} is not a link class or tier; valid: {valid} (or another "
                                 f"'{{kind}}_{{kind}}' of the kinds {', '.join(VERTEX_KINDS)}, in that order)")
        return value

    @property
    def active(self) -> bool:
        """Whether any perturbation is asked for."""
        return bool(self.slow_gpus or self.slow_nodes or self.slow_links or self.failed_links
                    or any(s > 0 for s in self.background.values()))


#: The tiers of today's fabrics, for the error message.
_TIERS = (("gpu", "nvswitch"), ("gpu", "gpu"), ("gpu", "nic"), ("nic", "leaf"), ("leaf", "spine"),
          ("spine", "core"))

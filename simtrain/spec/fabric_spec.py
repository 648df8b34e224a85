"""``hardware.fabric``: which network joins the nodes (issue 28).

A tagged union on ``kind``. ``rail_optimised`` (the default) is the fabric simtrain has always simulated:
a rail-optimised two-level fat tree built from the node profile and ``hardware.oversubscription`` /
``hardware.nodes_per_leaf`` (``simtrain.hardware.topology``). ``graph`` loads a user's graph from a file
(GraphML or node-link JSON; schema in ``simtrain.hardware.fabric``). Builders of other fabrics add their
own member to :data:`FabricSpec`.

In YAML and ``--set`` a fabric may be given as a bare string: a path ending in ``.graphml``, ``.xml`` or
``.json`` means ``{kind: graph, path: ...}``; any other string is a kind with its default parameters.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field

_STRICT = ConfigDict(extra="forbid", frozen=True)

#: File suffixes read as a graph file when ``hardware.fabric`` is a bare string.
GRAPH_SUFFIXES = (".graphml", ".xml", ".json")


class RailOptimisedFabric(BaseModel):
    """Today's fabric: NIC ``j`` of every node under a leaf group plugs into rail leaf ``j`` of that group;
    all leaves go up to one aggregated spine (``hardware.oversubscription`` leaf-to-spine)."""

    model_config = _STRICT
    kind: Literal["rail_optimised"] = "rail_optimised"


class GraphFileFabric(BaseModel):
    """A user's fabric graph read from a file (GraphML or networkx node-link JSON)."""

    model_config = _STRICT
    kind: Literal["graph"] = "graph"
    path: str
    """Path of the graph file; relative paths are relative to the working directory."""


def _coerce(value: Any) -> Any:
    """A bare string: a graph file path (by suffix) or a kind name with default parameters."""
    if isinstance(value, str):
        if value.lower().endswith(GRAPH_SUFFIXES):
            return {"kind": "graph", "path": value}
        return {"kind": value}
    return value


#: ``hardware.fabric``: one member per fabric kind, chosen by ``kind``.
FabricSpec = Annotated[
    RailOptimisedFabric | GraphFileFabric,
    Field(discriminator="kind"),
    BeforeValidator(_coerce),
]

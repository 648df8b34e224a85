"""Fabric builders: each turns a ``hardware.fabric`` spec and the cluster into a fabric graph
(``networkx.DiGraph`` with the schema of ``simtrain.hardware.fabric``)."""

from __future__ import annotations

import networkx as nx

from simtrain.hardware.hardware import ClusterSpec
from simtrain.hardware.topology import build_graph
from simtrain.spec.errors import ConfigError, problem
from simtrain.spec.fabric_spec import GraphFileFabric, RailOptimisedFabric


def build_fabric(spec: RailOptimisedFabric | GraphFileFabric, cluster: ClusterSpec) -> nx.DiGraph:
    """The fabric graph of ``spec`` for ``cluster`` (a graph file is read by the loader, not here)."""
    if isinstance(spec, RailOptimisedFabric):
        return build_graph(cluster)
    raise ConfigError(problem("hardware.fabric.kind", spec.kind, "a builder kind (rail_optimised)"))

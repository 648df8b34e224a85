"""The cluster fabric as a graph: the documented graph schema, loaders (GraphML, node-link JSON), fabric
builders (fat tree, rail-optimised, multi-plane, NVL rack domains, multi-site) and the routing tables the
engine uses (issue 28)."""

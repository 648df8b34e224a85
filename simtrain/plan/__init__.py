"""The parallel plan: rank grid and placement, pipeline schedule objects, MoE routing, roles, cross-field checks."""

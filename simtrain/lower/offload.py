"""CPU activation offloading: when each offloaded layer's activations move, and what that costs.

Megatron-core's ``--cpu-offloading`` (activations only) wraps a stage's transformer layers in Transformer
Engine's CPU-offload context (``transformer_engine.pytorch.cpu_offload.get_cpu_offload_context``, the
asynchronous double-buffer group handler). Each layer is one offload group; the first ``n`` layers'
saved-for-backward tensors go to pinned host memory on a device-to-host stream and come back on a
host-to-device stream. The handler spreads its ``n`` synchronisations evenly over the ``L`` layers
(its ``layer_window_map``): sync point ``k`` is after layer ``w[k] = q (k + 1) - 1 + min(k + 1, r)``
(q, r = divmod(L, n)), so ``w[n - 1] = L - 1``.

Forward: the copy of layer 0 starts when layer 0 ends; at sync point k (after layer ``w[k]``) the
compute stream waits for the copy of layer k, frees its GPU copy and starts the copy of layer k + 1.
Backward mirrors it: before layer ``w[k]``'s backward the compute stream waits for the reload of layer
k + 1, allocates layer k's buffers again and starts their reload; before layer 0's backward it waits for
the last reload. So each copy hides behind the compute of the layers of its window
``(w[k - 1], w[k]]`` (w[-1] = 0), forward and backward alike, and a copy longer than its window stalls
the compute stream by the difference. Copies also read or write HBM; TE notes this may slow
memory-bound kernels beside them (not modelled: a few per cent of HBM bandwidth at PCIe rates).
"""

from __future__ import annotations

from collections.abc import Sequence


def sync_layers(n_layers: int, n_offload: int) -> list[int]:
    """Layer after which (forward) or before whose backward (backward) each offload group syncs.

    Transformer Engine's ``AsyncDoubleBufferGroupOffloadHandler.layer_window_map`` (v1 handler,
    transformer_engine/pytorch/cpu_offload.py): the ``n_offload`` sync points spread evenly over the
    ``n_layers`` layers, the remainder going to the first windows; the last one is the last layer.
    """
    if not 0 < n_offload < n_layers:
        raise ValueError(f"offload 1 to {n_layers - 1} of {n_layers} layers, not {n_offload}")
    q, r = divmod(n_layers, n_offload)
    return [q * (k + 1) - 1 + min(k + 1, r) for k in range(n_offload)]


def windows(n_layers: int, n_offload: int) -> list[range]:
    """Layers whose compute hides copy k: ``(w[k - 1], w[k]]`` with w[-1] = 0 (forward and backward)."""
    w = sync_layers(n_layers, n_offload)
    return [range((w[k - 1] if k else 0) + 1, w[k] + 1) for k in range(n_offload)]


def copy_s(size_bytes: float, host_Bps: float) -> float:
    """Time of one copy between GPU and host memory, seconds (``NodeSpec.host_link_Bps``, per direction)."""
    return size_bytes / host_Bps


def stall_s(layer_s: Sequence[float], act_bytes: Sequence[float], host_Bps: float, n_offload: int) -> float:
    """Seconds one micro-batch's forward (or backward) waits for its copies.

    Args:
        layer_s: forward (or backward) time of each layer of the stage, seconds, in layer order.
        act_bytes: saved activation bytes of each layer (the offloaded ones are the first n_offload).
        host_Bps: copy rate per direction, bytes/s.
        n_offload: offloaded layers.

    Each copy starts at the previous sync point and is waited for at the next one, so the stalls of
    the windows add up.
    """
    if n_offload == 0:
        return 0.0
    return sum(max(0.0, copy_s(act_bytes[k], host_Bps) - sum(layer_s[j] for j in win))
               for k, win in enumerate(windows(len(layer_s), n_offload)))

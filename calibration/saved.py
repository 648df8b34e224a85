"""Bytes autograd saves for backward, counted with ``torch.autograd.graph.saved_tensors_hooks``.

Every tensor saved for backward passes through the pack hook; its *storage* is counted once (views
and tensors sharing memory are one allocation), parameters are excluded (they are not
activations), and each storage is attributed to the module that was running when it was first
saved. This is the ground truth simtrain's activation formulas (``simtrain/lower/memory.py``) are checked
against, and the CPU measurement of a layer step's activation memory.
"""

from __future__ import annotations

from collections import defaultdict
from types import TracebackType
from typing import Any

import torch
from torch import nn


class SavedTensorCounter:
    """Context manager counting saved-for-backward bytes per module (unique storages, no parameters).

    Args:
        model: whose parameters are excluded.
        modules: name -> module whose forward the saved storages are attributed to (innermost wins);
            storages saved outside all of them count under "outside".
    """

    def __init__(self, model: nn.Module, modules: dict[str, nn.Module]):
        self._params = {p.untyped_storage().data_ptr() for p in model.parameters()}
        self._owner: dict[int, str] = {}
        self.bytes: dict[str, int] = defaultdict(int)
        self._active: list[str] = []
        self._handles: list[Any] = []
        for name, mod in modules.items():
            self._handles.append(mod.register_forward_pre_hook(self._enter_hook(name)))
            self._handles.append(mod.register_forward_hook(self._leave_hook))
        self._hooks = torch.autograd.graph.saved_tensors_hooks(self._pack, lambda t: t)

    def _enter_hook(self, name: str) -> Any:
        def hook(module: nn.Module, args: Any) -> None:
            self._active.append(name)
        return hook

    def _leave_hook(self, module: nn.Module, args: Any, output: Any) -> None:
        self._active.pop()  # returns None: a forward hook's return value would replace the output

    def _pack(self, tensor: torch.Tensor) -> torch.Tensor:
        storage = tensor.untyped_storage()
        ptr = storage.data_ptr()
        if ptr and ptr not in self._params and ptr not in self._owner:
            owner = self._active[-1] if self._active else "outside"
            self._owner[ptr] = owner
            self.bytes[owner] += storage.nbytes()
        return tensor

    def __enter__(self) -> SavedTensorCounter:
        self._hooks.__enter__()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self._hooks.__exit__(exc_type, exc, tb)
        for h in self._handles:
            h.remove()

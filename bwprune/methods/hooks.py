"""Owned, reversible changes to a model: forward hooks and module swaps.

Every change a method makes to a model goes through a `HookSet`, which undoes all of them when its
context exits, also on error, so no method can leave a model altered for the next run (multirun jobs
share one process). Methods never monkeypatch `forward` or copy HF forward code.
"""

from __future__ import annotations

from collections.abc import Callable
from types import TracebackType
from typing import Any

from torch import nn
from torch.utils.hooks import RemovableHandle


class HookSet:
    """Context manager: register hooks / swap modules inside, all undone (in reverse) on exit."""

    def __init__(self) -> None:
        self._undo: list[Callable[[], None]] = []

    def forward_pre(
        self, module: nn.Module, fn: Callable[..., Any], with_kwargs: bool = False
    ) -> RemovableHandle:
        handle = module.register_forward_pre_hook(fn, with_kwargs=with_kwargs)
        self._undo.append(handle.remove)
        return handle

    def forward(self, module: nn.Module, fn: Callable[..., Any]) -> RemovableHandle:
        handle = module.register_forward_hook(fn)
        self._undo.append(handle.remove)
        return handle

    def swap(self, parent: object, name: str, new: nn.Module) -> object:
        """Replace `parent.<name>` by `new` until exit; returns the original."""
        old = getattr(parent, name)
        setattr(parent, name, new)
        self._undo.append(lambda: setattr(parent, name, old))
        return old

    def on_close(self, undo: Callable[[], None]) -> None:
        """Run `undo` when the set closes, in reverse order with the other changes."""
        self._undo.append(undo)

    def close(self) -> None:
        while self._undo:
            self._undo.pop()()

    def __enter__(self) -> HookSet:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

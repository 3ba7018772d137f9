"""Scratch matrices to re-lay weights through: one per use, shape and thread, kept for the process.

Re-laying an FFN's weights in place (`bwprune.models.in_place`, `bwprune.vllm.binding.one_copy`)
goes through a matrix as large as a weight. A fresh one per layer left the heap's freed holes too
small for the next, and the first kept set grew the 0.5B's run by 0.5 GiB; one per shape for the
process fixes that. One per thread, too: a generation's first kept sets fill layers side by side
(`bwprune.methods.side_by_side`), and two layers of one shape re-laid through one matrix at once
corrupt each other's weights.
"""

from __future__ import annotations

import threading

import torch

_HELD: dict[tuple, torch.Tensor] = {}


def scratch(use: str, shape: tuple[int, ...], like: torch.Tensor) -> torch.Tensor:
    """A contiguous matrix of `shape` and `like`'s dtype and device, the same one at every call
    from this thread with this `use`; its contents are whatever the last call left."""
    key = (use, tuple(shape), like.dtype, like.device, threading.get_ident())
    if key not in _HELD:
        _HELD[key] = torch.empty(shape, dtype=like.dtype, device=like.device)
    return _HELD[key]

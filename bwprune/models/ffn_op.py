"""One layer's FFN as an opaque op, so a compiled forward runs the method's FFN glue as it stands.

A compiled forward freezes the Python it traced: which kept set is in force, whether an observer
on the down projection records Z. Both engines therefore call a layer's FFN through the custom op
`bwprune::ffn(x, handle)` while they are traced: Dynamo and inductor see an op of fixed shape (x
in, the same shape out) and call it at run time, and inside it the registered FFN runs eagerly —
the kept set over its persistent buffers, or the dense MLP with the method's observers — at every
forward. What `handle` names is registered here (`register`), held weakly, so a model that goes
away takes its FFNs with it. Used by the HF loop's sliced MLP (`bwprune.models.sliced_mlp`) and by
vLLM's routed MLPs (`bwprune.vllm.binding.ffn_route`).

The HF loop's compiled step, which guards on whether a kept set is in force, runs its dense steps
as a graph of their own instead: gate, up and their product compiled as dense's are, and only the
down projection, whose observers record Z, called through `bwprune::observed(z, handle, width)`
(eagerly running the whole dense MLP in the op cost an observing step 3 ms more at batch 4).

A CUDA graph would replay the op's first run instead of calling it, so where a step is captured
into graphs (on CUDA) the sliced MLP is traced through instead (`opaque`), and a step whose FFN
observers keep state runs eager there (`bwprune.engine.step`).
"""

from __future__ import annotations

import itertools
import weakref
from collections.abc import Callable

import torch

OP = "bwprune::ffn"
OBSERVED = "bwprune::observed"
_FFNS: dict[int, weakref.ref] = {}  # handle -> one layer's FFN (a callable of x)
_HANDLES = itertools.count()


def register(ffn: Callable[[torch.Tensor], torch.Tensor]) -> int:
    """A handle for `ffn` (held weakly: unregistered when it is collected)."""
    handle = next(_HANDLES)
    _FFNS[handle] = weakref.ref(ffn)
    weakref.finalize(ffn, _FFNS.pop, handle, None)
    return handle


def opaque(device: torch.device) -> bool:
    """Whether a compiled forward on `device` runs its sliced FFNs as the op: wherever the step
    is not captured into CUDA graphs."""
    return device.type != "cuda"


# Defined through `torch.library.Library` rather than `torch.library.custom_op`: the latter wraps
# every call in Python layers of its own (autograd, schema checks), which cost 44 against 21 us
# per call from a compiled graph on this CPU (30 layers' calls per step); these ops run only
# under inference, so they need no autograd kernel.
_LIB = torch.library.Library("bwprune", "FRAGMENT")
_LIB.define("ffn(Tensor x, int handle) -> Tensor")
_LIB.define("observed(Tensor z, int handle, int width) -> Tensor")


def ffn(x: torch.Tensor, handle: int) -> torch.Tensor:
    """FFN `handle` of `x` (tokens × hidden, any leading dims), as it stands now."""
    return _FFNS[handle]()(x)


def observed(z: torch.Tensor, handle: int, width: int) -> torch.Tensor:
    """Projection `handle` (to `width` features) of `z`, called as a module: its hooks (a
    method's observers of Z) fire."""
    return _FFNS[handle]()(z)


_LIB.impl("ffn", ffn, "CompositeExplicitAutograd")
_LIB.impl("observed", observed, "CompositeExplicitAutograd")


@torch.library.register_fake(OP)
def _(x: torch.Tensor, handle: int) -> torch.Tensor:
    return torch.empty_like(x)


@torch.library.register_fake(OBSERVED)
def _(z: torch.Tensor, handle: int, width: int) -> torch.Tensor:
    return z.new_empty(*z.shape[:-1], width)

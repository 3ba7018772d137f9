"""Every FFN of the plugin's models as one opaque op, so a compiled vLLM keeps the method's choice.

vLLM compiles its decoder once, at warm-up, with no guards: Python inside the traced region —
which MLP module a layer holds, whether a kept set is in force, a hook that observes — is frozen
as it was then. So the plugin (`bwprune.vllm.binding.plugin`) makes each layer's MLP call the custom
op `bwprune::ffn(x, handle)` (`bwprune.models.ffn_op`) while it is traced. Dynamo and inductor see
an op of fixed shape (tokens × hidden in, the same out) and call it as it is at run time; inside,
the layer's `FFNRoute` runs whatever a host put there — the kept set over its persistent buffers, or
the dense MLP with the method's observers and masks on its projections — eagerly, every forward.
On a GPU the op is also one of vLLM's splitting ops (`SPLITTING_OP`), so piecewise CUDA graphs are
captured around it, never through it. Run eager, the MLP calls its route directly (no op dispatch).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from bwprune.models import ffn_op

SPLITTING_OP = ffn_op.OP


class FFNRoute:
    """What one layer's FFN runs: `impl` when a host set one (hooks.swap on `impl`), else the
    layer's own dense MLP."""

    def __init__(self, dense: Callable[[torch.Tensor], torch.Tensor]) -> None:
        self.dense = dense
        self.impl: Callable[[torch.Tensor], torch.Tensor] | None = None
        self.handle = ffn_op.register(self)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return (self.dense if self.impl is None else self.impl)(x)


class RoutedMLP:
    """Mixin over a vLLM gated MLP class: its forward goes through the layer's route (`dense` is
    the MLP's own forward)."""

    bwprune_route: FFNRoute

    def dense(self, x: torch.Tensor) -> torch.Tensor:
        return super().forward(x)  # type: ignore[misc]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if torch.compiler.is_compiling():
            return torch.ops.bwprune.ffn(x, self.bwprune_route.handle)
        return self.bwprune_route(x)


_ROUTED: dict[type, type] = {}


def route(mlp: nn.Module) -> None:
    """Make `mlp` (a vLLM MLP of a model being built) a `RoutedMLP`: the same module, weights and
    names, its class a subclass of its own whose forward goes through a fresh route."""
    cls = type(mlp)
    if cls not in _ROUTED:
        _ROUTED[cls] = type(f"Routed{cls.__name__}", (RoutedMLP, cls), {})
    mlp.__class__ = _ROUTED[cls]
    mlp.bwprune_route = FFNRoute(mlp.dense)

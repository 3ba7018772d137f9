"""One decode forward, eager or compiled (`generation.compile`).

The compiled step is the model's forward on one token per row with static shapes (a pooled static
KV cache, a fixed-size attention mask), compiled once per shape with `torch.compile`; on CUDA with
`mode="reduce-overhead"`, i.e. captured into CUDA graphs, which removes the per-kernel launch and
Python overhead that dominates an eager decode step of a 7-8B model at small batch. A method's
hooks run inside it (threshold methods add what they skip into tensors kept per batch size); its
policy (schedule, mask refresh) runs between steps in the driver. A step whose hooks write Python
state (`PruningMethod.capturable` is False: observers of the FFN activation) runs compiled where
the sliced FFNs are opaque ops (`bwprune.models.ffn_op`: off CUDA), which call the observers at
run time, and eager under CUDA graphs, whose replay would skip the writes.
"""

from __future__ import annotations

import logging

import torch
from torch import nn

from bwprune.engine.cache import SlotCache
from bwprune.errors import choices_error
from bwprune.models import ffn_op

log = logging.getLogger(__name__)
COMPILE = ("auto", "true", "false")


def resolve_compile(setting: str | bool, device: torch.device) -> bool:
    """`auto` compiles on CUDA only: on CPU a decode step is bound by weight reads, not by
    overhead, and compiling costs more time than it saves on short runs (README, speed)."""
    value = str(setting).lower()
    if value not in COMPILE:
        raise choices_error("generation.compile", setting, COMPILE)
    return device.type == "cuda" if value == "auto" else value == "true"


class DecodeStep:
    """Runs a decode forward; `compiled` selects the captured path where the step allows it."""

    def __init__(self, model: nn.Module, compiled: bool, backend: str = "inductor") -> None:
        self.model = model
        self.compiled = compiled
        self._said_eager = False  # one log line the first time a compiled run steps eager
        device = next(model.parameters()).device
        self._graphs = compiled and device.type == "cuda" and backend == "inductor"  # replayed
        self._opaque = ffn_op.opaque(device)  # a sliced FFN's state-keeping glue runs at run time
        if compiled:
            # One graph per (rows, cache length, kept sizes, dense/sparse) and per runner: the
            # default limit of 8 per code object would silently fall back to eager.
            torch._dynamo.config.cache_size_limit = max(torch._dynamo.config.cache_size_limit, 256)
            # Dynamo skips guards on module hooks by default, so a graph traced without a method's
            # hooks (dense, in a paired timing on the same model) would serve a step with them,
            # and the other way round. Guarded, a method's graph is its own; re-attaching the
            # same hooks (every batch) still replays it.
            torch._dynamo.config.skip_nnmodule_hook_guards = False
            mode = "reduce-overhead" if self._graphs else None
            self._compiled = torch.compile(self._forward, backend=backend, mode=mode, dynamic=False)

    def __call__(
        self,
        cache: SlotCache,
        token: torch.Tensor,
        mask: torch.Tensor,
        position: torch.Tensor,
        capturable: bool = True,
    ) -> torch.Tensor:
        """(B,) tokens at (B, 1) positions -> (B, V) next-token logits."""
        if self.compiled and (capturable or self._opaque):
            if not self._graphs:
                return self._compiled(cache.inputs(), token, mask, position)
            # A replay writes its outputs where the next replay writes again: each step starts a
            # new iteration, and the caller gets a copy (B x V, microseconds), so logits an
            # observer keeps (quality measures, batch-invariant rows) survive the next step.
            torch.compiler.cudagraph_mark_step_begin()
            return self._compiled(cache.inputs(), token, mask, position).clone()
        if self.compiled and not self._said_eager:
            log.info("a step whose hooks keep state runs eager (the method is not capturable)")
            self._said_eager = True
        return self._forward(cache.inputs(), token, mask, position)

    def _forward(self, cache_inputs: dict, token, mask, position) -> torch.Tensor:
        out = self.model(
            input_ids=token[:, None], attention_mask=mask, position_ids=position, **cache_inputs
        )
        return out.logits[:, -1]

"""The vLLM host: a vLLM model's side of the method glue (`bwprune.methods.host`).

vLLM runs a forward over the flat tokens of its scheduled requests, `(N, D)`, in its input
batch's order, which is not the method's slot order (a finished request's place is refilled by
the last one). The session (`bwprune.vllm.binding.session`) hands each forward's tokens to the
driver as the HF loop would — a `(B, T)` mask in slot order — and gives this host the permutation
from that order to vLLM's (`place`), so the method sees the same tokens in the same order in either
engine. Kept sets run as `SlicedMLP`s over the weights the plugin kept; keep masks zero entries
of vLLM's hidden states, which are sometimes tuples (fused add-norm) or fused (gate|up).

Under tensor parallelism each worker holds a contiguous shard of every FFN's neurons (gate|up
column-parallel, down row-parallel) and runs its own host on its own copy of the method. The
observer gathers the shards' activations, so every rank's method sees the whole FFN and decides
the same global kept set (`tp_select: global`, the paper's set exactly), or, with
`tp_select: per_rank`, each shard's own top share of it (what ranks choosing alone would keep,
its gap to the global set logged); each rank computes the part of the set in its shard and the
partial down projections are summed across ranks, as vLLM's own row-parallel layer sums them for
the dense FFN.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from bwprune.errors import UserError
from bwprune.methods.base import PruningMethod, StepContext, Tokens
from bwprune.methods.host import FFNSlot, Host, Site, decides_per_forward
from bwprune.methods.neuron_set import NeuronSetMethod
from bwprune.methods.sharded import PerRank
from bwprune.models.sliced_mlp import KeptFFN, KeptWeights, SlotWeights, neuron_rows
from bwprune.vllm.binding import packed
from bwprune.vllm.binding.one_copy import OneCopyFFN, OneCopyKept
from bwprune.vllm.binding.support import refuse_split

MLPSources = tuple[torch.Tensor, torch.Tensor, torch.Tensor]  # gate, up, down rows: (D_ff, H)


def _first(value):
    return value[0] if isinstance(value, tuple) else value


def _with_first(value, x: torch.Tensor):
    return (x, *value[1:]) if isinstance(value, tuple) else x


@dataclass(frozen=True)
class Shard:
    """This worker's place in vLLM's tensor-parallel group: rank `rank` of `size`."""

    rank: int = 0
    size: int = 1

    @classmethod
    def current(cls) -> Shard:
        """The calling worker's (a model outside a vLLM worker: the whole model)."""
        from vllm.distributed import parallel_state as ps

        if not ps.model_parallel_is_initialized():
            return cls()
        return cls(ps.get_tensor_model_parallel_rank(), ps.get_tensor_model_parallel_world_size())

    def gather(self, x: torch.Tensor) -> torch.Tensor:
        """(..., D/size) shards of every rank -> (..., D), in neuron order."""
        if self.size == 1:
            return x
        from vllm.distributed import get_tp_group

        return get_tp_group().all_gather(x.contiguous(), dim=-1)

    def reduce(self, x: torch.Tensor) -> torch.Tensor:
        """Every rank's partial sum -> the sum."""
        if self.size == 1:
            return x
        from vllm.distributed import tensor_model_parallel_all_reduce

        return tensor_model_parallel_all_reduce(x)


class SlicedMLP(KeptFFN):
    """A vLLM gated MLP (gate_up_proj, act_fn, down_proj) computing only the neurons of an
    index, over slot weights changed in place: packed for vLLM's CPU MoE kernel where it runs
    (`bwprune.vllm.binding.packed`), plain matrices otherwise (a GPU: in-place index copies).

    Sharded, the index is global and this rank computes its own neurons of it: a number that
    moves with every refresh, so its slots only grow (`KeptSlots`) and a refresh still writes
    only the neurons that changed."""

    def __init__(self, mlp: nn.Module, sources: MLPSources | OneCopyFFN,
                 shard: Shard = Shard()) -> None:  # fmt: skip
        """`sources`: the rows kept sets gather from, or the MLP's one copy in the kernel's
        panels (`generation.kept_weights=in_place`, one worker), whose first expert is the kept
        set."""
        one_copy = sources if isinstance(sources, OneCopyFFN) else None
        gate, up, down_rows = (None, None, None) if one_copy else sources
        d_ff = one_copy.d_ff if one_copy else down_rows.shape[0]
        gate_up_bias = getattr(mlp.gate_up_proj, "bias", None)
        down_bias = getattr(mlp.down_proj, "bias", None)
        biased = gate_up_bias is not None or down_bias is not None
        in_kernel = one_copy is not None or packed.supported(
            down_rows.shape[1], down_rows.dtype, down_rows.device, biased
        )
        super().__init__(d_ff, packed.ALIGN if in_kernel else 1, grow=shard.size > 1)
        self.one_copy = one_copy
        self.shard, self.first = shard, shard.rank * d_ff  # the global index of neuron 0 here
        self.packed, self.down_bias = in_kernel, down_bias
        self.mlp, self.act_fn = mlp, mlp.act_fn
        self.gate, self.up = gate, up  # (D_ff, H) each
        self.down_rows = down_rows  # (D_ff, H): each neuron's down column as a row
        self.gate_bias, self.up_bias = (None, None) if gate_up_bias is None else \
            (gate_up_bias[:d_ff], gate_up_bias[d_ff:])  # fmt: skip

    def slot_weights(self, slots: int) -> SlotWeights:
        if self.one_copy is not None:
            return OneCopyKept(self.one_copy, slots)
        if self.packed and packed.fits(self.down_rows.shape[1], slots):
            return packed.PackedKeptWeights(self.gate, self.up, self.down_rows, slots)
        return KeptWeights(self.gate, self.up, self.down_rows,
                           (self.gate_bias, self.up_bias, self.down_bias), self.act_fn,
                           slots)  # fmt: skip

    def set_index(self, index: torch.Tensor | None):
        if index is not None and self.shard.size > 1:
            mine = (index >= self.first) & (index < self.first + self.d_ff)
            index = index[mine] - self.first
        return super().set_index(index)

    @property
    def relays(self) -> bool:
        return self.one_copy is not None

    def restart(self) -> None:
        super().restart()
        if self.one_copy is not None:
            self.one_copy.reset()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = super().forward(x)
        return out if self.index is None else self.shard.reduce(out)  # dense: vLLM's reduces

    def dense(self, x: torch.Tensor) -> torch.Tensor:
        return self.mlp.dense(x)

    def activation(self, x: torch.Tensor) -> torch.Tensor:  # as vLLM's own forward computes it
        return self.act_fn(self.mlp.gate_up_proj(x)[0])

    def project(self, z: torch.Tensor) -> torch.Tensor:
        return self.mlp.down_proj.forward(z)[0]

    @property
    def weight(self) -> torch.Tensor:
        return self.one_copy.w2 if self.one_copy is not None else self.down_rows


FFN_SITES = frozenset({"gate_act", "mlp_mid"})  # hidden states inside the FFN's op


def compilable(method: PruningMethod) -> bool:
    """Whether `method` runs right in a compiled vLLM: its glue (kept sets, observers on the
    down projection, masks of FFN-internal states) lives inside the FFN's opaque op
    (`bwprune.vllm.binding.ffn_route`), which runs eagerly at every forward."""
    if not decides_per_forward(method) or isinstance(method, NeuronSetMethod):
        return True
    return set(method.sites) <= FFN_SITES


def refuse_tensor_parallel(method: PruningMethod, model: nn.Module, size: int, name: str) -> None:
    """One line, before vLLM starts, if `method` on `model` (the HF model called `name`) cannot
    run on `size` tensor-parallel workers: a keep mask of a shard would be the method's whole view
    of a layer (its ledger would count one shard); a model of per-layer widths (TriSP's) is split
    by no rule vLLM knows; vLLM splits FFN neurons only by sizes that divide them, and heads too
    unless they can be padded (`bwprune.vllm.binding.support.splits`)."""
    from bwprune.vllm.binding.widths import STRUCTURE_KEY

    if size == 1:
        return
    own_widths = hasattr(model.config, STRUCTURE_KEY)
    if own_widths or (decides_per_forward(method) and not isinstance(method, NeuronSetMethod)):
        raise UserError(
            f"{type(method).__name__} cannot run at generation.vllm.tensor_parallel_size={size}: "
            "there, run a method that keeps neuron sets (ours, griffin) or prunes weights in "
            "place (dense, wanda)"
        )
    refuse_split(model.config, size, type(model).__name__, name)


class VLLMHost(Host):
    """The glue on a vLLM model built by the plugin (`bwprune.vllm.binding.plugin`)."""

    def __init__(self, method: PruningMethod, compiled: bool, tp_select: str = "global") -> None:
        """`compiled`: the engine runs the model under torch.compile; `tp_select`: how a
        tensor-parallel rank's kept set is chosen (`bwprune.methods.sharded.TP_SELECT`)."""
        super().__init__(method)
        self.compiled, self.tp_select = compiled, tp_select
        self.shard = Shard.current()
        self._order: torch.Tensor | None = None  # vLLM's index of each token; None: the same
        self._count = 0  # tokens vLLM's next forward runs

    def attach(self, model: nn.Module, adapter=None):
        if self.compiled and not compilable(self.method):
            # vLLM compiles the decoder without guards: a Python branch inside it is frozen at
            # warm-up, so glue outside the FFN's op would run once and never after.
            raise UserError(
                f"{type(self.method).__name__} masks hidden states outside the FFN "
                f"({', '.join(sorted(set(self.method.sites) - FFN_SITES))}), which vLLM's "
                "compiled model would freeze at warm-up; run it with enforce_eager"
            )
        if self.glued and not hasattr(model, "bwprune_session"):
            raise UserError(
                f"the vLLM model is {type(model).__name__}, not one of the bwprune plugin's "
                "(bwprune.vllm.binding.plugin): is bwprune installed in vLLM's environment?"
            )
        if isinstance(self.method, NeuronSetMethod) and any(
            not isinstance(sources, OneCopyFFN) and any(w.is_meta for w in sources)
            for sources in self.mlp_weights(model)
        ):
            raise UserError(
                f"{type(self.method).__name__} slices the MLP, but this vLLM engine was built for "
                "a method that does not and kept no MLP rows (additional_config bwprune.rows)"
            )
        hooks = super().attach(model, adapter)
        if self.tp_select == "per_rank" and isinstance(self.method, NeuronSetMethod):
            # the gathered scores, chosen shard by shard as each rank would alone
            self.method.selection = PerRank(self.shard.size, self.log.per_rank_missed.append)
            hooks.on_close(lambda: delattr(self.method, "selection"))
        return hooks

    @staticmethod
    def mlp_weights(model: nn.Module) -> list[MLPSources] | list[OneCopyFFN]:
        """Each layer's gate and up rows and down's neuron rows: those the plugin kept at load
        time (or each MLP's one copy, kept in place), else from the layers' own (random weights
        of a dummy load, which calls no `load_weights`) while vLLM has not packed them away."""
        kept = getattr(model, "bwprune_weights", None)
        if kept is not None:
            return kept
        own = [(layer.mlp.gate_up_proj.weight, layer.mlp.down_proj.weight)
               for layer in model.model.layers]  # fmt: skip
        if any(w.numel() == 0 for pair in own for w in pair):
            raise UserError("vLLM packed the MLP weights before the plugin could keep them "
                            "(a dummy load on CPU): load real weights")  # fmt: skip
        return [(*gate_up.chunk(2), neuron_rows(down)) for gate_up, down in own]

    def place(self, order: torch.Tensor | None, count: int) -> None:
        """The next forward's tokens: vLLM's index of each of the method's tokens (None: vLLM
        runs them in the method's order, nothing else), and how many vLLM runs (it may pad)."""
        self._order, self._count = order, count

    def ffns(self, model: nn.Module, adapter=None) -> list[FFNSlot]:
        layers = model.model.layers
        if [s.mlp for s in self.sliced] != [layer.mlp for layer in layers]:
            self.sliced = [SlicedMLP(layer.mlp, w, self.shard) for layer, w in
                           zip(layers, self.mlp_weights(model))]  # fmt: skip
        return [FFNSlot(layer.mlp.bwprune_route, "impl", layer.mlp.down_proj, s)
                for layer, s in zip(layers, self.sliced)]  # fmt: skip

    def site(self, model: nn.Module, adapter, layer: int, name: str) -> Site:
        decoder = model.model.layers[layer]
        mlp = decoder.mlp
        if name == "gate_act":  # vLLM fuses gate and up: the gate is the first half
            d = mlp.down_proj.input_size_per_partition
            return Site(
                mlp.gate_up_proj, "output", F.silu,
                part=lambda out: out[0][..., :d],
                with_part=lambda out, g: (torch.cat([g, out[0][..., d:]], dim=-1), *out[1:]),
            )  # fmt: skip
        return {
            "attn_in": Site(decoder.input_layernorm, "output", None, _first, _with_first),
            "attn_out": Site(decoder.self_attn.o_proj, "input"),
            "mlp_in": Site(decoder.post_attention_layernorm, "output", None, _first, _with_first),
            "mlp_mid": Site(mlp.down_proj, "input"),
        }[name]

    def num_layers(self, model: nn.Module, adapter=None) -> int:
        return len(model.model.layers)

    def tokens(self, ctx: StepContext, valid: torch.Tensor, slots: torch.Tensor | None) -> Tokens:
        return self.padded_tokens(ctx, valid, slots)

    def whole(self, layer: int, z: torch.Tensor) -> torch.Tensor:
        if self.shard.size == 1:
            return z
        start = time.perf_counter()
        z = self.shard.gather(z)
        self.log.gathered(layer, time.perf_counter() - start)
        return z

    def flat(self, x: torch.Tensor) -> torch.Tensor:
        return x if self._order is None else x.index_select(-2, self._order)

    def unflat(self, keep: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
        if self._order is None:
            return keep
        full = torch.ones(like.shape, dtype=torch.bool, device=like.device)
        full[self._order] = keep
        return full

    def sink_shape(self, valid: torch.Tensor) -> tuple[int, ...]:
        return (self._count,)

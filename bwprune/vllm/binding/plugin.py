"""The vLLM model plugin: model classes a pruning method can run inside.

vLLM loads `register` in every process it starts (entry point `vllm.general_plugins`), and a
run selects these classes with `hf_overrides={"architectures": [...]}` (`ARCHITECTURES`). They
are vLLM's own Llama and Qwen2 models with these additions:

- after loading, each layer's MLP weights are kept: vLLM's CPU build repacks linear weights for
  oneDNN and empties `.weight`, and a kept neuron set needs rows of the original
  (`bwprune.vllm.binding.host.SlicedMLP` gathers from them): gate and up as the checkpoint's
  own rows, views of its mapped file (`mlp_sources`), down as its neurons' rows (`neuron_rows`,
  the layout a refresh gathers from; the original then goes). Down's rows are a third of the MLP
  held twice, so an engine for a method that never slices
  (`additional_config={"bwprune": {"rows": False}}`) keeps only their shapes; and one that keeps
  its kept sets in place (`{"kept_weights": "in_place"}`) holds each MLP once, in the panels of
  vLLM's CPU MoE kernel, with no oneDNN pack beside it (`bwprune.vllm.binding.one_copy`);
- each checkpoint tensor's file pages leave the process once vLLM has copied it
  (`bwprune.models.file_pages`): the load otherwise holds the mapped file beside the weights;
- on CPU, an output matrix of its own is packed for oneDNN and kept as loaded too, and the input
  embedding is packed for a matmul it never runs (vLLM packs every vocabulary layer alike): with
  untied embeddings the plugin skips the embedding's pack and drops the output matrix once packed,
  about 1.7 GiB of fp32 at the 1.5B's vocabulary (`untie_packs`); and the embedding's lookups
  read the checkpoint's own table, mapped, not a copy (`lookup_from_checkpoint`);
- every forward goes through `bwprune_session` when one is bound (`bwprune.vllm.binding.session`):
  it reads which requests and tokens the forward runs, and drives the method around it;
- each layer's MLP runs through its route (`bwprune.vllm.binding.ffn_route`), an opaque op while
  vLLM compiles, so a host can change what it computes after the decoder was compiled.

A model whose layers have widths of their own (TriSP's, its config recording them) is built by
`BwpruneWidthsForCausalLM` (`bwprune.vllm.binding.widths`), for both families; `architecture` picks.

With no session bound and no host attached a forward computes what vLLM's own does.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from functools import partial

import torch
from vllm.model_executor.models.llama import LlamaForCausalLM
from vllm.model_executor.models.qwen2 import Qwen2ForCausalLM
from vllm.platforms import current_platform

from bwprune.errors import UserError
from bwprune.models.file_pages import FilePages, released
from bwprune.models.sliced_mlp import neuron_rows
from bwprune.vllm.binding.ffn_route import route
from bwprune.vllm.binding.host import Shard
from bwprune.vllm.binding.one_copy import hold_once
from bwprune.vllm.binding.widths import WidthsForCausalLM


def untie_packs(embedding: torch.nn.Module, head: torch.nn.Module) -> None:
    """With an output matrix of its own (untied), the embedding only looks rows up and the head
    only multiplies through its pack: skip the one and free the other's weight once packed. A
    tied head is the embedding module itself (or shares its method): vLLM packs the table for the
    output matmul and keeps it for the lookup, which reads the checkpoint's rows
    (`lookup_from_checkpoint`), so the pages the pack read leave the process after it."""
    if head is embedding or head.quant_method is embedding.quant_method:
        pack = embedding.quant_method.process_weights_after_loading

        def pack_and_release(layer: torch.nn.Module) -> None:
            pack(layer)
            FilePages().release(layer.weight)

        embedding.quant_method.process_weights_after_loading = pack_and_release
        return
    embedding.quant_method.process_weights_after_loading = lambda layer: None
    pack = head.quant_method.process_weights_after_loading

    def pack_and_drop(layer: torch.nn.Module) -> None:
        pack(layer)
        if (
            getattr(layer, "cpu_linear", torch.nn.functional.linear)
            is not torch.nn.functional.linear
        ):
            layer.weight = torch.nn.Parameter(layer.weight.new_empty(0), requires_grad=False)

    head.quant_method.process_weights_after_loading = pack_and_drop


def lookup_from_checkpoint(embedding: torch.nn.Module, checkpoint: dict[str, torch.Tensor]) -> None:
    """The input embedding's table becomes the checkpoint's own, a view of the mapped file, where
    it is what vLLM loaded (same dtype, device, shape and rows): a lookup reads a few rows a
    step, so the table need not be held in memory beside the weights that every step reads
    (0.87 GiB of fp32 at the 1.5B's vocabulary, 0.51 GiB at the 0.5B's). The mapping keeps the
    file: a run's own export of pruned weights, deleted once loaded, frees its disk space when
    the engine closes."""
    own = checkpoint.get("model.embed_tokens.weight")
    if _as_loaded(own, embedding.weight):
        embedding.weight.data = own


def _as_loaded(own: torch.Tensor | None, loaded: torch.Tensor) -> bool:
    """Whether a checkpoint tensor is what vLLM loaded from it: same dtype, device and shape, and
    the same first and last rows (a layout vLLM changes while loading shows there)."""
    if own is None or (own.dtype, own.device, own.shape) != (loaded.dtype, loaded.device,
                                                             loaded.shape):  # fmt: skip
        return False
    return torch.equal(own[[0, -1]], loaded[[0, -1]])


def _noting(weights: Iterable[tuple[str, torch.Tensor]], into: dict[str, torch.Tensor],
            rows: bool) -> Iterator[tuple[str, torch.Tensor]]:  # fmt: skip
    """`weights` as they pass, the input embedding and (if `rows`) each layer's gate and up
    projections noted in `into`."""
    for name, tensor in weights:
        mlp = rows and name.endswith((".mlp.gate_proj.weight", ".mlp.up_proj.weight"))
        if mlp or name == "model.embed_tokens.weight":
            into[name] = tensor
        yield name, tensor


def mlp_sources(mlp: torch.nn.Module, checkpoint: dict[str, torch.Tensor],
                prefix: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:  # fmt: skip
    """A layer's gate and up rows and down's neuron rows, for kept sets to be gathered from.

    Gate and up are this worker's rows of the checkpoint's own tensors where they are what vLLM
    loaded (same dtype and rows): views of the mapped file, while vLLM packs its copy away. Their
    pages are the page cache's, mapped in as neurons enter kept sets (with the kernel's
    fault-around, most of gate and up by the first set): clean, so memory pressure drops them
    (a later refresh reads them again) rather than swapping or killing.
    (Dropping them after every refresh made the next one fault them back: +75 ms a refresh for
    the 1.5B's gate rows alone, against 23 ms for the gather itself.) Otherwise (another dtype, a
    checkpoint in another layout) vLLM's loaded gate|up is kept, two thirds of an MLP of
    anonymous memory beside its pack."""
    gate_up = mlp.gate_up_proj.weight
    d = gate_up.shape[0] // 2
    sources, first = (gate_up[:d], gate_up[d:]), Shard.current().rank * d
    from_file = [checkpoint.get(f"{prefix}.{name}_proj.weight") for name in ("gate", "up")]
    rows = [None if w is None else w[first : first + d] for w in from_file]
    if all(_as_loaded(r, own) for r, own in zip(rows, sources)):
        sources = tuple(rows)
    return (*sources, neuron_rows(mlp.down_proj.weight))


class _Hosted:
    """Mixin over a vLLM causal LM whose decoder layers have `mlp.gate_up_proj/down_proj`."""

    bwprune_session = None  # bwprune.vllm.binding.session.Session while a method runs

    def __init__(self, *, vllm_config, prefix: str = "") -> None:
        super().__init__(vllm_config=vllm_config, prefix=prefix)
        settings = (vllm_config.additional_config or {}).get("bwprune") or {}
        self.bwprune_rows = bool(settings.get("rows", True))
        self.bwprune_in_place = self.bwprune_rows and settings.get("kept_weights") == "in_place"
        for layer in self.model.layers:  # before vLLM first traces the decoder
            route(layer.mlp)
        if current_platform.is_cpu() and getattr(self, "lm_head", None) is not None:
            untie_packs(self.model.embed_tokens, self.lm_head)

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        checkpoint: dict[str, torch.Tensor] = {}
        rows = self.bwprune_rows and not self.bwprune_in_place
        loaded = super().load_weights(released(_noting(weights, checkpoint, rows)))
        if current_platform.is_cpu():
            lookup_from_checkpoint(self.model.embed_tokens, checkpoint)
        if self.bwprune_in_place:
            self.bwprune_weights = [hold_once(layer.mlp) for layer in self.model.layers]
            return loaded
        self.bwprune_weights = [
            mlp_sources(layer.mlp, checkpoint, f"model.layers.{i}.mlp") if self.bwprune_rows
            else tuple(w.to("meta") for w in (*layer.mlp.gate_up_proj.weight.chunk(2),
                                               layer.mlp.down_proj.weight.t()))
            for i, layer in enumerate(self.model.layers)
        ]  # fmt: skip
        return loaded

    def forward(self, input_ids, positions, intermediate_tensors=None, inputs_embeds=None):
        run = partial(super().forward, input_ids, positions, intermediate_tensors, inputs_embeds)
        session = self.bwprune_session
        return run() if session is None else session.forward(positions, run)


class BwpruneLlamaForCausalLM(_Hosted, LlamaForCausalLM):
    pass


class BwpruneQwen2ForCausalLM(_Hosted, Qwen2ForCausalLM):
    pass


class BwpruneWidthsForCausalLM(_Hosted, WidthsForCausalLM):
    pass


# HF architecture -> this plugin's class for it, and the name a run selects it by.
_HOSTED = {"LlamaForCausalLM": BwpruneLlamaForCausalLM, "Qwen2ForCausalLM": BwpruneQwen2ForCausalLM}
ARCHITECTURES = {arch: cls.__name__ for arch, cls in _HOSTED.items()}


def architecture(hf_architecture: str, own_widths: bool) -> str:
    """The plugin class a run selects for a model of HF class `hf_architecture`; `own_widths`:
    its config records per-layer widths (`bwprune.vllm.binding.widths.STRUCTURE_KEY`)."""
    if hf_architecture not in ARCHITECTURES:
        raise UserError(f"vLLM host: model class {hf_architecture!r} has no plugin class; choose "
                        f"one of {sorted(ARCHITECTURES)}")  # fmt: skip
    return BwpruneWidthsForCausalLM.__name__ if own_widths else ARCHITECTURES[hf_architecture]


def register() -> None:
    """The `vllm.general_plugins` entry point: make the classes known to vLLM's registry.

    They are registered as classes, not as "module:Class" strings: this module is imported
    already, and a string makes vLLM inspect each class in a fresh process (about 10 s here,
    until its cache under VLLM_CACHE_ROOT holds it), to spare an import that has happened."""
    from vllm import ModelRegistry

    for cls in (*_HOSTED.values(), BwpruneWidthsForCausalLM):
        if cls.__name__ not in ModelRegistry.get_supported_archs():
            ModelRegistry.register_model(cls.__name__, cls)

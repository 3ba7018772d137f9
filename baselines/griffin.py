"""`griffin`: GRIFFIN, prompt-prompted adaptive structured pruning (Dong, Chen, Chi,
arXiv 2404.01365, COLM 2024).

Official code: github.com/hdong920/GRIFFIN @ d1d3d6e (`src/griffin/llama.py`, mode `gen`,
selection `topk`). The prompt pass computes the full FF block; with z_t = act(W_gate x_t) ⊙
W_up x_t the FF activation of prompt token t, each row is normalised, z̄_t = z_t / ‖z_t‖₂, and
neuron j scores s_j = ‖(z̄_{1,j}, …, z̄_{S,j})‖₂, the L2 norm over prompt tokens. Each layer keeps
the k = ⌊(1 − ρ)·D_FF⌋ top-scoring neurons (`density` 0.5 in all its scripts) and every decode
step runs only those rows of W_gate/W_up and columns of W_down, fixed for the whole generation.

Batches. GRIFFIN runs batch 1 only (`prepare_reduced_weights` asserts it). Paper A's adaptation
(docs/paper-notes.md#baselines-in-batches) shares one expert set: per-row prompt scores over each
row's own valid tokens (padding excluded) are aggregated over the batch (`aggregate`, mean by
default as the ARR version says the baselines average; max available) and top-k is taken on the
aggregate. At batch 1 this is GRIFFIN exactly. The kept neurons run as real smaller matmuls
(`SlicedMLP`).

Deviation: the score is GRIFFIN's unnormalised L2 over tokens (no 1/√S as in paper A's Eq. 2), so
with `mean` a longer prompt weighs more in the batch score, as its raw score is larger.

Streams (continuous batching). Each slot keeps its row's prompt scores. A row that leaves frees
its slot (its prompt no longer counts, but the mask stays until the next entry); rows that enter
store their prompts' scores in their slots, and the mask is chosen again: top-k of the aggregate
over the prompts of every row then in the batch, entering and still running. A generation's
first prompts are the first rows entering. A row's prompt is its only say, as in GRIFFIN; decode
steps never move the mask.
"""

from __future__ import annotations

import torch
from torch import nn
from transformers import PreTrainedTokenizerBase

from bwprune.errors import check_sparsity, choices_error
from bwprune.methods.neuron_scores import AGGREGATES, aggregate, kept_count
from bwprune.methods.neuron_set import NeuronSetMethod, PhaseScores
from bwprune.models.adapters import ModelAdapter


class Griffin(NeuronSetMethod):
    """Top-k FFN neurons from the prompt's normalised activations, fixed through decoding."""

    def __init__(self, sparsity: float, aggregate: str) -> None:
        check_sparsity(sparsity)
        if aggregate not in AGGREGATES:
            raise choices_error("aggregate", aggregate, AGGREGATES)
        self.sparsity, self.aggregate = sparsity, aggregate
        self.k: list[int] = []  # kept neurons per layer

    def prepare(
        self, model: nn.Module, adapter: ModelAdapter, tokenizer: PreTrainedTokenizerBase
    ) -> None:
        self.k = [kept_count(d, self.sparsity, "floor") for d in self.shape.d_ff]

    def start(self, batch_size: int) -> None:
        """Per slot: its row's GRIFFIN scores s_j per layer, and whether its prompt had a token
        (kept in `slot_state`, so they follow compaction and refills)."""
        device = self.slots.occupied.device
        self.slot_state["prompted"] = torch.zeros(batch_size, dtype=torch.bool, device=device)
        self.slot_state["scores"] = [torch.zeros(batch_size, d, device=device)
                                     for d in self.shape.d_ff]  # fmt: skip

    def prompts_entered(self, slots: torch.Tensor, scores: PhaseScores) -> None:
        if self.sparsity == 0:
            return
        state = self.slot_state
        state["prompted"] = state["prompted"].index_copy(0, slots, scores.rows[slots])
        state["scores"] = [
            held.index_copy(0, slots, entered[slots].sqrt())  # GRIFFIN's s_j per row
            for held, entered in zip(state["scores"], scores.sum_sq)
        ]
        self._select()

    def _select(self) -> None:
        """Top-k per layer of the prompt scores aggregated over the slots holding a row."""
        rows = self.slot_state["prompted"] & self.slots.occupied
        self.set_kept([
            self.top(aggregate(s, rows, self.aggregate), k)
            for s, k in zip(self.slot_state["scores"], self.k)
        ])  # fmt: skip

"""`griffin`: GRIFFIN, prompt-prompted adaptive structured pruning (Dong, Chen, Chi,
arXiv 2404.01365, COLM 2024).

Official code: github.com/hdong920/GRIFFIN @ d1d3d6e (`src/griffin/llama.py`, mode `gen`,
selection `topk`). The prompt pass computes the full FF block; with z_t = act(W_gate x_t) ⊙
W_up x_t the FF activation of prompt token t, each row is normalised, z̄_t = z_t / ‖z_t‖₂, and
neuron j scores s_j = ‖(z̄_{1,j}, …, z̄_{S,j})‖₂, the L2 norm over prompt tokens. Each layer keeps
the k = ⌊(1 − ρ)·D_FF⌋ top-scoring neurons (`density` 0.5 in all its scripts) and every decode
step runs only those rows of W_gate/W_up and columns of W_down, fixed for the whole generation.

Batches. GRIFFIN runs batch 1 only (`prepare_reduced_weights` asserts it). Paper A's adaptation
(paper-specs A.7) shares one expert set: per-row prompt scores over each row's own valid tokens
(padding excluded) are aggregated over the batch (`aggregate`, mean by default as the ARR version
says the baselines average; max available) and top-k is taken on the aggregate. At batch 1 this is
GRIFFIN exactly. The kept neurons run as real smaller matmuls (`SlicedMLP`).

Deviation: the score is GRIFFIN's unnormalised L2 over tokens (no 1/√S as in paper A's Eq. 2), so
with `mean` a longer prompt weighs more in the batch score, as its raw score is larger.

Streams (continuous batching). Each slot keeps its row's prompt scores and whether a row occupies
it. A row that leaves frees its slot (its prompt no longer counts, but the mask stays until the
next entry); rows that enter store their prompts' scores in their slots, and the mask is chosen
again: top-k of the aggregate over the prompts of every row then in the batch, entering and still
running. A row's prompt is its only say, as in GRIFFIN; decode steps never move the mask.
"""

from __future__ import annotations

import torch
from torch import nn
from transformers import PreTrainedTokenizerBase

from bwprune.errors import UserError, choices_error
from bwprune.methods.base import Phase, StepContext
from bwprune.methods.neuron_mask import NeuronMaskMethod, PhaseScores
from bwprune.methods.neuron_scores import AGGREGATES, aggregate, kept_count, topk_index
from bwprune.models.adapters import ModelAdapter


class Griffin(NeuronMaskMethod):
    """Top-k FFN neurons from the prompt's normalised activations, fixed through decoding."""

    def __init__(self, sparsity: float, aggregate: str = "mean") -> None:
        super().__init__()
        if not 0.0 <= sparsity < 1.0:
            raise UserError(f"sparsity={sparsity} is outside [0, 1)")
        if aggregate not in AGGREGATES:
            raise choices_error("aggregate", aggregate, AGGREGATES)
        self.sparsity, self.aggregate = sparsity, aggregate
        self.k: list[int] = []  # kept neurons per layer
        self.prompt_scores: list[torch.Tensor] = []  # (B, D) per layer: s_j of each slot's row
        self.occupied = torch.zeros(0, dtype=torch.bool)  # (B,) slots whose row counts

    def prepare(
        self, model: nn.Module, adapter: ModelAdapter, tokenizer: PreTrainedTokenizerBase
    ) -> None:
        self.k = [kept_count(f.d_ff, self.sparsity, "floor") for f in adapter.ffns()]

    def begin_batch(self, batch_size: int) -> None:
        self.set_kept(None)  # the prompt pass is dense
        self.phase = PhaseScores(len(self.sliced)) if self.sparsity > 0 else None
        device = self.sliced[0].down_proj.weight.device if self.sliced else None
        self.prompt_scores = [torch.zeros(batch_size, s.d_ff, device=device) for s in self.sliced]
        self.occupied = torch.zeros(batch_size, dtype=torch.bool, device=device)

    def after_forward(self, ctx: StepContext) -> None:
        if ctx.phase is Phase.PREFILL and self.phase is not None:
            phase, self.phase = self.phase, None
            self.prompt_scores = [s.sqrt() for s in phase.sum_sq]  # GRIFFIN's s_j per row
            self.occupied = phase.rows
            self._select()

    def keep_rows(self, index: torch.Tensor) -> None:
        super().keep_rows(index)
        index = index.to(self.occupied.device)
        self.prompt_scores = [s[index] for s in self.prompt_scores]
        self.occupied = self.occupied[index]

    def rows_left(self, slots: torch.Tensor) -> None:
        self.occupied[slots.to(self.occupied.device)] = False

    def prompts_entered(self, slots: torch.Tensor, scores: PhaseScores) -> None:
        if self.sparsity == 0:
            return
        slots = slots.to(self.occupied.device)
        for held, entered in zip(self.prompt_scores, scores.sum_sq):
            held[slots] = entered.sqrt()
        self.occupied[slots] = scores.rows
        self._select()

    def _select(self) -> None:
        """Top-k per layer of the slots' prompt scores aggregated over the occupied slots."""
        self.set_kept([
            topk_index(aggregate(s, self.occupied, self.aggregate), k)
            for s, k in zip(self.prompt_scores, self.k)
        ])  # fmt: skip

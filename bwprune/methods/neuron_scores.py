"""Pure tensor math for FFN-neuron importance: paper A's Eq. 2–4, also used by Griffin.

No modules, no state beyond the tensors passed in, so every function can be checked on hand-made
inputs. Shapes: B rows, N tokens, D = D_FF neurons.
"""

from __future__ import annotations

import math

import torch

from bwprune.errors import choices_error

AGGREGATES = ("max", "mean")
K_RULES = ("floor", "round")


def unit_sq(z: torch.Tensor, in_place: bool = False) -> torch.Tensor:
    """(..., D) FF activations -> (..., D) (z_t / ‖z_t‖₂)², each token scaled to unit L2 norm.

    Eq. 2's numerator, squared, per token: summed over a phase's tokens, so a token with large
    overall activation cannot dominate. `in_place`: overwrite `z` (float32) with the result, the
    same numbers without a new tensor per op, which on a large batch cost more than the math.
    """
    z = z.float()
    norm = z.norm(dim=-1, keepdim=True).clamp_min(1e-12)
    return z.div_(norm).square_() if in_place else (z / norm).square()


def phase_score(sum_sq: torch.Tensor, count: torch.Tensor) -> torch.Tensor:
    """Eq. 2: s_j = ‖Z̄_{·,j}‖₂ / √T from accumulated `unit_sq` sums (..., B, D) and token
    counts (..., B).

    The 1/√T removes length bias, so a long prompt and a 4-token exploration window are comparable.
    Rows without a valid token score 0.
    """
    return (sum_sq / count.clamp_min(1)[..., None].to(sum_sq.dtype)).sqrt_()


def aggregate(scores: torch.Tensor, rows: torch.Tensor, how: str) -> torch.Tensor:
    """Eq. 3: (..., B, D) per-row scores -> (..., D) batch score over the rows in `rows` (B,)
    bool (any leading dims: layers, scored at once).

    `max` keeps a neuron that any sample needs (the paper's default); `mean` is the ablation.
    Scores are >= 0, so rows left out contribute 0 to `max`.
    """
    if how == "max":
        return (scores * rows[:, None].to(scores.dtype)).amax(dim=-2)
    if how == "mean":
        weights = rows.to(scores.dtype)
        return (scores * weights[:, None]).sum(dim=-2) / weights.sum().clamp_min(1)
    raise choices_error("aggregate", how, AGGREGATES)


def kept_count(d_ff: int, sparsity: float, rule: str = "floor") -> int:
    """k = ⌊(1 − ρ)·D_FF⌋ (paper) or round((1 − ρ)·D_FF) (the SGLang port); at least 1."""
    if rule == "floor":
        k = math.floor((1.0 - sparsity) * d_ff + 1e-9)
    elif rule == "round":
        k = round((1.0 - sparsity) * d_ff)
    else:
        raise choices_error("k_rule", rule, K_RULES)
    return max(1, min(d_ff, k))


def topk_index(scores: torch.Tensor, k: int) -> torch.Tensor:
    """Eq. 4's kept set: indices of the k largest scores, most important first.

    The order is no part of the set, but a host fills a generation's slots in it
    (`bwprune.models.kept_slots`), and the neurons a later refresh drops are those near the cut
    (in GSM8K runs, 95 % of them came from the last quarter of the kept set), so they share the
    last panels of a kernel's packed weights, and each refresh rewrites fewer of them."""
    index = scores.topk(k, sorted=False).indices
    return index[scores[index].argsort(descending=True, stable=True)]

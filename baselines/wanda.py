"""`wanda`: Wanda, pruning by weights and activations (Sun, Liu, Bair, Kolter, arXiv 2306.11695,
ICLR 2024).

Official code: github.com/locuslab/wanda @ 8e8fc87 (`lib/prune.py` `prune_wanda`,
`lib/layerwrapper.py`). For every linear layer of every decoder layer (q, k, v, o, gate, up, down;
embeddings and lm_head untouched) with weight W (out × in) and calibration inputs X (tokens × in),
S_ij = |W_ij| · ‖X_{:,j}‖₂, and within each output row the lowest-scored weights are zeroed: ⌊in ·
ρ⌋ of them (stable sort) for `unstructured`, or N of every M consecutive inputs for `N:M` (`2:4` is
paper A's setting, docs/paper-notes.md#baselines-in-batches). Layers are pruned in order and each
layer's statistics are taken on the outputs of the already-pruned layers before it.

Batches: weight sparsity is static, so rows are independent at any batch size; the mask is fixed
in `prepare` (the model's weights are edited there; nothing is attached at generation time).

Realized sparsity: the zeroed weights. `params` is their count; `ffn` the zeroed fraction of each
layer's gate/up/down weights (no neuron is skipped). Zeros in dense storage run at dense speed:
there is no speed-up here, on CPU or GPU. PyTorch's 2:4 semi-structured kernels (CUDA, fp16/bf16)
could turn `2:4` into one; they are not used, so speed numbers for Wanda are dense numbers.

Deviations: calibration text is WikiText-2 `valid.txt`, sized by `conf/calibration` (Wanda's code:
C4, 128 windows of max_position_embeddings tokens, 2048 for LLaMA-1, seed 0; paper A, per a
third-party note on its full text: C4, no size or seed given; see conf/method/wanda.yaml). The
cache stores Σ_tokens X_j² per input channel of every linear (which, with the weights, fixes the
masks) for this ρ and pattern.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
from torch import nn
from transformers import PreTrainedTokenizerBase

from bwprune.errors import UserError, check_sparsity
from bwprune.methods.base import PruningMethod, StepContext, StepSparsity
from bwprune.methods.calibrated import LayerStream, calibration_artifact
from bwprune.methods.hooks import HookSet
from bwprune.models.adapters import ModelAdapter

PATTERNS = ("unstructured", "N:M (e.g. 2:4, 4:8)")


def parse_pattern(pattern: str) -> tuple[int, int] | None:
    """`unstructured` -> None; `N:M` -> (N, M) with 0 < N < M."""
    if pattern == "unstructured":
        return None
    n, _, m = pattern.partition(":")
    if not (n.isdigit() and m.isdigit() and 0 < int(n) < int(m)):
        raise UserError(f"pattern={pattern!r} is not valid; choose one of {list(PATTERNS)}")
    return int(n), int(m)


def wanda_mask(
    weight: torch.Tensor, sq_norm: torch.Tensor, sparsity: float, nm: tuple[int, int] | None
) -> torch.Tensor:
    """(out, in) bool mask of the weights to zero, from S = |W| · ‖X_j‖₂ (`prune_wanda`)."""
    score = weight.abs().float() * sq_norm.float().sqrt()[None, :]
    mask = torch.zeros_like(score, dtype=torch.bool)
    if nm is None:  # per output row, the ⌊in · ρ⌋ lowest scores
        drop = score.sort(dim=-1, stable=True).indices[:, : int(score.shape[1] * sparsity)]
        return mask.scatter_(1, drop, True)
    n, m = nm  # per row, N lowest of every M consecutive inputs
    groups = score.reshape(score.shape[0], -1, m)
    drop = groups.topk(n, dim=-1, largest=False).indices
    return mask.reshape_as(groups).scatter_(-1, drop, True).reshape_as(score)


class Wanda(PruningMethod):
    """Static weight pruning by |W| · ‖X‖₂ per output row; `pattern` unstructured or N:M."""

    def __init__(
        self,
        sparsity: float,
        pattern: str,
        calibration: Mapping | None,
        cache_dir: str | None,
    ) -> None:
        check_sparsity(sparsity)
        self.nm = parse_pattern(pattern)
        if self.nm and sparsity > 0 and abs(sparsity - self.nm[0] / self.nm[1]) > 1e-9:
            raise UserError(
                f"pattern={pattern!r} prunes exactly {self.nm[0]}/{self.nm[1]} of the weights; "
                f"sparsity={sparsity} must be {self.nm[0] / self.nm[1]} (or 0 for dense); "
                "pattern='unstructured' prunes any fraction"
            )
        if sparsity > 0 and not calibration:
            raise UserError(f"sparsity={sparsity} needs a calibration config (calibration: ...)")
        self.sparsity, self.pattern = sparsity, pattern
        self.edits_weights = sparsity > 0  # weights are zeroed in place in `prepare`
        self.calibration, self.cache_dir = calibration, cache_dir
        self._step: StepSparsity | None = None

    @staticmethod
    def _linears(adapter: ModelAdapter, i: int) -> dict[str, nn.Linear]:
        a, f = adapter.attn(i), adapter.ffn(i)
        return {"q": a.q, "k": a.k, "v": a.v, "o": a.o, "gate": f.gate, "up": f.up, "down": f.down}

    def prepare(
        self, model: nn.Module, adapter: ModelAdapter, tokenizer: PreTrainedTokenizerBase
    ) -> None:
        if self.sparsity == 0:
            return
        m = self.nm[1] if self.nm else 1
        for i in range(len(adapter.layers)):
            for name, lin in self._linears(adapter, i).items():
                if lin.in_features % m:
                    raise UserError(f"pattern={self.pattern!r}: layer {i} {name} has "
                                    f"{lin.in_features} inputs, not a multiple of {m}")  # fmt: skip
        norms = calibration_artifact(
            "wanda", model, adapter, tokenizer, self.calibration, self.cache_dir,
            {"sparsity": self.sparsity, "pattern": self.pattern},
            lambda stream: self._sequential_norms(stream, adapter),
        )  # fmt: skip
        ffn_zeroed, params = [], 0
        for i in range(len(adapter.layers)):
            zeroed = self._prune_layer(adapter, i, norms)
            in_ffn = zeroed["gate"] + zeroed["up"] + zeroed["down"]
            ffn_zeroed.append(in_ffn / adapter.ffn(i).num_params)
            params += sum(zeroed.values())
        device = next(model.parameters()).device
        self._step = StepSparsity(
            torch.tensor(ffn_zeroed, dtype=torch.float64, device=device),
            torch.tensor(float(params), dtype=torch.float64, device=device),
        )

    @torch.no_grad()
    def _prune_layer(
        self, adapter: ModelAdapter, i: int, norms: dict[str, torch.Tensor]
    ) -> dict[str, int]:
        """Zero layer i's weights in place; returns the number zeroed per linear."""
        zeroed = {}
        for name, lin in self._linears(adapter, i).items():
            mask = wanda_mask(lin.weight, norms[f"{i}.{name}"], self.sparsity, self.nm)
            lin.weight.masked_fill_(mask, 0)
            zeroed[name] = int(mask.sum())
        return zeroed

    @torch.no_grad()
    def _sequential_norms(
        self, stream: LayerStream, adapter: ModelAdapter
    ) -> dict[str, torch.Tensor]:
        """Σ_tokens X_j² of every linear's inputs, layer by layer: layer i is measured dense on
        the outputs of pruned layers < i, pruned to produce layer i+1's inputs, then restored
        (the caller prunes from the returned statistics, so a cache hit takes the same path)."""
        norms: dict[str, torch.Tensor] = {}
        for i in range(len(adapter.layers)):
            linears = self._linears(adapter, i)

            def add(module: nn.Module, args: tuple, key: str) -> None:
                sq = args[0].float().square().sum(dim=(0, 1))  # (in,)
                norms[key] = norms[key] + sq if key in norms else sq

            with HookSet() as hooks:
                for name, lin in linears.items():
                    hooks.forward_pre(lin, lambda m, a, k=f"{i}.{name}": add(m, a, k))
                stream.forward(i)
            dense = {name: lin.weight.clone() for name, lin in linears.items()}
            self._prune_layer(adapter, i, norms)
            stream.advance(i)
            for name, lin in linears.items():
                lin.weight.copy_(dense[name])
        return norms

    def end_step(self, ctx: StepContext) -> StepSparsity | None:
        return self._step

"""A model loaded from a run config with a pruning method prepared on it.

Shared by run.py's experiment and the lm-eval plug-in, so both load, build the sparsity ledger
and prepare the method in the same order: the ledger sees the model as loaded, and a method that
prunes statically in `prepare` reports what it removed relative to the original.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from omegaconf import DictConfig
from torch import nn
from transformers import PreTrainedTokenizerBase

from bwprune.engine.ledger import SparsityLedger
from bwprune.engine.protocol import MethodDriver
from bwprune.generation.runner import BatchedRunner, EngineConfig, SamplingConfig
from bwprune.methods.base import PruningMethod
from bwprune.models.adapters import ModelAdapter, adapter_for
from bwprune.models.loading import load_model


@dataclass
class PreparedModel:
    """A model loaded from `cfg.model` with a method prepared on it: what every evaluation needs."""

    model: nn.Module
    tokenizer: PreTrainedTokenizerBase
    adapter: ModelAdapter
    method: PruningMethod
    ledger: SparsityLedger  # built before `prepare`: fractions of the model as loaded

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    def runner(self, sampling: SamplingConfig, seed: int, generation: DictConfig) -> BatchedRunner:
        """A batched runner on this model, its engine set by the `generation` config node;
        runners made here share the one ledger."""
        engine = EngineConfig.from_config(generation, self.device)
        invariant = bool(generation.batch_invariant)
        kept = str(generation.get("kept_weights", "buffers"))  # a run recorded before it: buffers
        return BatchedRunner(self.model, self.tokenizer, self.method, self.adapter, sampling,
                             seed, self.ledger, engine, invariant, kept)  # fmt: skip


def prepare_model(
    cfg: DictConfig,
    method: PruningMethod,
    before_prepare: Callable[[PreparedModel], None] | None = None,
) -> PreparedModel:
    """Load `cfg.model`, then `prepare_loaded` on it."""
    model, tokenizer = load_model(cfg.model, cfg.paths.cache_dir)
    return prepare_loaded(model, tokenizer, method, before_prepare)


def prepare_loaded(
    model: nn.Module,
    tokenizer: PreTrainedTokenizerBase,
    method: PruningMethod,
    before_prepare: Callable[[PreparedModel], None] | None = None,
) -> PreparedModel:
    """Build the sparsity ledger on `model` as it is, then prepare `method` on it.

    A method that prunes statically in `prepare` edits `model` (pass a copy to keep the original)
    and reports what it removed relative to it; `before_prepare` sees it unpruned too (dense
    references).
    """
    adapter = adapter_for(model)
    ledger = SparsityLedger(adapter, next(model.parameters()).device)
    prepared = PreparedModel(model, tokenizer, adapter, method, ledger)
    if before_prepare is not None:
        before_prepare(prepared)
    MethodDriver(method, model, adapter, ledger).prepare(tokenizer)
    return prepared

"""`trisp`: the method object the runner sees. All of TriSP happens once, in `prepare`:
calibrate (Eq. 1–3), score and allocate (Eq. 4–6, AL-AM), remove KV groups and neurons for good,
recover (bias compensation or merged LoRA). The result is a smaller dense model that generates like
any other, so `attach` changes nothing and every forward reports the same realized sparsity.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from pathlib import Path

import torch
from torch import nn
from transformers import PreTrainedTokenizerBase

from baselines.trisp.calibrate import collect_statistics
from baselines.trisp.lora import LoraSettings, merge_lora, train_lora
from baselines.trisp.prune import prune_layer, record_structure, save_pruned
from baselines.trisp.scores import SCORES, ZSCORES, plan_pruning
from bwprune.errors import UserError, check_sparsity, choices_error
from bwprune.methods.base import PruningMethod, StepContext, StepSparsity
from bwprune.methods.calibration import artifact_dir, cached_tensors, calibration_windows
from bwprune.models.adapters import ModelAdapter

log = logging.getLogger(__name__)

RECOVERIES = ("none", "bias", "lora")
CALIBRATION_KEYS = ("text_file", "num_sequences", "seq_len", "seed")
STATS_VERSION = 1  # bump when `collect_statistics` changes, so cached statistics are not reused


class TriSP(PruningMethod):
    """Tri-signal structured pruning (paper B) of attention KV groups and MLP neurons.

    `sparsity`: fraction of attention+MLP parameters removed (the last unit may leave it short by
    less than one KV group or neuron). `score`: `trisp` (Eq. 6) or one signal alone, `wifn` (Eq. 4)
    or `gs` (Eq. 5). `zscore`: standardise per `layer` (FLAP's code) or over the whole `model`.
    `attn_square`: square the attention channel scores before the z-score (FLAP's code; paper B's
    text does not).
    `calibration`: the shared calibration config (text_file, num_sequences, seq_len, seed, and
    cache_dir for the statistics; null: no cache). `lora`: `LoraSettings` fields. `save_dir`: where
    to save the pruned model (reload with `baselines.trisp.load_pruned`); null: not saved.
    """

    def __init__(
        self,
        sparsity: float,
        calibration: Mapping,
        score: str,
        zscore: str,
        attn_square: bool,
        recovery: str,
        lora: Mapping | None,
        save_dir: str | None,
    ) -> None:
        check_sparsity(float(sparsity))
        if score not in SCORES:
            raise choices_error("score", score, SCORES)
        if zscore not in ZSCORES:
            raise choices_error("zscore", zscore, ZSCORES)
        if not isinstance(attn_square, bool):  # a string such as "no" would be truthy
            raise UserError(f"attn_square={attn_square!r} must be true or false")
        if recovery not in RECOVERIES:
            raise choices_error("recovery", recovery, RECOVERIES)
        missing = [k for k in CALIBRATION_KEYS if k not in calibration]
        if missing:
            raise UserError(f"calibration lacks {missing}; it needs {list(CALIBRATION_KEYS)}")
        self.sparsity, self.score, self.zscore = float(sparsity), score, zscore
        self.attn_square = attn_square
        self.recovery = recovery
        self.calibration = {k: calibration[k] for k in calibration}
        self.lora = LoraSettings(**{k: lora[k] for k in lora or {}})
        self.save_dir = save_dir
        self.edits_weights = self.sparsity > 0  # `prepare` leaves a smaller model
        self._sparsity: StepSparsity | None = None

    def _statistics(
        self, model: nn.Module, adapter: ModelAdapter, windows: torch.Tensor
    ) -> dict[str, torch.Tensor]:
        """Calibration statistics of the unpruned model, from the artifact cache when present."""
        c = self.calibration
        if not c.get("cache_dir"):
            return collect_statistics(model, adapter, windows)
        key = {"version": STATS_VERSION, "text": str(Path(c["text_file"]).resolve()),
               **{k: c[k] for k in ("num_sequences", "seq_len", "seed")}}  # fmt: skip
        folder = artifact_dir(c["cache_dir"], "trisp", model, key)
        return cached_tensors(folder, key, lambda: collect_statistics(model, adapter, windows))

    def prepare(
        self, model: nn.Module, adapter: ModelAdapter, tokenizer: PreTrainedTokenizerBase
    ) -> None:
        """Calibrate, plan, remove, recover; afterwards `model` is the smaller dense model."""
        if self.sparsity == 0:  # nothing to remove: no bias, no LoRA, exactly the dense model
            return
        c = self.calibration
        windows = calibration_windows(
            tokenizer, c["text_file"], c["num_sequences"], c["seq_len"], c["seed"]
        )
        device = next(model.parameters()).device
        stats = {k: v.to(device) for k, v in self._statistics(model, adapter, windows).items()}
        plan = plan_pruning(
            adapter, stats, self.sparsity, self.score, self.zscore, self.attn_square
        )
        d_ff = torch.tensor([f.d_ff for f in adapter.ffns()], dtype=torch.float64)
        before = adapter.num_params()
        bias = self.recovery == "bias"
        for i in range(len(adapter.layers)):
            prune_layer(
                adapter, i, plan.kv_groups[i], plan.neurons[i],
                stats["attn_mean"][i] if bias else None, stats["mlp_mean"][i] if bias else None,
            )  # fmt: skip
        structure = record_structure(model, adapter)
        if self.recovery == "lora":
            merge_lora(train_lora(model, windows, self.lora))
        removed = before - adapter.num_params()
        kept = torch.tensor(structure["intermediate_size"], dtype=torch.float64)
        self._sparsity = StepSparsity(
            ffn=(1.0 - kept / d_ff).to(device),
            params=torch.tensor(float(removed), dtype=torch.float64, device=device),
        )
        log.info(
            "trisp: removed %.4f of attention+MLP parameters (%d in all); kv heads per layer %s, "
            "intermediate sizes %s", plan.removed_fraction, removed,
            structure["num_kv_heads"], structure["intermediate_size"],
        )  # fmt: skip
        if self.save_dir:
            save_pruned(model, self.save_dir, tokenizer)

    def end_step(self, ctx: StepContext) -> StepSparsity | None:
        """The same every forward: per layer the fraction of the original FFN neurons removed, and
        all parameters removed (heads included), relative to the model as loaded."""
        return self._sparsity

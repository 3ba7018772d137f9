"""LoRA recovery of the pruned model (paper B §3 step 3, Fig. 1): adapters on the frozen pruned
weights, a short fine-tune with the next-token loss (Eq. 1), then merged into the weights.

The paper gives no rank, alpha, data, steps or learning rate; these are config values. Targets are
every attention and MLP projection, LLM-Pruner's recipe (which the paper cites for LoRA recovery).
Training data are the calibration windows: the pruning itself needs no other corpus, and no
instruction set is available offline. `peft` injects the adapters into the model in place, and
`merge_and_unload` returns the same model object with plain `nn.Linear` modules again.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from peft import LoraConfig, PeftModel, get_peft_model
from torch import nn

from baselines.trisp.calibrate import next_token_loss
from bwprune.errors import UserError

TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


@dataclass(frozen=True)
class LoraSettings:
    rank: int = 8
    alpha: float = 16.0
    steps: int = 20
    lr: float = 2e-4
    batch_size: int = 2
    seed: int = 0

    def __post_init__(self) -> None:
        for key in ("rank", "steps", "batch_size"):
            if int(getattr(self, key)) < 1:
                raise UserError(f"lora.{key}={getattr(self, key)!r} must be an integer >= 1")
        for key in ("alpha", "lr"):
            if not float(getattr(self, key)) > 0:
                raise UserError(f"lora.{key}={getattr(self, key)!r} must be > 0")


def train_lora(model: nn.Module, windows: torch.Tensor, cfg: LoraSettings) -> PeftModel:
    """Wrap `model` with LoRA adapters and train them for `cfg.steps` steps on `windows` (N, T),
    cycling through a seeded permutation; returns the (unmerged) PEFT model in eval mode."""
    device = next(model.parameters()).device
    lora = LoraConfig(
        r=cfg.rank, lora_alpha=cfg.alpha, lora_dropout=0.0, target_modules=TARGETS, bias="none"
    )
    peft_model = get_peft_model(model, lora)
    # peft keeps the adapters in float32 on a bf16/fp16 model (`autocast_adapter_dtype`).
    params = [p for p in peft_model.parameters() if p.requires_grad]
    optim = torch.optim.AdamW(params, lr=cfg.lr, weight_decay=0.0)
    order = torch.randperm(len(windows), generator=torch.Generator().manual_seed(cfg.seed))
    peft_model.train()
    with torch.enable_grad():
        for step in range(cfg.steps):
            idx = order[(torch.arange(cfg.batch_size) + step * cfg.batch_size) % len(windows)]
            ids = windows[idx].to(device)
            loss = next_token_loss(peft_model(input_ids=ids, use_cache=False).logits, ids)
            loss.backward()
            optim.step()
            optim.zero_grad(set_to_none=True)
    return peft_model.eval()


def merge_lora(peft_model: PeftModel) -> nn.Module:
    """Fold the adapters into the weights: the original model object, no gradients."""
    model = peft_model.merge_and_unload()
    return model.requires_grad_(False)

"""What the vLLM backend can run, checked before anything is loaded (imports no vLLM)."""

from __future__ import annotations

from omegaconf import DictConfig

from bwprune.errors import UserError


def refuse_unsupported(cfg: DictConfig, kind: str) -> None:
    """One line naming what `generation.backend=vllm` cannot run, and why; `kind`: the
    benchmark's kind (generate | perplexity)."""
    gen = cfg.generation
    if kind != "generate":
        raise UserError(f"generation.backend=vllm generates; a {kind} benchmark scores given "
                        "text through the HF host: use generation.backend=hf")  # fmt: skip
    if gen.get("batch_invariant", False):
        raise UserError("generation.batch_invariant=true needs generation.backend=hf "
                        "(vLLM batches every row it holds)")  # fmt: skip

"""What the vLLM backend can run, checked before anything is loaded (imports no vLLM)."""

from __future__ import annotations

import torch
from omegaconf import DictConfig

from bwprune.errors import UserError, choices_error
from bwprune.methods.sharded import TP_SELECT


def splits(config, size: int) -> bool:
    """Whether vLLM shards a model of this HF `config` over `size` workers: its query heads and
    FFN neurons divide by `size`, and its KV heads divide by it or it by them (replicated)."""
    heads = config.num_attention_heads
    kv = getattr(config, "num_key_value_heads", None) or heads
    kv_fits = kv % size == 0 if kv >= size else size % kv == 0
    return heads % size == 0 and config.intermediate_size % size == 0 and kv_fits


def refuse_split(config, size: int, model: str) -> None:
    """One line, before vLLM starts, when `model` cannot be sharded over `size` workers."""
    if not splits(config, size):
        fits = [n for n in range(1, 17) if splits(config, n)]
        raise UserError(
            f"generation.vllm.tensor_parallel_size={size}: vLLM cannot split {model} "
            f"({config.num_attention_heads} attention heads, "
            f"{getattr(config, 'num_key_value_heads', None) or config.num_attention_heads} KV "
            f"heads, {config.intermediate_size} FFN neurons) over {size} workers; sizes that "
            f"divide it: {fits}"
        )


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
    size = gen.get("vllm", {}).get("tensor_parallel_size", 1)
    if not (isinstance(size, int) and not isinstance(size, bool) and size >= 1):
        raise UserError(f"generation.vllm.tensor_parallel_size={size!r}: a whole number of "
                        "workers, at least 1")  # fmt: skip
    select = gen.get("tp_select", "global")
    if select not in TP_SELECT:
        raise choices_error("generation.tp_select", select, TP_SELECT)
    if select != "global" and size == 1:
        raise UserError(f"generation.tp_select={select} chooses per tensor-parallel rank: it "
                        "needs generation.vllm.tensor_parallel_size > 1")  # fmt: skip
    if size > 1 and gen.vllm.get("executor") == "ray" and not torch.cuda.is_available():
        raise UserError("generation.vllm.executor=ray: vLLM's CPU build runs no Ray workers "
                        "(no Ray device on its platform); on CPU use executor=mp")  # fmt: skip

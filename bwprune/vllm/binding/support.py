"""What the vLLM backend can run, checked before anything is loaded (imports no vLLM)."""

from __future__ import annotations

from omegaconf import DictConfig

from bwprune.errors import UserError, choices_error
from bwprune.methods.sharded import TP_SELECT
from bwprune.vllm.binding.padding import Heads, padding


def splits(config, size: int, model_class: str) -> bool:
    """Whether vLLM shards a model of this HF `config` and class over `size` workers: its FFN
    neurons divide by `size`, and its heads split (`Heads.split`) or are padded until they do
    (`bwprune.vllm.binding.padding`; Llama's family only)."""
    heads = Heads.of(config)
    return config.intermediate_size % size == 0 and (
        heads.split(size) or padding(config, model_class, size) is not None
    )


def refuse_split(config, size: int, model_class: str, model: str) -> None:
    """One line, before vLLM starts, when `model` cannot be sharded over `size` workers."""
    if not splits(config, size, model_class):
        heads = Heads.of(config)
        fits = [n for n in range(1, 17) if splits(config, n, model_class)]
        raise UserError(
            f"generation.vllm.tensor_parallel_size={size}: vLLM cannot split {model} "
            f"({heads.query} attention heads, {heads.kv} KV heads, {config.intermediate_size} "
            f"FFN neurons) over {size} workers; sizes that divide it: {fits}"
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

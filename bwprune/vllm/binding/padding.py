"""Attention padded with zero heads, so that vLLM can split a model over more workers.

vLLM splits attention by heads: their count must divide by the tensor-parallel size, and the KV
heads' count divide by it or it by theirs. SmolLM2-135M has 9 heads over 3 KV heads, so vLLM runs
it on 1 or 3 workers only. A head whose query, key and value weights are zero adds nothing: its
scores are zero, its softmax spreads over zero values, and its columns of the output projection
are zero too. Appending whole groups of such heads (a zero KV head with its zero query heads, so
GQA's grouping of the real heads is kept) gives a model vLLM can split whose every output is the
original's, up to the order in which the output projection's shards are summed. The padding costs
attention work and KV cache in proportion (SmolLM2 at size 2: 12 heads for 9). The FFN, which the
methods prune, is untouched, and so is what the ledger counts (the HF model's own parameters).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

import torch

# vLLM's Llama reads `head_dim` from the config; its Qwen2 derives it from the width and the head
# count, so a padded head count would change every head's width there
PADDABLE = ("LlamaForCausalLM",)


@dataclass(frozen=True)
class Heads:
    """A model's attention heads: query heads, and the KV heads they share in equal groups."""

    query: int
    kv: int

    @classmethod
    def of(cls, config) -> Heads:
        query = config.num_attention_heads
        return cls(query, getattr(config, "num_key_value_heads", None) or query)

    def split(self, size: int) -> bool:
        """Whether vLLM splits these heads over `size` workers (KV heads replicated when fewer)."""
        kv_fits = self.kv % size == 0 if self.kv >= size else size % self.kv == 0
        return self.query % size == 0 and kv_fits

    def padded(self, size: int, hidden: int) -> Heads | None:
        """The fewest whole groups appended for vLLM to split the heads over `size` workers, their
        count dividing the `hidden` width (as transformers' configs require); None: no such."""
        group = self.query // self.kv
        for kv in range(self.kv, hidden // group + 1):
            heads = Heads(kv * group, kv)
            if heads.split(size) and hidden % heads.query == 0:
                return heads
        return None


def padding(config, model_class: str, size: int) -> Heads | None:
    """The heads to pad `config`'s model (of `model_class`) to for vLLM to split it over `size`
    workers: None when its heads split already, or when no padding can make them."""
    heads = Heads.of(config)
    if heads.split(size) or model_class not in PADDABLE:
        return None
    return heads.padded(size, config.hidden_size)


def pad_heads(state: dict[str, torch.Tensor], config, to: Heads) -> tuple[dict, object]:
    """`state` (an HF Llama's state dict) and `config` with zero heads appended up to `to`: query,
    key and value rows (and biases) of the new heads zero, the output projection's columns for
    them zero. Returns new objects; the model's own are not touched."""
    have = Heads.of(config)
    width = getattr(config, "head_dim", None) or config.hidden_size // have.query
    rows = {"q_proj": (to.query - have.query) * width, "k_proj": (to.kv - have.kv) * width,
            "v_proj": (to.kv - have.kv) * width}  # fmt: skip
    padded = {}
    for name, tensor in state.items():
        part = name.split(".")[-2] if name.count(".") >= 1 else ""
        if ".self_attn." in name and part in rows:
            extra = tensor.new_zeros(rows[part], *tensor.shape[1:])
            tensor = torch.cat([tensor, extra])
        elif ".self_attn.o_proj.weight" in name:
            extra = tensor.new_zeros(tensor.shape[0], rows["q_proj"])
            tensor = torch.cat([tensor, extra], dim=1)
        padded[name] = tensor
    config = copy.deepcopy(config)
    config.num_attention_heads, config.num_key_value_heads = to.query, to.kv
    config.head_dim = width
    return padded, config

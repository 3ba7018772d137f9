"""Turning a benchmark question into the model's prompt text, through its chat template, and
prompt token rows into the left-padded batch every forward of this project takes."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from omegaconf import DictConfig, OmegaConf
from transformers import PreTrainedTokenizerBase

from bwprune.benchmarks.base import Example


def render_prompt(tokenizer: PreTrainedTokenizerBase, model_cfg: DictConfig, question: str) -> str:
    """The text the model continues: chat template (with the model's options) or the raw question.

    No system prompt unless the model config sets one (DeepSeek-R1 usage recommendation); template
    options such as Qwen3's `enable_thinking` come from `model.chat_template_kwargs`.
    """
    if not model_cfg.chat_template:
        return question
    return render_messages(tokenizer, model_cfg, [{"role": "user", "content": question}])


def batch_prompts(
    tokenizer: PreTrainedTokenizerBase, model_cfg: DictConfig, batch: list[tuple[Example, int]]
) -> list[str]:
    """The prompt of every (example, sample) pair of a batch."""
    return [render_prompt(tokenizer, model_cfg, e.question) for e, _ in batch]


def render_messages(
    tokenizer: PreTrainedTokenizerBase,
    model_cfg: DictConfig,
    messages: list[dict[str, str]],
    add_generation_prompt: bool = True,
) -> str:
    """A chat through the model's template, with the model config's system prompt and options."""
    system = model_cfg.system_prompt
    if system and not (messages and messages[0]["role"] == "system"):
        messages = [{"role": "system", "content": system}, *messages]
    kwargs = OmegaConf.to_container(model_cfg.chat_template_kwargs, resolve=True)
    return tokenizer.apply_chat_template(
        messages,
        tokenize=False,
        add_generation_prompt=add_generation_prompt,
        continue_final_message=not add_generation_prompt,
        **kwargs,
    )


def left_pad(
    rows: Sequence[Sequence[int] | torch.Tensor],
    pad_id: int,
    device: torch.device | str | None = None,
    width: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(B, width) ids and attention mask of token `rows`, each right-aligned after `pad_id`s.

    Left padding is the layout of the runner's prefill: every row's next token goes in the same
    column, and a row's positions count from its first real token. `width` defaults to the
    longest row; a continuous batch passes the longest prompt of its whole work, so that rows
    entering later fit the same columns.
    """
    longest = max(map(len, rows), default=0)
    width = longest if width is None else width
    if width < longest:
        raise ValueError(f"a row of {longest} tokens does not fit width {width}")
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long, device=device)
    attn = torch.zeros_like(ids)
    for b, row in enumerate(rows):
        ids[b, width - len(row) :] = torch.as_tensor(row, dtype=torch.long, device=device)
        attn[b, width - len(row) :] = 1
    return ids, attn

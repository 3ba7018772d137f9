"""What every scorer shares: the `Score` record and the removal of a reasoning model's think block.

Scorers are pure functions of (completion, gold, think_open) so that finished runs can be
rescored from `samples.jsonl` alone. `think_open` is recorded per sample because some chat
templates (DeepSeek-R1 distills) open `<think>` inside the prompt: their completions carry only
the closing tag, and a completion cut off mid-thought carries neither tag.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Score:
    correct: bool | None  # None: unscorable (counted, never silently wrong)
    prediction: str | None  # the extracted answer, as text
    reason: str  # "ok" | "no_answer" | "unfinished_think"


UNFINISHED_THINK = Score(None, None, "unfinished_think")
NO_ANSWER = Score(None, None, "no_answer")


def strip_think(text: str, think_open: bool = False) -> str | None:
    """The answer part of a reasoning model's output; None when the think block never closed.

    `think_open`: the prompt itself ended inside `<think>`, so the completion starts mid-thought.
    """
    if "</think>" in text:
        return text.rsplit("</think>", 1)[1]
    if think_open or "<think>" in text:
        return None
    return text


def prompt_opens_think(prompt: str) -> bool:
    """True when a rendered prompt ends inside an open `<think>` block (R1-distill templates)."""
    return prompt.rfind("<think>") > prompt.rfind("</think>")

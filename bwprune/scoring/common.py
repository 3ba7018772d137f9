"""What every scorer shares: the `Score` record, the finish reasons, and the think-block removal.

Scorers are pure functions of (completion, gold, finish_reason, think_open) so that finished runs
can be rescored from `samples.jsonl` alone. `think_open` is recorded per sample because some chat
templates (DeepSeek-R1 distills) open `<think>` inside the prompt: their completions carry only
the closing tag, and a completion cut off mid-thought carries neither tag. `finish_reason` is
recorded because a completion cut at the token limit has not necessarily said its answer yet:
the scorers refuse to guess one from its reasoning (reason `truncated`).
"""

from __future__ import annotations

from dataclasses import dataclass

from bwprune.errors import choices_error

# How a generation ended (bwprune/generation/runner.py `Completion.finish_reason`).
FINISH_REASONS = ("stop", "length")  # a stop token or string | max_new_tokens reached


@dataclass(frozen=True)
class Score:
    correct: bool | None  # None: unscorable (counted, never silently wrong)
    prediction: str | None  # the extracted answer, as text
    reason: str  # "ok", or why unscorable: "truncated" | "no_answer" | "unfinished_think"


UNFINISHED_THINK = Score(None, None, "unfinished_think")  # the think block never closed
TRUNCATED = Score(None, None, "truncated")  # cut at the token limit before an answer was given
NO_ANSWER = Score(None, None, "no_answer")  # ended on its own without an answer


def was_cut(finish_reason: str) -> bool:
    """True when generation stopped at the token limit; checks `finish_reason` at every scorer's
    entry, so a caller passing anything else fails loudly instead of being scored as finished."""
    if finish_reason not in FINISH_REASONS:
        raise choices_error("finish_reason", finish_reason, FINISH_REASONS)
    return finish_reason == "length"


def unanswered(cut: bool) -> Score:
    """The score of a completion with no answer in it: cut off (`cut`), or ended without one."""
    return TRUNCATED if cut else NO_ANSWER


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

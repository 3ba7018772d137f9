"""Where a pruned completion first leaves the dense one, in tokens.

Samples keep each completion's text, not its token ids, so both texts are re-tokenized with the
run's tokenizer (text decoded from greedy ids encodes back to those ids, bar rare merges at the
seams) and compared id by id. Character spans locate the first differing token in each text for
the viewer. Pure functions: no files, no model.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from transformers import PreTrainedTokenizerBase


@dataclass(frozen=True)
class Tokens:
    """One text's token ids and each token's character span in it."""

    text: str
    ids: list[int]
    spans: list[tuple[int, int]]

    def span(self, i: int) -> tuple[int, int]:
        """Characters of token `i`; an empty span at the end when the text has no token `i`
        (it stopped there)."""
        return self.spans[i] if i < len(self.spans) else (len(self.text), len(self.text))

    def pieces(self, n: int) -> list[str]:
        """The text of the first `n` tokens (tooltips of a per-token strip)."""
        return [self.text[a:b] for a, b in self.spans[:n]]


def tokenize(tokenizer: PreTrainedTokenizerBase, texts: list[str]) -> list[Tokens]:
    """`texts` as the model's tokens, with character offsets (fast tokenizers only)."""
    enc = tokenizer(texts, add_special_tokens=False, return_offsets_mapping=True)
    return [
        Tokens(text, ids, [tuple(s) for s in spans])
        for text, ids, spans in zip(texts, enc["input_ids"], enc["offset_mapping"])
    ]


def first_divergence(a: Sequence[int], b: Sequence[int]) -> int | None:
    """Index of the first token where `a` and `b` differ (the shorter one's length when it is a
    prefix of the other: that one stopped there); None when they are equal."""
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))

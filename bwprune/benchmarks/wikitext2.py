"""WikiText-2 perplexity (Merity et al., 2016): the language-modelling benchmark of the structured
pruning papers (FLAP, TriSP). `kind = "perplexity"`: the experiment evaluates it with
`bwprune.generation.perplexity.evaluate_perplexity`, not by generating answers.

The text is `test.txt` (never `valid.txt`, the calibration text), tokenized once as a whole. It is
cut into windows of `seq_len` tokens starting every `stride` tokens; a window scores only the
tokens no earlier window scored, so with `stride < seq_len` each has `seq_len - stride` tokens of
context before its first scored token (HF's strided perplexity), and with `stride = seq_len`
(`null`, the default) windows are disjoint blocks (FLAP/Wanda's evaluation).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
from transformers import PreTrainedTokenizerBase

from bwprune.benchmarks.base import Benchmark, Example
from bwprune.errors import UserError


@dataclass(frozen=True)
class Window:
    """Tokens [begin, end) of the text; targets at positions >= `first_target` are scored."""

    begin: int
    end: int
    first_target: int  # absolute position of the first scored token (> begin)


class WikiText2(Benchmark):
    kind = "perplexity"

    def __init__(
        self,
        name: str,
        data_file: str,
        seq_len: int = 512,
        stride: int | None = None,
        max_windows: int | None = None,
    ) -> None:
        super().__init__(name, data_file, prompt="")
        stride = seq_len if stride is None else stride
        if seq_len < 2:
            raise UserError(f"seq_len={seq_len!r} must be >= 2")
        if not 1 <= stride <= seq_len:
            raise UserError(f"stride={stride!r} must be in [1, seq_len={seq_len}] (null: seq_len)")
        if max_windows is not None and max_windows < 1:
            raise UserError(f"max_windows={max_windows!r} must be >= 1 (null: the whole file)")
        self.seq_len, self.stride, self.max_windows = seq_len, stride, max_windows

    def token_ids(self, tokenizer: PreTrainedTokenizerBase) -> torch.Tensor:
        """The whole file as one (N,) id sequence (special tokens as the tokenizer adds them)."""
        path = Path(self.data_file)
        if not path.exists():
            raise UserError(f"benchmark data file {str(path)!r} does not exist")
        return tokenizer(path.read_text(encoding="utf-8"), return_tensors="pt").input_ids[0]

    def windows(self, n_tokens: int) -> list[Window]:
        """The windows over `n_tokens` tokens, in order, at most `max_windows` of them."""
        out: list[Window] = []
        prev_end = 1  # token 0 has no context: it is never a target
        for begin in range(0, n_tokens - 1, self.stride):
            end = min(begin + self.seq_len, n_tokens)
            out.append(Window(begin, end, max(prev_end, begin + 1)))
            prev_end = end
            if end == n_tokens or len(out) == self.max_windows:
                break
        return out

    def examples(self) -> list[Example]:
        """None: nothing is generated (the experiment checks `kind` first)."""
        raise UserError(
            f"benchmark {self.name!r} measures perplexity; it has no examples to answer"
        )

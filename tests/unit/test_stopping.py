"""When a row stops (bwprune/engine/stopping.py): the EOS ids it stops at, and stop strings that
span tokens, checked on running rows only."""

from types import SimpleNamespace

import torch

from bwprune.engine.stopping import StopStrings, stop_token_ids


class CharTokenizer:
    """One token per character (id = code point): stop strings span as many tokens as letters."""

    eos_token_id = None

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        return [ord(c) for c in text]

    def decode(self, ids: list[int]) -> str:
        return "".join(map(chr, ids))


def model_with_eos(eos):
    return SimpleNamespace(generation_config=SimpleNamespace(eos_token_id=eos))


def test_stop_ids_join_the_generation_config_and_the_tokenizer():
    tok = CharTokenizer()
    tok.eos_token_id = 2
    assert stop_token_ids(model_with_eos([7, 2, 5]), tok) == [2, 5, 7]  # a list, deduplicated
    assert stop_token_ids(model_with_eos(9), tok) == [2, 9]  # a single id
    assert stop_token_ids(model_with_eos(None), CharTokenizer()) == []


def test_a_stop_string_ends_only_running_rows_whose_tail_holds_it():
    stops = StopStrings(CharTokenizer(), ["\n\n", "", "Q:"])
    assert stops.strings == ["\n\n", "Q:"]  # an empty string would stop every row
    assert stops.window == 4  # the longest string's tokens + 2
    tails = torch.tensor([[ord(c) for c in t] for t in ("ab\n\n", "x Q:", "abcd", "ab Q")])
    finished = torch.tensor([False, True, False, False])
    assert stops.hits(tails, finished).tolist() == [True, False, False, False]

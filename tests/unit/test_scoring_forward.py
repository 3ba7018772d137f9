"""The scoring forward (bwprune/generation/scoring_forward.py) that perplexity and lm-eval's
loglikelihood share: a padded row computes what it computes alone, and the ledger measures the
forward once for each row that has a token."""

import torch

from baselines.dense import Dense
from bwprune.engine.protocol import MethodDriver
from bwprune.generation.prompts import left_pad
from bwprune.generation.scoring_forward import score_forward
from bwprune.models.adapters import adapter_for
from tests.conftest import tiny_model


def test_a_padded_row_scores_what_it_scores_alone_and_each_row_is_measured_once():
    model, tok = tiny_model("tiny_llama")
    driver = MethodDriver(Dense(), model, adapter_for(model))
    rows = [[40, 41, 42, 43, 44, 45], [50, 51, 52], []]
    ids, attn = left_pad(rows, tok.pad_token_id)
    logits, ledger = score_forward(driver, model, ids, attn)
    alone, _ = score_forward(driver, model, *left_pad(rows[1:2], tok.pad_token_id))
    torch.testing.assert_close(logits[1, -3:], alone[0], rtol=1e-4, atol=1e-5)
    assert [r["decode_steps"] for r in ledger] == [1, 1, 0]  # an empty row is not measured
    last, _ = score_forward(driver, model, ids, attn, logits_to_keep=2)
    torch.testing.assert_close(last[:2], logits[:2, -2:], rtol=1e-4, atol=1e-5)

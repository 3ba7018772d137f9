"""The rows a generation writes (bwprune/generation/samples.py): what resume, rescoring and the
tables read back from samples.jsonl and timing.jsonl."""

from bwprune.benchmarks.base import Example
from bwprune.generation.runner import BatchTiming, Completion
from bwprune.generation.samples import sample_row, timing_row
from bwprune.runs.recorder import batch_keys
from bwprune.scoring.common import Score

EXAMPLES = [Example(3, "q3", "What is 2 + 3?", "5"), Example(7, "q7", "Hi", "1")]


def test_a_sample_row_keys_the_problem_and_keeps_what_scoring_needs():
    completion = Completion("so \\boxed{5}", [11, 12, 2], "stop", {"ffn": 0.25})
    row = sample_row(EXAMPLES[0], 1, completion, Score(True, "5", "ok"), False, {"kl": 0.1})
    assert (row["index"], row["sample"], row["id"]) == (3, 1, "q3")
    assert (row["prompt"], row["gold"]) == ("What is 2 + 3?", "5")
    assert (row["completion"], row["finish_reason"], row["new_tokens"]) == (
        "so \\boxed{5}",
        "stop",
        3,
    )
    assert (row["prediction"], row["correct"], row["score_reason"]) == ("5", True, "ok")
    assert row["sparsity"] == {"ffn": 0.25} and row["quality"] == {"kl": 0.1}


def test_a_timing_row_names_its_pairs_in_batch_order_with_milliseconds_per_step():
    timing = BatchTiming(prefill_s=0.5, decode_s=1.5, decode_tokens=6, step_s=[0.0012345, 0.002])
    row = timing_row([(EXAMPLES[1], 0), (EXAMPLES[0], 2)], timing)
    assert batch_keys(row) == [(7, 0), (3, 2)]  # what resume reads back
    assert (row["prefill_s"], row["decode_s"], row["decode_tokens"]) == (0.5, 1.5, 6)
    assert row["step_ms"] == [1.2345, 2.0]
    assert "phases" not in row  # none logged
    timing.phases = {"refreshes": 2, "per_rank_missed": 0.01}
    assert timing_row([(EXAMPLES[1], 0)], timing)["phases"] == timing.phases

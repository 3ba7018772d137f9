"""`make view`: the page's data, its structure, and where completions first leave dense.

Hand-made run folders (tiny_llama's byte-level tokenizer: one token per byte) pin the divergence
positions; a real tiny run with `quality.traces` checks the whole path.
"""

import json
import re
from pathlib import Path

import pytest

from bwprune.errors import UserError
from bwprune.report.divergence import first_divergence
from bwprune.report.viewer import RunFolder, find_dense_run, write_view
from bwprune.runs.identity import run_key
from bwprune.runs.recorder import RunRecorder
from bwprune.runs.summary import summarize
from tests.conftest import compose_cfg

ROOT = Path(__file__).resolve().parents[2]
TINY = ["model=tiny_llama", "limit=4"]
# (dense, pruned) completions -> (first differing token, dense span, pruned span); bytes = tokens
CASES = [
    ("The answer is 42.", "The answer is 41.", (15, (15, 16), (15, 16))),
    ("same text", "same text", None),
    ("Stop.", "Stop. And more", (5, (5, 5), (5, 6))),  # dense stopped: an empty span at its end
    ("café au lait", "cafe au lait", (3, (3, 4), (3, 4))),  # "é" is two bytes: token 3 differs
]


def hand_made_run(results: Path, overrides: list[str], completions: list[str]) -> Path:
    """A complete run folder holding `completions`, laid out as `run` lays it out."""
    cfg = compose_cfg([*TINY, *overrides], results)
    recorder = RunRecorder(cfg.paths.runs_dir, run_key(cfg))
    recorder.start(cfg)
    rows = [
        {"index": i, "sample": 0, "id": str(i), "prompt": f"question {i}?", "completion": text,
         "prediction": text[-3:], "gold": "42", "correct": text.endswith("42.") or None,
         "score_reason": "ok" if text.endswith(".") else "no_answer", "new_tokens": len(text),
         "finish_reason": "stop", "sparsity": None, "quality": None}
        for i, text in enumerate(completions)
    ]  # fmt: skip
    timing = {"indices": [], "decode_s": 1.0, "decode_tokens": 1, "step_ms": [1.0], "prefill_s": 0}
    recorder.append(rows, timing)
    recorder.finish(summarize(rows, [timing], 0.0), {"device": "cpu"})
    return recorder.dir


def page_json(page: Path) -> dict:
    html = page.read_text(encoding="utf-8")
    blobs = re.findall(r'<script type="application/json" id="data">(.*?)</script>', html, re.S)
    assert len(blobs) == 1, "one embedded data blob, parsed by the page itself"
    return json.loads(blobs[0])


@pytest.fixture
def hand_made(tmp_path) -> tuple[Path, Path]:
    dense = hand_made_run(tmp_path, ["method=dense"], [d for d, _, _ in CASES])
    hand_made_run(tmp_path, ["method=dense", "batch_size=2"], ["other"] * 4)  # not its pair
    pruned = hand_made_run(tmp_path, ["method=ours"], [p for _, p, _ in CASES])
    return dense, pruned


def test_first_divergence():
    assert first_divergence([1, 2, 3], [1, 2, 4]) == 2
    assert first_divergence([1, 2], [1, 2, 3]) == 2
    assert first_divergence([1, 2], [1, 2]) is None
    assert first_divergence([], [7]) == 0


def test_page_marks_the_first_differing_token_of_every_problem(hand_made, tmp_path):
    dense, pruned = hand_made
    assert find_dense_run(RunFolder.load(pruned)) == dense, "same batch size, not the other one"
    data = page_json(write_view(pruned, out=tmp_path / "page.html"))
    assert data["header"]["dense"] == RunFolder.load(dense).key
    assert [r["index"] for r in data["rows"]] == [0, 1, 2, 3]
    for row, (_, _, expected) in zip(data["rows"], CASES):
        got = row["diverges_at"]
        if expected is None:
            assert got is None and "dense_span" not in row
        else:
            assert (got, tuple(row["dense_span"]), tuple(row["pruned_span"])) == expected


def test_page_is_self_contained_and_escapes_text(hand_made, tmp_path):
    _, pruned = hand_made
    samples = (pruned / "samples.jsonl").read_text().replace("41.", "</script><b>41.")
    (pruned / "samples.jsonl").write_text(samples)
    page = write_view(pruned, out=tmp_path / "page.html")
    html = page.read_text(encoding="utf-8")
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:)?//""", html), "no network"
    assert "<link" not in html and "<script src" not in html and "@import" not in html
    for anchor in ('id="top"', 'id="bar"', 'id="rows"', 'id="more"', "IntersectionObserver"):
        assert anchor in html
    assert html.count("</script>") == 2, "completion text cannot close the data script"
    assert page_json(page)["rows"][0]["pruned"]["text"].startswith("The answer is </script>")


def test_no_matching_dense_run_is_one_clear_error(tmp_path):
    pruned = hand_made_run(tmp_path, ["method=ours"], ["a"] * 4)
    with pytest.raises(UserError, match=r"no complete dense run under .* matches .*'batch_size'"):
        write_view(pruned)
    with pytest.raises(UserError, match=r"is not a run folder \(no config.yaml\)"):
        write_view(tmp_path)


def test_the_header_shows_the_run_s_paired_speedup_never_two_runs_tokens_per_s(hand_made, tmp_path):
    """Two runs' tokens/s depend on each machine's load when it ran (one config ran at 1.5 and at
    39.9 tok/s): the page shows the speedup the run measured against dense, paired."""
    _, pruned = hand_made
    assert page_json(write_view(pruned, out=tmp_path / "a.html"))["header"]["speedup"] is None
    record = json.loads((pruned / "run.json").read_text())
    spread = {"median": 1.21, "min": 1.18, "max": 1.24}
    record["metrics"]["speedup"] = {
        "step": spread, "e2e": spread, "batches": 1, "repeats": 3, "bandwidth_bound": 1.42,
        "ideal": 1.3, "overhead_s": 175.0, "overhead_fraction": 4.06,
    }  # fmt: skip
    (pruned / "run.json").write_text(json.dumps(record))
    header = page_json(write_view(pruned, out=tmp_path / "b.html"))["header"]
    assert header["speedup"].startswith("speedup vs dense (paired, 1 batch, 3 trials): step 1.21x")
    assert not [m for m in header["metrics"] if "/s" in m["label"]]

"""Benchmarks and the evaluation protocol: data loading, GPQA choices, subset, samples, pass@1."""

import csv
import hashlib
import json
from pathlib import Path

import pytest

from bwprune.benchmarks.gpqa import GPQA
from bwprune.benchmarks.selection import select_examples, work_items
from bwprune.config import build
from bwprune.errors import UserError
from bwprune.experiment import run
from bwprune.runs.recorder import RunRecorder
from bwprune.runs.rescore import rescore
from bwprune.runs.summary import summarize
from tests.conftest import compose_cfg

FIXTURE = str(Path(__file__).resolve().parent.parent / "fixtures" / "gpqa_synthetic.jsonl")
SYNTHETIC = [
    "benchmark=gpqa_diamond",
    f"benchmark.data_file={FIXTURE}",
    "benchmark.name=gpqa_synth",
]
TINY = ["model=tiny_llama", "batch_size=2"]


def examples(*overrides):
    return build(compose_cfg(list(overrides)).benchmark).examples()


@pytest.mark.parametrize(
    ("benchmark", "count", "first_id", "first_gold"),
    [
        ("gsm8k", 1319, "0", "18"),
        ("math500", 500, "test/precalculus/807.json", r"\left( 3, \frac{\pi}{2} \right)"),
        ("minerva", 272, "0", "1.6"),
        ("amc23", 40, "0", "27"),
    ],
)
def test_shipped_benchmarks_load(benchmark, count, first_id, first_gold):
    loaded = examples(f"benchmark={benchmark}")
    assert len(loaded) == count and len({e.id for e in loaded}) == count
    assert (loaded[0].id, loaded[0].gold) == (first_id, first_gold)
    assert loaded[0].question.endswith("put your final answer within \\boxed{}.")


@pytest.mark.parametrize(
    ("path", "sha256"),
    [
        ("math500", "35dc41080a3680858b27fa7e0533d2d547825316fc5dafe5d316f4ccc5a06132"),
        ("minerva_math", "0e656b430d3a0a1dab6aa853f453ba3805e28e2cabe4fc72486a897cc09d8ba2"),
        ("amc23", "43707e1ca784602d8479de24ee8ce36609dbebc46dd152b0b12a46611aa898a4"),
    ],
)
def test_shipped_data_is_the_upstream_file(path, sha256):
    data = Path(compose_cfg([]).paths.data_dir) / path / "test.jsonl"
    assert hashlib.sha256(data.read_bytes()).hexdigest() == sha256  # bwprune/data/SOURCES.md


@pytest.mark.slow
@pytest.mark.parametrize("benchmark", ["gsm8k", "math500", "minerva", "amc23"])
def test_every_gold_matches_itself_boxed(benchmark):
    bench = build(compose_cfg([f"benchmark={benchmark}"]).benchmark)
    wrong = [
        e.id
        for e in bench.examples()
        if not bench.score(f"\\boxed{{{e.gold}}}", e.gold, "stop").correct
    ]
    assert wrong == []


# --- GPQA-Diamond -------------------------------------------------------------------------------


def test_gpqa_choices_are_shuffled_once_per_question():
    loaded = examples(*SYNTHETIC)
    rows = [json.loads(x) for x in Path(FIXTURE).read_text().splitlines()]
    assert [e.id for e in loaded] == [r["Record ID"] for r in rows]
    for e, row in zip(loaded, rows):
        assert f"\n{e.gold}) {row['Correct Answer']}\n" in f"{e.question}\n"  # gold = its letter
        assert "'Answer: $LETTER'" in e.question and row["Question"] in e.question
    assert len({e.gold for e in loaded}) > 1  # not always the same position
    assert [e.question for e in examples(*SYNTHETIC)] == [e.question for e in loaded]
    reseeded = examples(*SYNTHETIC, "benchmark.shuffle_seed=1")
    assert [e.gold for e in reseeded] != [e.gold for e in loaded]


def test_gpqa_reads_the_official_csv_layout(tmp_path):
    rows = [json.loads(x) for x in Path(FIXTURE).read_text().splitlines()]
    rows[0]["Question"] += "\nIt spans two lines."
    path = tmp_path / "gpqa.csv"
    with path.open("w", newline="", encoding="utf-8") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(reversed(rows))  # another file order: same letters per question
    from_csv = {e.id: e for e in examples(*SYNTHETIC, f"benchmark.data_file={path}")}
    from_jsonl = {e.id: e for e in examples(*SYNTHETIC)}
    assert "It spans two lines." in from_csv["synthetic-001"].question
    assert len(from_csv) == len(from_jsonl) == 5
    same = [k for k in from_jsonl if k != "synthetic-001"]  # its question text was changed
    assert all(from_csv[k].question == from_jsonl[k].question for k in same)


def test_gpqa_letter_extraction_comes_from_the_config():
    bench = build(compose_cfg(SYNTHETIC).benchmark)
    assert bench.score("The answer is (B).", "B", "stop").correct is True  # the yaml: lenient
    with pytest.raises(UserError, match=r"letter_extraction='loose'.*\['lenient', 'strict'\]"):
        build(compose_cfg([*SYNTHETIC, "benchmark.letter_extraction=loose"]).benchmark)


def test_synthetic_questions_are_never_reported_as_gpqa():
    with pytest.raises(UserError, match=r"SYNTHETIC.*benchmark.name="):
        examples("benchmark=gpqa_diamond", f"benchmark.data_file={FIXTURE}")


def test_gpqa_without_data_says_how_to_pass_a_local_file(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.delenv("BWPRUNE_GPQA_FILE", raising=False)
    with pytest.raises(UserError, match=r"gated.*benchmark.data_file=/path/to/gpqa_diamond.csv"):
        examples("benchmark=gpqa_diamond")


@pytest.mark.parametrize(
    ("content", "suffix", "message"),
    [("{}", ".txt", r"unknown format '.txt'; choose one of \['.csv', '.jsonl'\]"),
     ('{"Question": "q"}', ".jsonl", r"missing field\(s\) \['Correct Answer'")],
)  # fmt: skip
def test_gpqa_bad_local_file(tmp_path, content, suffix, message):
    path = tmp_path / f"gpqa{suffix}"
    path.write_text(content + "\n")
    with pytest.raises(UserError, match=message):
        bench = GPQA(
            "gpqa_diamond", str(path), "{question}{choices}", "x/y", "c", "train", "strict"
        )
        bench.examples()


# --- subset, samples, pass@1 ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("overrides", "ids"),
    [
        (["subset=[17,3,5]"], ["3", "5", "17"]),  # file order, whatever the list's order
        (["subset=[17,3,5]", "limit=2"], ["3", "5"]),  # then limit
        (["subset=[17,3,5]", "num_shards=2", "shard=1"], ["3", "5", "17"]),  # shards cut batches
        (["benchmark=amc23", "subset=[7,8]"], ["7", "8"]),  # the dataset's ids, not positions
        (
            ["benchmark=math500", "subset=[test/precalculus/807.json]"],
            ["test/precalculus/807.json"],
        ),
    ],
)
def test_subset_selects_by_id(overrides, ids):
    cfg = compose_cfg(overrides)
    assert [e.id for e in select_examples(build(cfg.benchmark).examples(), cfg)] == ids


@pytest.mark.parametrize(
    ("subset", "message"),
    [("[6]", r"subset=\['6'\] names no example; ids look like \['0', '1', '2'\]"),
     ("[]", "names no example"), ("3", "must be a list of ids")],
)  # fmt: skip
def test_bad_subset_is_a_clear_error(subset, message):
    cfg = compose_cfg(["benchmark=amc23", f"subset={subset}"])
    with pytest.raises(UserError, match=message):
        select_examples(build(cfg.benchmark).examples(), cfg)


def test_work_items_are_sample_major():
    loaded = examples("limit=3")[:3]
    assert [(e.index, k) for e, k in work_items(loaded, 2)] == [
        (0, 0), (1, 0), (2, 0), (0, 1), (1, 1), (2, 1),
    ]  # fmt: skip


def test_pass_at_1_is_the_mean_over_samples():
    rows = [
        {"index": i, "sample": k, "correct": c, "score_reason": r, "new_tokens": 1, "sparsity": {}}
        for i, k, c, r in [
            (0, 0, True, "ok"), (0, 1, False, "ok"), (1, 0, True, "ok"), (1, 1, None, "no_answer"),
        ]
    ]  # fmt: skip
    m = summarize(rows, [], 0.0)
    assert (m["n"], m["problems"], m["samples_per_problem"]) == (4, 2, 2)
    assert m["accuracy"] == 0.5 and m["correct"] == 2
    assert m["unscorable"] == 1 and m["unscorable_reasons"] == {"no_answer": 1}


def test_sampled_run_keeps_one_row_per_problem_and_sample_and_resumes(cfg_factory):
    cfg = cfg_factory(*TINY, "limit=3", "generation=sampled", "generation.num_samples=2")
    record = run(cfg)
    recorder = RunRecorder(cfg.paths.runs_dir, record["run_key"])
    rows = recorder.samples()
    assert sorted(RunRecorder.row_key(s) for s in rows) == [
        (i, k) for i in range(3) for k in (0, 1)
    ]
    assert record["metrics"]["problems"] == 3 and record["metrics"]["n"] == 6
    # Lose the last batch and the completion mark: the rerun generates only what is missing.
    recorder.samples_path.write_text("".join(json.dumps(s) + "\n" for s in rows[:4]))
    recorder.run_path.unlink()
    rerun = run(cfg)
    assert sorted(RunRecorder.row_key(s) for s in recorder.samples()) == sorted(
        RunRecorder.row_key(s) for s in rows
    )
    assert rerun["metrics"]["n"] == 6


def test_greedy_with_several_samples_is_refused(cfg_factory):
    with pytest.raises(UserError, match=r"generation.num_samples=2 must be"):
        run(cfg_factory(*TINY, "limit=1", "generation.num_samples=2"))


def test_gpqa_run_and_rescore_with_an_open_think_block(cfg_factory):
    cfg = cfg_factory(*TINY, *SYNTHETIC, "limit=2")
    record = run(cfg)
    assert record["benchmark"] == "gpqa_synth" and record["metrics"]["n"] == 2
    folder = Path(cfg.paths.runs_dir) / record["run_key"]
    rows = RunRecorder(folder.parent, folder.name).samples()
    assert all(s["think_open"] is False and s["id"].startswith("synthetic-") for s in rows)
    # As if the template had opened <think>: "Answer:" without "</think>" is still thinking.
    rows[0].update(completion=f"Answer: {rows[0]['gold']}", think_open=True)
    rows[1].update(completion=f"...</think>Answer: {rows[1]['gold']}", think_open=True)
    (folder / "samples.jsonl").write_text("".join(json.dumps(s) + "\n" for s in rows))
    m = rescore(folder)["metrics"]
    assert (m["correct"], m["unscorable_reasons"]) == (1, {"unfinished_think": 1})

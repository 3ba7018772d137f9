"""What generation.backend=vllm refuses, in one line, before anything is loaded."""

from __future__ import annotations

import pytest

from bwprune.errors import UserError
from bwprune.experiment import run
from bwprune.runs.identity import run_key
from bwprune.vllm.support import refuse_unsupported


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["generation.batch_invariant=true"], "needs generation.backend=hf"),
        (["benchmark=wikitext2"], "a perplexity benchmark scores given text"),
        (["generation.backend=sglang"], "generation.backend='sglang'"),
    ],
)
def test_what_vllm_cannot_run_is_refused_before_loading(cfg_factory, overrides, message):
    backend = [] if any(o.startswith("generation.backend") for o in overrides) else \
        ["generation.backend=vllm"]  # fmt: skip
    cfg = cfg_factory("model=tiny_llama", *backend, *overrides)
    with pytest.raises(UserError, match=message):
        run(cfg)


def test_every_method_is_accepted(cfg_factory):
    """TriSP too: its layers of widths of their own are built by `bwprune.vllm.widths`."""
    for name in ("dense", "ours", "griffin", "teal", "cats", "wanda", "trisp"):
        cfg = cfg_factory("model=tiny_llama", f"method={name}", "generation.backend=vllm")
        refuse_unsupported(cfg, "generate")


def test_the_backend_is_part_of_a_runs_identity_and_its_settings_are_not(cfg_factory):
    hf = run_key(cfg_factory("method=ours"))
    assert run_key(cfg_factory("method=ours", "generation.backend=hf")) == hf  # old runs keep keys
    vllm = run_key(cfg_factory("method=ours", "generation.backend=vllm"))
    assert vllm != hf
    assert run_key(cfg_factory("method=ours", "generation.backend=vllm",
                               "generation.vllm.kv_cache_gib=2")) == vllm  # fmt: skip

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
        (["generation.vllm.tensor_parallel_size=0"], "tensor_parallel_size=0"),
        (["generation.vllm.tensor_parallel_size=two"], "tensor_parallel_size='two'"),
        (["generation.tp_select=per_rank"], "needs generation.vllm.tensor_parallel_size > 1"),
        (["generation.tp_select=ring"], "generation.tp_select='ring' is not valid"),
        (
            ["generation.vllm.tensor_parallel_size=2", "generation.vllm.executor=ray"],
            "CPU build runs no Ray workers",
        ),
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


def test_only_neuron_set_and_static_methods_are_sharded(cfg_factory):
    """Tensor parallelism: a keep mask would see one shard; TriSP's widths split by no rule."""
    pytest.importorskip("vllm")
    from bwprune.config import build_method
    from bwprune.vllm.host import refuse_sharding

    def method(name: str):
        return build_method(cfg_factory("model=tiny_llama", f"method={name}").method)

    for name in ("dense", "wanda", "ours", "griffin"):
        refuse_sharding(method(name), 2, own_widths=False)
    for name in ("teal", "cats"):
        with pytest.raises(UserError, match=f"(?i){name} cannot run at .*tensor_parallel_size=2"):
            refuse_sharding(method(name), 2, own_widths=False)
        refuse_sharding(method(name), 1, own_widths=False)
    with pytest.raises(UserError, match="tensor_parallel_size=2"):
        refuse_sharding(method("dense"), 2, own_widths=True)


@pytest.mark.parametrize(
    ("cores", "size", "binding"),
    [([0, 1], 2, "0|1"), ([0, 1, 2, 3, 4, 5, 6, 7], 2, "0,1,2,3|4,5,6,7"), ([4, 5], 3, "4|5|4")],
)
def test_workers_are_bound_to_their_share_of_the_cores(monkeypatch, cores, size, binding):
    from bwprune.vllm.cores import thread_binding

    monkeypatch.setattr("os.sched_getaffinity", lambda pid: set(cores))
    assert thread_binding(size) == binding


def test_a_model_vllm_cannot_split_is_refused_naming_the_sizes_it_can():
    """vLLM's rule: query heads and FFN neurons divide by the size, KV heads divide by it or it
    by them (replicated). SmolLM2-135M: 9 heads, 3 KV heads, 1536 neurons."""
    from types import SimpleNamespace

    from bwprune.vllm.support import refuse_split, splits

    smollm2 = SimpleNamespace(num_attention_heads=9, num_key_value_heads=3, intermediate_size=1536)
    shape = SimpleNamespace(num_attention_heads=6, num_key_value_heads=2, intermediate_size=1536)
    assert [n for n in range(1, 10) if splits(smollm2, n)] == [1, 3]
    assert [n for n in range(1, 10) if splits(shape, n)] == [1, 2, 6]
    refuse_split(smollm2, 3, "smollm2_135m")
    with pytest.raises(
        UserError,
        match=r"size=2: vLLM cannot split smollm2_135m \(9 attention "
        r"heads, 3 KV heads.*sizes that divide it: \[1, 3\]",
    ):
        refuse_split(smollm2, 2, "smollm2_135m")

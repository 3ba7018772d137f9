"""What generation.backend=vllm refuses, in one line, before anything is loaded."""

from __future__ import annotations

import pytest

from bwprune.errors import UserError
from bwprune.experiment import run
from bwprune.runs.identity import run_key
from bwprune.vllm.binding.support import refuse_unsupported


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
    ],
)
def test_what_vllm_cannot_run_is_refused_before_loading(cfg_factory, overrides, message):
    backend = [] if any(o.startswith("generation.backend") for o in overrides) else \
        ["generation.backend=vllm"]  # fmt: skip
    cfg = cfg_factory("model=tiny_llama", *backend, *overrides)
    with pytest.raises(UserError, match=message):
        run(cfg)


def test_every_method_is_accepted(cfg_factory):
    """TriSP too: its layers of widths of their own are built by `bwprune.vllm.binding.widths`."""
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


def test_only_neuron_set_and_static_methods_on_a_divisible_model_are_sharded(cfg_factory):
    """Tensor parallelism: a keep mask would see one shard; TriSP's widths split by no rule; a
    model whose heads do not divide by the size is refused by vLLM's rule, naming it."""
    pytest.importorskip("vllm")
    from types import SimpleNamespace

    from bwprune.config import build_method
    from bwprune.vllm.binding.host import refuse_tensor_parallel

    config = SimpleNamespace(num_attention_heads=4, num_key_value_heads=2, intermediate_size=64,
                             hidden_size=32)  # fmt: skip
    model = SimpleNamespace(config=config)  # not a Llama: its heads are not padded
    widths = SimpleNamespace(config=SimpleNamespace(**vars(config), trisp_structure={}))

    def method(name: str):
        return build_method(cfg_factory("model=tiny_llama", f"method={name}").method)

    for name in ("dense", "wanda", "ours", "griffin"):
        refuse_tensor_parallel(method(name), model, 2, "tiny")
    for name in ("teal", "cats"):
        with pytest.raises(UserError, match=f"(?i){name} cannot run at .*tensor_parallel_size=2"):
            refuse_tensor_parallel(method(name), model, 2, "tiny")
        refuse_tensor_parallel(method(name), model, 1, "tiny")
    with pytest.raises(UserError, match="tensor_parallel_size=2"):
        refuse_tensor_parallel(method("dense"), widths, 2, "tiny")
    with pytest.raises(UserError, match=r"cannot split tiny .*sizes that divide it: \[1, 2, 4\]"):
        refuse_tensor_parallel(method("ours"), model, 3, "tiny")


def test_a_cpu_server_on_ray_workers_is_refused_before_loading(cfg_factory, tmp_path):
    """A run's engine places CPU workers on Ray (`bwprune.vllm.running.ray_cpu`); the server's vLLM
    starts its own Ray instance, which has nothing to place them on."""
    from hydra import compose, initialize_config_dir

    from bwprune.vllm.serving.serve import export_served
    from tests.conftest import CONF_DIR

    with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
        cfg = compose("serve", overrides=["model=tiny_llama", "method=ours",
                                          "generation.vllm.tensor_parallel_size=2",
                                          "generation.vllm.executor=ray"])  # fmt: skip
    with pytest.raises(UserError, match=r"executor=ray needs GPUs.*use executor=mp"):
        export_served(cfg, tmp_path / "served")
    assert not (tmp_path / "served").exists()


@pytest.mark.parametrize(
    ("cores", "size", "binding"),
    [([0, 1], 2, "0|1"), ([0, 1, 2, 3, 4, 5, 6, 7], 2, "0,1,2,3|4,5,6,7"), ([4, 5], 3, "4|5|4")],
)
def test_workers_are_bound_to_their_share_of_the_cores(monkeypatch, cores, size, binding):
    from bwprune.vllm.running.cores import thread_binding

    monkeypatch.setattr("os.sched_getaffinity", lambda pid: set(cores))
    assert thread_binding(size) == binding


def test_a_model_vllm_cannot_split_is_refused_naming_the_sizes_it_can():
    """vLLM's rule: query heads and FFN neurons divide by the size, KV heads divide by it or it
    by them (replicated); a Llama's heads are padded until they do (`bwprune.vllm.binding.padding`),
    a Qwen2's are not (vLLM derives its head width from the head count). SmolLM2-135M: 9 heads,
    3 KV heads, 1536 neurons."""
    from types import SimpleNamespace

    from bwprune.vllm.binding.support import refuse_split, splits

    smollm2 = SimpleNamespace(num_attention_heads=9, num_key_value_heads=3, intermediate_size=1536,
                              hidden_size=576)  # fmt: skip
    shape = SimpleNamespace(num_attention_heads=6, num_key_value_heads=2, intermediate_size=1536,
                            hidden_size=576)  # fmt: skip
    assert [n for n in range(1, 10) if splits(smollm2, n, "Qwen2ForCausalLM")] == [1, 3]
    assert [n for n in range(1, 10) if splits(smollm2, n, "LlamaForCausalLM")] == [1, 2, 3, 4, 6, 8]
    assert [n for n in range(1, 10) if splits(shape, n, "Qwen2ForCausalLM")] == [1, 2, 6]
    refuse_split(smollm2, 3, "Qwen2ForCausalLM", "smollm2_135m")
    refuse_split(smollm2, 2, "LlamaForCausalLM", "smollm2_135m")
    with pytest.raises(
        UserError,
        match=r"size=2: vLLM cannot split smollm2_135m \(9 attention "
        r"heads, 3 KV heads.*sizes that divide it: \[1, 3\]",
    ):
        refuse_split(smollm2, 2, "Qwen2ForCausalLM", "smollm2_135m")
    with pytest.raises(UserError, match=r"1536 FFN neurons\) over 5 workers"):
        refuse_split(smollm2, 5, "LlamaForCausalLM", "smollm2_135m")

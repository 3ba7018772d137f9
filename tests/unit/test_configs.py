"""Every option of every config group composes; methods and benchmarks instantiate."""

from pathlib import Path

import pytest
from hydra.errors import ConfigCompositionException
from omegaconf import OmegaConf

from bwprune.config import build, build_method, compose_config
from bwprune.errors import UserError
from bwprune.runs.identity import run_key
from tests.conftest import CONF_DIR, compose_cfg


def options(group: str) -> list[str]:
    return sorted(p.stem for p in (Path(CONF_DIR) / group).glob("*.yaml"))


@pytest.mark.parametrize(
    "group", ["model", "method", "benchmark", "generation", "logger", "paths", "experiment"]
)
def test_every_option_composes(group):
    for option in options(group):
        cfg = compose_cfg([f"{group}={option}"])
        if group == "experiment":  # @package _global_: it sets top-level keys
            assert cfg.exp_name == option
        else:
            assert cfg[group] is not None
        run_key(cfg)  # resolves every interpolation


@pytest.mark.parametrize("method", options("method"))
def test_every_method_instantiates_under_its_config_name(method):
    cfg = compose_cfg([f"method={method}"])
    assert build_method(cfg.method) is not None
    assert run_key(cfg).split("/")[2] == method  # the run key names the config choice


def period(cfg) -> int:
    return cfg.method.t_prune + cfg.method.t_explore


def test_a_model_method_pair_specializes_the_method_config():
    """Paper A's mask period is 10 for Qwen3-1.7B, 20 for the 7-8B models
    (conf/model_method/qwen3_1p7b_ours.yaml); an explicit override still wins, and the run key
    hashes the resolved values, not how they were set."""
    qwen3 = ["model=qwen3_1p7b", "method=ours"]
    assert period(compose_config(CONF_DIR, qwen3)) == 10
    assert period(compose_config(CONF_DIR, ["model=ds_r1_qwen_7b", "method=ours"])) == 20
    assert period(compose_config(CONF_DIR, ["method=ours"])) == 20  # SmolLM2: ours.yaml as is
    overridden = compose_config(CONF_DIR, [*qwen3, "method.t_prune=16", "method.t_explore=4"])
    assert period(overridden) == 20
    spelled_out = compose_config(CONF_DIR, [*qwen3, "method.t_prune=8", "method.t_explore=2"])
    assert run_key(spelled_out) == run_key(compose_config(CONF_DIR, qwen3)) != run_key(overridden)
    for method in options("method"):  # the other methods are the same on every model
        if method != "ours":
            on_qwen3 = compose_config(CONF_DIR, ["model=qwen3_1p7b", f"method={method}"]).method
            assert on_qwen3 == compose_config(CONF_DIR, [f"method={method}"]).method, method


def test_every_model_method_file_names_a_model_and_a_method():
    """The defaults entry is optional, so a misnamed file would silently never apply."""
    pairs = {f"{model}_{method}" for model in options("model") for method in options("method")}
    assert options("model_method")
    assert set(options("model_method")) <= pairs


def test_a_method_config_without_a_name_is_refused():
    node = OmegaConf.create({"_target_": "baselines.dense.Dense"})
    with pytest.raises(UserError, match="lacks `name`"):
        build_method(node)


@pytest.mark.parametrize("benchmark", options("benchmark"))
def test_every_benchmark_loads(benchmark):
    overrides = [f"benchmark={benchmark}"]
    if benchmark == "gpqa_diamond":  # gated, not shipped: the synthetic test file stands in
        fixture = Path(CONF_DIR).parent / "tests" / "fixtures" / "gpqa_synthetic.jsonl"
        overrides += [f"benchmark.data_file={fixture}", "benchmark.name=gpqa_synthetic"]
    bench = build(compose_cfg(overrides).benchmark)
    if (
        bench.kind == "perplexity"
    ):  # evaluated by bwprune.generation.perplexity: windows, not examples
        assert Path(bench.data_file).exists() and bench.windows(10_000)
        return
    examples = bench.examples()
    assert examples and all(e.question and e.gold for e in examples[:5])


@pytest.mark.parametrize("group", ["model", "method", "benchmark"])
def test_unknown_option_lists_choices(group):
    with pytest.raises(ConfigCompositionException) as e:
        compose_cfg([f"{group}=nope"])
    assert options(group)[0] in str(e.value.__cause__ or e.value)


def test_run_key_separates_configs_and_ignores_logging():
    base = run_key(compose_cfg([]))
    assert base.startswith("gsm8k/smollm2_135m/dense/rho=0_bs=4_seed=0_")
    assert run_key(compose_cfg(["sparsity=0.3"])) == base  # dense has no sparsity
    assert run_key(compose_cfg(["logger=wandb", "tags=[x]", "exp_name=y"])) == base
    assert run_key(compose_cfg(["generation=sampled"])) != base
    assert run_key(compose_cfg(["limit=3"])) != base


def test_a_late_option_at_its_default_keeps_recorded_keys():
    """`quality.traces` came after runs were recorded: off, it leaves their keys as they were."""
    cfg = compose_cfg([])
    before_the_option = compose_cfg([])
    del before_the_option.quality.traces
    assert run_key(cfg) == run_key(before_the_option)
    assert run_key(compose_cfg(["quality.traces=true"])) != run_key(cfg)


def test_run_key_does_not_depend_on_the_checkout(monkeypatch, tmp_path):
    """Shipped data is named relative to the package, so keys match across clones."""
    from bwprune import config as config_module

    key = run_key(compose_cfg([]))
    fake = tmp_path / "elsewhere" / "bwprune" / "data"
    monkeypatch.setattr(config_module, "package_data_dir", lambda: str(fake))
    import bwprune.runs.identity as identity

    monkeypatch.setattr(identity, "package_data_dir", lambda: str(fake))
    assert run_key(compose_cfg([f"paths.data_dir={fake}"])) == key


def test_ours_takes_its_stream_default_in_streams_and_keeps_recorded_keys(cfg_factory):
    """`memory_policy: ${by_batching:...}`: max (the paper) in static batches, decay in streams;
    a run's key holds the resolved value, so static runs keep the keys they were recorded with."""
    static = cfg_factory("method=ours")
    stream = cfg_factory("method=ours", "generation.batching=continuous")
    assert (static.method.memory_policy, stream.method.memory_policy) == ("max", "decay")
    assert run_key(static) == run_key(cfg_factory("method=ours", "method.memory_policy=max"))
    explicit = cfg_factory("method=ours", "generation.batching=continuous",
                           "method.memory_policy=decay")  # fmt: skip
    assert run_key(stream) == run_key(explicit)
    bad = cfg_factory("method=ours", "generation.batching=bursty")
    with pytest.raises(Exception, match=r"generation.batching='bursty'.*continuous.*static"):
        OmegaConf.to_container(bad, resolve=True)

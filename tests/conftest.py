"""Shared fixtures: composed configs with results in tmp_path, and tiny random models."""

from __future__ import annotations

import copy
import functools
from collections.abc import Callable
from pathlib import Path

import hydra
import pytest
import torch
from hydra import compose, initialize_config_dir
from omegaconf import DictConfig, OmegaConf

from bwprune.config import package_data_dir, register_resolvers
from bwprune.engine.protocol import MethodDriver
from bwprune.generation.runner import BatchedRunner
from bwprune.methods.base import PruningMethod
from bwprune.models.adapters import adapter_for
from bwprune.models.loading import load_model

register_resolvers()
CONF_DIR = str(Path(__file__).resolve().parent.parent / "conf")
TINY_MODELS = ("tiny_llama", "tiny_qwen2")


# Paired timing stays on in tests (every pruned run exercises it) but times one pair of one batch.
QUICK_SPEED = ["speed.batches=1", "speed.repeats=1", "speed.max_repeats=1", "speed.warmup=0"]


def compose_cfg(overrides: list[str] = (), tmp_path: Path | None = None) -> DictConfig:
    """conf/config.yaml composed as run.py would, with run records under `tmp_path`.

    Each override list is composed once per session and copied per call: Hydra reads and merges
    every yaml of the defaults list again on each compose (about half a second here), and the
    suite composes the same few lists hundreds of times."""
    cfg = copy.deepcopy(_composed(("progress=false", *QUICK_SPEED, *overrides)))
    if tmp_path is not None and not any(o.startswith("paths.results_dir=") for o in overrides):
        cfg.paths.results_dir = str(tmp_path)  # the paths below it interpolate it
    return cfg


@functools.cache
def _composed(overrides: tuple[str, ...]) -> DictConfig:
    with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
        return compose("config", overrides=list(overrides))


def method_from_conf(name: str, *overrides: str, cls: type | None = None, **args) -> PruningMethod:
    """The method of conf/method/<name>.yaml with its defaults (config overrides `overrides`),
    `args` replacing constructor arguments; `cls` builds a test subclass instead of `_target_`.
    The yaml is the one source of a method's defaults, in tests too."""
    node = OmegaConf.to_container(compose_cfg([f"method={name}", *overrides]).method, resolve=True)
    node.pop("name")
    target = cls or hydra.utils.get_class(node["_target_"])
    node.pop("_target_")
    return target(**{**node, **args})


def prepared(method: PruningMethod, model, tokenizer) -> MethodDriver:
    """A driver with `method` prepared on `model` (as every run prepares it)."""
    driver = MethodDriver(method, model, adapter_for(model))
    driver.prepare(tokenizer)
    return driver


def small_calibration(folder: Path) -> list[str]:
    """Overrides for a small calibration set in `folder` (the byte tokenizer is slow on the whole
    WikiText-2 file), its artifacts cached there too."""
    text = folder / "valid_head.txt"
    source = Path(package_data_dir()) / "wikitext2" / "valid.txt"
    text.write_text(source.read_text(encoding="utf-8")[:20_000])
    return [f"calibration.text_file={text}", "calibration.num_sequences=4",
            "calibration.seq_len=64", f"paths.cache_dir={folder}"]  # fmt: skip


@pytest.fixture
def cfg_factory(tmp_path):
    return lambda *overrides: compose_cfg(list(overrides), tmp_path)


def interrupt_generation(monkeypatch: pytest.MonkeyPatch, call: int) -> Callable[[], None]:
    """Make the `call`-th batch generated raise KeyboardInterrupt, as a run stopped mid-way;
    returns the function that lets generation run normally again (to resume the run)."""
    real, calls = BatchedRunner.generate_tokens, []

    def generate_tokens(self, *args, **kwargs):
        calls.append(1)
        if len(calls) == call:
            raise KeyboardInterrupt
        return real(self, *args, **kwargs)

    monkeypatch.setattr(BatchedRunner, "generate_tokens", generate_tokens)
    return lambda: monkeypatch.setattr(BatchedRunner, "generate_tokens", real)


_MODELS: dict[str, tuple] = {}


def tiny_model(name: str):
    """(model, tokenizer) built from conf/model/<name>.yaml, shared across tests (read-only use)."""
    if name not in _MODELS:
        cfg = OmegaConf.load(Path(CONF_DIR) / "model" / f"{name}.yaml")
        cfg.device = "cpu"
        _MODELS[name] = load_model(cfg, cache_dir="unused")
    return _MODELS[name]


@pytest.fixture(params=TINY_MODELS)
def tiny(request):
    return tiny_model(request.param)


def chat(tokenizer, texts: list[str]) -> list[str]:
    return [
        tokenizer.apply_chat_template(
            [{"role": "user", "content": t}], tokenize=False, add_generation_prompt=True
        )
        for t in texts
    ]


PROMPTS = ["What is 2 + 3?", "Hi", "A much longer question that needs a lot more padding, surely?"]


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


def reported(method, model, ledger) -> dict:
    """The ledger row of one decode step that runs no forward: what a static method reports.

    `ledger` must be built on the model as loaded (before `prepare`), as every caller's is.
    """
    driver = MethodDriver(method, model, adapter_for(model), ledger)
    driver.start(1)
    driver.decode(0, torch.zeros(1, dtype=torch.bool), lambda _: None)
    return driver.rows()[0]


def kv_addresses(cache) -> list[int]:
    """Addresses of a static `SlotCache`'s key/value tensors: the same list step after step means
    nothing was reallocated."""
    return [t.data_ptr() for layer in cache.cache.layers for t in (layer.keys, layer.values)]


@pytest.fixture(scope="session")
def results_tree(tmp_path_factory):
    """(runs_dir, run keys) of the tiny results tree (`tests.results_tree`), with a speed record
    beside runs/; built once per session, read only."""
    from tests.results_tree import build_results_tree  # it composes configs with this module

    return build_results_tree(tmp_path_factory.mktemp("results"))

"""A model with a method prepared on it (bwprune/generation/prepared.py), as run.py and lm-eval both
get it: the ledger and `before_prepare` see the model as loaded, the method prepares after them."""

from pathlib import Path

from omegaconf import OmegaConf
from torch import nn

from bwprune.generation.prepared import prepare_loaded
from bwprune.generation.runner import SamplingConfig
from bwprune.methods.base import PruningMethod
from bwprune.models.loading import load_model
from tests.conftest import CONF_DIR, compose_cfg


class HalvesLayer0Up(PruningMethod):
    """A static method: `prepare` drops half of layer 0's up-projection rows (its shape only)."""

    def __init__(self) -> None:
        self.events: list[str] = []

    def prepare(self, model, adapter, tokenizer) -> None:
        self.events.append("prepare")
        up = adapter.ffn(0).up
        up.weight = nn.Parameter(up.weight[: up.weight.shape[0] // 2])


def test_ledger_and_before_prepare_see_the_model_as_loaded():
    cfg = OmegaConf.load(Path(CONF_DIR) / "model" / "tiny_llama.yaml")
    cfg.device = "cpu"
    model, tok = load_model(cfg, cache_dir="unused")  # its own copy: the method edits it
    loaded = sum(p.numel() for p in model.parameters())
    method = HalvesLayer0Up()

    def before(prepared) -> None:
        method.events.append("before_prepare")
        assert sum(p.numel() for p in prepared.model.parameters()) == loaded

    prepared = prepare_loaded(model, tok, method, before)
    assert method.events == ["before_prepare", "prepare"]
    assert prepared.ledger.total_params == loaded  # fractions stay relative to the original
    assert sum(p.numel() for p in model.parameters()) < loaded

    generation = compose_cfg().generation
    runners = [prepared.runner(SamplingConfig(4), 0, generation) for _ in range(2)]
    assert all(r.ledger is prepared.ledger and r.method is method for r in runners)

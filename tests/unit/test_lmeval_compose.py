"""lm-eval's `--model_args` as run.py's overrides (bwprune/lmeval/compose.py): composed and
validated as run.py does, and no key lm-eval sets is silently ignored. Needs no lm-eval."""

import pytest

from bwprune.errors import UserError
from bwprune.lmeval.compose import compose_from_model_args, hydra_override


def test_parsed_values_become_hydra_overrides():
    assert hydra_override("sparsity", 0.5) == "sparsity=0.5"
    assert hydra_override("method", "ours") == "method=ours"
    assert hydra_override("progress", False) == "progress=false"
    assert hydra_override("subset", [0, 5]) == "subset=[0, 5]"
    assert hydra_override("limit", None) == "limit=null"


def test_model_args_compose_the_run_config_with_lm_eval_s_batch_size():
    cfg = compose_from_model_args(
        {"model": "tiny_llama", "method": "ours", "sparsity": 0.25,
         "generation.max_new_tokens": 7}, batch_size="3",
    )  # fmt: skip
    assert (cfg.model.name, cfg.method.sparsity, cfg.batch_size) == ("tiny_llama", 0.25, 3)
    assert cfg.generation.max_new_tokens == 7  # the one `generation` key lm-eval leaves to us


@pytest.mark.parametrize(
    ("model_args", "batch_size", "message"),
    [
        ({"limit": 5}, None, r"limit=\.\.\. is lm-eval's to set here; use --limit"),
        ({"+generation.do_sample": True}, None, "use --gen_kwargs"),
        ({}, "auto", "batch_size='auto' must be an integer"),
        ({"method": "no_such_method"}, None, "no_such_method"),
        ({"cost.target": 0.3}, None, "cost.target=0.3 is run.py's"),
    ],
)
def test_what_lm_eval_or_run_py_owns_is_refused_in_one_line(model_args, batch_size, message):
    with pytest.raises(UserError, match=message) as refused:
        compose_from_model_args(model_args, batch_size)
    assert "\n" not in str(refused.value)

"""The GPU check (scripts/gpu_check.py), in process: it builds every method as its config does
without Hydra, and stops starting parts its time budget cannot hold. Its runs as a command are
tests/system/test_gpu_check_script.py."""

import importlib.util
import shutil
from collections.abc import Mapping
from pathlib import Path

import pytest
import yaml

from bwprune.config import build_method
from bwprune.generation.speed import within_budget
from tests.conftest import compose_cfg

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "gpu_check.py"


def _script():
    spec = importlib.util.spec_from_file_location("gpu_check", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_within_budget_stops_starting_parts_the_budget_cannot_hold():
    now = [0.0]
    clock = lambda: now[0]  # noqa: E731

    def part(seconds: float, value: str):
        def run():
            now[0] += seconds
            return value

        return run

    parts = [("a", part(3, "A")), ("b", part(5, "B")), ("c", part(2, "C")), ("d", part(1, "D"))]
    # a starts at 0 (nothing measured yet) and ends at 3; b starts since 3 + 3 <= 12 and ends at
    # 8; c would end at 8 + 5 = 13 were it as long as b: skipped, and d alike.
    assert list(within_budget(parts, 12.0, clock)) == [
        ("a", "A", 3), ("b", "B", 5), ("c", None, 0.0), ("d", None, 0.0)
    ]  # fmt: skip
    now[0] = 0.0  # with 3 s more: c ends at 10, and d would end at 10 + 5 = 15
    assert [r for _, r, _ in within_budget(parts, 15.0, clock)] == ["A", "B", "C", "D"]


@pytest.mark.parametrize("method", ["dense", "ours", "teal", "cats", "griffin", "wanda", "trisp"])
def test_the_check_builds_a_method_as_its_config_does(method, tmp_path):
    settings = yaml.safe_load((ROOT / "conf" / "gpu_check.yaml").read_text())
    settings["cache_dir"] = str(tmp_path)
    plain = _script().build_method({"method": method}, 0.5, settings)
    sequences = settings["calibration"]["num_sequences"]
    cfg = compose_cfg([f"method={method}", "sparsity=0.5", f"paths.cache_dir={tmp_path}",
                       f"calibration.num_sequences={sequences}"])  # fmt: skip
    hydra = build_method(cfg.method)
    assert type(plain) is type(hydra)
    mine, theirs = vars(plain), vars(hydra)
    if "calibration" in theirs:  # the composed one also carries its cache folder, given apart
        theirs = {**theirs, "calibration": dict(theirs["calibration"])}
        theirs["calibration"].pop("cache_dir")
    plain_value = lambda v: dict(v) if isinstance(v, Mapping) else str(v)  # noqa: E731
    assert {k: plain_value(v) for k, v in mine.items()} == {
        k: plain_value(v) for k, v in theirs.items()
    }


def test_the_check_reads_the_method_file_and_its_own_overrides(tmp_path, monkeypatch):
    """Not the classes' Python defaults, which equal the files' today and need not tomorrow."""
    conf = tmp_path / "conf"
    shutil.copytree(ROOT / "conf", conf)
    path = conf / "method" / "ours.yaml"
    path.write_text(path.read_text().replace("t_prune: 16", "t_prune: 7"))
    check = _script()
    monkeypatch.setattr(check, "CONF", conf)
    settings = yaml.safe_load((conf / "gpu_check.yaml").read_text())
    assert check.build_method({"method": "ours"}, 0.5, settings).t_prune == 7
    frozen = check.build_method(settings["methods"]["ours_frozen"], 0.5, settings)
    assert (frozen.t_init, frozen.t_explore, frozen.t_prune) == (0, 0, 7)


def test_a_method_key_the_check_cannot_resolve_is_refused(tmp_path):
    check = _script()
    with pytest.raises(SystemExit, match="k_rule"):
        check.plain_values({"k_rule": "${oc.env:RULE}"}, tmp_path / "x.yaml")

"""`report.source=wandb`: W&B runs carry their run folder, and a download reads like the local one.

No W&B server is reachable in tests: runs are logged offline, and a fake `wandb.Api` serves the
files of those offline runs, as the server would after `wandb sync`.
"""

import base64
import hashlib
import logging
import shutil
from pathlib import Path

import pytest
from pandas.testing import assert_frame_equal

from bwprune.errors import UserError
from bwprune.experiment import run
from bwprune.report.collect import load_runs
from bwprune.report.wandb_source import download_runs, report_config, runs_dir
from bwprune.runs.tracking import RUN_FILES, RUN_FILES_DIR
from tests.conftest import CONF_DIR, compose_cfg

TINY = ["model=tiny_llama", "limit=2", "generation.max_new_tokens=8", "batch_size=2"]


@pytest.fixture(scope="module")
def logged(tmp_path_factory):
    """Two tiny runs logged offline: (local runs dir, {run_key: the offline run's files dir})."""
    import wandb

    root = tmp_path_factory.mktemp("results")
    real_init, files_dirs = wandb.init, []

    def init(**kwargs):  # the files folder of each run, wherever an earlier session put WANDB_DIR
        run_ = real_init(**kwargs)
        files_dirs.append(Path(run_.dir))
        return run_

    keys = []
    with pytest.MonkeyPatch.context() as mp:
        for var in ("WANDB_DIR", "WANDB_CONFIG_DIR", "WANDB_CACHE_DIR", "WANDB_DATA_DIR"):
            mp.setenv(var, str(root / "wandb"))
        mp.setattr(wandb, "init", init)
        for method in ("dense", "ours"):
            overrides = [*TINY, f"method={method}", "logger=wandb", "logger.mode=offline"]
            keys.append(run(compose_cfg(overrides, root))["run_key"])
    assert len(files_dirs) == 2, "one W&B run per bwprune run"
    return root / "runs", dict(zip(keys, files_dirs, strict=True))


class FakeFile:
    def __init__(self, name: str, source: Path, downloads: list[str]) -> None:
        self.name, self.source, self.downloads = name, source, downloads
        self.md5 = base64.b64encode(hashlib.md5(source.read_bytes()).digest()).decode()  # as W&B

    def download(self, root: str = ".", replace: bool = False):
        target = Path(root) / self.name
        assert replace or not target.exists()
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(self.source, target)
        self.downloads.append(self.name)
        return open(target)


class FakeRun:
    def __init__(self, name, files_dir, state="finished", group="adhoc", downloads=None):
        self.name, self.files_dir, self.state, self.group = name, files_dir, state, group
        self.downloads = downloads if downloads is not None else []

    def files(self, names):
        present = [n for n in names if self.files_dir and (self.files_dir / n).is_file()]
        return [FakeFile(n, self.files_dir / n, self.downloads) for n in present]


class FakeApi:
    """`wandb.Api().runs` over runs listed oldest first, with equality filters."""

    def __init__(self, runs: list[FakeRun]) -> None:
        self._runs, self.paths = runs, []

    def runs(self, path, filters, order):
        self.paths.append(path)
        listed = [r for r in self._runs if all(getattr(r, k) == v for k, v in filters.items())]
        return listed[::-1] if order == "-created_at" else listed


def fake_runs(logged, downloads) -> list[FakeRun]:
    return [FakeRun(key, d, downloads=downloads) for key, d in logged[1].items()]


def test_tracker_uploads_copies_of_the_run_folder(logged):
    runs_dir_, files_dirs = logged
    for key, files_dir in files_dirs.items():
        for name in RUN_FILES:
            uploaded = files_dir / RUN_FILES_DIR / name
            assert not uploaded.is_symlink(), "a copy: W&B must never write into the run folder"
            assert uploaded.read_bytes() == (runs_dir_ / key / name).read_bytes()


def test_download_reads_like_the_local_runs(logged, tmp_path, caplog):
    legacy = tmp_path / "legacy_files"  # a run mirrored before the tracker uploaded run files
    legacy.mkdir()
    (legacy / "config.yaml").write_text("_wandb: {}\n")  # W&B's own config.yaml, not ours
    crashed_files = next(iter(logged[1].values()))
    api = FakeApi(
        [
            FakeRun("gsm8k/tiny_llama/dense/legacy_mirror", legacy),
            *fake_runs(logged, []),
            FakeRun("gsm8k/tiny_llama/dense/crashed", crashed_files, state="crashed"),
        ]
    )
    with caplog.at_level(logging.WARNING):
        kept = download_runs(api, "team/bwprune", None, tmp_path / "cache")
    assert sorted(kept) == sorted(logged[1]) and api.paths == ["team/bwprune"]
    assert "1 W&B run(s)" in caplog.text and "gsm8k/tiny_llama/dense/legacy_mirror" in caplog.text
    assert_frame_equal(load_runs(tmp_path / "cache"), load_runs(logged[0]))
    assert not list((tmp_path / "cache").glob("**/tmp*")), "downloads are moved into place"


def test_second_download_fetches_only_changes_and_drops_gone_runs(logged, tmp_path):
    downloads = []
    gone, kept = fake_runs(logged, downloads)
    download_runs(FakeApi([gone, kept]), "bwprune", None, tmp_path)
    assert len(downloads) == 2 * len(RUN_FILES)
    downloads.clear()
    (tmp_path / kept.name / "run.json").write_text("{}")  # a stale copy is fetched again
    download_runs(FakeApi([kept]), "bwprune", None, tmp_path)
    assert downloads == [f"{RUN_FILES_DIR}/run.json"]
    assert not (tmp_path / gone.name).exists()
    assert list(load_runs(tmp_path)["run_key"]) == [kept.name]


def test_newest_of_same_named_runs_wins_and_group_filters(logged, tmp_path):
    (key_a, dir_a), (key_b, dir_b) = logged[1].items()
    older, newer = FakeRun(key_a, dir_b), FakeRun(key_a, dir_a)
    other = FakeRun(key_b, dir_b, group="other")
    assert download_runs(FakeApi([older, newer, other]), "bwprune", "adhoc", tmp_path) == [key_a]
    assert (tmp_path / key_a / "run.json").read_bytes() == (
        logged[0] / key_a / "run.json"
    ).read_bytes()


def test_refuses_a_folder_it_did_not_download_into(tmp_path):
    (tmp_path / "notes.txt").write_text("mine")
    with pytest.raises(UserError, match=r"report.cache_dir=.* holds files that no W&B download"):
        download_runs(FakeApi([]), "bwprune", None, tmp_path)
    assert (tmp_path / "notes.txt").exists()


def test_wandb_source_downloads_the_configured_project(logged, tmp_path, monkeypatch):
    import wandb

    api = FakeApi(fake_runs(logged, []))
    monkeypatch.setattr(wandb, "Api", lambda: api)
    overrides = ["report.source=wandb", "report.entity=team", f"report.cache_dir={tmp_path}/c"]
    assert runs_dir(report_config(CONF_DIR, overrides)) == tmp_path / "c"
    assert api.paths == ["team/bwprune"] and len(load_runs(tmp_path / "c")) == 2


def test_wandb_source_without_a_key_is_one_line(tmp_path, monkeypatch):
    import wandb

    def no_key():
        raise wandb.errors.UsageError("No API key configured. Use `wandb login` to log in.")

    monkeypatch.setattr(wandb, "Api", no_key)
    cfg = report_config(CONF_DIR, ["report.source=wandb", f"report.cache_dir={tmp_path}"])
    with pytest.raises(
        UserError, match=r"^report.source=wandb: No API key configured\. Use `wandb"
    ):
        runs_dir(cfg)


def test_local_is_the_default_source(tmp_path):
    cfg = report_config(CONF_DIR, [f"paths.results_dir={tmp_path}"])
    assert cfg.report.source == "local"
    assert runs_dir(cfg) == tmp_path / "runs"


def test_bad_source_is_one_line_naming_the_choices():
    with pytest.raises(
        UserError, match=r"^report.source='s3' is not valid; choose one of \['local', 'wandb'\]$"
    ):
        runs_dir(report_config(CONF_DIR, ["report.source=s3"]))

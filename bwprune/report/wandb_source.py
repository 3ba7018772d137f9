"""The runs `make tables` / `make figures` read: the local folder's, or a download from W&B.

With `report.source=wandb`, the files each W&B run carries (the copies of its run folder that
`bwprune.runs.tracking` uploads) are downloaded into a folder laid out like `paths.runs_dir`, so
tables and figures come from the same `load_runs` whatever the source. This module builds no table;
it never writes to `paths.runs_dir`.
"""

from __future__ import annotations

import base64
import hashlib
import logging
import shutil
import tempfile
from pathlib import Path, PurePosixPath
from typing import Any

import pandas as pd
from omegaconf import DictConfig

from bwprune.config import compose_config
from bwprune.errors import UserError, choices_error
from bwprune.report.collect import report_runs
from bwprune.runs.tracking import RUN_FILES, RUN_FILES_DIR

log = logging.getLogger(__name__)

SOURCES = ("local", "wandb")
# What `load_runs` needs of a run; samples.jsonl and timing.jsonl are copied when the run has them.
REQUIRED = tuple(f"{RUN_FILES_DIR}/{name}" for name in ("config.yaml", "run.json"))
# Marks a folder as a download: stale runs are deleted there, so it must not be a results folder.
CACHE_MARK = ".wandb-download"


def report_config(conf_dir: str | Path, overrides: list[str]) -> DictConfig:
    """conf/config.yaml plus the `report` group. The group is added here rather than in
    config.yaml's defaults because a run's whole config, bar a few keys, is hashed into its
    run_key: a new top-level key there would rename every recorded run."""
    return compose_config(conf_dir, ["+report=default", *overrides])


def source_runs(cfg: DictConfig) -> tuple[pd.DataFrame, str | None]:
    """The runs of `report.source`, chosen by `report.runs` (`report_runs`), and a note on those
    left out. A W&B download is used whole: `report.group` already chose its runs."""
    which = cfg.report.runs if cfg.report.source == "local" else "all"
    return report_runs(runs_dir(cfg), which)


def runs_dir(cfg: DictConfig) -> Path:
    """`paths.runs_dir`, or (`report.source=wandb`) the cache folder after a fresh download."""
    rep = cfg.report
    if rep.source == "local":
        return Path(cfg.paths.runs_dir)
    if rep.source != "wandb":
        raise choices_error("report.source", rep.source, SOURCES)
    import wandb

    project = f"{rep.entity}/{rep.project}" if rep.entity else rep.project
    dest = Path(rep.cache_dir).expanduser()
    try:
        api = wandb.Api()
    except wandb.errors.UsageError as e:  # no API key: `wandb login` fixes it
        raise UserError(f"report.source=wandb: {e}") from None
    download_runs(api, project, rep.group, dest)
    return dest


def download_runs(api: Any, project: str, group: str | None, dest: Path) -> list[str]:
    """Mirror every finished run of `project` (of `group` only, unless None) into dest/<name>/.

    A W&B run's name is its run_key, so dest is laid out like `paths.runs_dir`. When names repeat
    (a run redone after its folder was lost) the newest wins. Runs W&B no longer lists are removed
    from dest, so it holds exactly the project's runs. Runs logged before the tracker uploaded run
    files are skipped with a warning naming them. Returns the names kept.
    """
    dest = _claim(dest)
    filters = {"state": "finished", **({"group": group} if group else {})}
    wanted = [f"{RUN_FILES_DIR}/{name}" for name in RUN_FILES]
    kept: list[str] = []
    skipped: list[str] = []
    for run in api.runs(project, filters=filters, order="-created_at"):
        if run.name in kept or run.name in skipped:  # an older run of a name already seen
            continue
        files = {f.name: f for f in run.files(names=wanted)}
        if not (_is_relative(run.name) and all(f in files for f in REQUIRED)):
            skipped.append(run.name)
            continue
        _mirror(files, dest / run.name)
        kept.append(run.name)
    if kept:
        _drop_stale(dest, set(kept))
    else:  # a wrong project or entity must not empty the cache
        log.warning("W&B lists no finished run with its run folder in %s (filters %s)", project,
                    filters)  # fmt: skip
    if skipped:
        log.warning(
            "skipped %d W&B run(s) that carry no run folder (%s; runs logged before the tracker "
            "uploaded them): %s",
            len(skipped),
            " and ".join(REQUIRED),
            ", ".join(skipped),
        )
    return kept


def _claim(dest: Path) -> Path:
    """`dest`, created and marked as a download; a non-empty folder without the mark is refused."""
    if dest.exists() and any(dest.iterdir()) and not (dest / CACHE_MARK).exists():
        raise UserError(
            f"report.cache_dir={str(dest)!r} holds files that no W&B download put there; choose an "
            "empty or new folder (runs that W&B no longer lists are deleted from it)"
        )
    dest.mkdir(parents=True, exist_ok=True)
    (dest / CACHE_MARK).touch()
    return dest


def _is_relative(name: str) -> bool:
    """A name that keeps its folder inside the cache (a run_key always does)."""
    path = PurePosixPath(name)
    return bool(name) and not path.is_absolute() and ".." not in path.parts


def _mirror(files: dict[str, Any], folder: Path) -> None:
    """The run's files in `folder`; one whose md5 matches the copy there is not fetched again."""
    folder.mkdir(parents=True, exist_ok=True)
    for name in RUN_FILES:
        local, remote = folder / name, files.get(f"{RUN_FILES_DIR}/{name}")
        if remote is None:
            local.unlink(missing_ok=True)
        elif not (local.exists() and _md5(local) == remote.md5):
            # W&B writes to root/<file name>: fetch aside, then move into place in one step.
            with tempfile.TemporaryDirectory(dir=folder) as tmp:
                remote.download(root=tmp, replace=True).close()
                Path(tmp, remote.name).replace(local)


def _md5(path: Path) -> str:
    """md5 as W&B reports it (base64 of the digest); a mismatch only costs a download."""
    return base64.b64encode(hashlib.md5(path.read_bytes(), usedforsecurity=False).digest()).decode()


def _drop_stale(dest: Path, kept: set[str]) -> None:
    """Delete the run folders under `dest` that are not in `kept` (runs W&B no longer lists)."""
    for run_json in list(dest.glob("**/run.json")):
        if run_json.parent.relative_to(dest).as_posix() not in kept:
            shutil.rmtree(run_json.parent)

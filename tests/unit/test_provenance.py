"""Provenance (bwprune/runs/provenance.py): what `run.json` says about where a run's numbers came
from, and that a missing git or package makes a field empty rather than failing the run."""

import subprocess

import torch

from bwprune.runs import provenance as prov


def test_git_answers_in_a_work_tree_and_none_elsewhere(tmp_path):
    head = subprocess.run(["git", "-C", str(prov.REPO), "rev-parse", "HEAD"],
                          capture_output=True, text=True, check=True).stdout.strip()  # fmt: skip
    assert prov.git(prov.REPO, "rev-parse", "HEAD") == head
    assert prov.git(tmp_path, "rev-parse", "HEAD") is None  # not a work tree
    assert prov.git(tmp_path / "missing", "status") is None


def test_provenance_records_code_versions_and_machine(monkeypatch):
    monkeypatch.setattr(prov, "VERSIONED_PACKAGES", ("torch", "no-such-package-bwprune"))
    record = prov.provenance(seed=3, device="cpu")
    assert record["seed"] == 3 and record["device"] == "cpu"
    assert record["git_sha"] == prov.git(prov.REPO, "rev-parse", "HEAD")
    assert isinstance(record["git_dirty"], bool)
    assert record["versions"] == {"torch": torch.__version__, "no-such-package-bwprune": None}
    assert record["torch_threads"] == torch.get_num_threads()


def test_without_git_the_code_version_is_unknown_not_an_error(monkeypatch):
    monkeypatch.setattr(prov, "git", lambda *_: None)
    record = prov.provenance(seed=0, device="cpu")
    assert record["git_sha"] is None and record["git_dirty"] is None

"""Every notebook in notebooks/ is stored without outputs and runs headless on a tiny tree."""

from pathlib import Path

import nbformat
import pytest
from jupyter_client import AsyncKernelManager
from jupyter_client.kernelspec import KernelSpecManager
from nbclient import NotebookClient

NOTEBOOK_DIR = Path(__file__).resolve().parents[2] / "notebooks"
NOTEBOOKS = sorted(NOTEBOOK_DIR.glob("*.ipynb"))


def _ids(paths):
    return [p.name for p in paths]


def test_notebooks_exist():
    assert {"collapse.ipynb", "sparsity.ipynb", "speed.ipynb", "dynamics.ipynb"} <= set(
        _ids(NOTEBOOKS)
    )


@pytest.mark.parametrize("path", NOTEBOOKS, ids=_ids(NOTEBOOKS))
def test_stored_without_outputs(path):
    nb = nbformat.read(path, as_version=4)
    nbformat.validate(nb)
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert code
    assert all(c.outputs == [] and c.execution_count is None for c in code), (
        f"{path.name} has outputs; clear them before saving"
    )


@pytest.mark.slow
@pytest.mark.parametrize("path", NOTEBOOKS, ids=_ids(NOTEBOOKS))
def test_runs_headless(path, results_tree, monkeypatch):
    results_dir = results_tree[0].parent
    monkeypatch.setenv("BWPRUNE_RESULTS_DIR", str(results_dir))  # the kernel inherits it
    nb = nbformat.read(path, as_version=4)
    # No kernel dirs: the native ipykernel spec, i.e. this interpreter, not a user-installed one.
    km = AsyncKernelManager(
        kernel_name="python3", kernel_spec_manager=KernelSpecManager(kernel_dirs=[])
    )
    cwd = {"metadata": {"path": str(NOTEBOOK_DIR)}}  # where Jupyter runs it, too
    NotebookClient(nb, km=km, timeout=120, resources=cwd).execute()

    outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs]
    data = [o.get("data", {}) for o in outputs]
    plain = [o.get("text") or d.get("text/plain", "") for o, d in zip(outputs, data)]
    assert any(str(results_dir) in t for t in plain), "a notebook shows the results folder it read"
    assert any("image/png" in d for d in data), "a notebook draws at least one figure"
    assert all("image/png" in d for d in data if d.get("text/plain", "").startswith("<Figure")), (
        "a Figure shown as text only: the notebook needs `%matplotlib inline`"
    )

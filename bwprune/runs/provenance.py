"""Where a run's numbers came from: code version, package versions, machine (`run.json`'s
`provenance`), and the git queries behind them. Imports torch only when called.
"""

from __future__ import annotations

import importlib.metadata
import platform
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
VERSIONED_PACKAGES = ("torch", "transformers", "math-verify", "hydra-core", "bwprune")


def git(folder: str | Path, *args: str) -> str | None:
    """`git -C folder args` stdout, or None where git fails (no git, not a work tree)."""
    try:
        out = subprocess.run(
            ["git", "-C", str(folder), *args], capture_output=True, text=True, timeout=10
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip() if out.returncode == 0 else None


def provenance(seed: int, device: str) -> dict:
    """Where a run's numbers came from: code version, package versions, machine."""
    versions = {}
    for pkg in VERSIONED_PACKAGES:
        try:
            versions[pkg] = importlib.metadata.version(pkg)
        except importlib.metadata.PackageNotFoundError:
            versions[pkg] = None
    status = git(REPO, "status", "--porcelain", "--untracked-files=no")
    import torch  # deferred: this module is also used by tools that never load a model

    return {
        "git_sha": git(REPO, "rev-parse", "HEAD"),
        "git_dirty": bool(status) if status is not None else None,
        "versions": versions,
        "python": platform.python_version(),
        "device": device,
        "device_name": torch.cuda.get_device_name()
        if device.startswith("cuda")
        else platform.processor() or platform.machine(),
        "torch_threads": torch.get_num_threads(),
        "hostname": platform.node(),
        "seed": seed,
    }

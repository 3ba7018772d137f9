"""Hydra's `ray` launcher for bwprune sweeps (`hydra/launcher=ray`, `ray_launcher.py`)."""

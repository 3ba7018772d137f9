"""`python scripts/calibrate.py method=teal [model=... calibration.num_sequences=... sparsity=...]`:
build (or find) a method's calibration artifacts in the cache ahead of a sweep, without generating.

Same overrides as run.py. It loads the model and runs the method's `prepare`, which calibrates and
caches (TEAL/CATS histograms do not depend on sparsity; Wanda's statistics do: one call per ρ).
"""

import logging
import sys
from pathlib import Path

from bwprune.config import build_method, compose_config, validate
from bwprune.engine.protocol import MethodDriver
from bwprune.errors import UserError
from bwprune.models.adapters import adapter_for
from bwprune.models.loading import load_model

if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    try:
        cfg = compose_config(Path(__file__).resolve().parent.parent / "conf", sys.argv[1:])
        validate(cfg)
        method = build_method(cfg.method)
        model, tokenizer = load_model(cfg.model, cfg.paths.cache_dir)
        MethodDriver(method, model, adapter_for(model)).prepare(tokenizer)
    except UserError as e:
        sys.exit(f"error: {e}")
    print(f"calibrated {cfg.method._target_} for {cfg.model.name} (cache: {cfg.paths.cache_dir})")

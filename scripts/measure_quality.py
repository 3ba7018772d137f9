"""`python scripts/measure_quality.py RUN_DIR [RUN_DIR ...] [overrides]`: a finished run's KL and
NLL to dense, measured now in the batches it was generated in (`bwprune.generation.requality`):
for runs made with `quality.enabled=false`, such as the real models' accuracy runs in vLLM.

Overrides are config keys of this checkout, e.g. quality.max_tokens=64 quality.top_k=256 (the
defaults a new run uses). Each run's record is replaced when its measurement is done, so stop it
any time: the runs already measured keep theirs.
"""

import sys
from pathlib import Path

from bwprune.config import compose_config
from bwprune.errors import UserError
from bwprune.generation.requality import requality

ROOT = Path(__file__).resolve().parent.parent


if __name__ == "__main__":
    args = sys.argv[1:]
    runs = [a for a in args if Path(a).is_dir()]  # run keys hold "=" too
    if not runs:
        sys.exit(__doc__)
    current = compose_config(ROOT / "conf", [a for a in args if a not in runs])
    for run in runs:
        try:
            q = requality(run, current)["metrics"]["quality"]
        except UserError as e:
            sys.exit(f"error: {e}")
        print(f"{run}\n  KL(dense ‖ method) {q['kl']:.4f} nats/token, NLL {q['nll_dense']:.3f} → "
              f"{q['nll']:.3f} over {q['tokens']} reference tokens", flush=True)  # fmt: skip

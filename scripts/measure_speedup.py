"""`python scripts/measure_speedup.py RUN_DIR [RUN_DIR ...] [overrides]`: a finished run's paired
speedup over dense, measured now on its first recorded batches (`bwprune.generation.remeasure`).

Overrides are config keys of this checkout, e.g. speed.batches=3 speed.repeats=5. Measure on a
quiet machine: the pairs are alternated, but a noisy machine widens their spread.
"""

import sys
from pathlib import Path

from bwprune.cli import speedup_line
from bwprune.config import compose_config
from bwprune.errors import UserError
from bwprune.generation.remeasure import remeasure

ROOT = Path(__file__).resolve().parent.parent

if __name__ == "__main__":
    runs = [a for a in sys.argv[1:] if Path(a).is_dir()]  # run keys hold "=" too
    if not runs:
        sys.exit(__doc__)
    current = compose_config(ROOT / "conf", [a for a in sys.argv[1:] if a not in runs])
    for run in runs:
        try:
            m = remeasure(run, current)["metrics"]
        except UserError as e:
            sys.exit(f"error: {e}")
        print(f"{run}\n{speedup_line(m['speedup'], m.get('time_to_answer'))}")

"""`python scripts/measure_speedup.py RUN_DIR [RUN_DIR ...] [overrides]`: a finished run's paired
speedup over dense, measured now on its first recorded batches (`bwprune.generation.remeasure`).

Overrides are config keys of this checkout, e.g. speed.batches=1 speed.half_width=0.02. The
pairs are timed as a new run times them (`speed`: alternated until the interval of the median is
within ±speed.half_width, at most speed.max_repeats pairs or speed.budget_s seconds a batch), and
the load is recorded: measure on a quiet machine, where the target is reached in fewer pairs, and
read the printed line for "not reached" or "load above the cores".
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

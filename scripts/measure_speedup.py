"""`python scripts/measure_speedup.py RUN_DIR [RUN_DIR ...] [overrides]`: a finished run's paired
speedup over dense, measured now on its first recorded batches (`bwprune.generation.remeasure`).

`--without-interval DIR` instead re-times every complete run under DIR whose speedup was timed
before intervals (min-max alone), one after the other: stop it any time, and the same command
goes on with the runs still left (each run's record is replaced when its timing is done).

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
from bwprune.generation.remeasure import remeasure, runs_without_interval

ROOT = Path(__file__).resolve().parent.parent
SWEEP = "--without-interval"


if __name__ == "__main__":
    args = sys.argv[1:]
    if SWEEP in args:
        at = args.index(SWEEP)
        if at + 1 == len(args) or not Path(args[at + 1]).is_dir():
            sys.exit(f"error: {SWEEP} needs a folder of runs, e.g. {SWEEP} results/runs")
        runs = runs_without_interval(Path(args[at + 1]))
        overrides = args[:at] + args[at + 2 :]
        print(f"{len(runs)} runs timed before intervals under {args[at + 1]}", flush=True)
    else:
        runs = [a for a in args if Path(a).is_dir()]  # run keys hold "=" too
        overrides = [a for a in args if a not in runs]
    if not runs and SWEEP not in args:
        sys.exit(__doc__)
    current = compose_config(ROOT / "conf", overrides)
    for run in runs:
        try:
            m = remeasure(run, current)["metrics"]
        except UserError as e:
            sys.exit(f"error: {e}")
        print(f"{run}\n{speedup_line(m['speedup'], m.get('time_to_answer'))}", flush=True)

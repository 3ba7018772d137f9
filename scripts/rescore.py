"""`python scripts/rescore.py RUN_DIR`: re-score a run from its samples.jsonl, without a model."""

import sys

from bwprune.errors import UserError
from bwprune.runs.rescore import rescore

if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python scripts/rescore.py results/runs/<benchmark>/<model>/<method>/<run>")
    try:
        m = rescore(sys.argv[1])["metrics"]
    except UserError as e:
        sys.exit(f"error: {e}")
    print(f"accuracy {m['accuracy']:.3f} ({m['correct']}/{m['n']}, {m['unscorable']} unscorable)")

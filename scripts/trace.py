"""`make traces`: per-step traces for the dynamics figures -> results/traces/*.json.

python scripts/trace.py [config overrides, e.g. model=tiny_llama trace.sparsity.batch_size=2]
Writes `<model>_<benchmark>_sparsity_steps_bs<B>.json` (realized sparsity of every decode step,
per method) and `<model>_<benchmark>_refire_L<l>.json` (one layer's activations over a dense
generation, with re-fire period and rate); `make figures` draws them. Settings:
conf/trace/default.yaml.
"""

import logging
import sys
from pathlib import Path

from bwprune.errors import UserError
from bwprune.generation.traces import record_traces

ROOT = Path(__file__).resolve().parent.parent

if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    try:
        written = record_traces(ROOT / "conf", sys.argv[1:])
    except UserError as e:
        sys.exit(f"error: {e}")
    for path in written:
        print(f"wrote {path}")

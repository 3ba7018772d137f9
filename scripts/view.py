"""`make view RUN=results/runs/...`: a run against its dense run, as one self-contained page."""

import argparse
import logging
import sys

from bwprune.errors import UserError
from bwprune.report.viewer import write_view

if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("run", help="results/runs/<benchmark>/<model>/<method>/<run>")
    parser.add_argument("--dense", help="the dense run to compare with (default: found)")
    parser.add_argument("--out", help="the page to write (default: results/views/<run key>.html)")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    try:
        page = write_view(args.run, args.dense, args.out)
    except UserError as e:
        sys.exit(f"error: {e}")
    print(f"wrote {page}\nopen file://{page.resolve()}")

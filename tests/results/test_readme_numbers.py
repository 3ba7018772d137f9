"""The reported small-scale results must be the recorded ones: every decimal in the tables of
results/README.md appears in a table `make tables` wrote under results/tables/.

Why: those tables are assembled by hand from results/tables/*.md; this catches a number left
stale after the runs (and `make tables`) changed.
"""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
FINDINGS = ROOT / "results" / "README.md"
DECIMAL = re.compile(r"^\d+\.\d+$")


def findings_table_decimals() -> set[str]:
    cells = (
        cell.strip()
        for line in FINDINGS.read_text().splitlines()
        if line.startswith("|")
        for cell in line.strip("|").split("|")
    )
    return {cell for cell in cells if DECIMAL.match(cell)}


def test_reported_results_come_from_results_tables():
    decimals = findings_table_decimals()
    assert decimals, f"no table with numbers found in {FINDINGS}"
    tables = "".join(p.read_text() for p in (ROOT / "results/tables").glob("*.md"))
    recorded = set(re.findall(r"\d+\.\d+", tables))
    missing = sorted(decimals - recorded)
    assert not missing, f"results/README.md numbers not in results/tables/*.md: {missing}"

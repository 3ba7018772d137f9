"""The README's small-scale results must be the recorded ones: every decimal in the tables of
its "Small-scale results" section appears in a table `make tables` wrote under results/tables/.

Why: those README tables are assembled by hand from results/tables/*.md; this catches a number
left stale after the runs (and `make tables`) changed.
"""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SECTION = "## Small-scale results"
DECIMAL = re.compile(r"^\d+\.\d+$")


def readme_table_decimals() -> set[str]:
    text = (ROOT / "README.md").read_text()
    section = text.split(SECTION, 1)[1].split("\n## ", 1)[0]
    cells = (
        cell.strip()
        for line in section.splitlines()
        if line.startswith("|")
        for cell in line.strip("|").split("|")
    )
    return {cell for cell in cells if DECIMAL.match(cell)}


def test_readme_results_come_from_results_tables():
    decimals = readme_table_decimals()
    assert decimals, f"no table with numbers found under {SECTION!r} in README.md"
    tables = "".join(p.read_text() for p in (ROOT / "results/tables").glob("*.md"))
    recorded = set(re.findall(r"\d+\.\d+", tables))
    missing = sorted(decimals - recorded)
    assert not missing, f"README numbers not in results/tables/*.md (run `make tables`?): {missing}"

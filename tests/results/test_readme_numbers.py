"""The reported numbers must be the recorded ones: every decimal in the tables of README.md and
results/README.md (row labels aside) appears in a table `make tables` wrote under results/tables/.

Why: those tables are assembled by hand from results/tables/*.md; this catches a number left
stale after the runs (and `make tables`) changed.
"""

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
NUMBER = re.compile(r"\d+\.\d+")


def table_decimals(path: Path) -> set[str]:
    """Decimals in the cells of the markdown tables of `path`, the first (label) column left out:
    a label such as `decay` (γ 0.9) names a setting, not a result."""
    cells = (
        cell
        for line in path.read_text().splitlines()
        if line.startswith("|")
        for cell in line.strip().strip("|").split("|")[1:]
    )
    return {n for cell in cells for n in NUMBER.findall(cell)}


@pytest.mark.parametrize("document", ["README.md", "results/README.md"])
def test_reported_results_come_from_results_tables(document):
    decimals = table_decimals(ROOT / document)
    assert decimals, f"no table with numbers found in {document}"
    tables = "".join(p.read_text() for p in (ROOT / "results/tables").glob("*.md"))
    missing = sorted(decimals - set(NUMBER.findall(tables)))
    assert not missing, f"{document} numbers not in results/tables/*.md: {missing}"

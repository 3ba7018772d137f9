"""The committed tables are what `make tables` makes of the committed runs, byte for byte."""

from pathlib import Path

from bwprune.report.collect import report_runs
from bwprune.report.selection import default_variants
from bwprune.report.tables import all_tables, pareto_table
from bwprune.report.wandb_source import report_config
from tests.conftest import CONF_DIR

ROOT = Path(__file__).resolve().parents[2]


def test_committed_tables_rebuild_from_the_committed_runs():
    """results/tables/*.md are what `make tables` makes of the runs committed under results/."""
    runs, _ = report_runs(ROOT / "results" / "runs", "committed")
    defaults = default_variants(CONF_DIR, runs)
    tables = all_tables(runs, defaults)
    at = list(report_config(CONF_DIR, []).report.pareto_at)
    tables["pareto"] = pareto_table(runs, defaults, at)  # as scripts/make_tables.py adds it
    for stem, table in tables.items():
        assert table.markdown() == (ROOT / "results" / "tables" / f"{stem}.md").read_text(), stem

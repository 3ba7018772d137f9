"""Run-level realized sparsity from per-row ledger summaries (`bwprune.engine.ledger`).

Pure Python on purpose: records, tables and the lm-eval summary combine ledger rows without
importing torch. The definition of each quantity is documented once, in `bwprune.engine.ledger`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping


def combine(rows: Iterable[Mapping]) -> dict:
    """Run-level realized sparsity: measured-step-weighted means of per-row ledger summaries."""
    rows = [r for r in rows if r]
    steps = sum(r["decode_steps"] for r in rows)
    sparse = sum(r["sparse_steps"] for r in rows)

    def mean(key: str, weight: str, total: int) -> float:
        return sum(r[key] * r[weight] for r in rows) / total if total else 0.0

    num_layers = len(rows[0]["per_layer"]) if rows else 0
    per_layer = [
        sum(r["per_layer"][i] * r["decode_steps"] for r in rows) / steps if steps else 0.0
        for i in range(num_layers)
    ]
    return {
        "ffn": mean("ffn", "decode_steps", steps),
        "ffn_sparse_steps": mean("ffn_sparse_steps", "sparse_steps", sparse),
        "params": mean("params", "decode_steps", steps),
        "decode_steps": steps,
        "sparse_step_fraction": sparse / steps if steps else 0.0,
        "per_layer": [round(v, 6) for v in per_layer],
    }

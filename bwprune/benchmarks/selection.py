"""Which (problem, sample) pairs a run generates: the `subset`, the `limit`, samples per problem.

Sharding comes after, over whole batches (`bwprune.runs.shards`), so a shard's batches are batches
of the unsharded run. Nothing here loads a model.
"""

from __future__ import annotations

from omegaconf import DictConfig, OmegaConf

from bwprune.benchmarks.base import Example
from bwprune.errors import UserError


def select_examples(examples: list[Example], cfg: DictConfig) -> list[Example]:
    """The `subset` (by dataset id, file order kept), then its first `limit`."""
    if cfg.subset is not None:
        if not OmegaConf.is_list(cfg.subset):
            raise UserError(f"subset={cfg.subset!r} must be a list of ids, e.g. subset=[0,5,17]")
        examples = _subset(examples, [str(i) for i in cfg.subset])
    return examples[: cfg.limit] if cfg.limit is not None else examples


def _subset(examples: list[Example], ids: list[str]) -> list[Example]:
    """Examples whose id is in `ids`; an id the benchmark lacks is a `UserError` naming it."""
    known = {e.id for e in examples}
    unknown = [i for i in ids if i not in known]
    if not ids or unknown:
        hint = [e.id for e in examples[:3]]
        raise UserError(f"subset={unknown or ids} names no example; ids look like {hint}")
    wanted = set(ids)
    return [e for e in examples if e.id in wanted]


def num_samples(cfg: DictConfig) -> int:
    """`generation.num_samples`: completions per problem, for pass@1 over samples."""
    n, gen = int(cfg.generation.num_samples), cfg.generation
    if n < 1 or (n > 1 and not gen.do_sample):
        raise UserError(
            f"generation.num_samples={n} must be >= 1, and 1 unless sampling "
            "(generation=sampled): greedy samples would all be the same"
        )
    return n


def work_items(examples: list[Example], samples: int) -> list[tuple[Example, int]]:
    """(example, sample) pairs, sample-major: pass k over all problems, then pass k + 1.

    Copies of one prompt in a batch would agree on which neurons matter and flatter any
    batch-shared pruning; sample-major order keeps batches a mix of different problems.
    """
    return [(e, k) for k in range(samples) for e in examples]

"""`make view`: one self-contained HTML page comparing a run's completions with its dense run's.

Per problem: both completions side by side with the first differing token marked, each side's
score, unscorable reason and token count, and, when the run stored `quality.traces`, the per-token
KL and NLL along the dense continuation as a colour strip. The data is embedded as JSON and
`viewer.html` renders rows on demand, so the page opens from a file (no server, no network) and
stays usable at 1,000 problems of 4k tokens. A run still in progress can be viewed too (its
metrics are those of the rows so far). Nothing is ever written into a run folder.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path

from omegaconf import DictConfig, OmegaConf
from transformers import PreTrainedTokenizerBase

from bwprune.cli import speedup_line
from bwprune.errors import UserError
from bwprune.report.divergence import Tokens, first_divergence, tokenize
from bwprune.runs.identity import target_sparsity
from bwprune.runs.pairing import PAIRING, matching_dense_runs
from bwprune.runs.recorder import RunRecorder
from bwprune.runs.summary import summarize

log = logging.getLogger(__name__)

TEMPLATE = Path(__file__).with_name("viewer.html")
DATA_MARK = "/*DATA*/"  # where the template takes the page's JSON
# Header rows: (label, run.json metric path, format); "%" is a share, "f" a plain number. Never
# tokens/s: two runs' rates depend on the machine and its load when each ran; the run's own
# paired speedup (measured against dense in one process) is shown instead.
METRICS = (
    ("accuracy", ("accuracy",), "%"),
    ("unscorable", ("unscorable",), "count"),
    ("mean generated tokens", ("mean_new_tokens",), "f"),
    ("realized sparsity (a) FFN", ("realized_sparsity", "ffn"), "%"),
    ("realized sparsity (c) params", ("realized_sparsity", "params"), "%"),
    ("KL to dense (nats/token)", ("quality", "kl"), "f"),
    ("NLL increase (nats/token)", ("quality", "nll_increase"), "f"),
)


@dataclass(frozen=True)
class RunFolder:
    """What the page needs of one run folder."""

    dir: Path
    cfg: DictConfig
    samples: list[dict]
    metrics: dict
    complete: bool

    @classmethod
    def load(cls, path: str | Path) -> RunFolder:
        folder = Path(path)
        if not (folder / "config.yaml").is_file():
            raise UserError(
                f"{str(folder)!r} is not a run folder (no config.yaml); "
                "pass one like results/runs/<benchmark>/<model>/<method>/<run>"
            )
        cfg = OmegaConf.load(folder / "config.yaml")
        recorder = RunRecorder(folder.parent, folder.name)
        samples, complete = recorder.samples(), recorder.is_complete()
        metrics = (
            recorder.record()["metrics"]
            if complete
            else summarize(
                samples, recorder.timings(), target_sparsity(cfg), recorder.cost_search()
            )
        )
        return cls(folder, cfg, samples, metrics, complete)

    @property
    def key(self) -> str:
        """`<benchmark>/<model>/<method>/<run>`: the folder's run key."""
        return "/".join(self.dir.resolve().parts[-4:])

    @property
    def method(self) -> str:
        """The method's name as in the run key (read from the folder: configs of older runs
        name it differently)."""
        return self.dir.resolve().parent.name


def find_dense_run(run: RunFolder) -> Path:
    """The complete dense run the tables compare `run` with (`bwprune.runs.pairing`)."""
    found = matching_dense_runs(run.dir, OmegaConf.to_container(run.cfg, resolve=True))
    if not found:
        raise UserError(
            f"no complete dense run under {str(run.dir.parent.parent / 'dense')!r} matches "
            f"{run.key} in {list(PAIRING)}; run it with method=dense and the same settings, "
            "or pass --dense"
        )
    return found[-1]


def run_tokenizer(cfg: DictConfig) -> PreTrainedTokenizerBase:
    """The tokenizer the run generated with, found as the run found it (no weights loaded)."""
    from bwprune.models.loading import load_tokenizer, model_source  # deferred: imports torch

    cache_dir = Path(cfg.paths.cache_dir).expanduser()
    return load_tokenizer(cfg.model, model_source(cfg.model, cache_dir))


def page_data(run: RunFolder, dense: RunFolder, tokenizer: PreTrainedTokenizerBase) -> dict:
    """The page's JSON: a header and one row per (problem, sample) of `run`."""
    reference = {RunRecorder.row_key(s): s for s in dense.samples}
    pairs = [(s, reference.get(RunRecorder.row_key(s))) for s in run.samples]
    pairs.sort(key=lambda pair: RunRecorder.row_key(pair[0]))
    # One pair at a time: all tokens of 1,000 completions of 4k tokens at once take gigabytes.
    rows = [
        _row(s, d, *tokenize(tokenizer, [s["completion"], d["completion"] if d else ""]))
        for s, d in pairs
    ]
    return {"header": _header(run, dense), "rows": rows, "scale": _trace_scale(rows)}


def _row(sample: dict, dense: dict | None, mine: Tokens, theirs: Tokens) -> dict:
    """One problem: both sides, and where the pruned side first leaves the dense one."""
    row = {
        "index": sample["index"],
        "sample": sample.get("sample", 0),
        "id": sample["id"],
        "prompt": sample["prompt"],
        "gold": sample["gold"],
        "pruned": _side(sample),
        "dense": _side(dense) if dense else None,  # None: the dense run lacks this problem
        "diverges_at": None,  # token index; None with a dense side: identical completions
    }
    if dense is not None:
        at = first_divergence(theirs.ids, mine.ids)
        row["diverges_at"] = at
        if at is not None:
            row["dense_span"], row["pruned_span"] = theirs.span(at), mine.span(at)
    trace = (sample.get("quality") or {}).get("trace")
    if trace:  # along the dense reference: the dense completion's first tokens
        row["trace"] = {**trace, "pieces": theirs.pieces(len(trace["kl"]))}
    return row


def _side(sample: dict) -> dict:
    return {
        "text": sample["completion"],
        "prediction": sample["prediction"],
        "correct": sample["correct"],
        "reason": sample["score_reason"],
        "tokens": sample["new_tokens"],
        "finish": sample["finish_reason"],
    }


def _header(run: RunFolder, dense: RunFolder) -> dict:
    cfg = run.cfg

    def value(metrics: dict, path: tuple[str, ...]) -> float | None:
        for key in path:
            metrics = (metrics or {}).get(key)
        return metrics

    return {
        "method": run.method,
        "run": run.key,
        "dense": dense.key,
        "complete": run.complete,
        "settings": {
            "benchmark": cfg.benchmark.name,
            "model": cfg.model.name,
            "batch size": cfg.batch_size,
            "target ρ": run.metrics["target_sparsity"],  # a matched-cost run's: the chosen ρ
            "seed": cfg.seed,
            "problems": len({s["index"] for s in run.samples}),
            "max new tokens": cfg.generation.max_new_tokens,
        },
        "config": {
            k: OmegaConf.to_container(cfg[k], resolve=True)
            for k in ("method", "generation", "quality")
            if k in cfg
        },
        "speedup": (
            speedup_line(run.metrics["speedup"], run.metrics.get("time_to_answer")).strip()
            if run.metrics.get("speedup")
            else None
        ),
        "metrics": [
            {
                "label": label,
                "fmt": fmt,
                "pruned": value(run.metrics, p),
                "dense": value(dense.metrics, p),
            }
            for label, p, fmt in METRICS
        ],
    }


def _trace_scale(rows: list[dict]) -> dict:
    """Per trace kind, the value drawn at full colour: the 95th percentile over all tokens, so a
    few extreme tokens do not wash out the rest."""
    scale = {}
    for kind in ("kl", "nll"):
        values = sorted(v for r in rows if "trace" in r for v in r["trace"][kind])
        if values:
            scale[kind] = max(values[int(0.95 * (len(values) - 1))], 1e-3)
    return scale


def render(data: dict) -> str:
    """The template with `data` embedded; `<` escaped so no text can close the script tag."""
    payload = json.dumps(data, ensure_ascii=False, separators=(",", ":")).replace("<", "\\u003c")
    return TEMPLATE.read_text(encoding="utf-8").replace(DATA_MARK, payload)


def default_output(run: RunFolder) -> Path:
    """`<results>/views/<run key>.html`, beside (never inside) `<results>/runs/`."""
    runs_root = run.dir.resolve().parents[3]
    return runs_root.parent / "views" / f"{run.key}.html"


def write_view(
    run_dir: str | Path, dense_dir: str | Path | None = None, out: str | Path | None = None
) -> Path:
    """Write the page for `run_dir` against `dense_dir` (default: found by `find_dense_run`)."""
    run = RunFolder.load(run_dir)
    dense = RunFolder.load(dense_dir or find_dense_run(run))
    log.info("comparing %s with dense %s", run.key, dense.key)
    path = Path(out) if out else default_output(run)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(render(page_data(run, dense, run_tokenizer(run.cfg))), encoding="utf-8")
    return path

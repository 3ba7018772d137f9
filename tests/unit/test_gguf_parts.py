"""A GGUF file split across wheels: joined in order, checked, and never cached half-made.

The parts are fake installed distributions (a dist-info folder with a RECORD, on sys.path), so
the tests go through `importlib.metadata` exactly as the real wheels do.
"""

from __future__ import annotations

import base64
import hashlib
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from bwprune.errors import UserError
from bwprune.models import loading
from bwprune.models.gguf_parts import GGUFParts, join

SLICES = [b"GGUF" + bytes(range(60)), bytes(range(100, 164)), b"tail" * 5]
VERSION = "0.9.0"


def _record_hash(data: bytes) -> str:
    return base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def install(site: Path, n: int, data: bytes, version: str = VERSION, recorded: bytes | None = None,
            record: bool = True) -> None:  # fmt: skip
    """A fake `fake-model-part{n}` distribution holding `data` as its slice; its RECORD hashes
    `recorded` (default: `data`, as pip writes it), or no hash at all (`record=False`)."""
    package = f"fake_model_part{n}"
    slice_path = site / package / "data" / f"part{n:02d}.bin"
    slice_path.parent.mkdir(parents=True)
    slice_path.write_bytes(data)
    info = site / f"{package}-{version}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(
        f"Metadata-Version: 2.1\nName: fake-model-part{n}\nVersion: {version}\n"
    )
    rows = [f"{package}-{version}.dist-info/METADATA,,", f"{package}-{version}.dist-info/RECORD,,"]
    digest = f"sha256={_record_hash(data if recorded is None else recorded)}" if record else ""
    rows.append(f"{package}/data/part{n:02d}.bin,{digest},{len(data)}")
    (info / "RECORD").write_text("\n".join(rows) + "\n")


def parts_for(slices: list[bytes] = SLICES) -> GGUFParts:
    whole = b"".join(slices)
    return GGUFParts(package="fake-model-part{n}", version=VERSION, count=len(slices),
                     slice="fake_model_part{n}/data/part{n:02d}.bin", size=len(whole),
                     sha256=hashlib.sha256(whole).hexdigest())  # fmt: skip


@pytest.fixture
def site(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    folder = tmp_path / "site"
    folder.mkdir()
    monkeypatch.syspath_prepend(str(folder))
    return folder


def assert_nothing_left(folder: Path) -> None:
    assert not folder.exists() or not any(folder.iterdir()), list(folder.iterdir())


def test_join_concatenates_the_slices_in_order(site: Path, tmp_path: Path) -> None:
    for n, data in enumerate(SLICES, start=1):
        install(site, n, data)
    seen = []
    dest = join(parts_for(), tmp_path / "out" / "model.gguf", progress=seen.append)
    assert dest.read_bytes() == b"".join(SLICES)
    assert sum(seen) == len(b"".join(SLICES))
    assert [p.name for p in dest.parent.iterdir()] == ["model.gguf"]  # no partial file left


def refused(site: Path, tmp_path: Path, match: str, **middle) -> None:
    """Parts 1 and 3 installed as pip would; part 2 as `middle` says (`missing=True`: not at
    all): the join fails with a line matching `match` and leaves nothing behind."""
    install(site, 1, SLICES[0])
    if not middle.pop("missing", False):
        install(site, 2, middle.pop("data", SLICES[1]), **middle)
    install(site, 3, SLICES[2])
    with pytest.raises(UserError, match=match):
        join(parts_for(), tmp_path / "out" / "model.gguf")
    assert_nothing_left(tmp_path / "out")


FLIPPED = bytes([SLICES[1][0] ^ 1]) + SLICES[1][1:]


def test_a_missing_part_names_it_and_the_install_command(site: Path, tmp_path: Path) -> None:
    refused(
        site, tmp_path, r"fake-model-part2==0\.9\.0 is not installed.*make models", missing=True
    )


def test_a_part_at_another_version_is_refused(site: Path, tmp_path: Path) -> None:
    refused(site, tmp_path, r"part2 is installed at version 0\.8\.0.*pins 0\.9\.0", version="0.8.0")


def test_a_flipped_byte_in_an_installed_slice_names_its_package(site: Path, tmp_path: Path) -> None:
    # the wheel recorded the good bytes
    refused(site, tmp_path, r"fake-model-part2==0\.9\.0.*--force-reinstall", data=FLIPPED,
            recorded=SLICES[1])  # fmt: skip


def test_a_flipped_byte_without_a_recorded_hash_fails_the_hash(site: Path, tmp_path: Path) -> None:
    refused(site, tmp_path, r"sha256 [0-9a-f]{64}, the config pins", data=FLIPPED, record=False)


def test_slices_in_the_wrong_order_fail_the_sha256(site: Path, tmp_path: Path) -> None:
    for n, data in enumerate([SLICES[0], SLICES[2], SLICES[1]], start=1):  # each intact
        install(site, n, data)
    with pytest.raises(UserError, match=r"in another order"):
        join(parts_for(), tmp_path / "out" / "model.gguf")
    assert_nothing_left(tmp_path / "out")


def test_a_short_join_fails_the_size(site: Path, tmp_path: Path) -> None:
    for n, data in enumerate(SLICES, start=1):
        install(site, n, data)
    longer = parts_for([*SLICES, b"more"])
    shorter = GGUFParts(**{**longer.__dict__, "count": 3})
    with pytest.raises(UserError, match=rf"are {len(b''.join(SLICES))} bytes, the config pins"):
        join(shorter, tmp_path / "out" / "model.gguf")


def model_config(parts: GGUFParts) -> OmegaConf:
    return OmegaConf.create({"gguf_package": None, "gguf_file": "model.gguf",
                             "gguf_parts": dict(parts.__dict__)})  # fmt: skip


def test_nothing_is_cached_when_the_conversion_fails(
    site: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for n, data in enumerate(SLICES, start=1):
        install(site, n, data)

    def broken(src: Path, dest: Path) -> None:
        assert src.read_bytes() == b"".join(SLICES)  # the converter reads the checked join
        raise RuntimeError("conversion failed")

    monkeypatch.setattr(loading, "_convert", broken)
    cache = tmp_path / "cache"
    with pytest.raises(RuntimeError, match="conversion failed"):
        loading.converted_gguf(model_config(parts_for()), cache)
    assert_nothing_left(cache / "models" / "fake-model-part-0.9.0")


def test_a_converted_model_is_made_once(
    site: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for n, data in enumerate(SLICES, start=1):
        install(site, n, data)
    calls = []

    def convert(src: Path, dest: Path) -> None:
        calls.append(src)
        dest.mkdir(parents=True)
        (dest / "config.json").write_text("{}")

    monkeypatch.setattr(loading, "_convert", convert)
    cache = tmp_path / "cache"
    first = loading.converted_gguf(model_config(parts_for()), cache)
    assert loading.converted_gguf(model_config(parts_for()), cache) == first
    assert len(calls) == 1
    assert [p.name for p in first.parent.iterdir()] == ["model"]  # the joined file is gone

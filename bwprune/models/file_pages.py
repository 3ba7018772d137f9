"""A loaded checkpoint's pages leave this process as soon as their tensor has been copied.

safetensors maps a checkpoint file whole and hands out tensors that are views of that mapping.
A loader that copies each tensor into a parameter of its own (vLLM's does) holds the file's pages
*and* the copies until the file is closed at the end of loading: vLLM's CPU load of the 1.5B
Qwen peaked at 14.9 GB resident for 6.6 GiB of fp32 weights, twice what the run then holds.
The pages are clean copies of the file (the page cache keeps them for the next reader), so once
a tensor has been copied they can leave the process's resident set (`madvise(MADV_DONTNEED)`):
a later read faults them back from the file. Only pages of a private file mapping are dropped,
never anonymous memory, where the same call would zero live data.
"""

from __future__ import annotations

import ctypes
import mmap
import sys
from collections.abc import Iterable, Iterator
from functools import cache
from typing import TypeVar

import torch

MADV_DONTNEED = 4
Item = TypeVar("Item")


def _file_mappings() -> list[tuple[int, int]]:
    """This process's private mappings of regular files, as (start, end) address ranges."""
    ranges = []
    with open("/proc/self/maps") as maps:
        for line in maps:
            fields = line.split(maxsplit=5)
            # address perms offset dev inode path; inode 0 is anonymous memory ([heap], ...)
            if len(fields) == 6 and fields[4] != "0" and fields[1].endswith("p"):
                start, end = (int(a, 16) for a in fields[0].split("-"))
                ranges.append((start, end))
    return ranges


@cache
def _madvise():
    libc = ctypes.CDLL(None, use_errno=True)
    libc.madvise.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)
    return libc.madvise


class FilePages:
    """Drops tensors' pages that lie in a file mapping; the mappings are re-read when a tensor
    lies in none known (a loader maps one file after another)."""

    def __init__(self) -> None:
        self.enabled = sys.platform.startswith("linux")
        self._ranges: list[tuple[int, int]] = []

    def mapped(self, tensor: torch.Tensor) -> bool:
        """Whether `tensor`'s bytes lie in a private file mapping."""
        return self._where(tensor) is not None

    def release(self, tensor: torch.Tensor) -> bool:
        """Drop the pages of `tensor`'s bytes (rounded out to whole pages, within its mapping)
        from the resident set; False, touching nothing, unless they lie in a file mapping."""
        where = self._where(tensor)
        if where is None:
            return False
        (start, end), (low, high) = where
        page = mmap.PAGESIZE
        low, high = max(start // page * page, low), min(-(-end // page) * page, high)
        return _madvise()(low, high - low, MADV_DONTNEED) == 0

    def _where(self, tensor: torch.Tensor) -> tuple[tuple[int, int], tuple[int, int]] | None:
        """The address span of `tensor`'s bytes (contiguous, on CPU) and the file mapping it lies
        in, if any."""
        if not self.enabled or tensor.device.type != "cpu" or not tensor.is_contiguous():
            return None
        start = tensor.data_ptr()
        end = start + tensor.numel() * tensor.element_size()
        for refresh in (False, True):
            if refresh:
                self._ranges = _file_mappings()
            for low, high in self._ranges:
                if low <= start and end <= high:
                    return (start, end), (low, high)
        return None


def released(weights: Iterable[tuple[str, Item]]) -> Iterator[tuple[str, Item]]:
    """`weights` (name, tensor) as a loader consumes them, each tensor's file pages dropped when
    the loader asks for the next: by then it has copied it. (A loader that keeps the tensor as
    its parameter loses nothing, the pages fault back from the file; one that wrote into it
    before asking for the next would lose that write: vLLM's Llama and Qwen2 loaders copy.)"""
    pages = FilePages()
    for name, tensor in weights:
        yield name, tensor
        if isinstance(tensor, torch.Tensor):
            pages.release(tensor)

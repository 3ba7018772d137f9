"""Loaded by Python at start-up when this folder is on PYTHONPATH: vLLM's CPU platform then loads
its AVX2 kernel library (`_C_AVX2`) on a CPU with AVX-512, the library an AVX2-only x86 CPU gets.

vLLM chooses that library from `torch.cpu._is_avx512_supported()` when it imports its kernels
(`vllm.platforms.cpu.CpuPlatform.import_kernels`); only that caller is told "no", so torch's own
kernels and torch.compile's code keep the instruction set the CPU has. Every process started with
this PYTHONPATH (vLLM's workers included) gets the same library. Used by
tests/system/test_tensor_parallel.py and by hand (docs/vllm.md, "Equal at every size").
"""

import sys

import torch

_has_avx512 = torch.cpu._is_avx512_supported


def _for_vllm_kernels() -> bool:
    if sys._getframe(1).f_code.co_filename.endswith("vllm/platforms/cpu.py"):
        return False
    return _has_avx512()


torch.cpu._is_avx512_supported = _for_vllm_kernels

"""This CPU's peak arithmetic rates for the instructions radixflow's CPU kernels are built on,
measured: each thread runs 12 independent chains of one instruction on registers (no memory),
all threads at once, each timed by its own CPU time (so other processes sharing the cores do
not count), best of 15 short runs.

    python -m bench.cpu_peak            # prints GOPS per instruction (2 ops per multiply-add)

- vpdpbusd zmm (avx512): 64 int8 x uint8 multiply-adds. The Q4_1 / Q8_0 products at avx512
  spend two per weight byte (x as 16-bit integers: a high and a low byte), so their ceiling is
  half this rate.
- vdpbf16ps zmm (avx512): 32 bf16 multiply-adds (the bf16 products, attention).
- vpmaddubsw ymm (avx2): 32 int8 multiply-adds, pairs summed (the Q4_1 / Q8_0 products at
  avx2, which add vpaddw / vpmaddwd on top).
- vfmadd231ps ymm (avx2): 8 fp32 multiply-adds (the bf16 products and attention at avx2).

A core shared with another process's thread (SMT) would still lower them.
"""

from __future__ import annotations

import ctypes
import functools
import os
import subprocess
import tempfile
from pathlib import Path

import torch

SOURCE = r"""
#include <immintrin.h>
#include <omp.h>
#include <stdint.h>
#include <time.h>

#define CHAINS 12
static volatile int seed = 1;

#ifdef __AVX512BF16__
static double vnni512(int64_t iters) {
    __m512i acc[CHAINS], a = _mm512_set1_epi32(seed), b = _mm512_set1_epi32(seed + 1);
    for (int j = 0; j < CHAINS; j++) acc[j] = _mm512_set1_epi32(j);
    for (int64_t i = 0; i < iters; i++) {
#pragma GCC unroll 12
        for (int j = 0; j < CHAINS; j++) acc[j] = _mm512_dpbusd_epi32(acc[j], a, b);
        __asm__ volatile("" : "+v"(a), "+v"(b));
    }
    int32_t s = 0;
    for (int j = 0; j < CHAINS; j++) s += _mm512_reduce_add_epi32(acc[j]);
    return (double)s;
}

static double bf16_512(int64_t iters) {
    __m512 acc[CHAINS];
    __m512bh a = (__m512bh)_mm512_set1_epi32(seed), b = (__m512bh)_mm512_set1_epi32(seed + 1);
    for (int j = 0; j < CHAINS; j++) acc[j] = _mm512_set1_ps((float)j);
    for (int64_t i = 0; i < iters; i++) {
#pragma GCC unroll 12
        for (int j = 0; j < CHAINS; j++) acc[j] = _mm512_dpbf16_ps(acc[j], a, b);
        __asm__ volatile("" : "+v"(a), "+v"(b));
    }
    float s = 0;
    for (int j = 0; j < CHAINS; j++) s += _mm512_reduce_add_ps(acc[j]);
    return (double)s;
}
#endif

static double maddubs256(int64_t iters) {
    __m256i acc[CHAINS], b = _mm256_set1_epi8((char)(seed + 1));
    for (int j = 0; j < CHAINS; j++) acc[j] = _mm256_set1_epi8((char)(seed + j));
    for (int64_t i = 0; i < iters; i++) {
#pragma GCC unroll 12
        for (int j = 0; j < CHAINS; j++) acc[j] = _mm256_maddubs_epi16(acc[j], b); /* chained */
        __asm__ volatile("" : "+x"(b));
    }
    int s = 0;
    for (int j = 0; j < CHAINS; j++) s += _mm256_extract_epi16(acc[j], 0);
    return (double)s;
}

static double fma256(int64_t iters) {
    __m256 acc[CHAINS], a = _mm256_set1_ps((float)seed * 1e-9f), b = _mm256_set1_ps(1.0f);
    for (int j = 0; j < CHAINS; j++) acc[j] = _mm256_set1_ps((float)j);
    for (int64_t i = 0; i < iters; i++) {
#pragma GCC unroll 12
        for (int j = 0; j < CHAINS; j++) acc[j] = _mm256_fmadd_ps(acc[j], b, a);
        __asm__ volatile("" : "+x"(a), "+x"(b));
    }
    float s = 0;
    for (int j = 0; j < CHAINS; j++) s += _mm256_cvtss_f32(acc[j]);
    return (double)s;
}

/* Instructions per second of `kind`, summed over `threads` threads running `iters` x CHAINS
 * each at once: each thread's rate over its own CPU time (CLOCK_THREAD_CPUTIME_ID), so time
 * another process held the core does not count. */
double rf_peak_rate(int kind, int64_t iters, int threads) {
    double rate = 0;
#pragma omp parallel num_threads(threads) reduction(+ : rate)
    {
        struct timespec a, b;
        double sink = 0;
        clock_gettime(CLOCK_THREAD_CPUTIME_ID, &a);
        switch (kind) {
#ifdef __AVX512BF16__
        case 0: sink = vnni512(iters); break;
        case 1: sink = bf16_512(iters); break;
#endif
        case 2: sink = maddubs256(iters); break;
        default: sink = fma256(iters); break;
        }
        clock_gettime(CLOCK_THREAD_CPUTIME_ID, &b);
        const double t = (b.tv_sec - a.tv_sec) + 1e-9 * (b.tv_nsec - a.tv_nsec);
        rate += sink == 12345.678 ? 0 : (double)iters * CHAINS / t;
    }
    return rate;
}
"""

# name -> (kind, multiply-adds per instruction, level)
INSTRUCTIONS = {
    "vpdpbusd zmm": (0, 64, "avx512"),
    "vdpbf16ps zmm": (1, 32, "avx512"),
    "vpmaddubsw ymm": (2, 32, "avx2"),
    "vfmadd231ps ymm": (3, 8, "avx2"),
}


@functools.cache
def _library(level: str) -> ctypes.CDLL:
    from radixflow.kernels.cpu.features import LEVEL_FLAGS

    folder = Path(tempfile.mkdtemp(prefix="cpu-peak-"))
    (folder / "peak.c").write_text(SOURCE)
    out = folder / f"peak-{level}.so"
    subprocess.run(["cc", "-O3", "-fopenmp", "-shared", "-fPIC", *LEVEL_FLAGS[level],
                    str(folder / "peak.c"), "-o", str(out)], check=True)
    lib = ctypes.CDLL(str(out))
    lib.rf_peak_rate.argtypes = [ctypes.c_int, ctypes.c_int64, ctypes.c_int]
    lib.rf_peak_rate.restype = ctypes.c_double
    return lib


def peak_gops(level: str, threads: int | None = None, runs: int = 15) -> dict[str, float]:
    """GOPS (2 per multiply-add) of each instruction the level's build has, all `threads`
    (default: torch's) at once, best of `runs`. The avx512 build measures every instruction."""
    threads = threads or torch.get_num_threads()
    lib = _library(level)
    out = {}
    for name, (kind, macs, needs) in INSTRUCTIONS.items():
        if level == "avx2" and needs == "avx512":
            continue
        iters = 300_000
        best = max(lib.rf_peak_rate(kind, iters, threads) for _ in range(runs))
        out[name] = 2 * macs * best / 1e9
    return out


def main() -> None:
    from radixflow.kernels.cpu.features import cpu_features

    level = cpu_features().kernel_level or "avx2"
    print(f"{cpu_features().describe()}; {torch.get_num_threads()} threads")
    for name, gops in peak_gops(level).items():
        print(f"{name}: {gops:.0f} GOPS")


if __name__ == "__main__":
    os.environ.setdefault("OMP_WAIT_POLICY", "active")
    main()

"""What this CPU can run, in one place: its instruction-set level and the features the rest of
radixflow asks about (bf16 dtype, oneDNN's bf16 packing, which C kernels to build).

Levels, best first (each a build of kernels/cpu's C sources, see LEVEL_FLAGS):
- "avx512": AVX-512 F/BW/VL with BF16 and VNNI (Intel Cooper Lake and later, AMD Zen 4/5).
- "avx2": AVX2 + FMA + F16C (most laptops and desktops, AMD Zen 2/3, many cloud VMs).
- "generic": none of these: torch's own kernels only.
A machine runs every level up to its best. `set_level` (the CLI's `--cpu-isa`, or the
RADIXFLOW_CPU_ISA environment variable) forces a lower one: the features seen through
`cpu_features()` are then those of a CPU of that level, so an AVX-512 machine runs, and tests,
exactly what an AVX2 machine would. ARM's NEON/SVE are detected and reported; no C kernels
exist for them yet (docs/cpu-arm.md).
"""

from __future__ import annotations

import functools
import os
import platform
from dataclasses import dataclass, field
from pathlib import Path

LEVELS = ("avx512", "avx2", "generic")  # best first
CHOICES = ("auto", *LEVELS)

# /proc/cpuinfo flags each level needs
REQUIRED = {
    "avx512": ("avx512f", "avx512bw", "avx512vl", "avx512_bf16", "avx512_vnni", "fma", "f16c"),
    "avx2": ("avx2", "fma", "f16c"),
    "generic": (),
}

# compiler flags of each level's build of the C kernels
LEVEL_FLAGS = {
    "avx512": ("-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512bf16", "-mavx512vnni",
               "-mavx2", "-mfma", "-mf16c"),
    "avx2": ("-mavx2", "-mfma", "-mf16c"),
}

# flags a CPU forced down to a level no longer shows (all of a better level's extensions)
_ABOVE = {
    "avx512": (),
    "avx2": ("avx512", "amx", "avx_vnni", "avx_ifma", "avx_ne_convert", "avx_vnni_int8", "avx10"),
    "generic": ("avx512", "amx", "avx_vnni", "avx_ifma", "avx_ne_convert", "avx_vnni_int8",
                "avx10", "avx2", "avx", "fma", "f16c"),
}


class CpuLevelError(ValueError):
    """A level this CPU cannot run was asked for."""


@dataclass(frozen=True)
class CpuFeatures:
    arch: str  # platform.machine(): x86_64, aarch64, ...
    model: str
    flags: frozenset[str] = field(repr=False)
    detected_level: str  # the best level of the CPU itself
    level: str  # the level in force (detected_level unless forced lower)

    def has(self, *names: str) -> bool:
        return all(n in self.flags for n in names)

    @property
    def bf16(self) -> bool:
        """Native bf16 arithmetic (AVX512-BF16 or AMX): bf16 is then the fast CPU dtype."""
        return self.has("avx512_bf16") or self.has("amx_bf16")

    @property
    def onednn_bf16(self) -> bool:
        """oneDNN packs bf16 linear weights only with AVX512 BW/VL/DQ or AVX-NE-CONVERT."""
        return self.has("avx512bw", "avx512vl", "avx512dq") or self.has("avx_ne_convert")

    @property
    def amx(self) -> bool:
        return self.has("amx_bf16", "amx_tile")

    @property
    def neon(self) -> bool:
        return self.arch in ("aarch64", "arm64") and (self.has("asimd") or self.has("neon")
                                                     or self.arch == "arm64")

    @property
    def sve(self) -> bool:
        return self.has("sve")

    @property
    def kernel_level(self) -> str | None:
        """The C kernels' build to load, or None (torch's kernels only)."""
        return None if self.level == "generic" else self.level

    def describe(self) -> str:
        """One line for the start-up log, e.g. 'x86_64 AMD EPYC: level avx2 (forced; the CPU
        has avx512), AMX no'."""
        extras = [name for name, on in (("AVX512-BF16", self.has("avx512_bf16")),
                                        ("VNNI", self.has("avx512_vnni") or self.has("avx_vnni")),
                                        ("AMX", self.amx), ("NEON", self.neon), ("SVE", self.sve))
                  if on]
        forced = f" (forced; the CPU's best is {self.detected_level})" \
            if self.level != self.detected_level else ""
        return (f"{self.arch} {self.model or 'CPU'}: level {self.level}{forced}"
                + (f", {'/'.join(extras)}" if extras else ""))

    def as_dict(self) -> dict:
        return {"arch": self.arch, "model": self.model, "level": self.level,
                "detected_level": self.detected_level, "bf16": self.bf16, "amx": self.amx,
                "neon": self.neon, "sve": self.sve}


def _read_cpuinfo() -> tuple[frozenset[str], str]:
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return frozenset(), platform.processor()
    flags: set[str] = set()
    model = ""
    for line in text.splitlines():
        key, _, value = line.partition(":")
        key = key.strip()
        if key in ("flags", "Features") and not flags:  # x86 / ARM
            flags = set(value.split())
        elif key in ("model name", "CPU part") and not model:
            model = value.strip()
    return frozenset(flags), model


def best_level(flags: frozenset[str]) -> str:
    return next(level for level in LEVELS if all(f in flags for f in REQUIRED[level]))


def missing_flags(flags: frozenset[str], level: str) -> list[str]:
    return [f for f in REQUIRED[level] if f not in flags]


@functools.cache
def detect() -> CpuFeatures:
    """The CPU itself, unforced."""
    flags, model = _read_cpuinfo()
    level = best_level(flags) if platform.machine() in ("x86_64", "AMD64") else "generic"
    return CpuFeatures(platform.machine(), model, flags, level, level)


def _at_level(cpu: CpuFeatures, level: str) -> CpuFeatures:
    if level == cpu.level:
        return cpu
    order = LEVELS.index
    if order(level) < order(cpu.detected_level):
        missing = missing_flags(cpu.flags, level)
        raise CpuLevelError(
            f"--cpu-isa {level}: this CPU ({cpu.model or cpu.arch}) lacks "
            f"{', '.join(missing) or 'what it needs'}; its best level is {cpu.detected_level} "
            f"(choose from {', '.join(LEVELS[order(cpu.detected_level):])} or auto)")
    hidden = _ABOVE[level]
    flags = frozenset(f for f in cpu.flags if not f.startswith(hidden))
    return CpuFeatures(cpu.arch, cpu.model, flags, cpu.detected_level, level)


_forced: str | None = None


def check_level(choice: str) -> CpuFeatures:
    """The features at `choice` ("auto" or a level); CpuLevelError names what the CPU lacks."""
    if choice not in CHOICES:
        raise CpuLevelError(f"--cpu-isa must be one of {', '.join(CHOICES)}, got {choice!r}")
    return _at_level(detect(), detect().detected_level if choice == "auto" else choice)


def set_level(choice: str) -> CpuFeatures:
    """Force a level ("auto" lifts it) for this process; raises CpuLevelError for one the CPU
    lacks. Returns the features now in force."""
    global _forced
    check_level(choice)
    _forced = None if choice == "auto" else choice
    return cpu_features()


def cpu_features() -> CpuFeatures:
    """The CPU as radixflow uses it: detected, seen at the level in force."""
    choice = _forced or os.environ.get("RADIXFLOW_CPU_ISA", "auto") or "auto"
    if choice == "auto":
        return detect()
    if choice not in CHOICES:
        raise CpuLevelError(f"RADIXFLOW_CPU_ISA must be one of {', '.join(CHOICES)}, "
                            f"got {choice!r}")
    return _at_level(detect(), choice)


def supported_levels() -> list[str]:
    """Every level this machine can run, best first (the tests run the kernels at each)."""
    return list(LEVELS[LEVELS.index(detect().detected_level):])

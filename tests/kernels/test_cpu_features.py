"""kernels/cpu/features.py: the CPU's level, forcing lower levels, and refusing higher ones."""

from __future__ import annotations

import pytest
import torch

from radixflow.kernels import cpu
from radixflow.kernels.cpu import features
from radixflow.runtime.server_args import ServerArgs

AVX2_LAPTOP = frozenset({"sse4_2", "avx", "avx2", "fma", "f16c", "bmi2"})
AVX512_SERVER = AVX2_LAPTOP | {"avx512f", "avx512bw", "avx512vl", "avx512dq", "avx512_bf16",
                               "avx512_vnni", "amx_bf16", "amx_tile"}


@pytest.fixture
def fake_cpu(monkeypatch):
    """fake_cpu(flags): detect() answers as a CPU with these flags would."""

    def install(flags: frozenset[str]) -> features.CpuFeatures:
        level = features.best_level(flags)
        cpu_ = features.CpuFeatures("x86_64", "Test CPU", flags, level, level)
        monkeypatch.setattr(features, "detect", lambda: cpu_)
        return cpu_

    yield install
    features.set_level("auto")


@pytest.mark.parametrize(("flags", "level"), [
    (AVX512_SERVER, "avx512"),
    (AVX512_SERVER - {"avx512_bf16"}, "avx2"),  # AVX-512 without BF16 runs the AVX2 build
    (AVX2_LAPTOP, "avx2"),
    (AVX2_LAPTOP - {"fma"}, "generic"),
    (frozenset({"sse2"}), "generic"),
])
def test_best_level(flags, level):
    assert features.best_level(flags) == level


def test_forcing_a_lower_level_hides_the_better_features(fake_cpu, monkeypatch):
    monkeypatch.delenv("RADIXFLOW_CPU_ISA", raising=False)
    fake_cpu(AVX512_SERVER)
    assert features.cpu_features().bf16 and features.cpu_features().amx
    at_avx2 = features.set_level("avx2")
    assert at_avx2.level == "avx2" and at_avx2.detected_level == "avx512"
    assert not at_avx2.bf16 and not at_avx2.amx and not at_avx2.onednn_bf16
    assert at_avx2.has("avx2", "fma", "f16c") and at_avx2.kernel_level == "avx2"
    assert "forced" in at_avx2.describe()
    generic = features.set_level("generic")
    assert not generic.has("avx2") and generic.kernel_level is None
    assert features.set_level("auto").level == "avx512"


def test_a_level_the_cpu_lacks_is_refused_with_the_missing_flags(fake_cpu, monkeypatch):
    monkeypatch.delenv("RADIXFLOW_CPU_ISA", raising=False)
    fake_cpu(AVX2_LAPTOP)
    with pytest.raises(features.CpuLevelError,
                       match=r"lacks avx512f, avx512bw, avx512vl, avx512_bf16, avx512_vnni.*"
                             r"best level is avx2"):
        features.set_level("avx512")
    assert features.cpu_features().level == "avx2"  # nothing was changed
    # the server refuses it at start-up, before any process runs a kernel
    with pytest.raises(ValueError, match="lacks avx512f"):
        ServerArgs(cpu_isa="avx512")
    with pytest.raises(ValueError, match="--cpu-isa must be one of"):
        ServerArgs(cpu_isa="sse9")


def test_environment_variable_forces_a_level(fake_cpu, monkeypatch):
    fake_cpu(AVX512_SERVER)
    monkeypatch.setenv("RADIXFLOW_CPU_ISA", "avx2")
    assert features.cpu_features().level == "avx2"
    monkeypatch.setenv("RADIXFLOW_CPU_ISA", "avx9000")
    with pytest.raises(features.CpuLevelError, match="RADIXFLOW_CPU_ISA must be one of"):
        features.cpu_features()
    monkeypatch.delenv("RADIXFLOW_CPU_ISA")


def test_arm_is_reported_without_kernels(monkeypatch):
    monkeypatch.setattr(features.platform, "machine", lambda: "aarch64")
    monkeypatch.setattr(features, "_read_cpuinfo",
                        lambda: (frozenset({"fp", "asimd", "sve", "bf16"}), "0xd40"))
    features.detect.cache_clear()
    try:
        arm = features.detect()
        assert arm.level == "generic" and arm.neon and arm.sve and arm.kernel_level is None
        assert "NEON/SVE" in arm.describe()
    finally:
        features.detect.cache_clear()


def test_this_machine_supports_its_own_level_and_every_lower_one():
    levels = features.supported_levels()
    assert levels[-1] == "generic" and levels[0] == features.detect().detected_level


def test_each_level_builds_only_its_own_instructions(cpu_level, monkeypatch):
    """Every kernel level this machine has compiles and loads; weights tiled at a level keep
    that level's build whatever is forced later."""
    lib = cpu._library()
    assert lib is not None and cpu.active_level() == cpu_level
    gen = torch.Generator().manual_seed(0)
    tiled = cpu.tile_q8_0(cpu.quantize_q8_0(torch.randn(16, 64, generator=gen)))
    assert tiled.level == cpu_level
    x = torch.randn(1, 64, generator=gen)
    expected = cpu.reference(x, tiled)
    features.set_level("generic")
    assert not cpu.available()
    monkeypatch.setattr(cpu, "reference", lambda *a: pytest.fail("fell back to the reference"))
    scale = float(x.abs().max() * cpu.unpack(tiled).abs().sum(1).max())
    torch.testing.assert_close(cpu.gemm(x, tiled), expected, atol=scale / 100, rtol=0)


def test_the_c_library_and_its_bindings_agree_on_the_abi(cpu_level):
    from radixflow.kernels.cpu import abi

    lib = cpu._library()
    lim = abi.check(lib, cpu.TILE, cpu.GROUP)
    assert lim == cpu.limits() and lim.max_batch >= 1 and lim.max_rows >= 1
    with pytest.raises(RuntimeError, match="disagree.*tile 16 vs 32"):
        abi.check(lib, 32, cpu.GROUP)


def test_a_structure_changed_on_one_side_only_is_refused(cpu_level, monkeypatch):
    import ctypes

    from radixflow.kernels.cpu import abi

    class Longer(ctypes.Structure):  # as if a field were added on the Python side only
        _fields_ = [*abi._Weight._fields_, ("extra", ctypes.c_int64)]

    monkeypatch.setattr(abi, "_Weight", Longer)
    with pytest.raises(RuntimeError, match="sizeof_weight 40 vs 48"):
        abi.check(cpu._library(), cpu.TILE, cpu.GROUP)


def test_the_avx2_build_holds_no_avx512_instruction():
    """What runs on an AVX2 machine: no zmm register, no opmask, no EVEX-only instruction (an
    AVX-512 machine builds and disassembles it too)."""
    import shutil
    import subprocess

    if "avx2" not in features.supported_levels():
        pytest.skip("needs a CPU with avx2, fma, f16c")
    objdump = shutil.which("objdump")
    if objdump is None:
        pytest.skip("needs objdump (binutils) to disassemble the build")
    lib = cpu._library_for("avx2")
    if lib is None:
        pytest.skip("no C compiler")
    text = subprocess.run([objdump, "-d", lib._name], capture_output=True, text=True,
                          check=True).stdout
    assert "vfmadd" in text and "ymm" in text  # it was disassembled, and it is AVX2 code
    for marker in ("zmm", "%k1", "%k2", "{1to", "vpdpbusd", "vdpbf16ps"):
        assert marker not in text, f"AVX-512 code in the avx2 build: {marker}"

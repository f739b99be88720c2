"""Compile every Triton kernel for an NVIDIA target without a GPU; report registers and spills.

    python bench/kernel_registers.py [--arch 90]

Checks that the kernels lower all the way to a cubin (ptxas included) and shows register
pressure per tile configuration, so tiles can be tuned on a machine with no GPU. The
configurations below mirror the launchers' (kernels/triton/*.py); keep them in step.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile

os.environ.pop("TRITON_INTERPRET", None)  # compile for real, not for the interpreter

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource, CompilationError

from radixflow.kernels.sampling import GREEDY_EPS
from radixflow.kernels.triton import bitmask, decode_attention, extend_attention, sampling


def compile_and_report(fn, types: dict[str, str], consts: dict, target: GPUTarget, **opts):
    signature = {n: "constexpr" if n in consts else types.get(n, "i32") for n in fn.arg_names}
    label = f"{fn.__name__} {consts} {opts}"
    try:
        kernel = triton.compile(ASTSource(fn, signature, constexprs=consts), target=target,
                                options=opts)
    except (CompilationError, RuntimeError, ValueError) as e:  # report, then go on
        print(f"FAIL {label}: {e}")
        return False
    ptxas = os.path.join(os.path.dirname(triton.__file__), "backends/nvidia/bin/ptxas-blackwell")
    arch = f"sm_{target.arch}a" if target.arch >= 90 else f"sm_{target.arch}"
    with tempfile.TemporaryDirectory() as tmp:
        ptx = os.path.join(tmp, "k.ptx")
        with open(ptx, "w") as f:
            f.write(kernel.asm["ptx"])
        cmd = [ptxas, "-v", f"--gpu-name={arch}", ptx, "-o", os.path.join(tmp, "k.o")]
        out = subprocess.run(cmd, capture_output=True, text=True, check=False)
    text = out.stdout + out.stderr
    regs = re.search(r"Used (\d+) registers", text)
    spill = re.search(r"(\d+) bytes spill stores", text)
    print(f"ok   {label}: shared {kernel.metadata.shared} B, registers "
          f"{regs.group(1) if regs else '?'}, spill stores {spill.group(1) if spill else '?'} B")
    return True


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--arch", type=int, default=90, help="compute capability, e.g. 80, 90")
    target = GPUTarget("cuda", parser.parse_args().arch, 32)
    ok = True
    for dt in ("bf16", "fp32"):
        precision = "tf32x3" if dt == "fp32" else "tf32"
        for d in (64, 128):
            if dt == "fp32":
                bm, bn, nw, ns = (64, 32, 4, 1) if d <= 64 else (64, 16, 4, 1)
            else:
                bm, bn, nw, ns = (128, 64, 8, 2) if d <= 64 else (128, 32, 8, 2)
            types = dict.fromkeys(("Q", "K", "V", "O", "K_cache", "V_cache"), "*" + dt)
            types.update(Req_to_token="*i32", Req_pool_indices="*i64", Prefix_lens="*i64",
                         Extend_lens="*i64", Extend_starts="*i64", qk_scale="fp32")
            ok &= compile_and_report(
                extend_attention._extend_attention_kernel, types,
                {"GROUP": 8, "HEAD_DIM": d, "BLOCK_D": d, "BLOCK_M": bm, "BLOCK_N": bn,
                 "PRECISION": precision, "UPCAST": False, "INT64": False},
                target, num_warps=nw, num_stages=ns)
            types = dict.fromkeys(("Q", "K_cache", "V_cache"), "*" + dt)
            types.update(Req_to_token="*i32", Req_pool_indices="*i64", Seq_lens="*i64",
                         Mid_o="*fp32", Mid_lse="*fp32", qk_scale="fp32", Shared_lens="*i64",
                         Group_start="*i64", Group_end="*i64")
            for shared in (False, True):
                ok &= compile_and_report(
                    decode_attention._decode_split_kernel, types,
                    {"GROUP": 8, "HEADS_PER_PROGRAM": 8, "HEAD_BLOCKS_PER_KV": 1, "BLOCK_H": 16,
                     "HEAD_DIM": d, "BLOCK_D": d, "BLOCK_N": 64, "PRECISION": precision,
                     "UPCAST": False, "SHARED": shared},
                    target, num_warps=4, num_stages=2)
                ok &= compile_and_report(
                    decode_attention._decode_merge_kernel,
                    {"Mid_o": "*fp32", "Mid_lse": "*fp32", "Seq_lens": "*i64", "O": "*" + dt},
                    {"NUM_SPLITS": 5, "BLOCK_S": 8, "HEAD_DIM": d, "BLOCK_D": d, "BLOCK_N": 64,
                     "FILLED": shared}, target, num_warps=4 if d >= 128 else 2)
            # shared prefixes: 8 requests x 8 query heads of a KV head per program (the
            # launcher's warps: decode_attention.shared_prefix_warps)
            ok &= compile_and_report(
                decode_attention._shared_prefix_kernel, types,
                {"GROUP": 8, "BLOCK_R": 8, "BLOCK_M": 64, "HEAD_DIM": d, "BLOCK_D": d,
                 "BLOCK_N": 64, "PRECISION": precision, "UPCAST": False},
                target, num_warps=decode_attention.shared_prefix_warps(64, d), num_stages=2)
        ok &= compile_and_report(
            bitmask._apply_bitmask_kernel, {"Logits": "*" + dt, "Bitmask": "*i32", "Rows": "*i64"},
            {"HAS_ROWS": True, "BLOCK_W": 32}, target, num_warps=4)
        ok &= compile_and_report(
            sampling._sample_kernel,
            {"Logits": "*" + dt, "Temperatures": "*fp32", "Top_ks": "*i32", "Top_ps": "*fp32",
             "Min_ps": "*fp32", "Uniforms": "*fp32", "Out": "*i64"},
            {"GREEDY_EPS": GREEDY_EPS, "BLOCK": 2048}, target, num_warps=8)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

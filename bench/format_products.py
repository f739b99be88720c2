"""Each tiled weight format's product at one shape: the C kernels' tiled product against
dequantizing the tiles into fp32 rows and torch.mm, at the CPU level in force (where a
prefill's time goes, format by format).

    python -m bench.format_products                        # 8192 x 2048, 256 rows
    RADIXFLOW_CPU_ISA=avx2 python -m bench.format_products --rows 1 64 256
    python -m bench.format_products --smoke                # tiny shapes: checks the script

The weights are random GGUF blocks of each stored type (fp16 scales kept small) repacked into
the tiles as a GGUF loads (kernels/cpu's `repack`); times are medians of --repeats calls, in
ms, on torch's thread count. Prints a markdown table; writes nothing.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import torch

sys.path.append(str(Path(__file__).resolve().parents[1]))  # (run as a file too)

from bench.prefill_attention import median_ms  # noqa: E402
from radixflow.kernels import cpu  # noqa: E402
from radixflow.kernels import gguf_blocks as gb  # noqa: E402

# tiled format -> the GGUF type it is repacked from, and its fp16 fields' byte offsets
SOURCES = {"q4_0": ("Q4_0", [0]), "q4_1": ("Q4_K", [0, 2]), "q5_0": ("Q5_0", [0]),
           "q5_1": ("Q5_1", [0, 2]), "q2_k": ("Q2_K", [80, 82]), "q3_k": ("Q3_K", [108]),
           "q4_k": ("Q4_K", [0, 2]), "q5_k": ("Q5_K", [0, 2]), "q6": ("Q6_K", [208]),
           "q6_k": ("Q6_K", [208]), "q8_0": ("Q8_0", [0]), "iq4_nl": ("IQ4_NL", [0]),
           "iq4_xs": ("IQ4_XS", [0])}


def random_tiles(fmt: str, n: int, k: int, seed: int = 0) -> cpu.TiledWeight:
    """n x k weights of random blocks of fmt's source type, its fp16 scales in [2^-10, 2^-9)."""
    name, halves = SOURCES[fmt]
    t = gb.GGMLType[name]
    rng = np.random.default_rng(seed)
    raw = rng.integers(0, 256, (n, gb.row_bytes(t, k)), dtype=np.uint8)
    block = gb.QUANT_SIZES[t][1]
    blocks = raw.reshape(n, -1, block)
    for at in halves:
        small = (0x1400 | rng.integers(0, 0x400, blocks.shape[:2])).astype(np.uint16)
        blocks[:, :, at:at + 2] = small.view(np.uint8).reshape(*blocks.shape[:2], 2)
    tiled = cpu.repack(torch.from_numpy(raw), int(t), fmt, k)
    if tiled is None:
        raise RuntimeError(f"no C repack of {name} into {fmt} here")
    return tiled


def measure(formats: list[str], n: int, k: int, rows: list[int], repeats: int) -> list[dict]:
    out = []
    for fmt in formats:
        w = random_tiles(fmt, n, k)
        for m in rows:
            x = torch.randn(m, k)
            tiled = median_ms(lambda x=x, w=w: cpu.gemm(x, w), repeats)
            blocks = median_ms(lambda x=x, w=w: cpu.gemm_dequant(x, w, torch.float32), repeats)
            out.append({"format": fmt, "rows": m, "bytes": w.nbytes, "tiled_ms": tiled,
                        "dequant_mm_ms": blocks})
    return out


def main(argv: list[str] | None = None) -> list[dict]:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", default="8192x2048", help="out x in features")
    ap.add_argument("--rows", type=int, nargs="+", default=[256])
    ap.add_argument("--formats", nargs="+", default=list(SOURCES))
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--smoke", action="store_true", help="tiny shapes, one repeat")
    args = ap.parse_args(argv)
    if not cpu.available():
        raise SystemExit("no CPU kernels here (no C compiler, or the generic level)")
    n, k = (int(v) for v in args.shape.split("x"))
    rows, repeats = args.rows, args.repeats
    if args.smoke:
        n, k, rows, repeats = 32, 256, [1, 5], 1
    results = measure(args.formats, n, k, rows, repeats)
    print(f"level {cpu.active_level()}, {torch.get_num_threads()} threads, {n} x {k}\n")
    print("| format | rows | MB | tiled (ms) | dequantize + torch.mm (ms) |")
    print("|---|---|---|---|---|")
    for r in results:
        print(f"| {r['format']} | {r['rows']} | {r['bytes'] / 1e6:.1f} | {r['tiled_ms']:.2f} "
              f"| {r['dequant_mm_ms']:.2f} |")
    return results


if __name__ == "__main__":
    main()

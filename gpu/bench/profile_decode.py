"""Runs a few decode steps of one shape for a profiler (Nsight Compute, nsys): B sequences of T
slots in bench_decode.py's setting (hils preset, Hq 16, Hkv 2, d 64, S 64, K 32, W 512), each
call after an L2 flush. Usage:
  ncu -k regex:"decode_|fused_window" -c 5 python3 gpu/bench/profile_decode.py --lib \
      build/gpu/libhils_gpu_c.so --B 8 --T 524288 --summary fp8 --kernel d29
"""
import argparse

from script_needs import needs
needs("torch")

import torch

from bench_decode import HilsDecode, flush_l2, kernel_code, load_library


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--lib", required=True)
    ap.add_argument("--B", type=int, default=8)
    ap.add_argument("--T", type=int, default=524288)
    ap.add_argument("--summary", choices=("bf16", "fp8"), default="fp8")
    ap.add_argument("--kernel", default="fused",
                    help="a decode kernel by name: fused (the default), d39, d36, ... (the library's "
                         "hils_gpu_enum_names(\"decode_kernel\"); a removed one is named as such)")
    ap.add_argument("--calls", type=int, default=1)
    args = ap.parse_args()
    lib = load_library(args.lib)
    kernel_code(args.kernel)  # an unknown or removed kernel: named before any work
    gen = torch.Generator(device="cuda")
    gen.manual_seed(4321)
    run = HilsDecode(lib, args.B, args.T, gen, summary=args.summary, kernel=args.kernel)
    torch.cuda.synchronize()
    for _ in range(args.calls):
        flush_l2()
        run()
    torch.cuda.synchronize()
    print(f"{args.calls} decode steps: B={args.B} T={args.T} {args.summary} {args.kernel}")


if __name__ == "__main__":
    main()

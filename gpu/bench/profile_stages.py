"""One forward of the benchmark geometry (bench_hils.py) for Nsight Compute: every stage runs
once to warm up, then select (two-pass v4.3, one-pass v5 and buffered v8) and fuse run again between cudaProfilerStart/Stop, so
`ncu --profile-from-start off` sees only those launches. Used by scripts/gpu_check.sh --profile.
"""
import argparse
import sys

from script_needs import needs
needs("torch")

import torch

sys.path.insert(0, __import__("os").path.dirname(__file__))
import hils.gpu as hc  # noqa: E402  (python/hils/gpu; script_needs puts python/ first)
from bench_hils import paper_problem  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--lib", required=True)
    ap.add_argument("--T", type=int, default=131072)
    args = ap.parse_args()
    lib = hc.Library(args.lib)
    gen = torch.Generator(device="cuda")
    gen.manual_seed(1234)
    T = args.T
    q, k, v, p = paper_problem(T, gen)
    st = hc.Stages(lib, p)
    st.forward()
    torch.cuda.synchronize()
    torch.cuda.profiler.start()
    st.window()
    st.select("two_pass_v4")
    st.select("one_pass_v5")
    st.select("two_pass_v8")
    st.fuse()
    torch.cuda.synchronize()
    torch.cuda.profiler.stop()
    print("profiled window, select and fuse at T =", T)


if __name__ == "__main__":
    main()

"""Selection kernels by name on bench_hils.py's problem (Hq=16, Hkv=2, d=64, S=64, K=32, W=512,
bf16, seed 1234): the time of each kernel (median of CUDA-event-timed calls, the kernels taken
in turns so that a drift of the card's clock spreads over all of them) and whether its
selection and selected scores equal the baseline kernel's byte for byte (gpu/NOTES.md: every
selection kernel must give the same bytes).

    python3 gpu/bench/bench_select.py --lib build/gpu/libhils_gpu_c.so \
        --kernels two_pass_v12,two_pass_v16 --T 16384,524288 [--baseline two_pass_v8] [--out f.json]

Exit status 1 when some kernel's bytes differ from the baseline's.
"""
import argparse
import json
import sys

from script_needs import needs
needs("torch")

import torch

sys.path.insert(0, __import__("os").path.dirname(__file__))
import hils_ctypes as hc  # noqa: E402
from bench_hils import HQ, HKV, D, S, K, W  # noqa: E402


def time_in_turns(calls, rounds):
    """Median ms of each call, the calls timed one after another in each of `rounds` rounds."""
    for fn in calls.values():
        fn()
    torch.cuda.synchronize()
    times = {name: [] for name in calls}
    for _ in range(rounds):
        for name, fn in calls.items():
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            times[name].append(start.elapsed_time(end))
    return {name: sorted(t)[len(t) // 2] for name, t in times.items()}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--lib", required=True)
    ap.add_argument("--kernels", required=True, help="comma-separated SelectKernel names")
    ap.add_argument("--T", default="16384,32768,131072,524288")
    ap.add_argument("--baseline", default="two_pass_v8")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--out", default="")
    args = ap.parse_args()
    lib = hc.Library(args.lib)
    kernels = args.kernels.split(",")
    for name in kernels + [args.baseline]:
        if name not in hc.SELECT_KERNEL:
            sys.exit(f"--kernels: unknown kernel '{name}' (expected one of {', '.join(hc.SELECT_KERNEL)})")
    print(f"device: {torch.cuda.get_device_name()}")
    results, all_equal = [], True
    for T in (int(t) for t in args.T.split(",")):
        gen = torch.Generator(device="cuda")
        gen.manual_seed(1234)
        q = torch.randn(HQ, T, D, device="cuda", dtype=torch.bfloat16, generator=gen)
        k = torch.randn(HKV, T, D, device="cuda", dtype=torch.bfloat16, generator=gen)
        v = torch.randn(HKV, T, D, device="cuda", dtype=torch.bfloat16, generator=gen)
        p = hc.make_problem(q, k, v, S, W, K, "hils")
        st = hc.Stages(lib, p)
        st.window()
        st.summarize()
        st.select(args.baseline)
        torch.cuda.synchronize()
        base = (st.selection.clone(), st.selected_score.clone())
        equal = {}
        for name in kernels:
            st.select(name)
            torch.cuda.synchronize()
            equal[name] = bool(torch.equal(st.selection, base[0]) and
                               torch.equal(st.selected_score.view(torch.int32), base[1].view(torch.int32)))
            all_equal &= equal[name]
        # --rounds 0: one call of each kernel only (for a profiler or memcheck), no times.
        ms = time_in_turns({name: (lambda n=name: st.select(n)) for name in kernels}, args.rounds) \
            if args.rounds > 0 else {}
        results.append({"T": T, "ms": ms, "bytes_equal_" + args.baseline: equal})
        print(f"T={T}: " + "  ".join(f"{n} {ms[n]:.3f} ms" if n in ms else n for n in kernels) + "; bytes equal to " +
              args.baseline + ": " + ", ".join(f"{n} {'yes' if equal[n] else 'NO'}" for n in kernels), flush=True)
        del st, q, k, v
        torch.cuda.empty_cache()
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"device": torch.cuda.get_device_name(), "results": results}, f, indent=1)
    sys.exit(0 if all_equal else 1)


if __name__ == "__main__":
    main()

"""What a batch in a kernel's own layout costs through hils.gpu.forward (layout=, python/hils/gpu/
batched.py) against B single calls, and against the permute and contiguous copies a caller made
before (README "Calling the GPU kernels"). Per (B, T), bf16 inputs, the hils preset (S = 64,
W = 512, K = 32), check_finite=False unless named:

    singles        B calls forward(q[b], k[b], v[b]) on the slices of a [B, Hq, T, d] tensor
    bhsd           forward(q, k, v, layout="bhsd"): the same, one call
    bshd           forward on [B, T, H, d] tensors, layout="bshd" (copies each sequence's inputs
                   to [H, T, d] and its outputs back into [B, T, Hq, dv], ...)
    bshd_checked   the same with check_finite=True (the default: one read of each input, a sync)
    user_bshd      what a caller did before: the [B, T, H, d] inputs permuted to [B, H, T, d] and
                   made contiguous, B single calls, the outputs stacked and permuted back, contiguous
    copies_bshd    those copies alone (inputs to [B, H, T, d], outputs to [B, T, H, ...])

Each case is timed with CUDA events on the current stream, the cases interleaved rep by rep
(after warm-up calls), median and min of --reps; peak memory is torch.cuda.max_memory_allocated
over one call minus what was allocated before it (the outputs included). The outputs of bshd
and user_bshd are compared (largest |difference| of each).

    python3 gpu/bench/bench_layouts.py --lib build/gpu/libhils_gpu_c.so --batches 4,8 --lengths 8192,32768
"""

import argparse
import json
import statistics

import torch

import hils.gpu

SPEC = {"preset": "hils", "S": 64, "W": 512, "K": 32}


def cases(q, k, v, lib):
    """name -> a call with no argument returning the outputs ({"o", "lse", "selection"})."""
    qs, ks, vs = (x.transpose(1, 2).contiguous() for x in (q, k, v))  # FlashAttention's [B, T, H, d]
    B = q.shape[0]

    def run(*tensors, **options):
        return hils.gpu.forward(*tensors, SPEC, library=lib, **dict(dict(check_finite=False), **options))

    def singles():
        return [run(q[b], k[b], v[b]) for b in range(B)]

    def user_bshd():
        heads = [x.transpose(1, 2).contiguous() for x in (qs, ks, vs)]
        outs = [run(*(x[b] for x in heads)) for b in range(B)]
        return {name: torch.stack([out[name] for out in outs]).transpose(1, 2).contiguous() for name in outs[0]}

    head_major = {name: torch.stack([t] * B) for name, t in run(q[0], k[0], v[0]).items()}  # [B, H, T, ...]

    def copies_bshd():
        for x in (qs, ks, vs):
            x.transpose(1, 2).contiguous()
        for t in head_major.values():
            t.transpose(1, 2).contiguous()

    return {"singles": singles, "bhsd": lambda: run(q, k, v, layout="bhsd"),
            "bshd": lambda: run(qs, ks, vs, layout="bshd"),
            "bshd_checked": lambda: run(qs, ks, vs, layout="bshd", check_finite=True),
            "user_bshd": user_bshd, "copies_bshd": copies_bshd}


def timed(call):
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    call()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) * 1e3  # us


def peak_bytes(call):
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    result = call()
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated() - before
    del result
    return peak


def measure(B, T, heads, d, reps, lib):
    Hq, Hkv = heads
    generator = torch.Generator(device="cuda").manual_seed(20261127)
    q, k, v = (torch.randn(B, h, T, d, device="cuda", generator=generator).bfloat16() for h in (Hq, Hkv, Hkv))
    calls = cases(q, k, v, lib)
    same = calls["bshd"](), calls["user_bshd"]()
    # the largest |difference| of each output (o's last bits vary from run to run: the sparse
    # stage's summation order, gpu/NOTES.md "Careless-user audit (session 21)")
    differences = {n: (same[0][n].float() - same[1][n].float()).abs().max().item() for n in same[1]}
    for call in calls.values():  # warm-up: library load, allocator pools
        call()
    times = {name: [] for name in calls}
    for _ in range(reps):
        for name, call in calls.items():
            times[name].append(timed(call))
    result = {"B": B, "T": T, "Hq": Hq, "Hkv": Hkv, "d": d, "bshd_vs_user_bshd_max_abs": differences,
              "input_MiB": sum(x.numel() * 2 for x in (q, k, v)) / 2**20}
    for name, values in times.items():
        result[name] = {"median_us": statistics.median(values), "min_us": min(values),
                        "peak_MiB": peak_bytes(calls[name]) / 2**20}
    return result


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--lib", default=None, help="libhils_gpu_c.so (default: hils.gpu.find_library())")
    parser.add_argument("--batches", default="4", help="B values, comma separated")
    parser.add_argument("--lengths", default="8192", help="T values, comma separated")
    parser.add_argument("--heads", default="16,2", help="Hq,Hkv")
    parser.add_argument("--d", type=int, default=64)
    parser.add_argument("--reps", type=int, default=20)
    parser.add_argument("--out", default=None, help="write the results as JSON here")
    args = parser.parse_args()
    lib = hils.gpu.load_library(args.lib)
    heads = tuple(int(h) for h in args.heads.split(","))
    print(f"# {torch.cuda.get_device_name()}, hils preset {SPEC}, bf16, Hq,Hkv = {heads}, d = {args.d}, "
          f"median (min) of {args.reps} interleaved reps, us; peak MiB over one call")
    results = []
    for B in (int(b) for b in args.batches.split(",")):
        for T in (int(t) for t in args.lengths.split(",")):
            r = measure(B, T, heads, args.d, args.reps, lib)
            results.append(r)
            line = " ".join(f"{name} {r[name]['median_us']:.0f} ({r[name]['min_us']:.0f}) {r[name]['peak_MiB']:.0f}MiB"
                            for name in ("singles", "bhsd", "bshd", "bshd_checked", "user_bshd", "copies_bshd"))
            print(f"B={B} T={T} inputs {r['input_MiB']:.0f}MiB: {line}; bshd against user_bshd, max |diff|: "
                  f"{r['bshd_vs_user_bshd_max_abs']}", flush=True)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()

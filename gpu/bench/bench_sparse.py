"""The sparse stage alone (hils_gpu_fuse on the packed path) in the benchmark geometry of
bench_hils.py, each chunk-major version and segment size on the same inputs, with the dense bf16
matmul rate of the same run; and the largest difference of each version's o and lse from
the first variant's (chunked_v21 unless --variants; the versions compute the same fusion, Eq. 10, in another order or
rounding). The versions removed in session 17 (gpu/NOTES.md "Kernels removed in session 17") were measured with this
script at commit ad5fb84.

Inputs are bench_hils.py's: random normal q, k, v (bf16), so adjacent queries' selections barely
overlap. --profile VARIANT runs one version once between cudaProfilerStart/Stop (Nsight Compute);
--kernels prints each version's GPU time per kernel (torch.profiler, 3 calls) at every T.
"""
import argparse
import json
import re
import sys

from script_needs import needs
needs("torch")

import torch

sys.path.insert(0, __import__("os").path.dirname(__file__))
import hils.gpu as hc  # noqa: E402  (python/hils/gpu; script_needs puts python/ first)
from bench_hils import HQ, HKV, D, S, K, W, dense_matmul_tflops, paper_problem, time_ms  # noqa: E402

# (label, sparse kernel, queries per segment; 0 = the version's own choice)
VARIANTS = [("v21", "chunked_v21", 0), ("v30", "chunked_v30", 0), ("v35", "chunked_v35", 0),
            ("v36", "chunked_v36", 0)]
# Variants through hils_gpu_fuse_rows: label -> (sparse kernel, o_swa dtype, o dtype). The fp16
# o_swa is the window's fp32 o_swa rounded once by torch before the timing (in a forward the
# window stage would write it).
ROW_VARIANTS = {"v30_h16in_bf16out": ("chunked_v30", torch.float16, torch.bfloat16),
                "v35_h16in_bf16out": ("chunked_v35", torch.float16, torch.bfloat16),
                "v36_h16in_bf16out": ("chunked_v36", torch.float16, torch.bfloat16)}


def prepared_stages(lib, T, gen):
    q, k, v, p = paper_problem(T, gen)  # p points into q, k, v: keep them
    st = hc.Stages(lib, p)
    st.window()
    st.summarize()
    st.select()
    torch.cuda.synchronize()
    return (q, k, v), st


def fuse_of(st, rows):
    """The call that runs the sparse stage: st.fuse (fp32 rows), or st.fuse_rows with
    rows = (o_swa dtype, o dtype) on buffers made once here."""
    if rows is None:
        return st.fuse, st.o
    o_swa = st.o_swa.to(rows[0])
    o = torch.empty(st.o.shape, device=st.o.device, dtype=rows[1])
    return (lambda: st.fuse_rows(o_swa, o)), o


def run_variant(lib, st, kernel, segment, rows=None, reps=5):
    default = hc.sparse_kernel(lib)
    hc.set_sparse(lib, kernel, segment)
    try:
        fuse, o = fuse_of(st, rows)
        ms = time_ms(fuse, warmup=1, reps=reps)
        o.fill_(float("nan"))
        fuse()
        torch.cuda.synchronize()
        return ms, o.float().clone(), st.lse.clone()
    finally:
        hc.set_sparse(lib, default, 0)


def kernel_table(lib, st, kernel, segment, calls=3, rows=None):
    """GPU ms per call of each kernel of the sparse stage (torch.profiler / CUPTI), and under the
    name IDLE the GPU's time per call between the stage's kernels (from the first kernel's start
    to the last one's end, less the time some kernel ran; the calls are issued back to back)."""
    from torch.profiler import ProfilerActivity, profile
    default = hc.sparse_kernel(lib)
    hc.set_sparse(lib, kernel, segment)
    try:
        fuse, _ = fuse_of(st, rows)
        fuse()
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(calls):
                fuse()
            torch.cuda.synchronize()
    finally:
        hc.set_sparse(lib, default, 0)
    rows = {}
    spans = sorted((e.time_range.start, e.time_range.end) for e in prof.events()
                   if str(getattr(e, "device_type", "")).endswith("CUDA") and e.time_range.end > e.time_range.start)
    if spans:
        busy, (lo, hi) = 0.0, spans[0]
        for start, end in spans[1:]:
            if start > hi:
                busy, lo, hi = busy + hi - lo, start, end
            else:
                hi = max(hi, end)
        busy += hi - lo
        idle_us = (max(end for _, end in spans) - spans[0][0]) - busy
        rows["IDLE"] = (idle_us / 1e3 / calls, len(spans) // calls)
    for e in prof.key_averages():
        us = getattr(e, "device_time_total", None)
        if us is None:
            us = e.cuda_time_total
        if us > 0:
            m = re.search(r"(\w+_kernel(<[^>]*>)?)", e.key)
            name = m.group(1) if m else e.key[:60]
            ms_old, n_old = rows.get(name, (0.0, 0))
            rows[name] = (ms_old + us / 1e3 / calls, n_old + e.count // calls)
    return rows


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--lib", required=True)
    ap.add_argument("--T", type=int, nargs="+", default=[131072, 524288])
    ap.add_argument("--out", default="bench_sparse.json")
    ap.add_argument("--profile", metavar="VARIANT", help="a VARIANTS label, for Nsight Compute")
    ap.add_argument("--kernels", action="store_true", help="per-kernel GPU time of each version")
    ap.add_argument("--reps", type=int, default=5, help="timed calls per variant (the median)")
    ap.add_argument("--variants", nargs="+", metavar="LABEL",
                    help="VARIANTS labels to run, in this order (default: all; the first is the "
                         "baseline of the differences)")
    args = ap.parse_args()
    lib = hc.Library(args.lib)
    gen = torch.Generator(device="cuda")
    gen.manual_seed(1234)
    if args.profile:
        # One variant (a VARIANTS label), warmed up, then once between profiler start and stop.
        _, kernel, segment = next(v for v in VARIANTS if v[0] == args.profile)
        _, st = prepared_stages(lib, args.T[0], gen)
        default = hc.sparse_kernel(lib)
        hc.set_sparse(lib, kernel, segment)
        st.fuse()
        torch.cuda.synchronize()
        torch.cuda.profiler.start()
        st.fuse()
        torch.cuda.synchronize()
        torch.cuda.profiler.stop()
        hc.set_sparse(lib, default, 0)
        print(f"profiled the sparse stage {args.profile} at T = {args.T[0]}")
        return
    peak = dense_matmul_tflops()
    print(f"device: {torch.cuda.get_device_name()}  dense bf16 matmul {peak:.0f} TFLOP/s")
    variants = [v + (None,) for v in VARIANTS] + [
        (label, kernel, 0, (o_swa, o)) for label, (kernel, o_swa, o) in ROW_VARIANTS.items()]
    if args.variants:
        by_label = {v[0]: v for v in variants}
        unknown = [label for label in args.variants if label not in by_label]
        if unknown:
            sys.exit(f"--variants: expected labels among {sorted(by_label)}, got {unknown}")
        variants = [by_label[label] for label in args.variants]
    rows = []
    for T in args.T:
        _, st = prepared_stages(lib, T, gen)
        selected = int((st.selection >= 0).sum().item())
        flops = selected * (HQ // HKV) * 4 * (S - 1) * D
        base_o = base_lse = None
        for label, kernel, segment, row_types in variants:
            if segment > T:
                continue
            ms, o, lse = run_variant(lib, st, kernel, segment, row_types, args.reps)
            if base_o is None:
                base_o, base_lse = o, lse
            tflops = flops / (ms * 1e-3) / 1e12
            row = dict(T=T, variant=label, kernel=kernel, segment=segment, ms=ms, tflops=tflops,
                       pct_matmul=100 * tflops / peak,
                       o_nan=int(torch.isnan(o).sum().item()),
                       o_maxdiff=float((o - base_o).abs().max().item()),
                       o_maxabs=float(base_o.abs().max().item()),
                       lse_maxdiff=float((lse - base_lse).abs().max().item()))
            rows.append(row)
            print(f"T={T:>7} {label:12s} {ms:8.2f} ms  {tflops:6.1f} TFLOP/s  "
                  f"{row['pct_matmul']:5.1f}% of matmul  o NaN {row['o_nan']}  |o - o_base| max "
                  f"{row['o_maxdiff']:.3g} (max |o| {row['o_maxabs']:.3g})  |lse - lse_base| max "
                  f"{row['lse_maxdiff']:.3g}", flush=True)
            if args.kernels and segment == 0:
                table = kernel_table(lib, st, kernel, segment, rows=row_types)
                row["kernels_ms"] = table
                for name, (ms_k, count) in sorted(table.items(), key=lambda kv: -kv[1][0]):
                    print(f"    {ms_k:8.3f} ms  x{count:<4d} {name}", flush=True)
        del st
        torch.cuda.empty_cache()
    with open(args.out, "w") as f:
        json.dump(dict(device=torch.cuda.get_device_name(), matmul_tflops=peak, rows=rows), f,
                  indent=1)


if __name__ == "__main__":
    main()

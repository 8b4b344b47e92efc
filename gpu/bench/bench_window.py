"""The window stage and the forward's other pieces in the benchmark geometry of bench_hils.py:
each packed window kernel by name, the packed summaries against the generic SIMT ones, the
default selection and sparse stage, and the whole forward against the sum of its stages, all on
the same inputs; with the largest difference of each window kernel's o_swa and lse_swa from
the first kernel's (mma_v9 by default; the kernels compute the same window branch in another rounding) and the dense bf16
matmul rate of the same run.

--kernels NAME ... times only those window kernels (default: every one), in turns: --rounds R
times each R times, the kernels in turn, and reports each one's median of the rounds' medians
(--reps calls each); o_swa and lse_swa are compared with the first kernel named (largest
differences, and the rows (query, head) whose o_swa or lse_swa differs at all, of all rows).
--window-only skips the summaries, the selection, the sparse stage and the forward.
--profile KERNEL runs that window kernel once at the largest T between cudaProfilerStart/Stop
(Nsight Compute with --profile-from-start off).
--trace records one forward at the largest T with torch.profiler: the forward's span on the GPU
(first kernel start to last kernel end) against the sum of its kernels' times, the gaps between
kernels, and the time per kernel name (trace_forward in the JSON).
"""
import argparse
import json
import sys

from script_needs import needs
needs("torch")

import torch

sys.path.insert(0, __import__("os").path.dirname(__file__))
import hils.gpu as hc  # noqa: E402  (python/hils/gpu; script_needs puts python/ first)
from bench_hils import HQ, HKV, D, S, K, W, dense_matmul_tflops, paper_problem, time_ms  # noqa: E402

# Window branch flops: every (query, head) row against its ~W + S/2 attendable keys, QK and PV.
WINDOW_FLOP_PER_ROW_KEY = 4 * D


def window_flops(T):
    keys = 0
    for t in range(0, T, 64):  # rows of one 64-slot chunk see about the same window length
        left = max(0, ((t + 32 - W + 1) // S) * S)  # window_left, floor division
        keys += min(64, T - t) * (t + 32 - left)
    return keys * HQ * WINDOW_FLOP_PER_ROW_KEY


def run_window(lib, st, kernel, reps=5):
    default = hc.window_kernel(lib)
    hc.set_window(lib, kernel)
    try:
        ms = time_ms(st.window, warmup=1, reps=reps)
        st.o_swa.fill_(float("nan"))
        st.window()
        torch.cuda.synchronize()
        return ms, st.o_swa.clone(), st.lse_swa.clone()
    finally:
        hc.set_window(lib, default)


def forward_stage_ms(st, reps=3):
    """Median CUDA-event time of each stage inside whole forwards (window, summarize, select,
    fuse back to back, as st.forward runs them), to compare with the stages timed alone."""
    stages = [("window", st.window), ("summarize", st.summarize), ("select", st.select),
              ("fuse", st.fuse)]
    times = {name: [] for name, _ in stages}
    times["forward"] = []
    for _ in range(reps):
        events = [torch.cuda.Event(enable_timing=True) for _ in range(len(stages) + 1)]
        events[0].record()
        for i, (_, fn) in enumerate(stages):
            fn()
            events[i + 1].record()
        events[-1].synchronize()
        for i, (name, _) in enumerate(stages):
            times[name].append(events[i].elapsed_time(events[i + 1]))
        times["forward"].append(events[0].elapsed_time(events[-1]))
    return {name: sorted(t)[len(t) // 2] for name, t in times.items()}


def trace_forward(st):
    """One forward under torch.profiler: span, busy time, gaps and per-kernel times (ms)."""
    from torch.profiler import ProfilerActivity, profile
    st.forward()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        st.forward()
        torch.cuda.synchronize()
    events = sorted((e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA),
                    key=lambda e: e.time_range.start)
    spans = [(e.time_range.start, e.time_range.end, e.name) for e in events]
    busy, gaps, end, per_name = 0.0, [], None, {}
    for start, stop, name in spans:
        if end is not None and start > end:
            gaps.append((start - end, name))
        end = stop if end is None else max(end, stop)
        busy += stop - start
        count, total = per_name.get(name, (0, 0.0))
        per_name[name] = (count + 1, total + (stop - start))
    gaps.sort(reverse=True)
    top = sorted(per_name.items(), key=lambda kv: -kv[1][1])[:12]
    return dict(span_ms=(spans[-1][1] - spans[0][0]) / 1e3 if spans else 0.0, busy_ms=busy / 1e3,
                n_kernels=len(spans), gap_total_ms=sum(g for g, _ in gaps) / 1e3,
                largest_gaps_us=[(round(g, 1), n[:60]) for g, n in gaps[:8]],
                per_kernel_ms=[(n[:80], c, round(t / 1e3, 3)) for n, (c, t) in top])


def others(lib, st, row):
    """The summaries, the selection, the sparse stage and the forward on the same inputs."""
    T = row["T"]
    st.window()
    row["summarize_ms"] = time_ms(st.summarize, reps=5)
    hc.set_packed(lib, False)
    row["summarize_simt_ms"] = time_ms(st.summarize, reps=3)
    hc.set_packed(lib, True)
    key_simt = st.key.clone()
    st.summarize()
    torch.cuda.synchronize()
    row["summary_key_diff_packed_vs_simt"] = (st.key - key_simt).abs().max().item()
    row["select_ms"] = time_ms(st.select, reps=3)
    row["sparse_ms"] = time_ms(st.fuse, reps=3)
    row["forward_ms"] = time_ms(st.forward, reps=5)
    row["forward_stage_ms"] = forward_stage_ms(st)
    row["sum_of_stages_ms"] = (row["window_ms"].get(hc.window_kernel(lib), float("nan")) +
                               row["summarize_ms"] + row["select_ms"] + row["sparse_ms"])
    print(f"T={T:>7} window " +
          " ".join(f"{n}={t:.3f}ms({row['window_tflops'][n]:.0f}TF/s)"
                   for n, t in row["window_ms"].items()) +
          f" | summarize packed={row['summarize_ms']:.3f} simt={row['summarize_simt_ms']:.3f}"
          f" | select={row['select_ms']:.2f} sparse={row['sparse_ms']:.2f}"
          f" | forward={row['forward_ms']:.2f} sum={row['sum_of_stages_ms']:.2f}"
          f" | inside the forward {json.dumps({k: round(v, 3) for k, v in row['forward_stage_ms'].items()})}"
          f" | o diff vs {row['reference']} {row['o_diff_vs_v4']} lse diff {row['lse_diff_vs_v4']}"
          f" nonfinite {row['nonfinite_o']} key diff {row['summary_key_diff_packed_vs_simt']:.2e}",
          flush=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--lib", required=True)
    ap.add_argument("--T", type=int, nargs="+", default=[16384, 131072, 524288])
    ap.add_argument("--out", default="bench_window.json")
    ap.add_argument("--profile", default=None, help="a WINDOW_KERNEL name")
    ap.add_argument("--trace", action="store_true", help="torch.profiler trace of one forward")
    ap.add_argument("--kernels", nargs="+", default=list(hc.WINDOW_KERNEL),
                    help="WINDOW_KERNEL names; the first is the reference of the differences")
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--window-only", action="store_true")
    args = ap.parse_args()
    lib = hc.Library(args.lib)
    gen = torch.Generator(device="cuda")
    gen.manual_seed(1234)
    print(f"device: {torch.cuda.get_device_name()}  torch {torch.__version__}")
    peak = dense_matmul_tflops()
    print(f"dense bf16 matmul (8192^3, torch.matmul): {peak:.0f} TFLOP/s")
    rows = []
    for T in args.T:
        q, k, v, p = paper_problem(T, gen)  # p points into q, k, v: keep them
        st = hc.Stages(lib, p)
        # o_diff_vs_v4 / lse_diff_vs_v4 (the keys of session 16's files): against the first kernel
        # named (mma_v9 by default; mma_v4 until session 17).
        row = dict(T=T, window_ms={}, window_tflops={}, o_diff_vs_v4={}, lse_diff_vs_v4={},
                   reference=args.kernels[0], window_ms_rounds={})
        flops = window_flops(T)
        ref = None
        for _ in range(args.rounds):
            for kernel in args.kernels:
                ms, o, lse = run_window(lib, st, kernel, args.reps)
                row["window_ms_rounds"].setdefault(kernel, []).append(ms)
                if ref is None:
                    ref = (o, lse)
                finite = torch.isfinite(ref[1])
                row["o_diff_vs_v4"][kernel] = (o - ref[0]).abs().max().item()
                row["lse_diff_vs_v4"][kernel] = (lse[finite] - ref[1][finite]).abs().max().item()
                # rows (query, head) whose o_swa or lse_swa differs at all from the first kernel's
                rows_o = (o - ref[0]).reshape(-1, o.shape[-1]).abs().amax(dim=1) > 0
                rows_lse = (lse != ref[1]).reshape(-1) & (torch.isfinite(lse) | torch.isfinite(ref[1])).reshape(-1)
                row.setdefault("rows_differing", {})[kernel] = [int((rows_o | rows_lse).sum().item()),
                                                                int(rows_o.numel())]
                row.setdefault("nonfinite_o", {})[kernel] = int((~torch.isfinite(o)).sum().item())
                del o, lse
        for kernel, times in row["window_ms_rounds"].items():
            ms = sorted(times)[len(times) // 2]
            row["window_ms"][kernel] = ms
            row["window_tflops"][kernel] = flops / (ms * 1e-3) / 1e12
        if args.window_only:
            print(f"T={T:>7} window " +
                  " ".join(f"{n}={t:.3f}ms({row['window_tflops'][n]:.0f}TF/s)"
                           for n, t in row["window_ms"].items()) +
                  f" | rounds {json.dumps({n: [round(x, 3) for x in v] for n, v in row['window_ms_rounds'].items()})}"
                  f" | o diff vs {args.kernels[0]} {row['o_diff_vs_v4']} lse diff {row['lse_diff_vs_v4']}"
                  f" rows differing {row['rows_differing']}"
                  f" nonfinite {row['nonfinite_o']}", flush=True)
        else:
            others(lib, st, row)
        rows.append(row)
        if args.trace and T == args.T[-1]:
            row["trace_forward"] = trace_forward(st)
            print("trace of one forward:", json.dumps(row["trace_forward"]), flush=True)
        if args.profile and T == args.T[-1]:
            hc.set_window(lib, args.profile)
            torch.cuda.synchronize()
            torch.cuda.cudart().cudaProfilerStart()
            st.window()
            torch.cuda.synchronize()
            torch.cuda.cudart().cudaProfilerStop()
        del q, k, v, st
        torch.cuda.empty_cache()
    with open(args.out, "w") as f:
        json.dump(dict(device=torch.cuda.get_device_name(), matmul_tflops=peak, rows=rows), f,
                  indent=1)


if __name__ == "__main__":
    main()

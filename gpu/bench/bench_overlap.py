"""Can the selection and the sparse stage share the GPU? (gpu/NOTES.md "Pipelined forward").

On precomputed inputs of the benchmark's shape (Hq=16, Hkv=2, d=64, S=64, K=32, W=512, bf16):
the whole forward on one stream (as bench_hils.py's), the selection alone, the sparse stage alone, and both at once on two streams (the selection
writing a second selection buffer, the sparse stage reading the first), in both launch orders
and with the sparse stream at a higher priority; also the window beside the selection. Each
time is the median of CUDA-event-timed repetitions from a fork event on the current stream to
the join of both streams.
"""
import argparse
import json
import sys

from script_needs import needs
needs("torch")

import torch

sys.path.insert(0, __import__("os").path.dirname(__file__))
import hils.gpu as hc  # noqa: E402  (python/hils/gpu; script_needs puts python/ first)
from bench_hils import paper_problem  # noqa: E402

REPS = 5


def time_fork_join(launches, reps=None):
    """Median ms from a start event on the current stream to the join of every launch's stream.
    launches: [(stream, fn)] run in this order, each on its stream after the start event."""
    main = torch.cuda.current_stream()
    reps = reps or REPS
    times = []
    for rep in range(reps + 1):  # the first is the warm-up
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record(main)
        for stream, fn in launches:
            stream.wait_event(start)
            with torch.cuda.stream(stream):
                fn()
        for stream, _ in launches:
            main.wait_stream(stream)
        end.record(main)
        end.synchronize()
        if rep > 0:
            times.append(start.elapsed_time(end))
    times.sort()
    return times[len(times) // 2]


def measure(lib, T, gen):
    global REPS
    REPS = 21 if T <= 131072 else 5
    q, k, v, p = paper_problem(T, gen)
    st = hc.Stages(lib, p)
    st.forward()
    # A second set of outputs on the same inputs: the concurrent selection writes these.
    other = hc.Stages(lib, p)
    other.key, other.bias, other.lse_swa, other.o_swa = st.key, st.bias, st.lse_swa, st.o_swa
    window_out = hc.Stages(lib, p)
    torch.cuda.synchronize()
    a, b = torch.cuda.Stream(), torch.cuda.Stream()
    b_high, a_low = torch.cuda.Stream(priority=-1), torch.cuda.Stream(priority=0)  # lower: higher
    r = {}
    r["forward"] = time_fork_join([(a, st.forward)])
    r["select"] = time_fork_join([(a, other.select)])
    r["sparse"] = time_fork_join([(b, st.fuse)])
    r["window"] = time_fork_join([(a, window_out.window)])
    r["select_then_sparse_one_stream"] = time_fork_join([(a, lambda: (other.select(), st.fuse()))])
    r["both_select_first"] = time_fork_join([(a, other.select), (b, st.fuse)])
    r["both_sparse_first"] = time_fork_join([(b, st.fuse), (a, other.select)])
    r["both_sparse_high_priority"] = time_fork_join([(a_low, other.select), (b_high, st.fuse)])
    r["select_and_window"] = time_fork_join([(a, other.select), (b, window_out.window)])
    same = bool(torch.equal(other.selection, st.selection))
    print(f"T={T:>7} " + " ".join(f"{n}={t:.2f}" for n, t in r.items()) +
          f" concurrent selection bytes equal: {same}", flush=True)
    return dict(T=T, ms=r, selection_equal=same)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--lib", required=True)
    ap.add_argument("--T", type=int, nargs="+", default=[131072, 524288])
    ap.add_argument("--out", default="overlap.json")
    args = ap.parse_args()
    lib = hc.Library(args.lib)
    gen = torch.Generator(device="cuda")
    gen.manual_seed(1234)
    print(f"device: {torch.cuda.get_device_name()}  torch {torch.__version__}")
    rows = [measure(lib, T, gen) for T in args.T]
    with open(args.out, "w") as f:
        json.dump(dict(device=torch.cuda.get_device_name(), rows=rows), f, indent=1)


if __name__ == "__main__":
    main()

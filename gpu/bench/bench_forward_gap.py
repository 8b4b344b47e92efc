"""The forward's time outside its kernels (issue 12), in the geometry of bench_hils.py.

At each T, the forward of bench_hils.py (window, summaries, selection, sparse stage on one stream) is timed
- "synced": CUDA events around each forward, a synchronize after each (as bench_hils.py does);
- "synced_pool0": the same with the device's default memory pool's release threshold set to 0
  before each forward (the driver's default; the pool then gives its free memory back at each
  synchronize), to see what scratch taken from that pool would cost;
- "back_to_back": five forwards between two events, no synchronize between them;
- "host_issue": the host's time to issue one forward (no synchronize inside);
and one forward at a time is recorded by torch.profiler between two marker kernels launched just
before its start event and just after its end event: "lead" is the idle time from the first
marker's end to the forward's first kernel (or memset), "tail" from its last kernel to the second
marker's start, "span" its first-to-last kernel time, "event" the events' time of the same
forward. Also the default pool's reserved bytes after a synchronized forward.
One library per process: to compare two, run them in turn (A B A B) in separate processes (two
copies of the library in one process broke the second's window launch: "invalid argument").
"""
import argparse
import ctypes
import json
import sys
import time

from script_needs import needs
needs("torch")

import torch

sys.path.insert(0, __import__("os").path.dirname(__file__))
import hils.gpu as hc  # noqa: E402  (python/hils/gpu; script_needs puts python/ first)
from bench_hils import paper_problem, time_ms  # noqa: E402

CU_MEMPOOL_ATTR_RELEASE_THRESHOLD = 4
CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT = 5


class DefaultPool:
    """The current device's default memory pool, through the driver API (libcuda)."""

    def __init__(self):
        self.cu = ctypes.CDLL("libcuda.so.1")
        dev = ctypes.c_int()
        self._ok(self.cu.cuDeviceGet(ctypes.byref(dev), torch.cuda.current_device()))
        self.pool = ctypes.c_void_p()
        self._ok(self.cu.cuDeviceGetDefaultMemPool(ctypes.byref(self.pool), dev))

    @staticmethod
    def _ok(rc):
        if rc != 0:
            raise RuntimeError(f"CUDA driver call returned {rc}")

    def get(self, attr):
        value = ctypes.c_uint64()
        self._ok(self.cu.cuMemPoolGetAttribute(self.pool, attr, ctypes.byref(value)))
        return value.value

    def set_threshold(self, value):
        v = ctypes.c_uint64(value)
        self._ok(self.cu.cuMemPoolSetAttribute(self.pool, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD,
                                               ctypes.byref(v)))


def median(xs):
    xs = sorted(xs)
    return xs[len(xs) // 2]


def back_to_back_ms(fn, n=5):
    fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(n):
        fn()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / n


def host_issue_ms(fn, reps=5):
    times = []
    for _ in range(reps):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e3)
    torch.cuda.synchronize()
    return median(times)


def idle_around(fn, reps=3):
    """Per forward (ms): idle before its first and after its last kernel, its span, its events."""
    from torch.profiler import ProfilerActivity, profile
    marker = torch.zeros(1, device="cuda")
    fn()
    marker.add_(1)
    torch.cuda.synchronize()
    event_ms = []
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(reps):
            torch.cuda.synchronize()
            marker.add_(1)
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            marker.add_(1)
            end.synchronize()
            event_ms.append(start.elapsed_time(end))
    acts = sorted((e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA),
                  key=lambda e: e.time_range.start)
    is_marker = [("elementwise" in e.name or "at::native" in e.name) for e in acts]
    rows, i = [], 0
    while i < len(acts) and len(rows) < reps:
        if not is_marker[i]:
            i += 1
            continue
        a = acts[i]
        j = i + 1
        while j < len(acts) and not is_marker[j]:
            j += 1
        if j >= len(acts):
            break
        inner = acts[i + 1:j]
        b = acts[j]
        if inner:
            first = min(e.time_range.start for e in inner)
            last = max(e.time_range.end for e in inner)
            rows.append(dict(lead_us=round(first - a.time_range.end, 1),
                             tail_us=round(b.time_range.start - last, 1),
                             span_ms=round((last - first) / 1e3, 3),
                             busy_ms=round(sum(e.time_range.end - e.time_range.start
                                               for e in inner) / 1e3, 3),
                             n_activities=len(inner),
                             first=inner[0].name[:50], last=inner[-1].name[:50]))
        i = j + 1
    for row, ev in zip(rows, event_ms):
        row["event_ms"] = round(ev, 3)
        row["event_minus_span_ms"] = round(ev - row["span_ms"], 3)
    return rows


def measure(st, pool):
    st.forward()
    torch.cuda.synchronize()
    threshold = pool.get(CU_MEMPOOL_ATTR_RELEASE_THRESHOLD)
    row = dict(default_pool_threshold=threshold, synced_ms=time_ms(st.forward))
    row["default_pool_reserved_mb"] = pool.get(CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT) / 2**20
    row["back_to_back_ms"] = back_to_back_ms(st.forward)
    row["host_issue_ms"] = host_issue_ms(st.forward)
    row["synced_pool0_ms"] = time_ms(st.forward, before=lambda: pool.set_threshold(0))
    torch.cuda.synchronize()
    row["default_pool_reserved_after_pool0_mb"] = pool.get(CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT) / 2**20
    pool.set_threshold(threshold)
    row["profiled"] = idle_around(st.forward)
    return row


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--lib", required=True)
    ap.add_argument("--T", type=int, nargs="+", default=[16384, 32768, 131072, 524288])
    ap.add_argument("--out", default="bench_forward_gap.json")
    args = ap.parse_args()
    lib = hc.Library(args.lib)
    pool = DefaultPool()
    gen = torch.Generator(device="cuda")
    gen.manual_seed(1234)
    print(f"device: {torch.cuda.get_device_name()}  torch {torch.__version__}  lib {args.lib}",
          flush=True)
    out = []
    for T in args.T:
        q, k, v, p = paper_problem(T, gen)  # p points into q, k, v: keep them
        st = hc.Stages(lib, p)
        row = dict(T=T, **measure(st, pool))
        out.append(row)
        print(json.dumps({key: value for key, value in row.items() if key != "profiled"}), flush=True)
        for p in row["profiled"]:
            print("   ", json.dumps(p), flush=True)
        del q, k, v, st
        torch.cuda.empty_cache()
    with open(args.out, "w") as f:
        json.dump(dict(device=torch.cuda.get_device_name(), lib=args.lib, rows=out), f, indent=1)


if __name__ == "__main__":
    main()

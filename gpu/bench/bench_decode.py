"""Decode step (gpu/include/hils/gpu/decode.hpp) vs dense one-token attention, in the paper's
small-model setting: Hq=16, Hkv=2, d=64, S=64, K=32, W=512, bf16, batch B in {1, 8, 32}.

Peers in the same run: PyTorch SDPA with a one-token query on each backend that accepts it
(GQA through enable_gqa, no repeated KV heads), FlexAttention decoding with the block mask of
the same sparse work (window + the K selected chunks, the mask given), and the dense byte floor:
the whole KV cache read once at the copy bandwidth measured here (no dense kernel beats it).
Ours runs four ways: the d5 kernel (six launches, bf16 summaries), the fused kernel (the
default, d36: gpu/NOTES.md "decode") with bf16 summaries, and with fp8 e4m3 summaries (a per-row
power-of-two scale), and d29 with fp8 summaries (the previous default: the baseline); --variants
picks others (d29, d34, d35, d36, d39, d40; the versions removed in session 17 are refused by name, see
gpu/NOTES.md "Kernels removed in session 17") and --batches / --lengths fewer shapes (no table
then). --scan-floor also times, per shape with fp8 summaries, launch 1 alone of d25 (d29's),
launch 1's loads alone (its grid, no arithmetic) and a flat read of the summary arrays
(hils::gpu::decode_scan_probe): what the scan could reach (with int4 summaries too when a
--variants label names int4: <kernel>_int4, codes -7..7 and a row scale, half fp8's bytes;
gpu/NOTES.md "decode", session 15; with int4h only the flat read of the codes and pairs);
<kernel>_int4h labels run the int4_h store (the int4 codes against an fp16 scale, the scale and
b' read as one fp16 pair: d40 only, gpu/NOTES.md "d40") on the same random cache as int4's, and
print how its outputs differ from the first int4 variant's; --handoffs times d25's launch 1 alone
and followed by four empty kernels launched as d29 launches its tails: what the kernel
boundaries after the scan cost without the tails' work.
Each side is timed as a CUDA-graph replay (one launch, as serving loops run decode; the eager
time of ours is printed too). Every timed call starts with a cold L2 (a 512 MiB buffer is written
between calls, or read with --flush read), as a step over a real model's layers would. Times are
medians of CUDA-event-timed calls after warm-up.
Usage: bench_decode.py --lib build/gpu/libhils_gpu_c.so [--out decode.json] [--no-flex]
       [--profile] [--variants fused_fp8,d29_fp8,...] [--batches 8,32] [--lengths 524288]
       [--scan-floor] [--handoffs]
"""
import argparse
import ctypes
import json
import math

from script_needs import needs
needs("torch")

# The C structs and the kernels by name, filled from the library's own table when it is loaded
# (python/hils/gpu/library.py; script_needs put python/ on sys.path).
import hils.gpu as hg  # noqa: E402
from hils.gpu import SUMMARY_TYPES, Decode, DecodeOutputs  # noqa: E402

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

HQ, HKV, D, S, K, W = 16, 2, 64, 64, 32, 512
BATCHES = (1, 8, 32)
LENGTHS = (32768, 131072, 524288)


def load_library(path):
    """libhils_gpu_c.so loaded by hils.gpu.Library (which fills hils.gpu.DECODE_KERNEL from the
    library's own list) -> its ctypes.CDLL, as HilsDecode takes it."""
    return hg.Library(path).lib


def kernel_code(name):
    """The DecodeKernel code of `name`; an unknown or removed one ends the script naming it."""
    try:
        return hg.kernel_code("decode_kernel", name)
    except ValueError as error:
        raise SystemExit(str(error)) from None


def variant(label):
    """'d29_fp8' -> ('d29_fp8', 'd29', 'fp8'); a removed kernel or an unknown label ends the script."""
    expected = f"expected <{'|'.join(hg.DECODE_KERNEL)}>_<bf16|fp8|int4|int4h>"
    if "_" not in label:
        raise SystemExit(f"--variants: unknown '{label}' ({expected})")
    kernel, summary = label.rsplit("_", 1)
    kernel_code(kernel)  # a removed version: named as such
    if summary not in SUMMARY_TYPES:
        raise SystemExit(f"--variants: unknown '{label}' ({expected})")
    return label, kernel, summary


def enum_value(lib, field, name):
    """The hils enum integer of `name` (e.g. key_rule taylor), from the library's own table."""
    lib.hils_gpu_enum_names.restype = ctypes.c_char_p
    lib.hils_gpu_enum_names.argtypes = [ctypes.c_char_p]
    return lib.hils_gpu_enum_names(field.encode()).decode().split().index(name)


# decode_scan_probe's probes (hils::gpu::ScanProbe), timed by --scan-floor (d21_scan = 0 and
# d24_scan = 1 were removed in session 17).
SCAN_PROBES = {"d25_scan": 2, "loads_only": 3, "flat_read": 4}
TAIL_HANDOFFS = 5  # ScanProbe::tail_handoffs (--handoffs)
# The variants timed per (B, T): (label, kernel, summary type); d29 fp8 is the baseline of fused.
VARIANTS = (("d5_bf16", "d5", "bf16"), ("fused_bf16", "fused", "bf16"), ("d29_fp8", "d29", "fp8"),
            ("fused_fp8", "fused", "fp8"))


def report_difference(label, first, got, row):
    """Prints (and keeps in `row`) how far `got` = (label, o, lse, selection) is from `first`: the
    selected chunks (ascending per (b, g)) that differ, the (b, g) rows whose selection differs,
    and the largest |o| and |lse| differences (variants whose scores are summed in another order,
    e.g. d39's tensor-core dots, may select differently where scores nearly tie)."""
    sel_a, sel_b = first[3], got[3]
    rows_differ = int((sel_a != sel_b).any(dim=-1).sum())
    entries = int(sum(len(set(a.tolist()) ^ set(b.tolist())) // 2
                      for a, b in zip(sel_a.reshape(-1, sel_a.shape[-1]), sel_b.reshape(-1, sel_b.shape[-1]))))
    o_diff = float((first[1] - got[1]).abs().max())
    lse_diff = float((first[2] - got[2]).abs().max())
    row[f"{label}_selection_rows_differ"] = rows_differ
    row[f"{label}_selected_chunks_differ"] = entries
    print(f"    {label}: {entries} selected chunks in {rows_differ} of {sel_a.numel() // sel_a.shape[-1]} "
          f"(b, g) selections differ from {first[0]}'s; max |o diff| {o_diff:.3g}, "
          f"max |lse diff| {lse_diff:.3g}", flush=True)


def ptr(t):
    return ctypes.c_void_p(t.data_ptr()) if t is not None else ctypes.c_void_p(0)


_flush = None
# How flush_l2 empties the L2 between timed calls: "write" (the default since session 6) fills a
# 512 MiB buffer, which leaves the L2 full of dirty lines that the timed call's misses must write
# back; "read" reads the buffer (a max over it), which leaves clean lines, as a model's weight
# reads between two decode steps would (--flush).
FLUSH = "write"


def flush_l2():
    global _flush
    if _flush is None:
        _flush = torch.ones(512 << 20, dtype=torch.uint8, device="cuda")
    if FLUSH == "read":
        _flush.view(torch.int32).max()
    else:
        _flush.fill_(1)


def time_us(fn, reps=30, warmup=3):
    """Median time of fn in microseconds, each call after an L2 flush."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(reps):
        flush_l2()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3)
    times.sort()
    return times[len(times) // 2]


def graphed(fn):
    """fn captured in a CUDA graph (one launch per call, as a serving loop runs decode), or
    None when capture fails."""
    try:
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            fn()
            fn()
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            fn()
        graph.replay()
        torch.cuda.synchronize()
        return graph.replay
    except Exception as e:  # noqa: BLE001  (reported, the eager time stays)
        print(f"    graph capture failed ({str(e).splitlines()[0][:100]})")
        return None


def best_us(fn, reps=30):
    """(graph replay time or None, eager time) of fn, microseconds."""
    eager = time_us(fn, reps=reps)
    g = graphed(fn)
    return (time_us(g, reps=reps) if g else None), eager


def copy_bandwidth():
    """Bytes moved (read + write) per second by a 4 GiB device-to-device copy."""
    n = 2 << 30
    src = torch.empty(n, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    us = time_us(lambda: dst.copy_(src), reps=10)
    del src, dst
    return 2 * n / (us * 1e-6)


def _quantize(lib, entry, key, out):
    """Runs the library's quantizer `entry` (hils_gpu_quantize_summaries_<store>) on key fp32
    [..., d] into `out`; returns (out, fp32 row scales [...])."""
    scale = torch.empty(key.shape[:-1], dtype=torch.float32, device="cuda")
    rows = key.numel() // key.shape[-1]
    fn = getattr(lib, entry)
    fn.argtypes = [ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64,
                   ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p]
    rc = fn(ptr(key), rows, key.shape[-1], ptr(out), ptr(scale),
            ctypes.c_void_p(torch.cuda.current_stream().cuda_stream))
    if rc != 0:
        raise RuntimeError(lib.hils_gpu_decode_last_error().decode())
    return out, scale


def quantize_fp8(lib, key):
    """key fp32 [..., d] -> (e4m3 [..., d], fp32 row scales [...]) by the library's quantizer."""
    key = key.float().contiguous()
    out = torch.empty(key.shape, dtype=torch.float8_e4m3fn, device="cuda")
    return _quantize(lib, "hils_gpu_quantize_summaries_fp8", key, out)


def quantize_int4(lib, key):
    """key fp32 [..., d] -> (int4 codes, two per byte [..., d / 2] uint8, fp32 row scales [...]) by
    the library's quantizer (hils::gpu::quantize_summaries_int4)."""
    key = key.float().contiguous()
    out = torch.empty(key.shape[:-1] + (key.shape[-1] // 2,), dtype=torch.uint8, device="cuda")
    return _quantize(lib, "hils_gpu_quantize_summaries_int4", key, out)


def quantize_int4h(lib, key, bias):
    """key fp32 [..., d], bias fp32 [...] -> (int4 codes against the fp16 scale [..., d / 2] uint8,
    (s16, b'16) pairs [..., 2] fp16) by the library's quantizer
    (hils::gpu::quantize_summaries_int4h; it refuses rows fp16 cannot hold)."""
    key = key.float().contiguous()
    bias = bias.float().contiguous()
    out = torch.empty(key.shape[:-1] + (key.shape[-1] // 2,), dtype=torch.uint8, device="cuda")
    pairs = torch.empty(key.shape[:-1] + (2,), dtype=torch.float16, device="cuda")
    fn = lib.hils_gpu_quantize_summaries_int4h
    fn.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64,
                   ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p]
    rc = fn(ptr(key), ptr(bias), key.numel() // key.shape[-1], key.shape[-1], ptr(out), ptr(pairs),
            ctypes.c_void_p(torch.cuda.current_stream().cuda_stream))
    if rc != 0:
        raise RuntimeError(lib.hils_gpu_decode_last_error().decode())
    return out, pairs


class HilsDecode:
    """Our decode step on a random cache of B sequences of T slots (hils preset); `summary`
    "bf16", "fp8" (e4m3 + row scales), "int4" (codes + row scales) or "int4h" (codes + (s16, b'16)
    pairs; the same random cache as "int4" from the same generator state), `kernel` a name of
    hils.gpu.DECODE_KERNEL."""

    def __init__(self, lib, B, T, gen, hq=HQ, hkv=HKV, d=D, s=S, w=W, k=K, summary="bf16",
                 kernel="fused"):
        nc = T // s
        bf = dict(device="cuda", dtype=torch.bfloat16)
        self.k = torch.randn(B, hkv, T, d, generator=gen, **bf)
        self.v = torch.randn(B, hkv, T, d, generator=gen, **bf)
        self.key = torch.randn(B, hq, nc, d, generator=gen, **bf)
        self.scale = self.pairs = None
        self.summary = summary
        # The fp32 rows of the hierarchical fusion's logits (every store; the fp32 b' too).
        self.key_fp32 = self.key.float()
        if summary == "fp8":
            self.key, self.scale = quantize_fp8(lib, self.key)
        if summary == "int4":
            self.key, self.scale = quantize_int4(lib, self.key)
        self.bias = torch.rand(B, hq, nc, generator=gen, device="cuda") * 3.0
        if summary == "int4h":
            self.key, self.pairs = quantize_int4h(lib, self.key, self.bias)
        self.q = torch.randn(B, hq, d, generator=gen, **bf)
        self.o = torch.empty(B, hq, d, device="cuda")
        self.lse = torch.empty(B, hq, device="cuda")
        self.sel = torch.empty(B, hkv, k, dtype=torch.int32, device="cuda")
        p = Decode()
        p.B, p.T, p.Hq, p.Hkv, p.d, p.dv, p.S, p.W, p.K = B, T, hq, hkv, d, d, s, w, k
        p.landmarks, p.softmax1, p.scale = 1, 0, 0.0  # the hils preset
        for field, name in (("key_rule", "taylor"), ("bias_rule", "entropy"),
                            ("group_rule", "max_normalized"), ("fusion", "hierarchical")):
            setattr(p, field, enum_value(lib, field, name))
        p.k, p.v, p.summary_key, p.summary_bias = ptr(self.k), ptr(self.v), ptr(self.key), ptr(self.bias)
        p.q, p.q_retrieval = ptr(self.q), ctypes.c_void_p(0)
        p.summary_type, p.kernel = SUMMARY_TYPES[summary], kernel_code(kernel)
        p.summary_scale, p.summary_key_fp32 = ptr(self.scale), ptr(self.key_fp32)
        p.summary_scale_bias = ptr(self.pairs)
        self.p = p
        self.out = DecodeOutputs(ptr(self.o), ptr(self.lse), ptr(self.sel), None, None, None, None)
        self.lib = lib
        nbytes = ctypes.c_size_t(0)
        self.check(lib.hils_gpu_decode_workspace_bytes(ctypes.byref(p), ctypes.byref(nbytes)))
        self.ws = torch.empty(max(1, nbytes.value), dtype=torch.uint8, device="cuda")

    def check(self, rc):
        if rc != 0:
            raise RuntimeError(self.lib.hils_gpu_decode_last_error().decode())

    def __call__(self):
        stream = ctypes.c_void_p(torch.cuda.current_stream().cuda_stream)
        self.check(self.lib.hils_gpu_decode_step(ctypes.byref(self.p), ctypes.byref(self.out),
                                                 ptr(self.ws), stream))

    def set_kernel(self, kernel):
        self.p.kernel = kernel_code(kernel)

    def bytes_read(self, B, T):
        """Cache bytes one step reads: summaries (k' + b' [+ the fp8 or int4 row scale] + the K
        selected fp32 rows; int4h: codes + the (s16, b'16) pair + the fp32 rows), plus window and
        K chunks of K/V per KV head."""
        nc = T // S
        row = self.key.shape[-1] * self.key.element_size() + 4 + (4 if self.scale is not None else 0)
        summaries = B * HQ * nc * row + B * HQ * K * D * 4
        tau = (T - 1 - W + 1) // S
        window = T - max(0, tau * S)
        kv = B * HKV * (K * S + window) * 2 * D * 2
        return summaries, kv


def scan_floor(run, B, T):
    """Times (graph replay, cold L2) each ScanProbe on run's cache; prints us and TB/s over the
    bytes launch 1 reads (summary rows, b', scales; the window's K/V)."""
    nc = T // S
    row = run.key.shape[-1] * run.key.element_size() + 4 + (4 if run.scale is not None else 0)
    probes = {"flat_read": SCAN_PROBES["flat_read"]} if run.summary == "int4h" else SCAN_PROBES
    tau = (T - 1 - W + 1) // S
    window_kv = B * HKV * (T - max(0, tau * S)) * 2 * D * 2
    scan_bytes = B * HQ * nc * row + window_kv
    lib = run.lib
    lib.hils_gpu_decode_scan_probe.argtypes = [ctypes.c_void_p, ctypes.c_int32, ctypes.c_void_p,
                                               ctypes.c_void_p]
    result = {}
    for name, probe in probes.items():
        def fn(probe=probe):
            stream = ctypes.c_void_p(torch.cuda.current_stream().cuda_stream)
            run.check(lib.hils_gpu_decode_scan_probe(ctypes.byref(run.p), probe, ptr(run.ws),
                                                     stream))
        graph_us, eager_us = best_us(fn)
        us = graph_us if graph_us is not None else eager_us
        nbytes = scan_bytes - (window_kv if name == "flat_read" else 0)
        result[name] = us
        print(f"  scan floor {run.summary} B={B} T={T} {name:>10}: {us:7.1f} us  {nbytes / 1e6:6.1f} MB  "
              f"{nbytes / us / 1e6:5.2f} TB/s", flush=True)
    return result


def handoffs(run, B, T):
    """Times (graph replay, cold L2) d25's (d29's) launch 1 alone and followed by four empty tail kernels
    (ScanProbe d25_scan, tail_handoffs); prints both and their difference."""
    lib = run.lib
    lib.hils_gpu_decode_scan_probe.argtypes = [ctypes.c_void_p, ctypes.c_int32, ctypes.c_void_p,
                                               ctypes.c_void_p]
    result = {}
    for name, probe in (("d25_scan", SCAN_PROBES["d25_scan"]), ("tail_handoffs", TAIL_HANDOFFS)):
        def fn(probe=probe):
            stream = ctypes.c_void_p(torch.cuda.current_stream().cuda_stream)
            run.check(lib.hils_gpu_decode_scan_probe(ctypes.byref(run.p), probe, ptr(run.ws),
                                                     stream))
        graph_us, eager_us = best_us(fn)
        result[name] = graph_us if graph_us is not None else eager_us
    print(f"  handoffs B={B} T={T}: launch 1 {result['d25_scan']:7.1f} us, + four empty tails "
          f"{result['tail_handoffs']:7.1f} us (+{result['tail_handoffs'] - result['d25_scan']:.1f})",
          flush=True)
    return result


def profile_kernels(run):
    """GPU time per kernel of our decode step (torch.profiler / CUPTI), 20 calls."""
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(20):
            flush_l2()
            run()
        torch.cuda.synchronize()
    print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=8, max_name_column_width=90))


def sdpa_us(q, k, v, backend):
    """One-token SDPA (q [B, Hq, 1, d], GQA KV) time, or None when the backend refuses."""
    try:
        with sdpa_kernel(backend):
            fn = lambda: F.scaled_dot_product_attention(q, k, v, enable_gqa=True)
            fn()
            torch.cuda.synchronize()
            graph, eager = best_us(fn, reps=10)
        return graph if graph is not None else eager
    except RuntimeError as e:
        print(f"    {backend}: refused ({str(e).splitlines()[0][:100]})")
        return None


def flex_us(q, k, v, sel, T):
    """flex_attention decode over the window + the selected chunks (mask given), compiled."""
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention
    B = q.shape[0]
    tau = (T - W) // S
    lo = max(0, tau * S)
    chunk_of = torch.zeros(B, HKV, T // S + 1, dtype=torch.bool, device="cuda")
    chunk_of.scatter_(2, sel.long().clamp(min=0), True)
    chunk_of = chunk_of.repeat_interleave(HQ // HKV, dim=1)

    def mask_mod(b, h, q_idx, kv_idx):
        return (kv_idx >= lo) | chunk_of[b, h, kv_idx // S]

    mask = create_block_mask(mask_mod, B, HQ, 1, T, device="cuda", BLOCK_SIZE=(128, S),
                             _compile=True)
    flex = torch.compile(flex_attention, dynamic=False)
    fn = lambda: flex(q, k, v, block_mask=mask, enable_gqa=True, kernel_options={"BLOCK_N": S})
    fn()
    torch.cuda.synchronize()
    graph, eager = best_us(fn, reps=10)
    return graph if graph is not None else eager


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--lib", required=True)
    ap.add_argument("--out", default="decode.json")
    ap.add_argument("--no-flex", action="store_true")
    ap.add_argument("--profile", action="store_true", help="kernel times of B=8 and 32, T=512K")
    ap.add_argument("--variants", help="comma-separated <kernel>_<summary> labels (no table)")
    ap.add_argument("--batches", help="comma-separated B (default 1,8,32; no table)")
    ap.add_argument("--lengths", help="comma-separated T (default 32K,128K,512K; no table)")
    ap.add_argument("--flush", choices=("write", "read"), default="write",
                    help="empty the L2 between calls by writing (default) or reading 512 MiB")
    ap.add_argument("--scan-floor", action="store_true",
                    help="time launch 1 alone and its read floor per shape (fp8 summaries; "
                         "int4 too when a variant uses int4)")
    ap.add_argument("--handoffs", action="store_true",
                    help="time launch 1 alone and with four empty tail launches (fp8 summaries)")
    args = ap.parse_args()
    global FLUSH
    FLUSH = args.flush
    lib = load_library(args.lib)  # --variants names are checked against the library's kernels
    variants = tuple(variant(v) for v in args.variants.split(",")) if args.variants else VARIANTS
    batches = tuple(int(b) for b in args.batches.split(",")) if args.batches else BATCHES
    lengths = tuple(int(t) for t in args.lengths.split(",")) if args.lengths else LENGTHS
    table = (variants, batches, lengths) == (VARIANTS, BATCHES, LENGTHS)
    gen = torch.Generator(device="cuda")
    gen.manual_seed(4321)
    print(f"device: {torch.cuda.get_device_name()}  torch {torch.__version__}  L2 flush: {FLUSH}")
    bw = copy_bandwidth()
    print(f"copy bandwidth (read + write, 4 GiB copy): {bw / 1e12:.2f} TB/s")
    rows = []
    for B in batches:
        for T in lengths:
            dense = B * HKV * T * 2 * D * 2
            row = dict(B=B, T=T, dense_bytes=dense, floor_us=dense / bw * 1e6)
            runs = {}
            # int4 and int4h in the order the variants name them, on the same random cache (the
            # generator's state restored before each); the first one's outputs are compared with
            # the other's
            compact_first, compact_state = None, None
            compact = tuple(dict.fromkeys(v[2] for v in variants if v[2] in ("int4", "int4h")))
            for summary in ("bf16", "fp8") + compact:
                if summary in compact:
                    if compact_state is None:
                        compact_state = gen.get_state()
                    gen.set_state(compact_state)
                run = HilsDecode(lib, B, T, gen, summary=summary)
                row[f"summary_bytes_{summary}"], row["sparse_kv_bytes"] = run.bytes_read(B, T)
                first = None  # the first variant's outputs on these summaries
                for label, kernel, kind in variants:
                    if kind != summary:
                        continue
                    run.set_kernel(kernel)
                    graph_us, eager_us = best_us(run)
                    row[f"{label}_us"] = graph_us if graph_us is not None else eager_us
                    row[f"{label}_eager_us"] = eager_us
                    # o, lse and the selection of the last timed call, against the first variant's
                    got = (label, run.o.clone(), run.lse.clone(), run.sel.clone())
                    if first is None:
                        first = got
                        if summary in compact and compact_first is None:
                            compact_first = got
                        elif summary in compact:
                            report_difference(label, compact_first, got, row)
                    else:
                        same = all(torch.equal(a, b) for a, b in zip(first[1:], got[1:]))
                        row[f"{label}_same_bits_as_{first[0]}"] = same
                        print(f"    {label}: o, lse, selection {'equal' if same else 'DIFFER from'} "
                              f"{first[0]}'s bit for bit", flush=True)
                        if not same:
                            report_difference(label, first, got, row)
                    if args.profile and B in (8, 32) and T == LENGTHS[-1] and kernel != "d5":
                        print(f"  profile {label}:")
                        profile_kernels(run)
                if args.scan_floor and summary == "fp8":
                    row["scan_floor_us"] = scan_floor(run, B, T)
                if args.scan_floor and summary in ("int4", "int4h"):
                    row[f"scan_floor_{summary}_us"] = scan_floor(run, B, T)
                if args.handoffs and summary == "fp8":
                    row["handoffs_us"] = handoffs(run, B, T)
                runs[summary] = run
            run = runs["bf16"]
            q4 = run.q.unsqueeze(2)
            for name, backend in (("flash", SDPBackend.FLASH_ATTENTION),
                                  ("efficient", SDPBackend.EFFICIENT_ATTENTION),
                                  ("cudnn", SDPBackend.CUDNN_ATTENTION)):
                row[f"{name}_us"] = sdpa_us(q4, run.k, run.v, backend)
            if not args.no_flex and T == LENGTHS[-1] and B <= 8:
                try:
                    row["flex_us"] = flex_us(q4, run.k, run.v, run.sel, T)
                except Exception as e:  # noqa: BLE001  (a peer that cannot run is reported)
                    print(f"    flex_attention: failed ({str(e).splitlines()[0][:120]})")
            for label, _, _ in variants:
                row[f"floor_over_{label}"] = row["floor_us"] / row[f"{label}_us"]
            rows.append(row)
            print(f"B={B:>2} T={T:>7}  floor {row['floor_us']:8.1f} us  " +
                  "  ".join(f"{label} {row[label + '_us']:7.1f} ({row['floor_over_' + label]:5.2f}x)"
                            for label, _, _ in variants) + "  " +
                  "  ".join(f"{n} {row.get(n + '_us') or math.nan:8.1f}"
                            for n in ("flash", "efficient", "cudnn", "flex")), flush=True)
            del run, runs, q4
            torch.cuda.empty_cache()
    with open(args.out, "w") as fh:
        json.dump(dict(device=torch.cuda.get_device_name(), copy_bandwidth=bw, rows=rows), fh,
                  indent=1)
    if not table:
        return
    print(f"\ncopy bandwidth {bw / 1e12:.2f} TB/s; bytes are of the cache read per step (all B); "
          "summaries MB bf16 / fp8, then the window and K chunks of K/V")
    print("|  B |       T | dense KV MB | summaries MB bf16 / fp8 | K/V MB | floor us | d5 bf16 us |"
          " fused bf16 us | d29 fp8 us | fused fp8 us | floor/fused fp8 | floor/d29 fp8 |"
          " floor/fused bf16 | floor/d5 | flash us | cuDNN us | flex us |")
    print("|---:|--------:|------------:|------------------------:|-------:|---------:|-----------:|"
          "--------------:|----------:|-------------:|----------------:|-------------:|"
          "-----------------:|---------:|---------:|---------:|--------:|")
    f = lambda x: f"{x:8.1f}" if x else "       –"
    for r in rows:
        print(f"| {r['B']:>2} | {r['T']:>7} | {r['dense_bytes'] / 1e6:11.1f} | "
              f"{r['summary_bytes_bf16'] / 1e6:11.1f} / {r['summary_bytes_fp8'] / 1e6:9.1f} | "
              f"{r['sparse_kv_bytes'] / 1e6:6.1f} | {r['floor_us']:8.1f} | {r['d5_bf16_us']:10.1f} | "
              f"{r['fused_bf16_us']:13.1f} | {r['d29_fp8_us']:10.1f} | {r['fused_fp8_us']:12.1f} | "
              f"{r['floor_over_fused_fp8']:15.2f} | {r['floor_over_d29_fp8']:13.2f} | "
              f"{r['floor_over_fused_bf16']:16.2f} | "
              f"{r['floor_over_d5_bf16']:8.2f} | {f(r.get('flash_us'))} | {f(r.get('cudnn_us'))} | "
              f"{f(r.get('flex_us')):>7} |")


if __name__ == "__main__":
    main()

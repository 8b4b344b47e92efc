"""HiLS forward (our kernels) vs PyTorch SDPA full causal attention (flash and cuDNN), in the
paper's small-model setting: Hq=16, Hkv=2, d=64, S=64, K=32, W=512, bf16, batch 1, prefill.

Run by scripts/gpu_check.sh. Times are medians of CUDA-event-timed repetitions after warm-up.
The table's three columns (the HiLS forward as a caller runs it, one hils_gpu_run call, and the
two SDPA backends) are medians of up to 25 calls after 3 warm-up calls (fewer where the calls
pass ~5 s), so that sub-millisecond differences at small T are not one call's noise; the
stages and the kernels by name are medians of 3. The HiLS column returns o in fp32; with
--hils-o bf16 it is the forward that keeps the window's rows in fp16 and returns o in bf16, as
SDPA does for bf16 inputs (four calls: hils_gpu_window_rows, summaries, selection,
hils_gpu_fuse_rows); forward_h16swa and forward_h16swa_bf16o are timed either way.
Beside them (unless --no-flex) a sparse peer: FlexAttention, torch.compile'd, given a block mask
of the same attention work and no selection (flex_same_work_ms), against HiLS's window and
sparse stages, the part of the forward that does that work.
"""
import argparse
import json
import math
import sys

from script_needs import needs
needs("torch")

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

sys.path.insert(0, __import__("os").path.dirname(__file__))
import hils.gpu as hc  # noqa: E402  (python/hils/gpu; script_needs puts python/ first)

HQ, HKV, D, S, K, W = 16, 2, 64, 64, 32, 512
# The sparse stage of the forwards with rows other than fp32 (hils_gpu_fuse_rows takes them from
# chunked_v24 on; gpu/NOTES.md "Sparse v23, v24, v25").
ROWS_SPARSE_KERNEL = "chunked_v36"


def time_ms(fn, warmup=1, reps=5, budget_ms=20000.0, before=None):
    """Median of CUDA-event-timed calls of fn after warm-up; fewer reps for slow calls. before,
    if given, runs ahead of each timed call, outside the timing."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        if before:
            before()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
        if sum(times) > budget_ms:
            break
    times.sort()
    return times[len(times) // 2]


def headline_ms(fn):
    """The table's timing: the median of up to 25 calls after 3 warm-up calls."""
    return time_ms(fn, warmup=3, reps=25, budget_ms=5000.0)


def dense_matmul_tflops():
    n = 8192
    a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    ms = time_ms(lambda: torch.matmul(a, b), warmup=3, reps=10)
    return 2 * n**3 / (ms * 1e-3) / 1e12


def sdpa_ms(q, k, v, backend):
    """Full causal SDPA time, or None when the backend refuses these inputs."""
    qq, kk, vv = q.unsqueeze(0), k.unsqueeze(0), v.unsqueeze(0)
    try:
        with sdpa_kernel(backend):
            fn = lambda: F.scaled_dot_product_attention(qq, kk, vv, is_causal=True, enable_gqa=True)
            fn()
            torch.cuda.synchronize()
            return headline_ms(fn)
    except RuntimeError as first:
        # Some backends take GQA only as repeated KV heads.
        try:
            kr = kk.repeat_interleave(HQ // HKV, dim=1)
            vr = vv.repeat_interleave(HQ // HKV, dim=1)
            with sdpa_kernel(backend):
                fn = lambda: F.scaled_dot_product_attention(qq, kr, vr, is_causal=True)
                fn()
                torch.cuda.synchronize()
                return headline_ms(fn)
        except RuntimeError as second:
            print(f"  {backend}: unavailable ({str(first)[:80]} / {str(second)[:80]})")
            return None


def paper_problem(T, gen):
    """The benchmarks' problem: the paper's shape at length T, q, k and v drawn from gen (bf16
    normals, in this order, so that every script sees the same inputs for the same seed). The
    problem holds raw device pointers into q, k and v: keep them alive while it is used."""
    q = torch.randn(HQ, T, D, device="cuda", dtype=torch.bfloat16, generator=gen)
    k = torch.randn(HKV, T, D, device="cuda", dtype=torch.bfloat16, generator=gen)
    v = torch.randn(HKV, T, D, device="cuda", dtype=torch.bfloat16, generator=gen)
    return q, k, v, hc.make_problem(q, k, v, S, W, K, "hils")


def forward_with_rows(lib, st, o_dtype):
    """The forward with the window's rows kept in fp16 (no o_window returned) and o in o_dtype
    (fp32, or bf16 as SDPA returns for bf16 inputs), the sparse stage ROWS_SPARSE_KERNEL."""
    o_swa16 = torch.empty(st.o_swa.shape, device=st.o_swa.device, dtype=torch.float16)
    o = st.o if o_dtype == torch.float32 else torch.empty(st.o.shape, device=st.o.device, dtype=o_dtype)

    def forward(select_kernel=None):
        default = hc.sparse_kernel(lib)
        hc.set_sparse(lib, ROWS_SPARSE_KERNEL)
        try:
            st.forward(select_kernel, rows=(o_swa16, o))
        finally:
            hc.set_sparse(lib, default)
    return forward


def hils_run(lib, T, gen, hils_o="f32"):
    """hils_o: the forward of the total (the table's HiLS column): "f32" (one hils_gpu_run: o in
    fp32) or "bf16" (four calls: the window's rows kept in fp16, o in bf16)."""
    q, k, v, p = paper_problem(T, gen)
    st = hc.Stages(lib, p)
    stage_ms = {
        "window": time_ms(st.window, reps=3),
        "summarize": time_ms(st.summarize, reps=3),
        "select": time_ms(st.select, reps=3),
        "sparse": time_ms(st.fuse, reps=3),
        # Every kept version of the selection by name ("select" is the library's default; the
        # versions removed in session 17 were measured at commit ad5fb84, gpu/NOTES.md): two-pass
        # v4.3, one-pass v5, buffered v8, v8 on wgmma with 128 queries per block, pass 2 trimmed and
        # two tiles per pass-1 step (v15), with the scores by a kernel of their own from bf16 k' in
        # fewer instructions (v21, v22), and pass 2's bias and log Z_hat as a fifth wgmma k-step
        # (v25, which may differ from v22 at near ties), and v22 with the scores from fp32 k' (v26)
        # or an fp16 copy of it (v27, the default) (gpu/NOTES.md).
        "select_v4": time_ms(lambda: st.select("two_pass_v4"), reps=3),
        "select_v5": time_ms(lambda: st.select("one_pass_v5"), reps=3),
        "select_v8": time_ms(lambda: st.select("two_pass_v8"), reps=3),
        "select_v15": time_ms(lambda: st.select("two_pass_v15"), reps=3),
        "select_v21": time_ms(lambda: st.select("two_pass_v21"), reps=3),
        "select_v22": time_ms(lambda: st.select("two_pass_v22"), reps=3),
        "select_v25": time_ms(lambda: st.select("two_pass_v25"), reps=3),
        "select_v26": time_ms(lambda: st.select("two_pass_v26"), reps=3),
        "select_v27": time_ms(lambda: st.select("two_pass_v27"), reps=3),
    }
    # Every kept version of the sparse stage by name ("sparse" is the library's default).
    default_sparse = hc.sparse_kernel(lib)
    for kernel in hc.SPARSE_KERNEL:
        hc.set_sparse(lib, kernel)
        stage_ms["sparse_" + kernel.split("_")[-1]] = time_ms(st.fuse, reps=3)
    hc.set_sparse(lib, default_sparse)
    # Every kept version of the window kernel by name ("window" is the library's default), and the
    # generic SIMT summaries ("summarize_simt") against the packed ones ("summarize").
    default_window = hc.window_kernel(lib)
    for kernel in hc.WINDOW_KERNEL:
        hc.set_window(lib, kernel)
        stage_ms["window_" + kernel.split("_")[-1]] = time_ms(st.window, reps=3)
    hc.set_window(lib, default_window)
    hc.set_packed(lib, False)
    stage_ms["summarize_simt"] = time_ms(st.summarize, reps=3)
    hc.set_packed(lib, True)
    # The forward with the window's rows in fp16 (hils_gpu_window_rows, no o_window returned) and
    # an fp32 / a bf16 o (hils_gpu_fuse_rows), as four calls; the window stage alone in fp16.
    forward_h16 = forward_with_rows(lib, st, torch.float32)
    forward_h16_bf16o = forward_with_rows(lib, st, torch.bfloat16)
    o_swa16 = torch.empty(st.o_swa.shape, device=st.o_swa.device, dtype=torch.float16)
    stage_ms["window_h16"] = time_ms(lambda: st.window_rows(o_swa16), reps=3)
    # The table's HiLS column: hils_gpu_run (fp32 o) or, with --hils-o bf16, the forward with
    # fp16 window rows and a bf16 o.
    total = headline_ms(st.run if hils_o == "f32" else forward_h16_bf16o)
    # The same forward as four calls (one per stage), as the by-name forwards below run it.
    stage_ms["forward_stages"] = time_ms(st.forward, reps=3)
    stage_ms["forward_h16swa"] = time_ms(forward_h16, reps=3)
    stage_ms["forward_h16swa_bf16o"] = time_ms(forward_h16_bf16o, reps=3)
    stage_ms["forward_v4"] = time_ms(lambda: st.forward("two_pass_v4"), reps=3)
    stage_ms["forward_v8"] = time_ms(lambda: st.forward("two_pass_v8"), reps=3)
    # Selected work of the sparse stage: QK and PV over S-1 tokens of each selected chunk.
    selected = int((st.selection >= 0).sum().item())
    sparse_flops = selected * (HQ // HKV) * 4 * (S - 1) * D
    return q, k, v, total, stage_ms, sparse_flops, st.selection.clone()


def check_flex_work(out, q4, k4, v4, member):
    """That FlexAttention did the work its block mask was meant to name (small T only): its output
    against SDPA's math backend in fp32 given, as a dense boolean mask, each query's window (the
    last W slots) and every slot of the chunks `member` [Hkv, T / 128, T / S] marks for its block."""
    T, g = q4.shape[2], HQ // HKV
    qi = torch.arange(T, device=q4.device)
    window = (qi[None, :] <= qi[:, None]) & (qi[:, None] - qi[None, :] < W)
    chunks = member.repeat_interleave(128, dim=1).repeat_interleave(S, dim=2)[:, :T, :T]
    allowed = (window[None] | chunks).repeat_interleave(g, dim=0).unsqueeze(0)
    with sdpa_kernel(SDPBackend.MATH):
        ref = F.scaled_dot_product_attention(q4.float(), k4.float().repeat_interleave(g, dim=1),
                                             v4.float().repeat_interleave(g, dim=1),
                                             attn_mask=allowed)
    err = (out.float() - ref).abs().max().item()
    print(f"  flex check at T={T}: max |flex - SDPA math with the same mask| = {err:.3g}"
          f"{'' if err < 0.03 else '  (FAILED: the mask is not the work it names)'}", flush=True)


def flex_same_work_ms(q, k, v, selection):
    """FlexAttention (torch.compile'd flex_attention, GQA) over a block mask of the work HiLS's
    window and sparse stages do, with no selection of its own: for each block of 128 queries the
    64-slot blocks of its sliding window (partial blocks: causal, the last W slots) and, as full
    blocks, the K chunks that the block's last query selected (HiLS's own selection, `selection`
    [Hkv, T, K], each KV group's for its G heads) that lie before the window's first block. So a
    query attends ~W + K S slots, as in HiLS; what differs is that the chunks are shared by the
    128 queries of a block (a block-sparse kernel's granularity). Median ms, or None where
    FlexAttention refuses."""
    from torch.nn.attention.flex_attention import BlockMask, flex_attention
    T, dev, i32 = q.shape[1], q.device, torch.int32
    n_qb, n_kb = T // 128, T // S
    first = torch.arange(n_qb, device=dev) * 128
    win_lo = (first - W + 1).clamp(min=0) // S           # first block the window touches
    win_hi = (first + 127) // S                           # the diagonal block
    cols = torch.arange(n_kb, device=dev)
    # Partial blocks: the window's, ascending; entries past kv_num_blocks are not read.
    win_idx = (win_lo[:, None] + cols[None, :]).clamp(max=n_kb - 1).to(i32)
    win_num = (win_hi - win_lo + 1).to(i32)
    # Full blocks: the last query's chunks before win_lo, ascending, the rest padded.
    sel = selection[:, first + 127, :].long()             # [Hkv, n_qb, K]
    valid = (sel >= 0) & (sel < win_lo[None, :, None])
    chosen, _ = torch.where(valid, sel, n_kb).sort(dim=-1)
    full_idx = torch.zeros(HKV, n_qb, n_kb, device=dev, dtype=i32)
    full_idx[..., :K] = chosen.clamp(max=n_kb - 1).to(i32)
    full_num = valid.sum(-1).to(i32)
    g = HQ // HKV
    per_head = lambda x: x.repeat_interleave(g, dim=0).unsqueeze(0).contiguous()
    block_mask = BlockMask.from_kv_blocks(
        win_num.expand(HQ, n_qb).unsqueeze(0).contiguous(),
        win_idx.expand(HQ, n_qb, n_kb).unsqueeze(0).contiguous(),
        per_head(full_num), per_head(full_idx), BLOCK_SIZE=(128, S),
        mask_mod=lambda b, h, qi, ki: (ki <= qi) & (qi - ki < W), seq_lengths=(T, T))
    print(f"  flex mask: per 128-query block {full_num.float().mean().item():.1f} full (selected) "
          f"and {win_num.float().mean().item():.1f} partial (window) blocks of {S} slots", flush=True)
    flex = torch.compile(flex_attention, dynamic=False)
    q4, k4, v4 = q.unsqueeze(0), k.unsqueeze(0), v.unsqueeze(0)
    for options in ({"BLOCK_M": 128, "BLOCK_N": S}, None):
        try:
            fn = lambda: flex(q4, k4, v4, block_mask=block_mask, enable_gqa=True,
                              kernel_options=options)
            out = fn()
            torch.cuda.synchronize()
            if not bool(torch.isfinite(out).all()):
                print("  flex_attention: non-finite output")
                return None
            if T <= 8192:
                member = torch.zeros(HKV, n_qb, n_kb + 1, dtype=torch.bool, device=dev)
                member.scatter_(2, torch.where(valid, sel, n_kb), True)
                check_flex_work(out, q4, k4, v4, member[..., :n_kb])
            return headline_ms(fn)
        except Exception as e:  # a compile or launch refusal: try the defaults, then give up
            print(f"  flex_attention (kernel_options {options}): failed "
                  f"({str(e).splitlines()[0][:120] if str(e) else type(e).__name__})")
    return None


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--lib", required=True)
    ap.add_argument("--max-T", type=int, default=524288)
    ap.add_argument("--out", default="bench.json")
    ap.add_argument("--no-flex", action="store_true",
                    help="skip the FlexAttention peer (flex_same_work_ms)")
    ap.add_argument("--hils-o", choices=["f32", "bf16"], default="f32",
                    help="the HiLS column's forward: f32 (one hils_gpu_run, o in fp32) or bf16 (the "
                         "window's rows kept in fp16, o in bf16 as SDPA returns; four calls)")
    args = ap.parse_args()
    lib = hc.Library(args.lib)
    gen = torch.Generator(device="cuda")
    gen.manual_seed(1234)
    print(f"device: {torch.cuda.get_device_name()}  torch {torch.__version__}  HiLS forward: "
          f"o in {args.hils_o}" + (" (window rows in fp16)" if args.hils_o == "bf16" else ""))
    peak = dense_matmul_tflops()
    print(f"dense bf16 matmul (8192^3, torch.matmul): {peak:.0f} TFLOP/s")
    rows = []
    T = 8192
    while T <= args.max_T:
        try:
            q, k, v, hils_ms, stage_ms, flops, selection = hils_run(lib, T, gen, args.hils_o)
            flash = sdpa_ms(q, k, v, SDPBackend.FLASH_ATTENTION)
            cudnn = sdpa_ms(q, k, v, SDPBackend.CUDNN_ATTENTION)
            flex = None if args.no_flex else flex_same_work_ms(q, k, v, selection)
        except torch.cuda.OutOfMemoryError:
            print(f"T={T}: out of memory, stopping")
            break
        row = dict(T=T, hils_ms=hils_ms, flash_ms=flash, cudnn_ms=cudnn, flex_ms=flex,
                   stages_ms=stage_ms, sparse_tflops=flops / (stage_ms["sparse"] * 1e-3) / 1e12)
        rows.append(row)
        print(f"T={T:>7}  hils {hils_ms:9.2f} ms  flash {flash or float('nan'):9.2f}  "
              f"cudnn {cudnn or float('nan'):9.2f}  flex {flex or float('nan'):9.2f}  stages " +
              " ".join(f"{n}={t:.2f}" for n, t in stage_ms.items()) +
              f"  sparse {row['sparse_tflops']:.1f} TFLOP/s", flush=True)
        del q, k, v, selection
        torch.cuda.empty_cache()
        T *= 2
    print("\n|       T |  HiLS ms | flash ms | cuDNN ms | best/HiLS | sparse TFLOP/s | window + sparse ms |"
          " flex ms | flex/(window + sparse) |")
    print("|--------:|---------:|---------:|---------:|----------:|---------------:|-------------------:|"
          "--------:|-----------------------:|")
    crossover = None
    for r in rows:
        best = min(x for x in (r["flash_ms"], r["cudnn_ms"], math.inf) if x is not None)
        r["speedup_vs_best"] = best / r["hils_ms"]
        if crossover is None and r["speedup_vs_best"] >= 1.0:
            crossover = r["T"]
        same_work = r["stages_ms"]["window"] + r["stages_ms"]["sparse"]
        print(f"| {r['T']:>7} | {r['hils_ms']:8.2f} | {r['flash_ms'] or math.nan:8.2f} | "
              f"{r['cudnn_ms'] or math.nan:8.2f} | {r['speedup_vs_best']:9.2f} | "
              f"{r['sparse_tflops']:14.1f} | {same_work:18.2f} | {r['flex_ms'] or math.nan:7.2f} | "
              f"{(r['flex_ms'] or math.nan) / same_work:22.2f} |")
    print(f"dense bf16 matmul rate: {peak:.0f} TFLOP/s")
    print(f"crossover (first T where HiLS beats the faster SDPA backend): {crossover}")
    if rows:
        print(f"speedup at T={rows[-1]['T']}: {rows[-1]['speedup_vs_best']:.2f}x vs the faster backend")
    with open(args.out, "w") as f:
        json.dump(dict(device=torch.cuda.get_device_name(), matmul_tflops=peak, rows=rows,
                       crossover=crossover, hils_o=args.hils_o), f, indent=1)


if __name__ == "__main__":
    main()

"""Dumps one decode step (gpu/include/hils/gpu/decode.hpp) in the `hils verify` format
(data/verify_format.md): B = 2 sequences of T slots, one file per sequence,
verify_decode_seq<b>.h5, with /queries = [T - 1] (the cache's last slot) and the cache's
summaries (the prefill's summarize stage, rounded to bf16 as the cache keeps them) as
/outputs/summary_key and summary_bias; then the same step with fp8 e4m3 summaries (the library's
quantizer, k' read back as e4m3 x row scale) as verify_decode_fp8_seq<b>.h5 with
score_precision fp8_e4m3, and with --summaries ...,int4 the same with int4 summaries (codes -7..7 x
row scale) as verify_decode_int4_seq<b>.h5 with score_precision int4, and with int4h (d40's
store: codes x the fp16 scale s16, b' read as fp16) as verify_decode_int4h_seq<b>.h5 with
score_precision int4_h (/outputs/summary_bias then holds the fp16 b' the scan scored with). Run by `scripts/gpu_check.sh --decode` on the device
machine; `hils verify FILE` judges the files wherever the CLI is built."""
import argparse
import json
import os
import sys

from script_needs import needs
needs("h5py", "numpy", "torch")

import h5py
import numpy as np
import torch

sys.path.insert(0, os.path.dirname(__file__))
import bench_decode as bd  # noqa: E402
import hils.gpu as hc  # noqa: E402  (python/hils/gpu; script_needs puts python/ first)

B, T, HQ, HKV, D, S, W, K = 2, 2052, 8, 2, 64, 64, 256, 8  # ~10 MB per file


def main():
    global T, K
    ap = argparse.ArgumentParser()
    ap.add_argument("--lib", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--kernel", default="fused",
                    help="a decode kernel by name: fused (the default), d39, d36, ... (the library's "
                         "hils_gpu_enum_names(\"decode_kernel\"); a removed one is named as such)")
    ap.add_argument("--summaries", default="bf16,fp8",
                    help="comma-separated summary types to dump (bf16, fp8, int4, int4h: d40 only)")
    ap.add_argument("--t", type=int, default=T, help="slots per sequence (default %(default)s)")
    ap.add_argument("--k", type=int, default=K,
                    help="selected chunks (default %(default)s; d36 and d39 select in their "
                         "chunk tiles only with K = 32, which needs T >= ~2,400 here)")
    args = ap.parse_args()
    T, K = args.t, args.k
    lib = hc.Library(args.lib)
    bd.kernel_code(args.kernel)  # an unknown or removed kernel: named before any work
    gen = torch.Generator(device="cuda")
    gen.manual_seed(20261122)
    bf = dict(device="cuda", dtype=torch.bfloat16, generator=gen)
    seqs, keys, biases = [], [], []
    for _ in range(B):
        q = torch.randn(HQ, T, D, **bf)
        k = torch.randn(HKV, T, D, **bf)
        v = torch.randn(HKV, T, D, **bf)
        qr = (q.float() + 0.3 * torch.randn(HQ, T, D, device="cuda", generator=gen)).bfloat16()
        st = hc.Stages(lib, hc.make_problem(q, k, v, S, W, K, "hils", q_retrieval=qr))
        st.summarize()
        seqs.append((q, k, v, qr))
        keys.append(st.key.float())
        biases.append(st.bias)
    for summary in args.summaries.split(","):
        if summary not in bd.SUMMARY_TYPES:
            raise SystemExit(f"--summaries: unknown '{summary}' (expected bf16, fp8, int4 or int4h)")
        dump_step(lib, gen, seqs, keys, biases, summary, args.out, args.kernel)


def dump_step(lib, gen, seqs, keys, biases, summary, out_dir, kernel="fused"):
    """One decode step of `kernel` over `seqs` with `summary` ("bf16", "fp8", "int4" or "int4h")
    summaries, one file per sequence."""
    nc = T // S
    run = bd.HilsDecode(lib.lib, B, T, gen, hq=HQ, hkv=HKV, d=D, s=S, w=W, k=K, summary=summary,
                        kernel=kernel)
    run.k.copy_(torch.stack([s[1] for s in seqs]))
    run.v.copy_(torch.stack([s[2] for s in seqs]))
    if summary == "fp8":
        run.key_bf16 = torch.stack(keys).bfloat16()
        run.key, run.scale = bd.quantize_fp8(lib.lib, torch.stack(keys))
        run.p.summary_key, run.p.summary_scale = hc.ptr(run.key), hc.ptr(run.scale)
        run.p.summary_key_bf16 = hc.ptr(run.key_bf16)
        stored = run.key.float() * run.scale[..., None]  # what the step scores with
    elif summary == "int4":
        run.key_bf16 = torch.stack(keys).bfloat16()
        run.key, run.scale = bd.quantize_int4(lib.lib, torch.stack(keys))
        run.p.summary_key, run.p.summary_scale = hc.ptr(run.key), hc.ptr(run.scale)
        run.p.summary_key_bf16 = hc.ptr(run.key_bf16)
        codes = torch.stack([(run.key & 0xF), (run.key >> 4)], dim=-1).flatten(-2).float() - 8.0
        stored = codes * run.scale[..., None]  # what the step scores with
    elif summary == "int4h":
        run.key_bf16 = torch.stack(keys).bfloat16()
        run.key, run.pairs = bd.quantize_int4h(lib.lib, torch.stack(keys), torch.stack(biases))
        run.p.summary_key, run.p.summary_scale = hc.ptr(run.key), hc.ptr(None)
        run.p.summary_scale_bias = hc.ptr(run.pairs)
        run.p.summary_key_bf16 = hc.ptr(run.key_bf16)
        codes = torch.stack([(run.key & 0xF), (run.key >> 4)], dim=-1).flatten(-2).float() - 8.0
        stored = codes * run.pairs[..., 0].float()[..., None]  # what the step scores with
    else:
        run.key.copy_(torch.stack(keys).bfloat16())
        stored = run.key.float()
    run.bias.copy_(torch.stack(biases))
    run.q.copy_(torch.stack([s[0][:, T - 1] for s in seqs]))
    qr_last = torch.stack([s[3][:, T - 1] for s in seqs]).contiguous()
    run.p.q_retrieval = hc.ptr(qr_last)
    f32 = dict(device="cuda", dtype=torch.float32)
    o_window, lse_window = torch.empty(B, HQ, D, **f32), torch.empty(B, HQ, **f32)
    surrogate, weights = torch.empty(B, HQ, nc, **f32), torch.empty(B, HQ, K + 2, **f32)
    run.out.o_window, run.out.lse_window = hc.ptr(o_window), hc.ptr(lse_window)
    run.out.surrogate, run.out.fusion_weights = hc.ptr(surrogate), hc.ptr(weights)
    run()
    torch.cuda.synchronize()
    spec = {"preset": "hils", "S": S, "W": W, "K": K, "landmarks": True}
    np32 = lambda t: t.float().cpu().numpy()
    tag = "" if summary == "bf16" else f"_{summary}"
    for b in range(B):
        q, k, v, qr = seqs[b]
        path = os.path.join(out_dir, f"verify_decode{tag}_seq{b}.h5")
        with h5py.File(path + ".tmp", "w") as f:
            f.attrs["format"] = "hils-verify"
            f.attrs["format_version"] = np.int64(1)
            f.attrs["spec"] = json.dumps(spec)
            f.attrs["input_precision"] = "bf16"
            # the cache keeps k' in bf16, in e4m3 with a per-row power-of-two scale, or in int4
            # codes with a per-row fp32 scale (int4h: an fp16 scale and b')
            f.attrs["score_precision"] = {"bf16": "bf16", "fp8": "fp8_e4m3", "int4": "int4",
                                          "int4h": "int4_h"}[summary]
            f.attrs["kernel"] = f"hils::gpu decode_step {kernel}, {summary} summaries (B = {B}, sequence {b})"
            f["inputs/q"], f["inputs/k"], f["inputs/v"] = np32(q), np32(k), np32(v)
            f["inputs/q_retrieval"] = np32(qr)
            f["queries"] = np.array([T - 1], dtype=np.int64)
            f["outputs/o"], f["outputs/lse"] = np32(run.o[b, :, None]), np32(run.lse[b, :, None])
            f["outputs/o_window"] = np32(o_window[b, :, None])
            f["outputs/lse_window"] = np32(lse_window[b, :, None])
            f["outputs/selection"] = run.sel[b, :, None].cpu().numpy().astype(np.int32)
            f["outputs/surrogate_scores"] = np32(surrogate[b, :, None])
            f["outputs/fusion_weights"] = np32(weights[b, :, None])
            f["outputs/summary_key"] = np32(stored[b])
            # int4h: the fp16 b' of the pairs (what the scan scored with); else the fp32 b'
            f["outputs/summary_bias"] = np32(run.pairs[b, ..., 1] if summary == "int4h" else biases[b])
        os.replace(path + ".tmp", path)
        print(f"wrote {path}")

if __name__ == "__main__":
    main()

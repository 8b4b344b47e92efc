"""Dumps one decode step (gpu/include/hils/gpu/decode.hpp) in the `hils verify` format
(data/verify_format.md): B = 2 sequences of T slots, one file per sequence,
verify_decode_seq<b>.h5, with /queries = [T - 1] (the cache's last slot) and the cache's
summaries (hils.gpu.DecodeCache filled with slots < T - 1, then slot T - 1 appended and
stepped: the library's summarize stage, rounded to bf16 as the cache keeps them) as
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

from script_needs import needs
needs("h5py", "numpy", "torch")

import h5py
import numpy as np
import torch

import hils.gpu as hc  # noqa: E402  (python/hils/gpu; script_needs puts python/ first)

B, T, HQ, HKV, D, S, W, K = 2, 2052, 8, 2, 64, 64, 256, 8  # ~10 MB per file


def main():
    global T, K
    ap = argparse.ArgumentParser()
    ap.add_argument("--lib", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--kernel", default=None,
                    help="a decode kernel by name: d39, d36, ... (the library's hils_gpu_enum_names"
                         "(\"decode_kernel\"); a removed one is named as such); default: fused, d40 "
                         "for int4h summaries (hils.gpu.DecodeCache's)")
    ap.add_argument("--summaries", default="bf16,fp8",
                    help="comma-separated summary types to dump (bf16, fp8, int4, int4h: d40 only)")
    ap.add_argument("--t", type=int, default=T, help="slots per sequence (default %(default)s)")
    ap.add_argument("--k", type=int, default=K,
                    help="selected chunks (default %(default)s; d36 and d39 select in their "
                         "chunk tiles only with K = 32, which needs T >= ~2,400 here)")
    args = ap.parse_args()
    T, K = args.t, args.k
    lib = hc.Library(args.lib)
    summaries = args.summaries.split(",")
    for summary in summaries:  # an unknown store or kernel, or a removed kernel: named before any work
        try:
            hc.decode.kernel_name(args.kernel, hc.decode.summary_store(summary))
        except ValueError as error:
            raise SystemExit(f"--summaries {summary}, --kernel {args.kernel}: {error}") from None
    gen = torch.Generator(device="cuda")
    gen.manual_seed(20261122)
    bf = dict(device="cuda", dtype=torch.bfloat16, generator=gen)
    seqs = []
    for _ in range(B):
        q = torch.randn(HQ, T, D, **bf)
        k = torch.randn(HKV, T, D, **bf)
        v = torch.randn(HKV, T, D, **bf)
        qr = (q.float() + 0.3 * torch.randn(HQ, T, D, device="cuda", generator=gen)).bfloat16()
        seqs.append((q, k, v, qr))
    for summary in summaries:
        dump_step(lib, seqs, summary, args.out, args.kernel)


def dump_step(lib, seqs, summary, out_dir, kernel=None):
    """One decode step of `kernel` over `seqs` with `summary` ("bf16", "fp8", "int4" or "int4h")
    summaries, one file per sequence: a hils.gpu.DecodeCache filled with slots < T - 1 (the
    summaries: the library's summarize stage and quantizer), slot T - 1 appended and stepped."""
    spec = {"preset": "hils", "S": S, "W": W, "K": K, "landmarks": True}
    q, k, v, qr = (torch.stack([s[i] for s in seqs]) for i in range(4))  # [B, heads, T, d]
    cache = hc.DecodeCache(spec, q[:, :, :T - 1], k[:, :, :T - 1], v[:, :, :T - 1], capacity=T,
                           summaries=summary, q_retrieval=qr[:, :, :T - 1], kernel=kernel, library=lib)
    cache.append(k[:, :, T - 1], v[:, :, T - 1])
    out = cache.step(q[:, :, T - 1], q_retrieval=qr[:, :, T - 1], diagnostics=True)
    stored, stored_bias = cache.stored_summaries()  # what the step scores with
    torch.cuda.synchronize()
    spec = {"preset": "hils", "S": S, "W": W, "K": K, "landmarks": True}
    np32 = lambda t: t.float().cpu().numpy()
    tag = "" if summary == "bf16" else f"_{summary}"
    for b in range(B):
        path = os.path.join(out_dir, f"verify_decode{tag}_seq{b}.h5")
        with h5py.File(path + ".tmp", "w") as f:
            f.attrs["format"] = "hils-verify"
            f.attrs["format_version"] = np.int64(1)
            f.attrs["spec"] = json.dumps(spec)
            f.attrs["input_precision"] = "bf16"
            # the cache keeps k' in bf16, in e4m3 with a per-row power-of-two scale, or in int4
            # codes with a per-row fp32 scale (int4h: an fp16 scale and b')
            f.attrs["score_precision"] = hc.SUMMARY_STORES[summary]
            f.attrs["kernel"] = f"hils::gpu decode_step {cache.kernel}, {summary} summaries (B = {B}, sequence {b})"
            f["inputs/q"], f["inputs/k"], f["inputs/v"] = np32(q[b]), np32(k[b]), np32(v[b])
            f["inputs/q_retrieval"] = np32(qr[b])
            f["queries"] = np.array([T - 1], dtype=np.int64)
            for name in ("o", "lse", "o_window", "lse_window", "surrogate_scores", "fusion_weights"):
                f[f"outputs/{name}"] = np32(out[name][b, :, None])
            f["outputs/selection"] = out["selection"][b, :, None].cpu().numpy().astype(np.int32)
            f["outputs/summary_key"] = np32(stored[b])
            # int4h: the fp16 b' of the pairs (what the scan scored with); else the fp32 b'
            f["outputs/summary_bias"] = np32(stored_bias[b])
        os.replace(path + ".tmp", path)
        print(f"wrote {path}")

if __name__ == "__main__":
    main()

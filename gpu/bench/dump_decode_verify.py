"""Dumps one decode step (gpu/include/hils/gpu/decode.hpp) in the `hils verify` format
(data/verify_format.md): B = 2 sequences of T slots, one file per sequence,
verify_decode_seq<b>.h5, with /queries = [T - 1] (the cache's last slot) and the cache's
summaries (the prefill's summarize stage, rounded to bf16 as the cache keeps them) as
/outputs/summary_key and summary_bias. Run by `scripts/gpu_check.sh --decode` on the device
machine; `hils verify FILE` judges the files wherever the CLI is built."""
import argparse
import ctypes
import json
import os
import sys

import h5py
import numpy as np
import torch

sys.path.insert(0, os.path.dirname(__file__))
import bench_decode as bd  # noqa: E402
import hils_ctypes as hc  # noqa: E402

B, T, HQ, HKV, D, S, W, K = 2, 2052, 8, 2, 64, 64, 256, 8  # ~10 MB per file


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--lib", required=True)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    lib = hc.Library(args.lib)
    lib.lib.hils_gpu_decode_last_error.restype = ctypes.c_char_p
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
        keys.append(st.key.bfloat16())
        biases.append(st.bias)
    nc = T // S
    run = bd.HilsDecode(lib.lib, B, T, gen, hq=HQ, hkv=HKV, d=D, s=S, w=W, k=K)
    run.k.copy_(torch.stack([s[1] for s in seqs]))
    run.v.copy_(torch.stack([s[2] for s in seqs]))
    run.key.copy_(torch.stack(keys))
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
    for b in range(B):
        q, k, v, qr = seqs[b]
        path = os.path.join(args.out, f"verify_decode_seq{b}.h5")
        with h5py.File(path + ".tmp", "w") as f:
            f.attrs["format"] = "hils-verify"
            f.attrs["format_version"] = np.int64(1)
            f.attrs["spec"] = json.dumps(spec)
            f.attrs["input_precision"] = "bf16"
            f.attrs["score_precision"] = "bf16"  # the cache keeps k' in bf16
            f.attrs["kernel"] = f"hils::gpu decode_step (B = {B}, sequence {b})"
            f["inputs/q"], f["inputs/k"], f["inputs/v"] = np32(q), np32(k), np32(v)
            f["inputs/q_retrieval"] = np32(qr)
            f["queries"] = np.array([T - 1], dtype=np.int64)
            f["outputs/o"], f["outputs/lse"] = np32(run.o[b, :, None]), np32(run.lse[b, :, None])
            f["outputs/o_window"] = np32(o_window[b, :, None])
            f["outputs/lse_window"] = np32(lse_window[b, :, None])
            f["outputs/selection"] = run.sel[b, :, None].cpu().numpy().astype(np.int32)
            f["outputs/surrogate_scores"] = np32(surrogate[b, :, None])
            f["outputs/fusion_weights"] = np32(weights[b, :, None])
            f["outputs/summary_key"] = np32(keys[b])
            f["outputs/summary_bias"] = np32(biases[b])
        os.replace(path + ".tmp", path)
        print(f"wrote {path}")


if __name__ == "__main__":
    main()

"""Dumps our kernels' inputs and outputs in the `hils verify` format (data/verify_format.md):
verify_hils.h5 (the hils preset on the packed bf16 path) and verify_shifted_window.h5 (the
kernel run with W + S but the file declaring W: `hils verify` must catch it). Run by
scripts/gpu_check.sh on the device machine; the other broken variants are derived from
verify_hils.h5 afterwards with scripts' help, wherever h5py is at hand."""
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
import hils.gpu as hc  # noqa: E402  (python/hils/gpu; script_needs puts python/ first)

T, HQ, HKV, D, S, W, K = 1024, 8, 2, 64, 64, 256, 8


def run(lib, q, k, v, q_retrieval, window, select_kernel=None):
    p = hc.make_problem(q, k, v, S, window, K, "hils", q_retrieval=q_retrieval)
    st = hc.Stages(lib, p)
    st.forward(select_kernel)
    torch.cuda.synchronize()
    return st


def write(path, spec, q, k, v, q_retrieval, st, kernel):
    tmp = path + ".tmp"
    f32 = lambda t: t.float().cpu().numpy()
    with h5py.File(tmp, "w") as f:
        f.attrs["format"] = "hils-verify"
        f.attrs["format_version"] = np.int64(1)
        f.attrs["spec"] = json.dumps(spec)
        f.attrs["input_precision"] = "bf16"
        f.attrs["score_precision"] = "bf16"  # the packed selection rounds k' to bf16
        f.attrs["kernel"] = kernel
        f["inputs/q"], f["inputs/k"], f["inputs/v"] = f32(q), f32(k), f32(v)
        f["inputs/q_retrieval"] = f32(q_retrieval)
        f["outputs/o"], f["outputs/lse"] = f32(st.o), f32(st.lse)
        f["outputs/o_window"], f["outputs/lse_window"] = f32(st.o_swa), f32(st.lse_swa)
        f["outputs/selection"] = st.selection.cpu().numpy().astype(np.int32)
        f["outputs/summary_key"] = f32(st.key)
        f["outputs/summary_bias"] = f32(st.bias)
    os.replace(tmp, path)
    print(f"wrote {path}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--lib", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--sparse-versions", nargs="*", choices=sorted(hc.SPARSE_KERNEL),
                    default=sorted(hc.SPARSE_KERNEL),
                    help="sparse stages dumped besides the default one (default: all)")
    ap.add_argument("--select-kernel", choices=sorted(hc.SELECT_KERNEL),
                    help="the selection kernel of every dump (default: the library's)")
    args = ap.parse_args()
    sel = args.select_kernel
    lib = hc.Library(args.lib)
    gen = torch.Generator(device="cuda")
    gen.manual_seed(20261121)
    bf = dict(device="cuda", dtype=torch.bfloat16, generator=gen)
    q = torch.randn(HQ, T, D, **bf)
    k = torch.randn(HKV, T, D, **bf)
    v = torch.randn(HKV, T, D, **bf)
    q_retrieval = (q.float() + 0.3 * torch.randn(HQ, T, D, device="cuda", generator=gen)).bfloat16()
    spec = {"preset": "hils", "S": S, "W": W, "K": K, "landmarks": True}
    tag = f", selection {sel}" if sel else ""
    good = run(lib, q, k, v, q_retrieval, W, sel)
    write(os.path.join(args.out, "verify_hils.h5"), spec, q, k, v, q_retrieval, good,
          "hils::gpu v2 packed bf16" + tag)
    # Peaked attention (queries x 4): chunk scores spread widely, so one wrong chunk is a
    # large error (on flat random data a single swap can sit inside the bf16 tolerance).
    qp = (q.float() * 4).bfloat16()
    qrp = (q_retrieval.float() * 4).bfloat16()
    peaked = run(lib, qp, k, v, qrp, W, sel)
    write(os.path.join(args.out, "verify_hils_peaked.h5"), spec, qp, k, v, qrp, peaked,
          "hils::gpu v2 packed bf16, peaked queries" + tag)
    # The same two problems through every other sparse stage (gpu/NOTES.md, sparse v4-v6):
    # verify_hils_sparse_v5.h5, verify_hils_peaked_sparse_v5.h5, ...
    default = hc.sparse_kernel(lib)
    for kernel in args.sparse_versions:
        if kernel == default:
            continue
        hc.set_sparse(lib, kernel)
        version = kernel.split("_")[-1]
        for name, (qq, qr) in ((f"verify_hils_sparse_{version}.h5", (q, q_retrieval)),
                               (f"verify_hils_peaked_sparse_{version}.h5", (qp, qrp))):
            write(os.path.join(args.out, name), spec, qq, k, v, qr, run(lib, qq, k, v, qr, W, sel),
                  f"hils::gpu v2 packed bf16, sparse stage {kernel}" + tag)
    hc.set_sparse(lib, default)
    shifted = run(lib, q, k, v, q_retrieval, W + S, sel)
    write(os.path.join(args.out, "verify_shifted_window.h5"), spec, q, k, v, q_retrieval, shifted,
          "hils::gpu v2 packed bf16, run with W + S (broken on purpose)")


if __name__ == "__main__":
    main()

"""Our GPU hils kernel (packed bf16 path, bf16 summaries) run with planted subtle bugs, dumped
in the `hils verify` format with the spec it should have implemented (issue 13, the oracle's
power on a real kernel): logit scale x1.01 and x1.003, and an extra softmax1 logit. Only o, lse
and the selection are written (what most kernels give). Same inputs as gpu/bench/dump_verify.py.
Usage (device): python3 tests/oracle/dump_planted_gpu.py --lib LIB --out DIR"""
import argparse
import json
import math
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "gpu", "bench"))
from script_needs import needs  # noqa: E402
needs("h5py", "numpy", "torch")

import h5py  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402

import hils.gpu as hc  # noqa: E402  (python/hils/gpu; script_needs puts python/ first)
from dump_verify import T, HQ, HKV, D, S, W, K  # noqa: E402


def run(lib, q, k, v, q_retrieval, scale_factor=1.0, softmax1=False):
    p = hc.make_problem(q, k, v, S, W, K, "hils", q_retrieval=q_retrieval, softmax1=softmax1)
    p.scale = scale_factor / math.sqrt(D)
    st = hc.Stages(lib, p)
    st.forward()
    torch.cuda.synchronize()
    return st


def write(path, q, k, v, q_retrieval, st, kernel):
    f32 = lambda t: t.float().cpu().numpy()  # noqa: E731
    spec = {"preset": "hils", "S": S, "W": W, "K": K, "landmarks": True}
    with h5py.File(path + ".tmp", "w") as f:
        f.attrs["format"] = "hils-verify"
        f.attrs["format_version"] = np.int64(1)
        f.attrs["spec"] = json.dumps(spec)
        f.attrs["input_precision"] = "bf16"
        f.attrs["score_precision"] = "bf16"
        f.attrs["kernel"] = kernel
        f["inputs/q"], f["inputs/k"], f["inputs/v"] = f32(q), f32(k), f32(v)
        f["inputs/q_retrieval"] = f32(q_retrieval)
        f["outputs/o"], f["outputs/lse"] = f32(st.o), f32(st.lse)
        f["outputs/selection"] = st.selection.cpu().numpy().astype(np.int32)
    os.replace(path + ".tmp", path)
    print(f"wrote {path}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--lib", required=True)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    lib = hc.Library(args.lib)
    gen = torch.Generator(device="cuda")
    gen.manual_seed(20261121)  # dump_verify.py's draws, in its order
    bf = dict(device="cuda", dtype=torch.bfloat16, generator=gen)
    q = torch.randn(HQ, T, D, **bf)
    k = torch.randn(HKV, T, D, **bf)
    v = torch.randn(HKV, T, D, **bf)
    q_retrieval = (q.float() + 0.3 * torch.randn(HQ, T, D, device="cuda", generator=gen)).bfloat16()
    for name, scale, softmax1 in [("planted_scale_1pct", 1.01, False),
                                  ("planted_scale_0.3pct", 1.003, False),
                                  ("planted_extra_softmax1", 1.0, True)]:
        st = run(lib, q, k, v, q_retrieval, scale, softmax1)
        write(os.path.join(args.out, name + ".h5"), q, k, v, q_retrieval, st,
              f"hils::gpu v2 packed bf16, planted: scale x{scale}, softmax1 {softmax1}")


if __name__ == "__main__":
    main()

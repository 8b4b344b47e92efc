"""Derives deliberately broken `hils verify` files from our kernels' dumps (gpu/bench/
dump_verify.py): one wrong chunk (the strongest chosen chunk of one row swapped for the weakest
candidate left out, in the peaked dump), a NaN in o, and a spec that declares softmax1 while the
kernel ran without it. The shifted window comes from the device (the kernel run with W + S).
Usage: /usr/bin/python3 gpu/bench/break_verify_dumps.py DIR   (DIR holds verify_hils.h5 and
verify_hils_peaked.h5); then `hils verify DIR/verify_*.h5`: every broken file must exit 1."""
import json
import os
import shutil
import sys

import h5py
import numpy as np


def variant(src, dst, edit):
    shutil.copy(src, dst + ".tmp")
    with h5py.File(dst + ".tmp", "r+") as f:
        edit(f)
    os.replace(dst + ".tmp", dst)


def wrong_chunk(f, t=1000, g=0):
    spec = json.loads(f.attrs["spec"])
    S, W = spec["S"], spec["W"]
    qr, key = f["inputs/q_retrieval"][...], f["outputs/summary_key"][...]
    bias, sel = f["outputs/summary_bias"][...], f["outputs/selection"][...]
    G = qr.shape[0] // sel.shape[0]
    n_cand = (t - W + 1) // S
    scale = 1.0 / np.sqrt(qr.shape[2])
    r = np.stack([scale * qr[h, t] @ key[h, :n_cand].T + bias[h, :n_cand]
                  for h in range(g * G, g * G + G)]).max(0)
    row = sel[g, t].copy()
    picked = [c for c in row if c >= 0]
    strongest = max(picked, key=lambda c: r[c])
    weakest = min((c for c in range(n_cand) if c not in picked), key=lambda c: r[c])
    row[row == strongest] = weakest
    sel[g, t] = np.sort(row)
    f["outputs/selection"][...] = sel
    print(f"wrong chunk: t={t} group={g}: {strongest} (max_h s_hat {r[strongest]:.2f}) -> "
          f"{weakest} ({r[weakest]:.2f})")


def nan_in_o(f):
    o = f["outputs/o"][...]
    o[3, 500, 7] = np.nan
    f["outputs/o"][...] = o


def declare_softmax1(f):
    spec = json.loads(f.attrs["spec"])
    spec["softmax1"] = True
    f.attrs["spec"] = json.dumps(spec)


def main():
    d = sys.argv[1]
    variant(os.path.join(d, "verify_hils_peaked.h5"), os.path.join(d, "verify_wrong_chunk.h5"),
            wrong_chunk)
    variant(os.path.join(d, "verify_hils.h5"), os.path.join(d, "verify_nan.h5"), nan_in_o)
    variant(os.path.join(d, "verify_hils.h5"), os.path.join(d, "verify_missing_softmax1.h5"),
            declare_softmax1)


if __name__ == "__main__":
    main()

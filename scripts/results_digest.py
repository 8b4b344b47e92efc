#!/usr/bin/env python3
"""One line per object of a hils results file, in visit order: datasets' dtype, shape and
SHA-256 of their bytes, every attribute's SHA-256 (root provenance attributes left out, as
tests/experiments/compare_results.py does). Two files hold the same results when the outputs
are equal.  usage: scripts/results_digest.py FILE.h5 > FILE.digest (then cmp two digests)"""
import hashlib
import sys

import h5py
import numpy as np

PROVENANCE = {"created", "command", "mpi_ranks", "resumed"}


def value_digest(v):
    if isinstance(v, bytes):
        v = v.decode()
    if isinstance(v, str):
        return "str " + hashlib.sha256(v.encode()).hexdigest()
    a = np.asarray(v)
    if a.dtype.kind == "O":
        text = "\0".join(x.decode() if isinstance(x, bytes) else str(x) for x in a.ravel())
        return f"obj {a.shape} " + hashlib.sha256(text.encode()).hexdigest()
    return f"{a.dtype.str} {a.shape} " + hashlib.sha256(np.ascontiguousarray(a).tobytes()).hexdigest()


def main(path):
    with h5py.File(path, "r") as f:
        names = []
        f.visit(names.append)
        for name in [""] + names:
            obj = f[name] if name else f
            for k in sorted(obj.attrs):
                if not (name == "" and k in PROVENANCE):
                    print(f"/{name}@{k} {value_digest(obj.attrs[k])}")
            if isinstance(obj, h5py.Dataset):
                print(f"/{name} {value_digest(obj[()])}")


if __name__ == "__main__":
    main(sys.argv[1])

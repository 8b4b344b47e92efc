#!/usr/bin/python3
"""Exits 0 when two hils results files hold the same objects, the same attributes and
bit-identical datasets; provenance (root attributes created, command, mpi_ranks, resumed) may differ.

usage: compare_results.py A.h5 B.h5"""
import sys

import h5py
import numpy as np

PROVENANCE = {"created", "command", "mpi_ranks", "resumed"}


def attributes(obj, root):
    return {k: v for k, v in obj.attrs.items() if not (root and k in PROVENANCE)}


def same_value(a, b):
    a, b = np.asarray(a), np.asarray(b)
    return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()


def main(a_path, b_path):
    problems = []
    with h5py.File(a_path, "r") as a, h5py.File(b_path, "r") as b:
        names_a, names_b = [], []
        a.visit(names_a.append)
        b.visit(names_b.append)
        if names_a != names_b:
            only_a = sorted(set(names_a) - set(names_b))[:5]
            only_b = sorted(set(names_b) - set(names_a))[:5]
            problems.append(f"objects differ: only in A {only_a}, only in B {only_b}, "
                            f"or in another order")
        for name in [""] + [n for n in names_a if n in b]:
            obj_a, obj_b = (a[name], b[name]) if name else (a, b)
            attrs_a, attrs_b = attributes(obj_a, not name), attributes(obj_b, not name)
            if sorted(attrs_a) != sorted(attrs_b):
                problems.append(f"/{name}: attributes {sorted(attrs_a)} vs {sorted(attrs_b)}")
            for k in attrs_a:
                if k in attrs_b and not same_value(attrs_a[k], attrs_b[k]):
                    problems.append(f"/{name}@{k}: {attrs_a[k]!r} vs {attrs_b[k]!r}")
            if isinstance(obj_a, h5py.Dataset) and not same_value(obj_a[()], obj_b[()]):
                problems.append(f"/{name}: data differ")
    for p in problems[:20]:
        print(p)
    print(f"{len(problems)} differences between {a_path} and {b_path}")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:3]))

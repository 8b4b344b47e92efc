"""CPU model of the selection's pass-2 offers (gpu/NOTES.md "The selection's floor"): iid normal
scores for G heads, the group score max_h (s_h - log2 Z_h), chunks arriving in 64-chunk tiles;
counts per row the list insertions of a sorted top-K (v4), the candidates that pass the pass-1
lower bound formed from n_slots slot maxima (v6.1: 32, v8: 64; a lane's slots cycle over the
tiles as in select_packed.cu) and the tiles holding at least one candidate.
Usage: python3 gpu/bench/simulate_select_offers.py [--rows 100]"""
import argparse

import numpy as np

K, G, TILE = 32, 8, 64


def slot_bound(s, z, n_slots):
    # K-th largest of the slot maxima of the group score; -inf with fewer than K nonempty slots.
    n = s.shape[1]
    c = np.arange(n)
    slot = ((c // TILE) % (n_slots // 4)) * 4 + (c // 2) % 4
    v = np.full(n_slots, -np.inf)
    for h in range(G):
        m = np.full(n_slots, -np.inf)
        np.maximum.at(m, slot, s[h])
        v = np.maximum(v, m - z[h])
    return np.sort(v)[::-1][K - 1] if (v > -np.inf).sum() >= K else -np.inf


def one_row(rng, n, n_slots):
    s = rng.standard_normal((G, n)).astype(np.float32)
    z = np.log2(np.exp2(s).sum(1))
    r = (s - z[:, None]).max(0)
    bound = slot_bound(s, z, n_slots) if n_slots else -np.inf
    top, inserted, flagged = [], 0, 0
    for i in range(0, n, TILE):
        kth = top[-1] if len(top) == K else -np.inf
        flagged += bool(((r[i:i + TILE] > kth) & (r[i:i + TILE] >= bound)).any())
        for v in r[i:i + TILE]:
            if v >= bound and v > (top[-1] if len(top) == K else -np.inf):
                inserted += 1
                top = sorted(top + [v], reverse=True)[:K]
    return inserted, flagged, int((r >= bound).sum())


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=100)
    args = ap.parse_args()
    rng = np.random.default_rng(1)
    print("n_chunks n_slots insertions flagged_tiles pass_bound (means per row)")
    for n in (1024, 4096):
        for n_slots in (0, 32, 64, 128):
            got = np.mean([one_row(rng, n, n_slots) for _ in range(args.rows)], axis=0)
            print(f"{n:8d} {n_slots:7d} {got[0]:10.1f} {got[1]:13.1f} {got[2]:10.1f}")


if __name__ == "__main__":
    main()

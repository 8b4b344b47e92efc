#!/usr/bin/python3
"""Plots of a hils study results file (fidelity, overlap or extrapolation), from the file alone.

Usage: /usr/bin/python3 plot_study.py RESULTS.h5 --out FOLDER [--list FILE]
Exit 2 when the file is not a study results file.
"""
import argparse
import json
import math
import os
import sys

import h5py
import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

COLS = ["n", "mean", "sd", "min", "max", "ci_low", "ci_high", "confidence"]


def col(rows, name):
    return rows[:, COLS.index(name)]


def mechanisms_of(group):
    return [m for m in group.keys() if m not in ("lengths", "block_sizes")]


def fidelity_plots(f, config, stem, out):
    """Surrogate-vs-true scatter, gap vs intra-chunk entropy, rank correlation per length."""
    paths = []
    mechs = config.get("mechanisms", [])
    T = config["lengths"][-1]
    unit = f[f"T{T}/layer0/group0"]
    head = unit[sorted(k for k in unit.keys() if k.startswith("head"))[0]]
    if "exact" in head:
        L = head["exact"][()]
        ok = np.isfinite(L)
        shown = [m for m in mechs if m in head and "surrogate" in head[m]]
        fig, axes = plt.subplots(1, len(shown), figsize=(3.2 * len(shown), 3.2), squeeze=False)
        for ax, m in zip(axes[0], shown):
            s = head[m]["surrogate"][()]
            rho = np.nanmean(head[m]["spearman"][()])
            ax.scatter(s[ok], L[ok], s=3, alpha=0.35)
            lo, hi = np.nanmin(L[ok]), np.nanmax(L[ok])
            ax.plot([lo, hi], [lo, hi], "k--", lw=0.8, label="s = L")
            ax.set_title(f"{m}\nmean Spearman {rho:.3f}", fontsize=9)
            ax.set_xlabel("surrogate score ŝ")
        axes[0][0].set_ylabel("true chunk log-mass L")
        fig.suptitle(f"{stem}: surrogate vs true chunk mass (T={T}, layer 0, {head.name.split('/')[-1]})",
                     fontsize=10)
        fig.tight_layout()
        paths.append(save(fig, out, f"{stem}_scatter.png"))

        H = head["entropy"][()]
        fig, ax = plt.subplots(figsize=(5.5, 3.8))
        for m in [x for x in ("mean", "max_logit", "taylor", "taylor_entropy") if x in shown]:
            # Only candidate chunks (finite L) have a gap; -inf - -inf outside V(t) is skipped.
            gap = np.subtract(L, head[m]["surrogate"][()], where=ok, out=np.zeros_like(L))
            ax.scatter(H[ok], gap[ok], s=3, alpha=0.35, label=m)
        ax.axhline(0.0, color="k", lw=0.6)
        ax.set_xlabel("intra-chunk entropy H(p_q) [nats]  (Eq. 5: low = one logit dominates)")
        ax.set_ylabel("gap L − ŝ [nats]")
        ax.set_title(f"{stem}: gap vs intra-chunk entropy (T={T})", fontsize=10)
        ax.legend(markerscale=4, fontsize=8)
        fig.tight_layout()
        paths.append(save(fig, out, f"{stem}_gap_entropy.png"))

    summary = f["summary"]
    lengths = summary["lengths"][()]
    metrics = [("spearman", "Spearman ρ(ŝ, L)"), ("topk_recall", "top-K recall"),
               ("mass_recall", "mass recall"), ("output_error", "output rel. error")]
    fig, axes = plt.subplots(1, len(metrics), figsize=(3.4 * len(metrics), 3.2))
    for ax, (metric, label) in zip(axes, metrics):
        for m in mechs:
            if m not in summary or metric not in summary[m]:
                continue
            rows = summary[m][metric][()]
            y = col(rows, "mean")
            err = np.vstack([y - col(rows, "ci_low"), col(rows, "ci_high") - y])
            ax.errorbar(lengths, y, yerr=np.nan_to_num(err), marker="o", ms=3, capsize=2, label=m)
        ax.set_xscale("log", base=2)
        ax.set_xlabel("context T (slots)")
        ax.set_title(label, fontsize=9)
    axes[0].legend(fontsize=7)
    fig.suptitle(f"{stem}: mean over layers × heads, 95% t-interval", fontsize=10)
    fig.tight_layout()
    paths.append(save(fig, out, f"{stem}_rank_correlation.png"))
    return paths


def overlap_plots(f, config, stem, out):
    """The two panels of the paper's Fig. 7."""
    s = f["summary"]
    lengths = s["lengths"][()]
    Ms = s["block_sizes"][()]
    fu, fc, lf = s["final_union"][()], s["final_candidates"][()], s["loaded_fraction"][()]
    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 3.8))
    x = np.arange(len(lengths))
    a.bar(x - 0.2, col(fc, "mean"), width=0.4, label="visible chunks |V|", color="#bbbbbb")
    a.bar(x + 0.2, col(fu, "mean"), width=0.4, yerr=np.nan_to_num(col(fu, "sd")), capsize=3,
          label=f"loaded union, final M={config['overlap']['final_block']}", color="#3b7dd8")
    for i in range(len(lengths)):
        a.text(x[i] + 0.2, col(fu, "mean")[i], f"{100 * col(lf, 'mean')[i]:.1f}%",
               ha="center", va="bottom", fontsize=8)
    a.set_xticks(x, [f"{int(t) // 1024}K" if t >= 1024 else str(int(t)) for t in lengths])
    a.set_xlabel("context length")
    a.set_ylabel("chunks")
    a.set_title("loaded union vs visible chunks", fontsize=10)
    a.legend(fontsize=8)
    for i, T in enumerate(lengths):
        mean = np.array([col(s[f"overlap_M{m}"][()], "mean")[i] for m in Ms])
        sd = np.array([col(s[f"overlap_M{m}"][()], "sd")[i] for m in Ms])
        per = np.array([s[f"overlap_M{m}_per_unit"][()][i] for m in Ms])
        b.errorbar(Ms, mean, yerr=np.nan_to_num(sd), marker="o", ms=3, capsize=2,
                   label=f"T={int(T)}")
        b.fill_between(Ms, np.nanmin(per, axis=1), np.nanmax(per, axis=1), alpha=0.15)
        reuse = col(s["reuse"][()], "mean")[i]
        b.axhline(reuse, ls="--", lw=0.8, color=b.lines[-1].get_color())
    b.set_xscale("log", base=2)
    b.set_xticks(Ms, [str(int(m)) for m in Ms])
    b.set_ylim(0, 1.05)
    b.set_xlabel("block size M")
    b.set_ylabel("normalized overlap")
    b.set_title("overlap vs M (dashed: inter-block reuse)", fontsize=10)
    b.legend(fontsize=8)
    fig.suptitle(f"{stem}: chunk overlap of adjacent queries ({config['overlap']['mechanism']}, "
                 f"S={config['geometry']['S']}, K={config['geometry']['K']}); "
                 "bars ±1 sd over layers × groups, shade min–max", fontsize=9)
    fig.tight_layout()
    return [save(fig, out, f"{stem}_overlap.png")]


def extrapolation_plots(f, config, stem, out):
    """Needle heatmaps per (encoding, mechanism) and metric-vs-length curves per encoding."""
    paths = []
    enc = config["extrapolation"]["encodings"]
    mechs = config["mechanisms"]
    if "needle" in f and "depths" in f["needle"]:
        depths = f["needle/depths"][()]
        lengths = f["needle/lengths"][()]
        fig, axes = plt.subplots(len(enc), len(mechs), figsize=(2.2 * len(mechs), 2.1 * len(enc)),
                                 squeeze=False)
        for i, e in enumerate(enc):
            for j, m in enumerate(mechs):
                ax = axes[i][j]
                key = f"needle/{e}/{m}/grid"
                if key not in f:
                    ax.axis("off")
                    continue
                ax.imshow(f[key][()], vmin=0, vmax=1, cmap="RdYlGn", aspect="auto", origin="lower")
                ax.set_xticks(range(len(depths)), [f"{d:.2g}" for d in depths], fontsize=6)
                ax.set_yticks(range(len(lengths)), [f"{int(t) // 1024}K" if t >= 1024 else str(int(t))
                                                    for t in lengths], fontsize=6)
                if i == 0:
                    ax.set_title(m, fontsize=8)
                if j == 0:
                    ax.set_ylabel(f"{e}\nlength", fontsize=8)
                if i == len(enc) - 1:
                    ax.set_xlabel("depth", fontsize=7)
        fig.suptitle(f"{stem}: needle selected (green) by length × depth", fontsize=10)
        fig.tight_layout()
        paths.append(save(fig, out, f"{stem}_needle.png"))
    metrics = [("spearman", "Spearman ρ"), ("topk_recall", "top-K recall"),
               ("covered_mass", "covered mass"), ("output_error", "output rel. error")]
    fig, axes = plt.subplots(len(enc), len(metrics), figsize=(3.2 * len(metrics), 2.6 * len(enc)),
                             squeeze=False)
    for i, e in enumerate(enc):
        if f"{e}/summary" not in f:
            continue
        s = f[f"{e}/summary"]
        lengths = s["lengths"][()]
        for j, (metric, label) in enumerate(metrics):
            ax = axes[i][j]
            for m in mechs:
                if m in s and metric in s[m]:
                    rows = s[m][metric][()]
                    y = col(rows, "mean")
                    err = np.vstack([y - col(rows, "ci_low"), col(rows, "ci_high") - y])
                    ax.errorbar(lengths, y, yerr=np.nan_to_num(err), marker="o", ms=3, capsize=2,
                                label=m)
            ax.set_xscale("log", base=2)
            ax.set_title(f"{e}: {label}", fontsize=9)
            if i == len(enc) - 1:
                ax.set_xlabel("context T (slots)")
    axes[0][0].legend(fontsize=6)
    fig.suptitle(f"{stem}: metrics vs length (train length {config['extrapolation']['train_length']})",
                 fontsize=10)
    fig.tight_layout()
    paths.append(save(fig, out, f"{stem}_metrics_vs_length.png"))
    return paths


def save(fig, out, name):
    path = os.path.join(out, name)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def missing_summaries(f, config, study):
    """The summary units a finished study writes last that the file's complete_units lacks."""
    try:
        units = set(json.loads(f.attrs["complete_units"]))
    except (KeyError, ValueError):
        units = set()
    if study == "extrapolation":
        wanted = [f"{e}/summary" for e in config.get("extrapolation", {}).get("encodings", [])]
    else:
        wanted = ["summary"]
    return [w for w in wanted if not any(u == w or u.endswith("/" + w) for u in units)]


def main():
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("results")
    p.add_argument("--out", required=True)
    p.add_argument("--list", help="write the PNG paths here, one per line")
    a = p.parse_args()
    try:
        f = h5py.File(a.results, "r")
        config = json.loads(f.attrs["config"])
        study = config["study"]
    except (OSError, KeyError, ValueError) as e:
        print(f"{a.results}: not a hils study results file ({e})", file=sys.stderr)
        return 2
    os.makedirs(a.out, exist_ok=True)
    stem = os.path.splitext(os.path.basename(a.results))[0]
    draw = {"fidelity": fidelity_plots, "overlap": overlap_plots,
            "extrapolation": extrapolation_plots}.get(study)
    if draw is None:
        print(f"{a.results}: config.study is '{study}', expected fidelity, overlap or "
              "extrapolation", file=sys.stderr)
        return 2
    missing = missing_summaries(f, config, study)
    if missing:
        print(f"{a.results}: note: the run is incomplete (interrupted?): no {', '.join(missing)} "
              "unit yet, so panels may be empty or partial; run the same command again to "
              "resume it", file=sys.stderr)
    paths = draw(f, config, stem, a.out)
    if a.list:
        with open(a.list, "w") as fh:
            fh.write("\n".join(paths) + "\n")
    for path in paths:
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/python3
"""Plots of a hils study results file (fidelity, overlap or extrapolation), from the file alone.

Usage: /usr/bin/python3 plot_study.py RESULTS.h5 --out FOLDER [--list FILE]
Exit 2 when the file is not a study results file, 3 when a PNG cannot be written (a full disk,
a read-only folder: the message names the file and the reason), 4 when h5py, matplotlib or numpy
cannot be imported; a PNG appears whole or not at all. Ctrl-C (SIGINT) ends the script by that signal, without a traceback.

What every figure shares, so that figures can be read side by side:
- a mechanism has one colour in every figure (MECHANISM_COLOURS, through mechanism_colour);
- a metric has one title, one axis label that defines it, and one range (METRICS); intervals
  drawn for it are clipped to that range (a Student-t interval of a mean of Spearman values can
  pass 1; the statistic cannot);
- a study of a single length shows its mechanisms side by side at that length, not a length axis;
- a panel without data says why in the panel (an interrupted run), never stays blank.
The definitions are those of reference/SEMANTICS.md §9 and data/results_format.md.
"""
import argparse
import json
import math
import os
import signal
import sys
import textwrap
import zlib
from typing import NamedTuple

if __name__ == "__main__":
    # Ctrl-C while the libraries load ends the script at once (nothing is written yet); main()
    # turns it back into KeyboardInterrupt, so that a PNG being written is removed.
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    # A user whose home is not writable gets matplotlib's advice to set MPLCONFIGDIR on every
    # run; matplotlib then uses a temporary folder, which is all a plot needs.
    import logging
    logging.getLogger("matplotlib").addFilter(
        lambda record: "MPLCONFIGDIR" not in record.getMessage())
    # A results name that is not UTF-8 shows a box in the titles; one warning per figure
    # about the missing glyph says nothing more.
    import warnings
    warnings.filterwarnings("ignore", message=r"Glyph \d+ .* missing from (current )?font")
    # An undefined (NaN) mean's error bar, which matplotlib skips; the panel says "undefined"
    # at its place (say_undefined).
    warnings.filterwarnings("ignore", message="Warning: converting a masked element to nan")

try:
    import h5py
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: E402
    import numpy as np  # noqa: E402
    from matplotlib.colors import to_rgb  # noqa: E402
    from matplotlib.lines import Line2D  # noqa: E402
except ImportError as e:  # a setup to complete, not a fault of hils (exit 4: draw_plots.cpp)
    print(f"{sys.executable}: expected the modules h5py, matplotlib and numpy for the plots "
          f"(apt-get install python3-h5py python3-matplotlib python3-numpy), found {e}",
          file=sys.stderr)
    sys.exit(4)

COLS = ["n", "mean", "sd", "min", "max", "ci_low", "ci_high", "confidence"]

# One look for every figure: fonts a printed page can read, no clipped labels.
plt.rcParams.update({
    "font.size": 9, "axes.titlesize": 9.5, "axes.labelsize": 9, "xtick.labelsize": 8,
    "ytick.labelsize": 8, "legend.fontsize": 8, "figure.titlesize": 10.5,
    "savefig.dpi": 130, "axes.spines.top": False, "axes.spines.right": False,
})

# The one colour of each mechanism in every figure (Okabe-Ito palette: colour-blind safe).
MECHANISM_COLOURS = {
    "mean": "#0072B2",            # blue
    "landmark_key": "#E69F00",    # orange
    "taylor": "#009E73",          # bluish green
    "taylor_entropy": "#D55E00",  # vermillion
    "max_logit": "#CC79A7",       # reddish purple
    "naive_bsa": "#000000",       # black: the exact top-K by L, the reference choice
    "hils": "#D55E00",            # the preset taylor_entropy runs
    "nsa": "#0072B2",             # the preset mean runs
    "lmk": "#E69F00",             # the preset landmark_key runs
    "full": "#777777",
    "swa": "#999999",
}
# And one marker each, so that mechanisms whose values coincide (lines drawn over each other)
# still show, and so that a grey-scale print tells them apart.
MECHANISM_MARKERS = {
    "mean": "o", "landmark_key": "s", "taylor": "^", "taylor_entropy": "D", "max_logit": "v",
    "naive_bsa": "x", "hils": "P", "nsa": "h", "lmk": "X", "full": "*", "swa": "<",
}
SPARE_MARKERS = ["p", ">", "d", "8", "H", "1", "2"]
# Mechanisms the table does not name (presets, "<key>+<bias>"): a colour chosen by the name's
# CRC, so the same name gets the same colour in every figure and every run.
SPARE_COLOURS = ["#56B4E9", "#8C564B", "#BCBD22", "#7F7F7F", "#17BECF", "#9467BD", "#F0E442"]


def mechanism_colour(name):
    """mechanism name -> its colour, the same in every figure."""
    if name in MECHANISM_COLOURS:
        return MECHANISM_COLOURS[name]
    return SPARE_COLOURS[zlib.crc32(name.encode()) % len(SPARE_COLOURS)]


def mechanism_marker(name):
    """mechanism name -> its marker, the same in every figure."""
    if name in MECHANISM_MARKERS:
        return MECHANISM_MARKERS[name]
    return SPARE_MARKERS[zlib.crc32(name.encode()) % len(SPARE_MARKERS)]


def mechanism_style(name):
    """mechanism name -> the colour, marker and legend label of its points in every figure."""
    return dict(color=mechanism_colour(name), marker=mechanism_marker(name), label=name,
                mfc="white" if name == "naive_bsa" else mechanism_colour(name))


class Metric(NamedTuple):
    title: str    # what the panel shows, in words
    axis: str     # the definition (reference/SEMANTICS.md §9), as the y-axis label
    low: float    # the range the statistic can take; intervals are clipped to it
    high: float
    drawn_in: tuple  # the figures (PNG name after the stem) with a panel of it, in this order


# Every metric a study writes has its entry (tests/python/test_plots.py reads the metrics of the
# results files and the table of data/results_format.md against it): a metric added to the
# fidelity study (kFidelityMetrics, analysis/src/fidelity.cpp) gets one title, axis and range
# here, and says in which figures it is drawn (README "Adding a study metric").
# Per sampled query t, candidate chunks V(t), exact log-mass L(t,c), Z = exp L, surrogate ŝ,
# I_ŝ the K chunks the mechanism selects, I_L the K chunks of largest L.
METRICS = {
    "spearman": Metric("rank correlation of ŝ and L", r"Spearman $\rho(\hat s, L)$ over $V(t)$",
                       -1.0, 1.0, ("metrics", "metrics_vs_length")),
    "topk_recall": Metric("top-K recall", r"$|I_{\hat s} \cap I_L| \;/\; |I_L|$", 0.0, 1.0,
                          ("metrics", "metrics_vs_length")),
    "mass_recall": Metric("mass recall", r"$\Sigma_{I_{\hat s}} Z \;/\; \Sigma_{I_L} Z$",
                          0.0, 1.0, ("metrics",)),
    "covered_mass": Metric("covered attention mass",
                           r"$(\Sigma_{I_{\hat s}} Z + Z_{win}) \;/\; (\Sigma_{V} Z + Z_{win})$",
                           0.0, 1.0, ("metrics_vs_length",)),
    "output_error": Metric("output error vs full attention",
                           "relative output error\n"
                           r"$\Vert o_t - o^{full}_t\Vert_2 \;/\; \Vert o^{full}_t\Vert_2$",
                           0.0, math.inf, ("metrics", "metrics_vs_length")),
    "overlap": Metric("overlap of a block of M adjacent queries",
                      "normalized overlap\n"
                      r"$(\Sigma|I_m| - |\cup I_m|) \,/\, (\Sigma|I_m| - \max|I_m|)$",
                      0.0, 1.0, ("overlap",)),
    "gap_mean": Metric("mean gap L − ŝ", r"mean of $L - \hat s$ over $V(t)$ [nats]",
                       -math.inf, math.inf, ()),
}


def panels(figure):
    """A figure's PNG name after the stem -> the metrics it has a panel of, in METRICS order."""
    return [name for name, metric in METRICS.items() if figure in metric.drawn_in]


SUMMARY_NOTE = ("points: mean over (layer, head) of each head's mean over its sampled queries; "
                "bars: 95% Student-t interval of that mean, clipped to the metric's range")
OUTPUT_ERROR_NOTE = (r"output error: $o_t$ is one query head's output row at sampled query $t$, "
                     r"$o^{full}_t$ full causal attention of that query over every attendable slot "
                     r"$\leq t$ (no selection); $\Vert\cdot\Vert_2$: Euclidean norm over the "
                     "value dimension")


# Set by main when the run is incomplete: the first line of every figure's title then, so that a
# PNG seen on its own (in a paper draft, a chat) still says it shows an unfinished run.
INCOMPLETE_LINE = ""


def suptitle(fig, text):
    """A figure and its title -> the title set, led by the incomplete-run line when there is
    one (in red)."""
    if INCOMPLETE_LINE:
        fig.suptitle(f"{INCOMPLETE_LINE}\n{text}", color="#aa0000")
    else:
        fig.suptitle(text)


def fitted(fig, text):
    """A title's lines wrapped to the figure's width (about 10.5 characters an inch at the
    title's size): a figure of one or two panels cut the gap and scatter titles at both edges."""
    width = max(30, int(10.5 * fig.get_figwidth()))
    return "\n".join(textwrap.fill(line, width) for line in text.split("\n"))


def col(rows, name):
    """[n_lengths, 8] summary rows -> the column `name`."""
    return rows[:, COLS.index(name)]


def clipped_interval(rows, metric):
    """[n, 8] summary rows -> mean, and its interval [lo, hi] clipped to the metric's range."""
    y = col(rows, "mean")
    lo = np.clip(col(rows, "ci_low"), metric.low, metric.high)
    hi = np.clip(col(rows, "ci_high"), metric.low, metric.high)
    return y, lo, hi


def yerr_of(y, lo, hi):
    """mean and interval -> matplotlib's [2, n] error-bar lengths (0 where undefined)."""
    return np.nan_to_num(np.vstack([np.maximum(y - lo, 0.0), np.maximum(hi - y, 0.0)]))


def length_label(T):
    """slots -> '4K' style tick label."""
    T = int(T)
    return f"{T // 1024}K" if T >= 1024 and T % 1024 == 0 else str(T)


def say_missing(ax, what):
    """An axes without data -> a visible note in it instead of a blank panel."""
    ax.text(0.5, 0.5, f"no {what} in the file\n(run interrupted? run it again to resume)",
            ha="center", va="center", transform=ax.transAxes, fontsize=8, color="#aa0000")
    ax.set_xticks([])
    ax.set_yticks([])


def say_undefined(ax, x, y, mechanism):
    """Means that are NaN (the metric is undefined for every sample at that length, e.g. the
    Spearman correlation of tied scores) -> "undefined" at their place, written up from the
    bottom of the axes in the mechanism's colour, instead of a point silently left out."""
    for xi in np.asarray(x)[~np.isfinite(y)]:
        ax.text(xi, 0.03, "undefined", transform=ax.get_xaxis_transform(), rotation=90,
                ha="center", va="bottom", fontsize=6.5, color=mechanism_colour(mechanism))


def length_axis(ax, lengths):
    """An axes -> a log2 length axis ticked at the study's own lengths."""
    ax.set_xscale("log", base=2)
    ax.set_xticks(lengths, [length_label(t) for t in lengths])
    ax.minorticks_off()
    ax.set_xlabel("context length T [slots]")


def frame_undefined_panel(ax, xs, metric, single_length):
    """A panel whose every mean is undefined (no point for matplotlib to fit its limits to) and
    the places `xs` of its "undefined" notes -> the limits a drawn panel would have: those
    places (the mechanisms' slots of one length are set already) with a margin, and the
    metric's range where it has one. Its length axis had collapsed to one spot, the tick labels
    and the notes on top of each other."""
    if not single_length:
        lo, hi = np.log2(np.min(xs)), np.log2(np.max(xs))
        pad = 0.08 * max(hi - lo, 1.0)
        ax.set_xlim(2.0 ** (lo - pad), 2.0 ** (hi + pad))
    if math.isfinite(metric.low) and math.isfinite(metric.high):
        ax.set_ylim(metric.low, metric.high)


DODGE = 0.04  # between neighbouring mechanisms on a length axis, in steps between lengths


def metric_panel(ax, summary, mechs, name, single_length):
    """One metric of a summary group -> mean and clipped interval per mechanism on `ax`.

    Several lengths: a line per mechanism over a length axis. One length: the mechanisms side
    by side (categorical axis), since a length axis with one point says nothing.
    """
    metric = METRICS[name]
    lengths = summary["lengths"][()]
    shown = [m for m in mechs if m in summary and name in summary[m]]
    steps = np.diff(np.log2(lengths))
    dodge = DODGE * (steps.min() if len(steps) else 1.0)
    defined, xs = False, []
    for i, m in enumerate(shown):
        y, lo, hi = clipped_interval(summary[m][name][()], metric)
        # The reference choice (naive_bsa, black) goes under the others, which it often equals.
        style = dict(mechanism_style(m), ms=4.5, capsize=3,
                     zorder=1.5 if m == "naive_bsa" else 2.5)
        if single_length:
            x = np.array([i])
            ax.errorbar(x, y, yerr=yerr_of(y, lo, hi), ls="none", **style)
        else:
            # Each mechanism a little to the side (a fixed factor on the log axis), so that equal
            # values and their intervals stay visible side by side instead of one hiding another.
            x = lengths * 2.0 ** (dodge * (i - (len(shown) - 1) / 2))
            ax.errorbar(x, y, yerr=yerr_of(y, lo, hi), lw=1.3, **style)
        say_undefined(ax, x, y, m)
        defined, xs = defined or bool(np.isfinite(y).any()), [*xs, *x]
    if single_length:
        ax.set_xticks(range(len(shown)), shown, rotation=35, ha="right")
        for tick, m in zip(ax.get_xticklabels(), shown):
            tick.set_color(mechanism_colour(m))
        ax.set_xlim(-0.6, len(shown) - 0.4)
    else:
        length_axis(ax, lengths)
    ax.set_ylabel(metric.axis)
    if metric.low == 0.0 and metric.high == math.inf:
        ax.set_ylim(bottom=0.0)  # an error: its size is read against zero
    if shown and not defined:
        frame_undefined_panel(ax, xs, metric, single_length)
    ax.grid(axis="y", lw=0.4, alpha=0.5)


def bottom_strip(fig, mechs=(), extra=(), note=""):
    """A figure -> its mechanism legend and a footnote in a strip below the panels.

    Returns the fraction of the figure's height the strip takes (tight_layout's rect bottom).
    """
    height = fig.get_figheight()
    legend_in, note_in = (0.35 if mechs else 0.0), (0.25 if note else 0.0)
    if note:
        fig.text(0.5, 0.08 / height, note, ha="center", va="bottom", fontsize=7.5,
                 color="#444444")
    if mechs:
        handles = [Line2D([], [], ms=4.5, lw=1.3, **mechanism_style(m)) for m in mechs]
        handles += list(extra)
        fig.legend(handles=handles, loc="lower center", ncol=min(len(handles), 7),
                   frameon=False, bbox_to_anchor=(0.5, (0.02 + note_in) / height))
    return (legend_in + note_in + 0.05) / height


def n_of(summary, mechs, names):
    """The sample sizes n (defined values per length) of the metrics' summaries, as text. A
    metric undefined for every head (n = 0, said "undefined" in its panel) is left out while
    another metric has values: the title said "n = 0" over panels drawn from n = 4."""
    ns = {int(v) for name in names for m in mechs if m in summary and name in summary[m]
          for v in col(summary[m][name][()], "n") if np.isfinite(v)}
    ns = sorted(ns - {0}) or sorted(ns)
    return "n = " + ", ".join(str(v) for v in ns) if ns else "n = 0"


def fidelity_plots(f, config, stem, out):
    """Surrogate-vs-true scatter, gap vs intra-chunk entropy, the four metrics per mechanism."""
    paths = []
    mechs = config.get("mechanisms", [])
    done = [T for T in config["lengths"] if f"T{T}/layer0/group0" in f]
    if done:
        T = done[-1]
        unit = f[f"T{T}/layer0/group0"]
        head_name = sorted((k for k in unit.keys() if k.startswith("head")),
                           key=lambda k: int(k[4:]))[0]
        head = unit[head_name]
        where = f"T = {T} slots, layer 0, {head_name.replace('head', 'query head ')}"
        if "exact" in head:
            paths.append(fidelity_scatter(head, mechs, stem, where, out))
            paths.append(gap_entropy(head, mechs, stem, where, out))
    else:
        print(f"{stem}: note: no finished unit of layer 0, group 0 yet: the scatter and gap "
              "figures are not drawn", file=sys.stderr)

    metrics = panels("metrics")
    fig, axes = plt.subplots(1, len(metrics), figsize=(3.3 * len(metrics), 3.6))
    if "summary" in f:
        summary = f["summary"]
        lengths = summary["lengths"][()]
        single = len(lengths) == 1
        for ax, name in zip(axes, metrics):
            metric_panel(ax, summary, mechs, name, single)
            ax.set_title(METRICS[name].title)
        at = f"at T = {int(lengths[0])} slots (the study's only length)" if single else "vs length"
        suptitle(fig, f"{stem}: chunk-selection fidelity {at}, "
                     f"{n_of(summary, mechs, metrics)} (layers × heads)\n{SUMMARY_NOTE}")
        legend = [] if single else [m for m in mechs if m in summary]
        fig.tight_layout(rect=(0, bottom_strip(fig, legend, note=OUTPUT_ERROR_NOTE), 1, 1))
    else:
        for ax, name in zip(axes, metrics):
            ax.set_title(METRICS[name].title)
            say_missing(ax, "summary")
        suptitle(fig, f"{stem}: chunk-selection fidelity")
        fig.tight_layout()
    paths.append(save(fig, out, f"{stem}_metrics.png"))
    return paths


def fidelity_scatter(head, mechs, stem, where, out):
    """One head's (ŝ, L) pairs per mechanism, one panel each, in the mechanism's colour."""
    L = head["exact"][()]
    ok = np.isfinite(L)
    shown = [m for m in mechs if m in head and "surrogate" in head[m]]
    ncols = max(1, min(3, len(shown)))
    nrows = max(1, math.ceil(len(shown) / ncols))
    fig, axes = plt.subplots(nrows, ncols, figsize=(3.4 * ncols, 3.0 * nrows + 0.6),
                             squeeze=False, sharey=True)
    lo, hi = np.nanmin(L[ok]), np.nanmax(L[ok])
    for k, m in enumerate(shown):
        ax = axes[k // ncols][k % ncols]
        s = head[m]["surrogate"][()]
        ax.scatter(s[ok], L[ok], s=3, alpha=0.4, color=mechanism_colour(m), lw=0)
        ax.plot([lo, hi], [lo, hi], "k--", lw=0.8)
        ax.set_title(f"{m}   ({mean_spearman(head[m]['spearman'][()])})",
                     color=mechanism_colour(m))
        ax.set_xlabel("surrogate score ŝ(t, c) [nats]")
        if k % ncols == 0:
            ax.set_ylabel("exact chunk log-mass L(t, c) [nats]")
    for k in range(len(shown), nrows * ncols):
        axes[k // ncols][k % ncols].set_visible(False)
    suptitle(fig, fitted(fig, f"{stem}: surrogate score vs exact chunk log-mass ({where})\n"
                 "one point per sampled query t and candidate chunk c ∈ V(t); dashed: ŝ = L; "
                 "ρ: Spearman over V(t), mean over this head's queries"))
    fig.tight_layout()
    return save(fig, out, f"{stem}_scatter.png")


def mean_spearman(rho):
    """A head's Spearman values per query -> their mean as a title says it, or that it is
    undefined for every query (tied scores, one candidate chunk): was "ρ = nan"."""
    rho = rho[np.isfinite(rho)]
    return f"mean Spearman ρ = {rho.mean():.3f}" if rho.size else "Spearman ρ undefined"


def gap_entropy(head, mechs, stem, where, out):
    """The gap L − ŝ against the query's entropy inside the chunk, one panel per estimator."""
    L = head["exact"][()]
    ok = np.isfinite(L)
    H = head["entropy"][()]
    # The pooling surrogates, which estimate L, in the other figures' order; naive_bsa's ŝ is L
    # (gap 0) and landmark_key's is a logit, not a log-mass: the title says so.
    shown = [m for m in mechs if m in ("mean", "max_logit", "taylor", "taylor_entropy")
             and m in head and "surrogate" in head[m]]
    why = {"naive_bsa": "naive_bsa (ŝ = L, gap 0)", "landmark_key": "landmark_key (ŝ is a logit)"}
    # A preset or <key>+<bias> (nsa, hils, ...) is not one of the four estimators either: said
    # too, and a study of none of them (--mechanisms naive_bsa, or nsa,hils) draws the note
    # alone (was a ValueError from a figure of 0 panels: hils plot exit 3).
    left_out = [why.get(m, f"{m} (drawn for mean, max_logit, taylor, taylor_entropy)")
                for m in mechs if m not in shown and m in head]
    fig, axes = plt.subplots(1, max(1, len(shown)), figsize=(3.2 * max(2, len(shown)), 3.3),
                             squeeze=False, sharex=True)
    if not shown:
        axes[0][0].set_axis_off()
        axes[0][0].text(0.5, 0.5, "no pooling estimator of L among the mechanisms studied",
                        ha="center", va="center", transform=axes[0][0].transAxes, fontsize=9)
    for ax, m in zip(axes[0], shown):
        # Only candidate chunks (finite L) have a gap; -inf - -inf outside V(t) is skipped.
        gap = np.subtract(L, head[m]["surrogate"][()], where=ok, out=np.zeros_like(L))
        ax.scatter(H[ok], gap[ok], s=3, alpha=0.4, color=mechanism_colour(m), lw=0)
        ax.axhline(0.0, color="k", lw=0.6)
        ax.set_title(m, color=mechanism_colour(m))
        ax.set_xlabel("entropy H(p_q) in the chunk [nats]")
    if shown:
        axes[0][0].set_ylabel("gap L − ŝ [nats]")
    suptitle(fig, fitted(fig, f"{stem}: gap between exact log-mass and surrogate vs the query's "
                 f"entropy inside the chunk ({where})\n"
                 "H(p_q) = entropy of softmax over the chunk's logits; low: one key dominates "
                 "(Eq. 5). Own y scale per panel."
                 + (f"\nnot drawn: {', '.join(left_out)}" if left_out else "")))
    fig.tight_layout()
    return save(fig, out, f"{stem}_gap_entropy.png")


def shade(colour, k, n):
    """A colour, step k of n -> a lighter (k = 0) to full (k = n - 1) shade of it."""
    c = np.array(to_rgb(colour))
    mix = 0.25 + 0.75 * (k + 1) / n if n > 1 else 1.0
    return tuple(1.0 - mix * (1.0 - c))


def overlap_plots(f, config, stem, out):
    """The two panels of the paper's Fig. 7, in the colour of the mechanism studied."""
    ov = config["overlap"]
    mech = ov["mechanism"]
    colour = mechanism_colour(mech)
    geometry = config["geometry"]
    if "summary" not in f:
        fig, ax = plt.subplots(figsize=(6, 3))
        say_missing(ax, "summary")
        suptitle(fig, f"{stem}: chunk overlap of adjacent queries ({mech})")
        return [save(fig, out, f"{stem}_overlap.png")]
    s = f["summary"]
    lengths = s["lengths"][()]
    # A block of one query has overlap 1 by definition (reference/SEMANTICS.md, "Chunk
    # overlap"), not by measurement: drawn, it made a dip at M = 2 out of nothing. A block of
    # more queries than a short context has (its units study fewer than tail_queries: those
    # with a candidate) has no overlap at any length: not drawn, and said so.
    sizes = [m for m in s["block_sizes"][()] if m > 1]
    Ms = np.array([m for m in sizes if np.isfinite(col(s[f"overlap_M{m}"][()], "mean")).any()])
    too_large = [int(m) for m in sizes if m not in Ms]
    studied = [studied_queries(f, T) for T in lengths]
    fig, (a, b) = plt.subplots(1, 2, figsize=(10.5, 4.2))
    loaded_union_bars(a, s, lengths, ov["final_block"], colour)

    for i, T in enumerate(lengths):
        c = shade(colour, i, len(lengths))
        overlap = METRICS["overlap"]
        mean = np.array([col(s[f"overlap_M{m}"][()], "mean")[i] for m in Ms])
        sd = np.array([col(s[f"overlap_M{m}"][()], "sd")[i] for m in Ms])
        lo = np.clip(mean - sd, overlap.low, overlap.high)
        hi = np.clip(mean + sd, overlap.low, overlap.high)
        per = np.array([s[f"overlap_M{m}_per_unit"][()][i] for m in Ms]).reshape(len(Ms), -1)
        # fmin/fmax skip NaN (a block size this length's queries cannot fill) without numpy's
        # "All-NaN slice" warning under hils plot's lines.
        b.fill_between(Ms, np.fmin.reduce(per, axis=1), np.fmax.reduce(per, axis=1), color=c,
                       alpha=0.15, lw=0)
        b.errorbar(Ms, mean, yerr=yerr_of(mean, lo, hi), marker="os^vD"[i % 5], ms=4, capsize=2,
                   color=c, label=f"T = {length_label(T)}")
        b.axhline(col(s["reuse"][()], "mean")[i], ls="--", lw=0.9, color=c)
    b.set_xscale("log", base=2)
    b.set_xticks(Ms, [str(int(m)) for m in Ms])
    b.minorticks_off()
    b.set_ylim(0, 1.05)
    b.set_xlabel("block size M (adjacent queries; M = 1 is 1 by definition, not drawn)")
    b.set_ylabel(METRICS["overlap"].axis)
    b.set_title(METRICS["overlap"].title
                + (f"\n(M = {', '.join(map(str, too_large))}: more than the "
                   f"{max(n for n in studied if n is not None)} queries studied, not drawn)"
                   if too_large else ""))
    handles, _ = b.get_legend_handles_labels()
    no_reuse = [length_label(T) for i, T in enumerate(lengths)
                if not np.isfinite(col(s["reuse"][()], "mean")[i])]
    handles.append(Line2D([], [], ls="--", lw=0.9, color=colour,
                          label=r"inter-block reuse $|U_b \cap U_{b-1}| \,/\, |U_b|$, "
                          f"M = {ov['final_block']}"
                          + (", one per T in its shade" if len(lengths) > 1 else "")
                          + (f"\n(none at T = {', '.join(no_reuse)}: fewer than two blocks)"
                             if no_reuse else "")))
    # Below the axes: overlap values fill the whole [0, 1] range, so no corner is free of data.
    b.legend(handles=handles, loc="upper center", bbox_to_anchor=(0.5, -0.16), frameon=False,
             ncol=2)
    fewer = [f"{n} at T = {length_label(T)}" for T, n in zip(lengths, studied)
             if n is not None and n < ov["tail_queries"]]
    suptitle(fig, f"{stem}: chunk overlap of adjacent queries, mechanism {mech} "
                 f"(S = {geometry['S']}, K = {geometry['K']}, last {ov['tail_queries']} queries)\n"
                 + (f"fewer queries where fewer have a candidate: {', '.join(fewer)}\n"
                    if fewer else "") +
                 "mean over layers × KV groups; bars ±1 sd (clipped to [0, 1]), shading min–max")
    fig.tight_layout()
    return [save(fig, out, f"{stem}_overlap.png")]


def studied_queries(f, T):
    """A results file, a length -> how many tail queries its units studied (the same in every
    unit of a length: tail_queries, or the queries with a candidate where fewer), None when no
    unit of that length is in the file."""
    for layer in f.get(f"T{T}", {}).values():
        for unit in layer.values():
            if "queries" in unit:
                return len(unit["queries"])
    return None


def loaded_union_bars(ax, s, lengths, final_block, colour):
    """Visible chunks |V| and the final block's loaded union per length, with the fraction."""
    x = np.arange(len(lengths))
    fc, fu, lf = s["final_candidates"][()], s["final_union"][()], s["loaded_fraction"][()]
    union, sd = col(fu, "mean"), np.nan_to_num(col(fu, "sd"))
    ax.bar(x - 0.2, col(fc, "mean"), width=0.4, color="#c8c8c8",
           label=r"visible chunks $|V(t_{last})|$")
    # A count is >= 0: the bar's lower end stops at zero.
    ax.bar(x + 0.2, union, width=0.4, yerr=np.vstack([np.minimum(sd, union), sd]), capsize=3,
           color=colour,
           label=f"loaded union of the last {final_block} queries, ±1 sd")
    top = max(np.nanmax(col(fc, "mean")), np.nanmax(union + sd))
    for i in range(len(lengths)):
        # Above the error bar's cap, never over it.
        ax.text(x[i] + 0.2, union[i] + sd[i] + 0.02 * top, f"{100 * col(lf, 'mean')[i]:.1f}%",
                ha="center", va="bottom", fontsize=8)
    ax.set_ylim(0, 1.22 * top)
    if len(lengths) == 1:
        ax.set_xticks(x, [f"T = {int(lengths[0])} slots"])
        ax.set_xlim(-1.0, 1.0)
    else:
        ax.set_xticks(x, [length_label(t) for t in lengths])
        ax.set_xlabel("context length T [slots]")
    ax.set_ylabel("chunks (count)")
    ax.set_title("loaded union vs visible chunks (label: loaded fraction |U| / |V|)")
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.16), frameon=False, ncol=1)


def extrapolation_plots(f, config, stem, out):
    """Needle success grids per (encoding, mechanism) and the metrics vs length per encoding."""
    paths = []
    ex = config["extrapolation"]
    enc = ex["encodings"]
    mechs = config["mechanisms"]
    if ex.get("depths"):
        if "needle" in f and "depths" in f["needle"]:
            paths.append(needle_grid(f, config, stem, out))
        else:
            print(f"{stem}: note: no needle summary in the file yet: the needle figure is not "
                  "drawn", file=sys.stderr)

    metrics = panels("metrics_vs_length")
    fig, axes = plt.subplots(len(enc), len(metrics), figsize=(3.4 * len(metrics), 2.9 * len(enc)),
                             squeeze=False)
    train = ex["train_length"]
    single = len(config["lengths"]) == 1
    for i, e in enumerate(enc):
        for j, name in enumerate(metrics):
            ax = axes[i][j]
            ax.set_title(f"{e}: {METRICS[name].title}")
            if f"{e}/summary" not in f:
                say_missing(ax, f"{e} summary")
                continue
            metric_panel(ax, f[f"{e}/summary"], mechs, name, single)
            if not single:
                ax.axvline(train, color="#888888", ls=":", lw=1.0)
            if i < len(enc) - 1 and not single:
                ax.set_xlabel("")
    train_line = Line2D([], [], color="#888888", ls=":", lw=1.0,
                        label=f"train length {train} slots")
    if single:
        what = (f"fidelity at T = {config['lengths'][0]} slots (the study's only length; "
                f"train length {train} slots)")
    else:
        what = f"fidelity as the context grows past the train length ({train} slots)"
    suptitle(fig, f"{stem}: {what}, per positional encoding\n{SUMMARY_NOTE}")
    strip = bottom_strip(fig, [] if single else mechs, [train_line], OUTPUT_ERROR_NOTE)
    fig.tight_layout(rect=(0, strip, 1, 1))
    paths.append(save(fig, out, f"{stem}_metrics_vs_length.png"))
    return paths


def needle_grid(f, config, stem, out):
    """Needle success rate [length x depth] per (encoding, mechanism), one colour bar.

    Several lengths: a panel per (encoding, mechanism) with the lengths as rows. One length: a
    panel per encoding with the mechanisms as rows (a length axis of one row says nothing).
    """
    ex = config["extrapolation"]
    enc, mechs = ex["encodings"], config["mechanisms"]
    depths = f["needle/depths"][()]
    lengths = f["needle/lengths"][()]
    single = len(lengths) == 1
    grid = lambda e, m: f[f"needle/{e}/{m}/grid"][()] if f"needle/{e}/{m}/grid" in f else None
    if single:
        fig, axes = plt.subplots(1, len(enc), figsize=(0.55 * len(depths) * len(enc) + 2.6,
                                                       0.32 * len(mechs) + 2.0),
                                 squeeze=False, sharey=True)
        panels = [(axes[0][i], e, None) for i, e in enumerate(enc)]
    else:
        fig, axes = plt.subplots(len(enc), len(mechs), figsize=(2.0 * len(mechs) + 1.2,
                                                                1.9 * len(enc) + 1.1),
                                 squeeze=False, sharex=True, sharey=True)
        panels = [(axes[i][j], e, m) for i, e in enumerate(enc) for j, m in enumerate(mechs)]
    image = None
    for ax, e, m in panels:
        if single:
            rows = [grid(e, name) for name in mechs]
            values = np.vstack([r if r is not None else np.full((1, len(depths)), np.nan)
                                for r in rows])
            row_labels = mechs
        else:
            values = grid(e, m)
            row_labels = [length_label(t) for t in lengths]
        if values is None:
            say_missing(ax, "grid")
            continue
        # Lengths grow upwards; mechanisms read top-down in the order of the legends.
        image = ax.imshow(values, vmin=0, vmax=1, cmap="viridis", aspect="auto",
                          origin="upper" if single else "lower")
        annotate_cells(ax, values)
        ax.set_xticks(range(len(depths)), [f"{d:g}" for d in depths])
        ax.set_yticks(range(len(row_labels)), row_labels)
        ax.tick_params(length=0)
        if single:
            for tick, name in zip(ax.get_yticklabels(), mechs):
                tick.set_color(mechanism_colour(name))
            ax.set_title(e)
            ax.set_xlabel("needle depth")
        else:
            # The train length: rows above the line are longer than the model was trained on.
            beyond = int(np.searchsorted(lengths, ex["train_length"], side="right"))
            if 0 < beyond < len(lengths):
                ax.axhline(beyond - 0.5, color="white", ls="--", lw=1.2)
    if not single:
        for j, m in enumerate(mechs):
            axes[0][j].set_title(m, color=mechanism_colour(m))
            axes[-1][j].set_xlabel("needle depth")
        for i, e in enumerate(enc):
            axes[i][0].set_ylabel(f"{e}\nT [slots]")
    layout = ("one panel per positional encoding, one row per mechanism, "
              f"at T = {int(lengths[0])} slots" if single else
              "rows: positional encoding, columns: mechanism; white dashes: train length")
    suptitle(fig, f"{stem}: needle retrieval by selection: a key planted at a depth of the last "
                 f"query's candidates\n(0 = oldest chunk, 1 = newest), logit "
                 f"{ex['needle_logit']:g} for that query; train length {ex['train_length']} "
                 f"slots\n{layout}")
    right = 1.0 - 1.0 / fig.get_figwidth()
    fig.tight_layout(rect=(0, 0, right, 1))
    if image is not None:
        bar_ax = fig.add_axes((right + 0.1 / fig.get_figwidth(), 0.15,
                               0.12 / fig.get_figwidth(), 0.6))
        bar = fig.colorbar(image, cax=bar_ax)
        bar.set_label("success: fraction of KV groups whose\nselection I(t_last) holds the "
                      "needle's chunk", fontsize=7.5)
    return save(fig, out, f"{stem}_needle.png")


def annotate_cells(ax, values):
    """[rows x cols] values drawn by imshow -> each cell's value written in it (readable on the
    dark and the light end of viridis)."""
    for (r, c), v in np.ndenumerate(values):
        if np.isfinite(v):
            ax.text(c, r, f"{v:.2g}", ha="center", va="center", fontsize=7,
                    color="white" if v < 0.6 else "black")


class OutputError(Exception):
    """A PNG that could not be written (full disk, read-only folder): exit 3 with the reason."""


def save(fig, out, name):
    """A figure -> the PNG `name` in `out`, whole or not at all; returns its path."""
    path = os.path.join(out, name)
    temp = os.path.join(out, f".{name}.tmp-{os.getpid()}")
    try:
        fig.savefig(temp, format="png")
        os.replace(temp, path)
    except BaseException as e:  # a full disk, or Ctrl-C mid-write: no half-written file
        try:
            os.remove(temp)
        except OSError:
            pass
        if isinstance(e, OSError):
            raise OutputError(f"{path}: expected a writable folder with room for the plot, "
                              f"found {e.strerror or e}") from e
        raise
    finally:
        plt.close(fig)
    return path


def missing_summaries(f, config, study):
    """The summary units a finished study writes last that the file's complete_units lacks."""
    try:
        units = set(json.loads(f.attrs["complete_units"]))
    except (KeyError, ValueError):
        units = set()
    if study == "extrapolation":
        ex = config.get("extrapolation", {})
        wanted = [f"{e}/summary" for e in ex.get("encodings", [])]
        if ex.get("depths"):
            wanted.append("needle/summary")
    else:
        wanted = ["summary"]
    return [w for w in wanted if not any(u == w or u.endswith("/" + w) for u in units)]


def other_hils_file(f):
    """An open HDF5 file -> what it is in words when it is a hils file that is not a study's
    results (an activation file, hils run's results), else None: the message was "not a hils
    study results file" and h5py's words for a missing attribute ("'study'")."""
    fmt = f.attrs.get("format")
    if isinstance(fmt, bytes):
        fmt = fmt.decode(errors="replace")
    if fmt == "hils-activations":
        return "an activation file (hils dump), not the results of a study"
    try:
        study = json.loads(f.attrs["config"]).get("study")
    except (KeyError, TypeError, ValueError, AttributeError):
        return None
    if fmt == "hils-results" and study is None:
        return "the results of hils run (hils info describes them), not of a study"
    return None


# The figures of each study (config.study), one entry per row of the CLI's study table
# (experiments/cli/studies/study_table.hpp; tests/experiments/test_study_table.cpp plots each).
DRAW = {"fidelity": fidelity_plots, "overlap": overlap_plots,
        "extrapolation": extrapolation_plots}


def studies_listed():
    """-> "fidelity, overlap or extrapolation": the studies DRAW draws."""
    names = list(DRAW)
    return ", ".join(names[:-1]) + " or " + names[-1] if len(names) > 1 else names[0]


def main():
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("results")
    p.add_argument("--out", required=True)
    p.add_argument("--list", help="write the PNG paths here, one per line")
    a = p.parse_args()
    try:
        f = h5py.File(a.results, "r")
        other = other_hils_file(f)
        if other:
            print(f"{a.results}: {other}: hils plot draws those of hils fidelity, overlap and "
                  "extrapolate", file=sys.stderr)
            return 2
        config = json.loads(f.attrs["config"])
        study = config["study"]
    except (OSError, KeyError, TypeError, ValueError) as e:
        print(f"{a.results}: not a hils study results file ({e})", file=sys.stderr)
        return 2
    # The layout is that of data/results_format.md's format_version; another one (a newer hils,
    # a file edited by hand) would be drawn wrongly or half, so it is refused as `hils info` does.
    fmt, version = f.attrs.get("format"), f.attrs.get("format_version")
    if isinstance(fmt, bytes):
        fmt = fmt.decode(errors="replace")
    if fmt != "hils-results" or not isinstance(version, (int, np.integer)) or version != 1:
        print(f"{a.results}: / attributes format, format_version: expected 'hils-results', 1 "
              f"(this hils version's results layout), found {fmt!r}, {version!r}",
              file=sys.stderr)
        return 2
    stem = os.path.splitext(os.path.basename(a.results))[0]
    draw = DRAW.get(study) if isinstance(study, str) else None
    if draw is None:
        print(f"{a.results}: config.study is '{study}', expected {studies_listed()}",
              file=sys.stderr)
        return 2
    missing = missing_summaries(f, config, study)
    global INCOMPLETE_LINE
    INCOMPLETE_LINE = ("INCOMPLETE RUN (interrupted?): run the same command again to resume it"
                       if missing else "")
    if missing:
        print(f"{a.results}: note: the run is incomplete (interrupted?): no {', '.join(missing)} "
              "unit yet, so panels may be empty or partial; run the same command again to "
              "resume it", file=sys.stderr)
    try:
        os.makedirs(a.out, exist_ok=True)
        paths = draw(f, config, stem, a.out)
        if a.list:  # the caller (hils plot) prints the paths itself
            # surrogateescape: a results name that is not UTF-8 goes back to hils byte for byte
            with open(a.list, "w", errors="surrogateescape") as fh:
                fh.write("\n".join(paths) + "\n")
    except OutputError as e:
        print(e, file=sys.stderr)
        return 3
    except OSError as e:
        print(f"{e.filename or a.out}: expected a writable plot folder with room, found "
              f"{e.strerror or e}", file=sys.stderr)
        return 3
    except (KeyError, TypeError) as e:
        # A file of another version or tool: its config or datasets lack what this study writes.
        print(f"{a.results}: expected the datasets and config keys of a {study} results file of "
              f"this hils version; reading it failed ({type(e).__name__}: {e})", file=sys.stderr)
        return 2
    if not a.list:
        for path in paths:
            print(path)
    return 0

def interrupted(signum, frame):
    """SIGINT -> KeyboardInterrupt, once: a second one (hils passing the terminal's Ctrl-C on to
    this script as it ends, io::ChildProcessScope) must not cut short the removal of a PNG half
    written."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    raise KeyboardInterrupt


if __name__ == "__main__":
    signal.signal(signal.SIGINT, interrupted)
    try:
        sys.exit(main())
    except KeyboardInterrupt:
        # End by the signal itself, as a program without a handler would: the caller sees
        # "killed by SIGINT" (a shell: status 130), and no traceback is printed.
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)

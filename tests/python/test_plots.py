"""The study figures (analysis/plots/plot_study.py) read as one paper's figures: a mechanism has
one colour and marker in every figure; an interval never leaves the range its statistic can take
(Spearman in [-1, 1], fractions in [0, 1], errors >= 0); a study of one length has no length
axis; the needle grid has a colour bar; the output error's axis says its formula; no text sits
on an error bar and no legend on data. The results files come from the `hils` studies at a
small size; the figures are inspected as matplotlib objects after the script saved them."""

import importlib.util
import json
import math
import os
import re
import shutil
import subprocess

import numpy as np
import pytest

from conftest import ROOT, tool

h5py = pytest.importorskip("h5py")
pytest.importorskip("matplotlib")
from matplotlib.colors import to_rgba  # noqa: E402
from matplotlib.transforms import Bbox  # noqa: E402

def load_plot_study():
    """The plotting script as a module (it is a script, not a package)."""
    spec = importlib.util.spec_from_file_location(
        "plot_study", ROOT / "analysis" / "plots" / "plot_study.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


ps = load_plot_study()


@pytest.fixture(scope="module")
def studies(tmp_path_factory):
    """name -> results file of a small study: fidelity at two lengths and at one, overlap at
    one and at two, extrapolation at two lengths (the first is the train length) and at one."""
    hils = tool("HILS_CLI")
    folder = tmp_path_factory.mktemp("studies")
    config = folder / "extrapolation.toml"
    # Two encodings and three mechanisms: enough to check the layout, small enough to draw fast.
    config.write_text("[extrapolation]\ntrain_length = 256\ndepths = [0.0, 0.5, 1.0]\n"
                      'encodings = ["rope", "nope"]\n')
    few = ["--mechanisms", "mean", "taylor_entropy", "naive_bsa"]
    small = ["--n-layers", "1", "-K", "4", "-S", "16", "-W", "64", "-q"]
    runs = {
        "fid2": ["fidelity", "--lengths", "256", "512", "--queries", "4"],
        "fid1": ["fidelity", "--lengths", "512", "--queries", "4"],
        "ov1": ["overlap", "--lengths", "512"],
        "ov2": ["overlap", "--lengths", "256", "512"],
        "ex2": ["extrapolate", "--config", str(config), "--lengths", "256", "512",
                "--queries", "4", *few],
        "ex1": ["extrapolate", "--config", str(config), "--lengths", "512", "--queries", "4",
                *few],
    }
    # One thread: these runs are tiny, and OpenMP's waiting threads only cost time on a busy
    # machine.
    env = dict(os.environ, OMP_NUM_THREADS="1")
    files = {}
    for name, args in runs.items():
        files[name] = folder / f"{name}.h5"
        subprocess.run([hils, *args, "--out", str(files[name]), *small], check=True, env=env)
    return files


def draw(path, out):
    """A results file -> {PNG name without the stem: figure}, drawn and saved by the script's
    own entry point; the figures are kept open (rendered, layout final) for inspection."""
    figures = {}
    real_save = ps.save

    def keep(fig, folder, name):
        figures[name.split("_", 1)[1]] = fig
        return real_save(fig, folder, name)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(ps, "save", keep)
        patch.setattr(ps.plt, "close", lambda fig: None)
        # Fewer pixels to encode; the layout is in inches, so what is checked is the same.
        patch.setitem(ps.plt.rcParams, "savefig.dpi", 40)
        patch.setattr("sys.argv", ["plot_study.py", str(path), "--out", str(out)])
        assert ps.main() == 0
    return figures


@pytest.fixture(scope="module")
def drawn(studies, tmp_path_factory):
    """name -> {PNG name: figure} of each small study, drawn once for all the tests."""
    out = tmp_path_factory.mktemp("plots")
    figures = {name: draw(path, out) for name, path in studies.items()}
    yield figures
    ps.plt.close("all")


def error_bars(ax):
    """An axes -> [(label, data line, [n, 2, 2] bar segments)] of its error bars."""
    bars = []
    for c in ax.containers:
        if hasattr(c, "has_yerr") and c.has_yerr:
            line, _, cols = c.lines
            bars.append((c.get_label(), line, np.array(cols[0].get_segments())))
    return bars


def metric_of(ax):
    """An axes -> the METRICS entry whose axis label it carries (None if none)."""
    return ps.METRICS.get(metric_name(ax))


def metric_name(ax):
    """An axes -> the METRICS key whose axis label it carries (None if none)."""
    return next((k for k, m in ps.METRICS.items() if ax.get_ylabel() == m.axis), None)


def test_one_colour_and_marker_per_mechanism_in_every_figure(drawn):
    seen = {}
    for name in ("fid2", "fid1", "ex2", "ex1"):
        for figure_name, fig in drawn[name].items():
            for ax in fig.axes:
                for label, line, _ in error_bars(ax):
                    if label not in ps.MECHANISM_COLOURS:
                        continue
                    style = (to_rgba(line.get_color()), line.get_marker())
                    assert style == (to_rgba(ps.mechanism_colour(label)),
                                     ps.mechanism_marker(label)), (name, figure_name, label)
                    seen.setdefault(label, set()).add(style)
            # The legends show the same style as the points.
            for legend in fig.legends + [ax.get_legend() for ax in fig.axes if ax.get_legend()]:
                handles = getattr(legend, "legend_handles", None) or legend.legendHandles
                for handle, text in zip(handles, legend.get_texts()):
                    if text.get_text() in ps.MECHANISM_COLOURS:
                        assert to_rgba(handle.get_color()) == to_rgba(
                            ps.mechanism_colour(text.get_text())), (name, figure_name)
    assert len(seen) >= 5
    assert all(len(styles) == 1 for styles in seen.values()), seen
    # Distinct mechanisms of one study are told apart by colour or marker.
    assert len({next(iter(s)) for s in seen.values()}) == len(seen)


def beyond_range(metric):
    """A metric -> an interval that leaves its range on each side where it has one (ends at
    -1.5 or 5.0 where it has none), as a Student-t interval of a mean can."""
    low = metric.low - 0.3 if math.isfinite(metric.low) else -1.5
    high = metric.high + 0.4 if math.isfinite(metric.high) else 5.0
    return low, high


def test_intervals_stay_in_the_range_of_their_statistic(studies, tmp_path):
    # A Student-t interval of a mean can leave the statistic's range; write such intervals into
    # a copy of the file, as a run on heavy-tailed data would.
    path = tmp_path / "wide.h5"
    shutil.copy(studies["fid2"], path)
    low, high = ps.COLS.index("ci_low"), ps.COLS.index("ci_high")
    wide = {name: beyond_range(ps.METRICS[name]) for name in ps.panels("metrics")}
    with h5py.File(path, "r+") as f:
        for m in ("mean", "taylor"):
            for name, (lo, hi) in wide.items():
                rows = f[f"summary/{m}/{name}"][()]
                rows[:, low], rows[:, high] = lo, hi
                f[f"summary/{m}/{name}"][...] = rows
    fig = draw(path, tmp_path / "plots")["metrics.png"]
    checked = 0
    for ax in fig.axes:
        name = metric_name(ax)
        if name is None:
            continue
        metric = ps.METRICS[name]
        for label, _, segments in error_bars(ax):
            y = segments[:, :, 1]
            assert y.min() >= metric.low and y.max() <= metric.high, (name, label, y)
            if label in ("mean", "taylor"):
                checked += 1
                # Clipped, not dropped: each bar reaches the bound it was clipped to (or the
                # written end, where the statistic has no bound).
                assert np.allclose(y.min(axis=1), max(metric.low, wide[name][0])), (name, y)
                assert np.allclose(y.max(axis=1), min(metric.high, wide[name][1])), (name, y)
    assert checked == 2 * len(wide)


@pytest.mark.parametrize("study", ["fid1", "fid2"])
def test_an_undefined_mean_is_said_where_its_point_would_be(studies, tmp_path, study):
    # A mean that is NaN (the metric undefined for every sample, as Spearman is for tied
    # scores) was left out without a word: the panel looked as if the mechanism had not run.
    path = tmp_path / f"{study}nan.h5"  # no "_": draw() keys figures by the name after it
    shutil.copy(studies[study], path)
    with h5py.File(path, "r+") as f:
        rows = f["summary/taylor/spearman"][()]
        rows[-1, ps.COLS.index("mean")] = np.nan
        f["summary/taylor/spearman"][...] = rows
    fig = draw(path, tmp_path / "plots")["metrics.png"]
    ax = next(a for a in fig.axes if metric_name(a) == "spearman")
    notes = [t for t in ax.texts if t.get_text() == "undefined"]
    assert len(notes) == 1
    assert to_rgba(notes[0].get_color()) == to_rgba(ps.mechanism_colour("taylor"))
    line = next(c.lines[0] for c in ax.containers if c.get_label() == "taylor")
    assert np.isclose(notes[0].get_position()[0], line.get_xdata()[-1])
    # The other panels, whose means are all defined, say nothing of the kind.
    assert not any(t.get_text() == "undefined" for a in fig.axes if a is not ax for t in a.texts)


def test_a_single_length_has_no_length_axis(drawn):
    two, one = drawn["fid2"]["metrics.png"], drawn["fid1"]["metrics.png"]
    metric_axes = [ax for ax in two.axes if metric_of(ax)]
    assert metric_axes and all(ax.get_xscale() == "log" for ax in metric_axes)
    for ax in (ax for ax in one.axes if metric_of(ax)):
        assert ax.get_xscale() == "linear"
        names = [t.get_text() for t in ax.get_xticklabels()]
        assert names and all(n in ps.MECHANISM_COLOURS for n in names), names
        assert "length" not in ax.get_xlabel()
    # The single-length needle: one panel per encoding, the mechanisms as its rows.
    needle = drawn["ex1"]["needle.png"]
    panels = [ax for ax in needle.axes if ax.images]
    assert len(panels) == 2
    assert [t.get_text() for t in panels[0].get_yticklabels()][0] == "mean"


def test_needle_grid_has_a_colour_bar_and_cell_values(drawn):
    needle = drawn["ex2"]["needle.png"]
    bars = [ax for ax in needle.axes if "fraction of KV groups" in ax.get_ylabel()]
    assert len(bars) == 1
    lo, hi = bars[0].get_ylim()
    assert (lo, hi) == (0.0, 1.0)
    panel = next(ax for ax in needle.axes if ax.images)
    grid = panel.images[0].get_array()
    assert len(panel.texts) == grid.size


def test_the_overlap_of_one_query_is_not_drawn_as_a_measurement(drawn):
    # A block of M = 1 query has overlap 1 by definition; drawn, every curve fell from 1 at
    # M = 1 to its first measured value at M = 2, a dip the data do not have.
    panel = next(ax for ax in drawn["ov1"]["overlap.png"].axes
                 if ax.get_ylabel() == ps.METRICS["overlap"].axis)
    bars = error_bars(panel)
    assert bars
    for _, line, _ in bars:
        assert 1 not in line.get_xdata() and 2 in line.get_xdata(), line.get_xdata()
    assert "M = 1 is 1 by definition" in panel.get_xlabel()
    # The dashed reuse lines, one per length, share one legend entry: it says so (one length:
    # nothing to say).
    for name, said in (("ov1", False), ("ov2", True)):
        axes = drawn[name]["overlap.png"].axes
        ax = next(ax for ax in axes if ax.get_ylabel() == ps.METRICS["overlap"].axis)
        legend = [t.get_text() for t in ax.get_legend().get_texts()]
        reuse = next(t for t in legend if "inter-block reuse" in t)
        assert ("one per T in its shade" in reuse) == said, reuse


def test_an_overlap_of_fewer_queries_than_its_blocks_says_so_without_warnings(tmp_path):
    # A context with fewer queries that have a candidate than tail_queries (T = 100 at S = 16,
    # W = 64: 21; an activation file of a short text): the title said "last 256 queries", the
    # blocks of M = 32 and 64 had empty places on the axis without a word, the reuse line was
    # in the legend and not drawn, and numpy's "All-NaN slice encountered" RuntimeWarning was
    # printed under hils plot's lines.
    path = tmp_path / "short.h5"
    subprocess.run([tool("HILS_CLI"), "overlap", "--lengths", "100", "--n-layers", "1", "-S",
                    "16", "-W", "64", "-K", "4", "-q", "--out", str(path)], check=True,
                   env=dict(os.environ, OMP_NUM_THREADS="1"))
    n = len(h5py.File(path)["T100/layer0/group0/queries"])
    assert n < 32, n
    code, err = run_script(path, tmp_path)
    assert code == 0, err
    assert "Warning" not in err, err
    fig = draw(path, tmp_path / "plots")["overlap.png"]
    title = fig._suptitle.get_text()
    assert f"{n} at T = 100" in title, title
    ax = next(ax for ax in fig.axes if ax.get_ylabel() == ps.METRICS["overlap"].axis)
    ticks = [t.get_text() for t in ax.get_xticklabels()]
    assert "32" not in ticks and "64" not in ticks, ticks
    assert f"M = 32, 64: more than the {n} queries studied, not drawn" in ax.get_title()
    legend = [t.get_text() for t in ax.get_legend().get_texts()]
    assert any("none at T = 100: fewer than two blocks" in t for t in legend), legend


def test_the_gap_figure_keeps_the_mechanism_order_and_says_what_it_leaves_out(studies, drawn):
    # Was: mean, max_logit, taylor, taylor_entropy whatever the other figures' order, and
    # landmark_key and naive_bsa left out without a word.
    with h5py.File(studies["fid2"], "r") as f:
        mechs = json.loads(f.attrs["config"])["mechanisms"]
    assert "landmark_key" in mechs and "naive_bsa" in mechs, mechs
    fig = drawn["fid2"]["gap_entropy.png"]
    titles = [ax.get_title() for ax in fig.axes if ax.get_title()]
    assert titles == [m for m in mechs if m in ("mean", "max_logit", "taylor", "taylor_entropy")]
    said = fig._suptitle.get_text().split("not drawn:")[-1]
    assert "landmark_key (ŝ is a logit)" in said and "naive_bsa (ŝ = L, gap 0)" in said, said


def test_a_study_of_no_pooling_estimator_draws_its_figures(tmp_path):
    # `--mechanisms naive_bsa`, or presets only (nsa, hils): the gap figure had 0 panels, a
    # ValueError from matplotlib; hils plot (and --plot) ended with a traceback and exit 3 on a
    # complete results file. Presets were also left out of the gap figure without a word.
    for i, mechs in enumerate((["naive_bsa"], ["nsa", "hils"], ["mean", "nsa"])):
        path = tmp_path / f"m{i}.h5"  # no '_' in the stem: draw() keys the figures after it
        subprocess.run([tool("HILS_CLI"), "fidelity", "--lengths", "256", "--n-layers", "1",
                        "--queries", "4", "-S", "16", "-W", "64", "-K", "4", "--mechanisms",
                        *mechs, "-q", "--out", str(path)], check=True,
                       env=dict(os.environ, OMP_NUM_THREADS="1"))
        code, err = run_script(path, tmp_path / "png")
        assert code == 0, (mechs, err)
        fig = draw(path, tmp_path / "plots")["gap_entropy.png"]
        said = fig._suptitle.get_text().split("not drawn:")[-1]
        assert all(m in said for m in mechs if m != "mean"), (mechs, said)
        titles = [ax.get_title() for ax in fig.axes if ax.get_title()]
        assert titles == [m for m in mechs if m == "mean"], (mechs, titles)
        # A figure of one panel cut its title at both edges.
        for name in ("gap_entropy.png", "scatter.png"):
            figure = draw(path, tmp_path / "plots")[name]
            box = figure._suptitle.get_window_extent(figure.canvas.get_renderer())
            assert box.x0 >= 0 and box.x1 <= figure.bbox.width, (mechs, name, box)


def test_output_error_axis_states_its_formula(drawn):
    for name, figure in (("fid2", "metrics.png"), ("ex2", "metrics_vs_length.png")):
        fig = drawn[name][figure]
        labels = [ax.get_ylabel() for ax in fig.axes if metric_of(ax) is ps.METRICS["output_error"]]
        assert labels and all(r"\Vert o_t - o^{full}_t\Vert_2" in lab for lab in labels)
        notes = [t.get_text() for t in fig.texts]
        assert any("full causal attention" in n for n in notes), notes


def overlaps(a, b):
    """Two display-space boxes -> whether they intersect with positive area."""
    return a.x0 < b.x1 and b.x0 < a.x1 and a.y0 < b.y1 and b.y0 < a.y1


def test_no_text_on_an_error_bar_and_no_legend_on_data(drawn):
    figures = {f"{name}/{k}": fig for name, figs in drawn.items() for k, fig in figs.items()}
    for figure_name, fig in figures.items():
        renderer = fig.canvas.get_renderer()
        for ax in fig.axes:
            # Each error bar as a display-space box, a few pixels wide (the bar's line).
            bar_boxes = [Bbox(ax.transData.transform(segment)).padded(2.0)
                         for _, _, segments in error_bars(ax) for segment in segments]
            for text in ax.texts:
                if not text.get_text() or "needle" in figure_name:
                    continue  # the needle's cell values sit in their cells by design
                box = text.get_window_extent(renderer)
                for bar in bar_boxes:
                    assert not overlaps(box, bar), (figure_name, text.get_text())
            legend = ax.get_legend()
            if legend is None:
                continue
            box = legend.get_window_extent(renderer)
            for line in ax.lines:
                data = np.column_stack(line.get_data()).astype(float)
                xy = line.get_transform().transform(data)  # axhline: x in axes units
                inside = ((xy[:, 0] > box.x0) & (xy[:, 0] < box.x1) & (xy[:, 1] > box.y0)
                          & (xy[:, 1] < box.y1))
                assert not inside.any(), (figure_name, line.get_label())


def test_an_incomplete_run_is_said_in_every_figure(studies, drawn, tmp_path, capsys):
    path = tmp_path / "cut.h5"
    shutil.copy(studies["fid2"], path)
    with h5py.File(path, "r+") as f:
        del f["summary"]
        f.attrs["complete_units"] = '["T1024/layer0/group0"]'
    figures = draw(path, tmp_path / "plots")
    assert "the run is incomplete" in capsys.readouterr().err
    texts = [t.get_text() for ax in figures["metrics.png"].axes for t in ax.texts]
    assert len(texts) == len(ps.panels("metrics"))
    assert all("no summary in the file" in t for t in texts)
    # Every figure of the file says so itself, in its title (a PNG is often seen alone).
    assert len(figures) == 3
    for name, fig in figures.items():
        assert fig._suptitle.get_text().startswith("INCOMPLETE RUN"), name
    # A finished run's figures carry no stamp.
    assert not any("INCOMPLETE" in fig._suptitle.get_text() for figs in drawn.values()
                   for fig in figs.values())


def loading_matplotlib(pid):
    """Whether process `pid` has mapped one of matplotlib's compiled modules (it is importing
    matplotlib, well past the interpreter's start)."""
    try:
        with open(f"/proc/{pid}/maps") as maps:
            return "matplotlib" in maps.read()
    except OSError:
        return False


def run_script(results, out, limit=None, sigint=False):
    """The plotting script as hils runs it -> (return code, stderr); optionally under a
    file-size limit (a full disk: writes fail with EFBIG) or sent SIGINT (Ctrl-C) once it is
    loading matplotlib."""
    import resource
    import signal
    import sys
    import time

    def limited():
        if limit is not None:
            resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
    command = [sys.executable, str(ROOT / "analysis" / "plots" / "plot_study.py"), str(results),
               "--out", str(out), "--list", str(out / ".plots.txt")]
    p = subprocess.Popen(command, stderr=subprocess.PIPE, text=True, preexec_fn=limited)
    if sigint:
        deadline = time.monotonic() + 60
        while not loading_matplotlib(p.pid) and p.poll() is None and time.monotonic() < deadline:
            time.sleep(0.005)
        p.send_signal(signal.SIGINT)
    _, err = p.communicate()
    return p.returncode, err


def test_a_full_disk_is_a_clear_message_and_no_half_written_png(studies, tmp_path):
    # Was a PIL traceback (exit 1: "internal error" in hils) and a truncated PNG.
    out = tmp_path / "plots"
    out.mkdir()
    code, err = run_script(studies["fid1"], out, limit=4096)
    assert code == 3, err
    assert "expected a writable folder with room for the plot, found File too large" in err
    assert "Traceback" not in err
    assert sorted(os.listdir(out)) == []  # no PNG cut short, no temporary file


def test_ctrl_c_ends_the_script_by_the_signal_without_a_traceback(studies, tmp_path):
    # Was a KeyboardInterrupt traceback and exit 1, reported by hils as an internal error.
    import signal
    code, err = run_script(studies["fid1"], tmp_path, sigint=True)
    assert code == -signal.SIGINT, err
    assert "Traceback" not in err


def test_a_results_file_of_another_format_version_is_refused(studies, tmp_path):
    # Was drawn as if it had this version's layout (exit 0), while `hils info` refused it.
    path = tmp_path / "newer.h5"
    shutil.copy(studies["fid1"], path)
    with h5py.File(path, "r+") as f:
        f.attrs["format_version"] = 2
    code, err = run_script(path, tmp_path)
    assert code == 2, err
    assert "format_version: expected 'hils-results', 1" in err and ", 2" in err
    assert not list(tmp_path.glob("*.png"))


def test_hils_plot_takes_any_path_and_reports_a_full_disk_as_bad_input(studies, tmp_path):
    # Was a shell command line: a quote in the path broke it (and `$(...)` would have run), and
    # the script's exit 3 (full disk) was reported by hils as an internal error.
    hils = tool("HILS_CLI")
    odd = tmp_path / "it's $(touch pwned) fid.h5"
    shutil.copy(studies["fid1"], odd)
    done = subprocess.run([hils, "plot", str(odd), "--out", str(tmp_path / "p q")],
                          capture_output=True, text=True, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert list((tmp_path / "p q").glob("*.png"))
    assert not (tmp_path / "pwned").exists()
    full = subprocess.run(["bash", "-c", 'ulimit -f 4; exec "$@"', "-", hils, "plot", str(odd),
                           "--out", str(tmp_path / "full")], capture_output=True, text=True)
    assert full.returncode == 2, full.stderr
    assert "expected a writable plot folder with room" in full.stderr
    assert "internal error" not in full.stderr


def test_a_results_name_that_is_not_utf8_is_plotted(studies, tmp_path):
    # The list of PNGs the script hands back to hils raised UnicodeEncodeError (a traceback,
    # then "internal error: plotting failed"), and each title warned of a missing glyph.
    hils = tool("HILS_CLI")
    odd = os.fsencode(tmp_path) + b"/f\xff.h5"
    shutil.copy(studies["fid1"], odd)
    done = subprocess.run([hils, "plot", odd, "--out", os.fsencode(tmp_path) + b"/p\xff"],
                          capture_output=True)
    err = done.stderr.decode(errors="replace")
    assert done.returncode == 0, err
    assert "Traceback" not in err and "Glyph" not in err, err
    assert list((tmp_path / os.fsdecode(b"p\xff")).glob("*.png"))


def undefined_everywhere(source, path, metric="spearman"):
    """A copy of a results file whose `metric` is undefined for every head of every mechanism,
    as a study writes it (Spearman over one candidate chunk: n = 0, every statistic NaN)."""
    shutil.copy(source, path)
    with h5py.File(path, "r+") as f:
        for m in f["summary"]:
            if isinstance(f["summary"][m], h5py.Group) and metric in f["summary"][m]:
                rows = f["summary"][m][metric][()]
                rows[:, :-1] = np.nan
                rows[:, ps.COLS.index("n")] = 0
                f["summary"][m][metric][...] = rows
        head = f[[k for k in f if k.startswith("T")][-1] + "/layer0/group0/head0"]
        for m in head:
            if isinstance(head[m], h5py.Group) and metric in head[m]:
                head[m][metric][...] = np.nan
    return path


def test_a_metric_undefined_everywhere_keeps_its_axes_and_the_sample_size(studies, tmp_path):
    # Every Spearman mean NaN (one candidate chunk per query): the title said "n = 0 (layers x
    # heads)" while the other panels drew n = 4; the Spearman panel lost its length axis (both
    # tick labels at one spot, "5740", the "undefined" notes on top of each other) and its range.
    path = undefined_everywhere(studies["fid2"], tmp_path / "fidnan.h5")
    figures = draw(path, tmp_path / "plots")
    fig = figures["metrics.png"]
    n = int(h5py.File(studies["fid2"])["summary/mean/topk_recall"][0, ps.COLS.index("n")])
    title = fig._suptitle.get_text()
    assert f"n = {n} (layers × heads)" in title and "n = 0" not in title, title
    ax = next(a for a in fig.axes if metric_name(a) == "spearman")
    lo, hi = ax.get_xlim()
    assert lo < 256 and hi > 512, (lo, hi)
    assert ax.get_ylim() == (-1.0, 1.0)
    notes = [t for t in ax.texts if t.get_text() == "undefined"]
    assert notes and all(lo < t.get_position()[0] < hi for t in notes), (lo, hi, notes)
    # The scatter says it in words, not "ρ = nan".
    titles = [a.get_title() for a in figures["scatter.png"].axes if a.get_visible()]
    assert titles and all("Spearman ρ undefined" in t and "nan" not in t for t in titles), titles


def test_undefined_values_are_drawn_without_warnings(studies, tmp_path):
    # numpy's "Mean of empty slice" and matplotlib's "converting a masked element to nan" were
    # printed under `hils plot`'s own lines for every such file.
    path = undefined_everywhere(studies["fid2"], tmp_path / "fidnan.h5")
    code, err = run_script(path, tmp_path)
    assert code == 0, err
    assert "Warning" not in err, err


def test_hils_plot_names_a_file_that_is_not_a_study_results_file(studies, tmp_path):
    # An activation file and hils run's results were "not a hils study results file" followed
    # by h5py's words ("Can't open attribute", "'study'"); a folder by h5py's errno dump.
    hils = tool("HILS_CLI")
    acts, results = tmp_path / "acts.h5", tmp_path / "run.h5"
    subprocess.run([hils, "-q", "dump", "synthetic", "-T", "128", "-S", "16", "-o", str(acts)],
                   check=True)
    subprocess.run([hils, "-q", "run", str(acts), "-o", str(results), "-p", "full", "-S", "16",
                    "--landmarks", "true"], check=True)
    (tmp_path / "folder.h5").mkdir()
    said = {
        acts: "acts.h5: an activation file (hils dump), not the results of a study: hils plot "
              "draws those of hils fidelity, overlap and extrapolate",
        results: "run.h5: the results of hils run (hils info describes them), not of a study: "
                 "hils plot draws those of hils fidelity, overlap and extrapolate",
        tmp_path / "folder.h5": "folder.h5: expected a results file, found a folder",
    }
    for path, message in said.items():
        done = subprocess.run([hils, "plot", str(path), "--out", str(tmp_path / "p")],
                              capture_output=True, text=True)
        assert done.returncode == 2, done.stderr
        assert message in done.stderr, done.stderr
        assert "errno" not in done.stderr and "Can't open" not in done.stderr, done.stderr


def metrics_written(path, prefix=""):
    """A study results file -> the per-query metrics of its fidelity summary (the first
    mechanism's `<prefix>summary/<m>/<metric>`, without the `_per_head` companions)."""
    with h5py.File(path, "r") as f:
        mechanism = json.loads(f.attrs["config"])["mechanisms"][0]
        return {name for name in f[f"{prefix}summary/{mechanism}"]
                if not name.endswith("_per_head")}


def documented_metrics():
    """data/results_format.md's metric table -> {metric: the figures it names, in order}."""
    text = (ROOT / "data" / "results_format.md").read_text()
    table = text.split("| metric | per sampled query t | figures |")[1].split("\n\n")[0]
    rows = re.findall(r"^\| `(\w+)` \|.*\| (.*) \|$", table, re.M)
    assert rows, "no metric rows in data/results_format.md"
    return {name: tuple(re.findall(r"`(\w+)`", figures)) for name, figures in rows}


def test_every_metric_a_study_writes_has_its_plot_entry_and_its_documents(studies):
    # A metric added to the fidelity study (kFidelityMetrics, analysis/src/fidelity.cpp) is
    # written by fidelity and extrapolation alike; it needs its METRICS entry here (title, axis,
    # range, the figures that draw it), its row in the results format and its name in
    # reference/SEMANTICS.md §9 (README "Adding a study metric").
    written = metrics_written(studies["fid2"])
    assert written and metrics_written(studies["ex2"], "rope/") == written
    documented = documented_metrics()
    semantics = (ROOT / "reference" / "SEMANTICS.md").read_text()
    semantics = semantics.split("## 9. ")[1].split("## 10. ")[0]
    for name in sorted(written):
        assert name in ps.METRICS, f"{name}: no METRICS entry in analysis/plots/plot_study.py"
        assert name in documented, f"{name}: no row in data/results_format.md's metric table"
        assert documented[name] == ps.METRICS[name].drawn_in, (
            f"{name}: data/results_format.md names the figures {documented[name]}, "
            f"plot_study.py draws it in {ps.METRICS[name].drawn_in}")
        assert f"`{name}`" in semantics, f"{name}: not named in reference/SEMANTICS.md §9"
    assert set(documented) == written, "data/results_format.md lists a metric no study writes"
    drawn = set(ps.panels("metrics")) | set(ps.panels("metrics_vs_length"))
    assert drawn <= written, "plot_study.py has a panel of a metric no study writes"

"""A kernel's own layouts and batches (hils.verify's layout=, lse_layout=, selection_order=;
python/hils/layouts.py): a batch made of the reference's own outputs, written out here in each
layout by hand (not with the library's table), passes; a fault planted in one sequence fails
that sequence and the report names it; top-K rows in score order pass only when the caller
says so, and duplicates, chunks out of range and wrong padding still fail; each wrong or
swapped shape is refused with a message naming the tensor, the shapes and the fix. CPU only."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

import hils
from conftest import CASES, case_spec, seed_of, tool, refused
from hils import layouts
from hils.testing import assert_kernel_matches

CASE = "ragged_tail"          # T = 77, S = 8, W = 16, K = 3, Hq = 4, Hkv = 2, d = 16, dv = 12
C = CASES[CASE]
SPEC = case_spec("hils", CASE)
B = 3
LAYOUTS = ("hsd", "shd", "bhsd", "bshd")


def sequence(b, case=CASE):
    """Gaussian float32 q, k, v of sequence b, seeded by the case name and b."""
    c = CASES[case]
    rng = np.random.default_rng(seed_of(f"{case}/b{b}"))
    return tuple(rng.standard_normal(shape).astype(np.float32) for shape in
                 ((c["Hq"], c["T"], c["d"]), (c["Hkv"], c["T"], c["d"]), (c["Hkv"], c["T"], c["dv"])))


@pytest.fixture(scope="module")
def batch():
    """B sequences in the verify file's order: (q, k, v) and the reference's outputs of each."""
    inputs = [sequence(b) for b in range(B)]
    return inputs, [hils.reference(SPEC, *qkv) for qkv in inputs]


def in_layout(parts, layout):
    """Per-sequence [heads, rows, ...] arrays -> one array in `layout`, written out per layout
    (the kernels' conventions: FlashAttention [B, T, H, d], SDPA [B, H, T, d])."""
    if layout == "hsd":
        return parts[0]
    if layout == "shd":
        return np.swapaxes(parts[0], 0, 1)
    stacked = np.stack(parts)
    return stacked if layout == "bhsd" else np.swapaxes(stacked, 1, 2)


def kernel_call(batch, layout, names=None, edit=None):
    """(q, k, v, outputs) in `layout` from the reference's outputs; edit(b, outputs_b) may
    change one sequence's outputs (the verify file's order) before they are laid out."""
    inputs, refs = batch
    count = 1 if layout in ("hsd", "shd") else B
    outs = [{n: a.copy() for n, a in refs[b].items() if names is None or n in names}
            for b in range(count)]
    if edit:
        for b in range(count):
            edit(b, outs[b])
    q, k, v = (in_layout([inputs[b][i] for b in range(count)], layout) for i in range(3))
    return q, k, v, {n: in_layout([out[n] for out in outs], layout) for n in outs[0]}


@pytest.mark.parametrize("layout", LAYOUTS)
def test_every_output_in_each_layout_passes(batch, layout):
    q, k, v, outputs = kernel_call(batch, layout)
    assert set(outputs) == {"o", "lse", "fusion_weights", "selection", "surrogate_scores",
                            "o_window", "lse_window", "summary_key", "summary_bias"}
    report = hils.verify(SPEC, q, k, v, outputs, layout=layout)
    assert report.passed, str(report)
    if layout in ("bhsd", "bshd"):
        assert isinstance(report, hils.BatchReport) and len(report) == B and report.failed == []
        assert all(r.tensors["o"].max_abs < 1e-12 for r in report)  # each b against its own inputs
        assert str(report).startswith(f'batch of 3 sequences, layout "{layout}": 3 pass, 0 fail')
    else:
        assert isinstance(report, hils.Report)


def test_flash_attention_shapes(batch):
    """FlashAttention's flash_attn_func: q, k, v, o [B, T, H, d], softmax_lse [B, H, T]."""
    q, k, v, outputs = kernel_call(batch, "bshd", ("o", "lse", "selection"))
    T, Hq, Hkv = C["T"], C["Hq"], C["Hkv"]
    assert q.shape == (B, T, Hq, C["d"]) and k.shape == (B, T, Hkv, C["d"])
    assert outputs["o"].shape == (B, T, Hq, C["dv"]) and outputs["selection"].shape == (B, T, Hkv, C["K"])
    softmax_lse = np.ascontiguousarray(np.swapaxes(outputs["lse"], 1, 2))   # [B, Hq, T]
    fa = dict(outputs, lse=softmax_lse)
    assert hils.verify(SPEC, q, k, v, fa, layout="bshd", lse_layout="bhsd").passed
    with pytest.raises(ValueError) as error:
        hils.verify(SPEC, q, k, v, fa, layout="bshd")
    assert str(error.value) == (
        'outputs["lse"]: layout "bshd" expects [B, Tq, Hq] = [3, 77, 4], found shape [3, 4, 77], '
        'which is [B, Hq, Tq], the order of layout "bhsd": say so with lse_layout="bhsd" '
        "(FlashAttention's softmax_lse is [B, Hq, T] beside its [B, T, Hq, d] o)")


def test_lse_layout_of_a_bhsd_kernel(batch):
    """lse_layout also reads lse_window the other way (and lse_layout='bshd' beside bhsd o)."""
    q, k, v, outputs = kernel_call(batch, "bhsd", ("o", "lse", "o_window", "lse_window"))
    flipped = {n: (np.swapaxes(a, 1, 2) if n.startswith("lse") else a) for n, a in outputs.items()}
    assert hils.verify(SPEC, q, k, v, flipped, layout="bhsd", lse_layout="bshd").passed
    with pytest.raises(ValueError, match=r'outputs\["lse"\]: layout "bhsd" expects \[B, Hq, Tq\] = \[3, 4, 77\]'):
        hils.verify(SPEC, q, k, v, flipped, layout="bhsd")


def wrong_chunk(b, out):
    """Sequence 2's last query, KV group 0: its last chosen chunk swapped for a candidate of
    V(t) it did not choose (the row kept ascending)."""
    if b != 2:
        return
    row = out["selection"][0, -1]
    missed = next(c for c in range(C["T"] // C["S"]) if c not in row)
    row[-1] = missed
    row.sort()


def shifted_window(b, out):
    """Sequence 2 computed with the window W + S."""
    if b == 2:
        inputs = sequence(2)
        out.update(hils.reference(dict(SPEC, W=C["W"] + C["S"]), *inputs))


def wrong_lse(b, out):
    if b == 2:
        out["lse"][2, 40] += 1e-3


@pytest.mark.parametrize("layout", ("bhsd", "bshd"))
@pytest.mark.parametrize("fault", (wrong_chunk, shifted_window, wrong_lse),
                         ids=("wrong_chunk", "shifted_window", "wrong_lse"))
def test_fault_in_one_sequence_is_named(batch, layout, fault):
    names = ("o", "lse", "selection", "o_window", "lse_window")
    q, k, v, outputs = kernel_call(batch, layout, names, fault)
    report = hils.verify(SPEC, q, k, v, outputs, layout=layout)
    assert not report.passed and report.failed == [2]
    assert report[0].passed and report[1].passed
    text = str(report)
    assert "3 sequences" in text and "2 pass, 1 fail (b=2)" in text
    assert "\n  b=0: PASS" in text and "\n  b=1: PASS" in text and "\n  b=2: FAIL" in text
    assert "---- b=2: FAIL ----\n" + str(report[2]) in text
    assert text.endswith("batch FAIL (b=2)")
    if fault is shifted_window:
        assert "W=24 instead of W=16" in report[2].tensors["o_window"].diagnosis
    with pytest.raises(AssertionError) as raised:
        assert_kernel_matches(SPEC, q, k, v, outputs, layout=layout, kernel="mine")
    assert str(raised.value).startswith("kernel mine: b=2: FAIL (")
    assert "(1 of 3 sequences fail)\nbatch of 3 sequences" in str(raised.value)
    assert "---- b=2: FAIL ----" in str(raised.value)


def score_order(b, out):
    """Sequence b's selection rows [Hkv, Tq, K] permuted at random (the -1 padding anywhere, as
    torch.topk's score order with fla-org's masked_fill(-1) leaves it), and the first K columns
    of its fusion_weights [Hq, Tq, K+2] alike for the G query heads of each group."""
    selection, weights = out["selection"], out["fusion_weights"]
    rng = np.random.default_rng(seed_of(f"topk/b{b}"))
    order = np.argsort(rng.random(selection.shape), axis=-1)
    count, group = selection.shape[-1], weights.shape[0] // selection.shape[0]
    weights[:, :, :count] = np.take_along_axis(weights[:, :, :count],
                                               np.repeat(order, group, axis=0), axis=-1)
    out["selection"] = np.take_along_axis(selection, order, axis=-1)


def topk_outputs(batch, layout):
    q, k, v, outputs = kernel_call(batch, layout, ("o", "lse", "selection", "fusion_weights"),
                                   score_order)
    _, _, _, ascending = kernel_call(batch, layout, ("selection",))
    assert (outputs["selection"] != ascending["selection"]).any()
    assert (outputs["selection"][..., 0] == -1).any()             # padding first in some rows
    return q, k, v, outputs


@pytest.mark.parametrize("layout", ("hsd", "bshd"))
def test_topk_order_passes_with_any_and_fails_without(batch, layout):
    q, k, v, outputs = topk_outputs(batch, layout)
    report = hils.verify(SPEC, q, k, v, outputs, layout=layout, selection_order="any")
    assert report.passed, str(report)
    report = hils.verify(SPEC, q, k, v, outputs, layout=layout)
    assert not report.passed and "entries ascending, -1 at the end" in str(report)
    # The weights must follow the selection: left in ascending order they fail under "any".
    _, _, _, ascending = kernel_call(batch, layout, ("fusion_weights",))
    report = hils.verify(SPEC, q, k, v, dict(outputs, fusion_weights=ascending["fusion_weights"]),
                         layout=layout, selection_order="any")
    sequences = [report] if layout == "hsd" else list(report)
    assert any(not r.tensors["fusion_weights"].passed for r in sequences)


@pytest.mark.parametrize("row,words", [
    ([2, 5, 2], "chunks must be distinct"),                      # a duplicate
    ([9 + 3, 1, 4], "chunk 12 is not a candidate"),               # past n_chunks = 9
    ([77, 1, 4], "chunk 77 is not a candidate"),                  # fla-org test_nsa's pad value T
    ([6, 1, 4], "chunk 6 is not a candidate (V(t) = [0, 5))"),    # in the window of t = 60
], ids=("duplicate", "out_of_range", "pad_T", "in_window"))
def test_any_order_still_fails_malformed_rows(batch, row, words):
    q, k, v, outputs = topk_outputs(batch, "bshd")
    outputs["selection"][1, 60, 0, :] = row                      # b = 1, t = 60, KV group 0
    report = hils.verify(SPEC, q, k, v, outputs, layout="bshd", selection_order="any")
    assert report.failed == [1], str(report)
    assert not report[1].selection.passed
    assert words in str(report[1]), str(report[1])


def test_any_order_refuses_padding_other_than_minus_one(batch):
    q, k, v, outputs = topk_outputs(batch, "bshd")
    outputs["selection"][1, 60, 0, :] = [1, -2, 4]
    with pytest.raises(ValueError) as error:
        hils.verify(SPEC, q, k, v, outputs, layout="bshd", selection_order="any")
    assert str(error.value).startswith('outputs["selection"]: expected chunk indices from -1 '
                                       "(padding) to 2147483647 (int32), found -2 (sequence b=1 "
                                       'of layout "bshd"')


def test_every_reference_output_has_a_layout(batch):
    """The layout table knows every tensor the reference gives and every gradient."""
    known = set(layouts._AXES)
    assert set(batch[1][0]) <= known
    assert {"dq", "dk", "dv", "dq_retrieval", "dprior", "do", "dlse", "prior", "q_retrieval"} <= known



def test_refusals_name_the_tensor_the_shapes_and_the_fix(batch):
    q, k, v, outputs = kernel_call(batch, "bshd", ("o", "lse"))
    verify = lambda *args, **kw: hils.verify(SPEC, *args, **kw)
    refused(lambda: verify(q[0], k, v, outputs, layout="bshd"),
          'q: layout "bshd" expects rank 4 [B, T, Hq, d], found rank 3 shape [77, 4, 16]')
    refused(lambda: verify(q, k[:2], v, outputs, layout="bshd"),
          'k: layout "bshd" expects [B, T, Hkv, d] with B = 3 (from q), found shape [2, 77, 2, 16]')
    refused(lambda: verify(q, k, v, dict(outputs, o=np.swapaxes(outputs["o"], 1, 2)), layout="bshd"),
          'outputs["o"]: layout "bshd" expects [B, Tq, Hq, dv] = [3, 77, 4, *], found shape '
          '[3, 4, 77, 12], which is [B, Hq, Tq, dv], the order of layout "bhsd": transpose it to '
          '[B, Tq, Hq, dv] (x.transpose(1, 2) in torch, np.swapaxes(x, 1, 2) in numpy)')
    refused(lambda: verify(q, k, v, dict(outputs, lse=outputs["lse"][:2]), layout="bshd"),
          'outputs["lse"]: layout "bshd" expects [B, Tq, Hq] with B = 3 (from q), found shape [2, 77, 4]')
    refused(lambda: verify(q[:0], k[:0], v[:0], outputs, layout="bshd"),
          'q: layout "bshd" expects [B, T, Hq, d] with at least one sequence, found B = 0 (shape [0, 77, 4, 16])')
    refused(lambda: verify(q, k, v, outputs, layout="BTHD"),
          'layout: expected one of "hsd", "shd", "bhsd", "bshd" (batch, heads, sequence, dims: '
          "the order of a kernel's axes), found 'BTHD'")
    refused(lambda: verify(q, k, v, outputs, layout="bshd", lse_layout="hsd"),
          'lse_layout: expected None or one of "bhsd", "bshd" (batched, as layout "bshd" is), found "hsd"')
    refused(lambda: hils.verify(SPEC, q[0].swapaxes(0, 1), k[0].swapaxes(0, 1), v[0].swapaxes(0, 1),
                              {}, lse_layout="bhsd"),
          'lse_layout: expected None or one of "hsd", "shd" (one sequence, as layout "hsd" is), found "bhsd"')
    refused(lambda: verify(q, k, v, outputs, layout="bshd", selection_order="descending"),
          'selection_order: expected "ascending" (the verify file\'s rows: chunks ascending, -1 '
          'padding last) or "any" (rows in any order, e.g. torch.topk\'s, sorted before judging), '
          "found 'descending'")
    # The oracle's own message for sequence b, with the layout's reading of it.
    with pytest.raises(ValueError) as error:
        verify(q, k[:, :70], v, outputs, layout="bshd")
    assert str(error.value).startswith("k: expected rank 3 shape [*, 77, 16]")
    assert str(error.value).endswith(
        '(sequence b=0 of layout "bshd", read as q [Hq, T, d] = [4, 77, 16], k [Hkv, T, d] = '
        "[2, 70, 16], v [Hkv, T, dv] = [2, 77, 12])")


def test_heads_equal_to_rows_is_read_as_declared():
    """T = Hq: no shape tells [B, T, Hq] from [B, Hq, T], so nothing is refused or guessed:
    the declared layout is read, and FlashAttention's lse without lse_layout fails as values."""
    rng = np.random.default_rng(seed_of("heads_equal_rows"))
    T = Hq = 8
    q = rng.standard_normal((2, T, Hq, 8)).astype(np.float32)                 # bshd
    k, v = (rng.standard_normal((2, T, 2, 8)).astype(np.float32) for _ in range(2))
    refs = [hils.reference({"preset": "full"}, *(np.swapaxes(a[b], 0, 1) for a in (q, k, v)))
            for b in range(2)]
    o = np.stack([np.swapaxes(r["o"], 0, 1) for r in refs])
    softmax_lse = np.stack([r["lse"] for r in refs])                         # [B, Hq, T]
    spec = {"preset": "full"}
    assert hils.verify(spec, q, k, v, {"o": o, "lse": softmax_lse}, layout="bshd",
                       lse_layout="bhsd").passed
    report = hils.verify(spec, q, k, v, {"o": o, "lse": softmax_lse}, layout="bshd")
    assert report.failed == [0, 1] and not report[0].tensors["lse"].passed
    assert report[0].tensors["o"].passed


def test_queries_and_a_verifier_over_the_batch(batch):
    """queries: one list for every sequence; hils.Verifier(layout=) judges several kernels."""
    inputs, _ = batch
    queries = [5, 40, 76]
    refs = [hils.reference(SPEC, *inputs[b], queries=queries) for b in range(B)]
    q, k, v = (in_layout([inputs[b][i] for b in range(B)], "bshd") for i in range(3))
    outputs = {n: in_layout([r[n] for r in refs], "bshd") for n in ("o", "lse", "selection")}
    assert outputs["o"].shape == (B, 3, C["Hq"], C["dv"])
    oracle = hils.Verifier(SPEC, q, k, v, layout="bshd", queries=queries)
    assert oracle.verify(outputs).passed
    outputs["o"][2, 1, 0, 0] += 0.01
    report = oracle.verify(outputs, kernel="late")
    assert report.failed == [2] and report[2].kernel == "late"
    with pytest.raises(ValueError, match="queries"):
        hils.Verifier(SPEC, q, k, v, layout="bshd", queries=[queries] * B)


def test_gradients_in_a_batch(tmp_path):
    """A backward kernel's do, dlse, q_retrieval, prior and grads in "bshd": two copies of the
    maker's gradient file pass; a zeroed chunk of dk in sequence 1 fails it with the diagnosis."""
    h5py = pytest.importorskip("h5py")
    path = tmp_path / "grads.h5"
    subprocess.run([tool("HILS_MAKE_VERIFY_FILE"), str(path), "gqa_group4", "grads", "hils", "fp32"],
                   check=True, capture_output=True)
    with h5py.File(path, "r") as f:
        inputs = {n: f["inputs/" + n][()] for n in f["inputs"]}
        grads = {n: f["grads/" + n][()] for n in f["grads"]}
        outputs = {n: f["outputs/" + n][()] for n in ("o", "lse", "selection")}
        spec = json.loads(f.attrs["spec"])
    two = lambda a: np.swapaxes(np.stack([a, a]), 1, 2)                       # bshd
    args = (spec, two(inputs["q"]), two(inputs["k"]), two(inputs["v"]))
    options = dict(layout="bshd", q_retrieval=two(inputs["q_retrieval"]), prior=two(inputs["prior"]),
                   do=two(inputs["do"]), dlse=two(inputs["dlse"]))
    batched = {n: two(a) for n, a in grads.items()}
    report = hils.verify(*args, {n: two(a) for n, a in outputs.items()}, grads=batched, **options)
    assert report.passed, str(report)
    assert {"dq", "dk", "dv"} <= set(report[1].tensors)
    batched["dk"] = batched["dk"].copy()
    batched["dk"][1, 16:24, 1, :] = 0                                        # b=1, rows 16-23, head 1
    report = hils.verify(*args, {n: two(a) for n, a in outputs.items()}, grads=batched, **options)
    assert report.failed == [1]
    assert "dk is exactly zero on h=1 rows 16-23 (chunk 2)" in str(report)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_reference_in_each_layout(batch, layout):
    """hils.reference(layout=) reads the inputs and returns every array in the layout (each
    sequence's own reference), and lse_layout turns lse and lse_window."""
    inputs, refs = batch
    count = 1 if layout in ("hsd", "shd") else B
    q, k, v = (in_layout([inputs[b][i] for b in range(count)], layout) for i in range(3))
    got = hils.reference(SPEC, q, k, v, layout=layout)
    assert set(got) == set(refs[0])
    for name, array in got.items():
        np.testing.assert_array_equal(array, in_layout([refs[b][name] for b in range(count)], layout),
                                      err_msg=name)
    if layout == "bshd":
        assert got["o"].shape == (B, C["T"], C["Hq"], C["dv"])
        turned = hils.reference(SPEC, q, k, v, layout=layout, lse_layout="bhsd")
        np.testing.assert_array_equal(turned["lse"], np.stack([r["lse"] for r in refs]))
        np.testing.assert_array_equal(turned["lse_window"], np.stack([r["lse_window"] for r in refs]))


def test_a_batch_in_the_default_layout_is_told_of_the_batched_layouts(batch):
    """Batched arrays under the default layout "hsd": the message names layout="bhsd" and
    "bshd". Before (audit, session 22) it said "one sequence per call, no batch axis: pass
    x[b]", as if the oracle could not judge a batch."""
    q, k, v, outputs = kernel_call(batch, "bhsd", names=("o",))
    with pytest.raises(ValueError) as raised:
        hils.verify(SPEC, q, k, v, outputs)
    assert str(raised.value) == (
        'outputs["o"]: expected rank 3 shape [*, *, *] (heads, rows, columns; one sequence in '
        'layout "hsd", the default: pass x[b], or the batch with layout="bhsd" or "bshd"), '
        f"found rank 4 shape [{B}, {C['Hq']}, {C['T']}, {C['dv']}]")


# B = 4 sequences whose double outputs (32768 queries x 4135 values, 1.01 GiB each) fit alone
# under a 4 GiB address-space limit (80% of it: 3.2 GiB) and not four at once (0.8 GiB each).
_BATCH_TOO_LARGE = """
import resource
resource.setrlimit(resource.RLIMIT_AS, (4 << 30, resource.RLIM_INFINITY))
import numpy as np, hils
q = np.zeros((4, 1, 32768, 16), np.float32)
try:
    hils.{call}({{"preset": "hils", "S": 8, "W": 16, "K": 3}}, q, q, q, layout="bhsd")
except BaseException as error:
    print(type(error).__name__, error)
"""


@pytest.mark.parametrize("call", ("reference", "Verifier"))
def test_a_batch_that_cannot_fit_is_refused_before_it_is_computed(call):
    """The memory checks of one sequence (run_mechanism's outputs, hils/memory.hpp) give each
    sequence of a batch its share, as they give each unit of `hils --jobs N` its own: a batch
    whose sequences fit one at a time but not all at once (each is kept until the call returns)
    is refused at b=0, naming the batch. Before (audit, session 22) every sequence was checked
    alone: sequence 0 was computed (10 s here) and the call ended in a MemoryError naming
    neither the batch nor the argument ("std::bad_alloc" from Verifier, numpy's "Unable to
    allocate 1.00 GiB for an array with shape (1, 32768, 4096)" from reference; without a ulimit,
    an out-of-memory kill)."""
    env = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1")
    result = subprocess.run([sys.executable, "-c", _BATCH_TOO_LARGE.format(call=call)],
                            capture_output=True, text=True, env=env, timeout=300)
    assert result.returncode == 0, result.stderr
    assert "shared by the 4 sequences of a batch held at once" in result.stdout, result.stdout
    if call == "reference":
        assert result.stdout.startswith("ValueError outputs: expected outputs (32768 queries x 1 "
                                        "heads x 4135 values) within 80% of "), result.stdout
        assert "got 1.01 GiB (sequence b=0 of layout \"bhsd\"" in result.stdout, result.stdout
        return
    # The oracle's own estimate (oracle::require_oracle_fits: both runs, its copies of the inputs,
    # the chunk scores) refuses first, naming the sizes and the queries= knob.
    assert result.stdout.startswith(
        "ValueError inputs: expected a problem whose oracle (the reference in double and float, "
        "and what it compares) fits in 80% of "), result.stdout
    assert "judge fewer query rows (queries), a shorter T or fewer heads at once, got T = 32768 " \
           "slots, 1 query heads, 1 KV heads, d = 16, 32768 query rows: about" in result.stdout
    assert "(sequence b=0 of layout \"bhsd\"" in result.stdout, result.stdout


def nan_in_o(b, out):
    if b == 1:
        out["o"][0, 5, 0] = np.nan                                   # h=0, t=5, col=0


def duplicate_chunk(b, out):
    if b == 1:
        row = out["selection"][0, 60]                                # t=60, group 0: 3 chunks
        assert (row >= 0).all()
        row[1] = row[0]


@pytest.mark.parametrize("fault,problem", [
    (nan_in_o, "o contains NaN at h=0 t=5 col=0 (1 NaN elements)"),
    (duplicate_chunk, "selection row t=60, group 0: chunks must be distinct and ascending"),
])
def test_a_failure_without_headroom_is_told_in_its_line(batch, fault, problem):
    """A NaN in one sequence's output or a malformed selection row is a verdict (not an
    error), and its line names the problem: before (audit, session 22) it read "b=1: FAIL (o)
    worst headroom 2.35e-11 (o), selection 0 of 154 rows differ" or "b=1: FAIL (selection)
    worst headroom 2.35e-11 (o), selection 0 of 154 rows differ", the numbers of a pass, the
    cause only in the full report below."""
    q, k, v, outputs = kernel_call(batch, "bshd", edit=fault)
    report = hils.verify(SPEC, q, k, v, outputs, layout="bshd")
    assert report.failed == [1]
    line = str(report).splitlines()[2]
    assert line.startswith("  b=1: FAIL (") and f")  {problem}" in line, line
    assert "worst headroom" in line, line
    assert str(report).splitlines()[1].startswith("  b=0: PASS  worst headroom")


@pytest.mark.parametrize("layout", ("hsd", "bshd"))
def test_a_report_has_no_truth_value(batch, layout):
    """`assert hils.verify(...)` must not pass a failing kernel: a Report or BatchReport refuses
    bool(), naming .passed. Before (audit, session 22) both were true whatever the verdict (any
    object is; a BatchReport's length is B > 0)."""
    def lse_off(b, out):
        out["lse"][2, 40] += 1e-3
    q, k, v, outputs = kernel_call(batch, layout, edit=lse_off)
    report = hils.verify(SPEC, q, k, v, outputs, layout=layout)
    assert not report.passed
    with pytest.raises(TypeError, match=r"truth value of a report is ambiguous .*use report\.passed"):
        bool(report)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_sequence_views_write_through_to_the_layout(layout):
    """hils.gpu.forward (hils/gpu/batched.py) allocates each output of Layout.shape and writes
    sequence b through Layout.sequences' view of it: the result must be the per-sequence arrays
    laid out by hand (in_layout). Its argument checks read Layout.read_sizes (messages in
    test_gpu_module.py)."""
    lay = layouts.Layout(layout)
    count = B if lay.batched else 1
    sizes = {"B": count, "Hq": 4, "Tq": 6, "dv": 5}
    parts = [np.arange(4 * 6 * 5, dtype=np.float64).reshape(4, 6, 5) + 1000 * b for b in range(count)]
    out = np.zeros(lay.shape("o", sizes))
    assert lay.expected("o", sizes) == str(list(out.shape))
    for b, view in enumerate(lay.sequences(out, "o", "o", count)):
        assert view.shape == (4, 6, 5)
        view[...] = parts[b]
    assert np.array_equal(out, in_layout(parts, layout))
    assert lay.read_sizes(out, "o", "o", {"Hq": 4}, "") == dict(zip(lay.axes("o"), out.shape), Hq=4)
    with pytest.raises(ValueError, match=r"o: layout .* expects .* \(from here\), found shape"):
        lay.read_sizes(out, "o", "o", {"Hq": 3}, "from here")

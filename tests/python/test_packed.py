"""Packed (varlen) batches: hils.verify(..., layout="thd", cu_seqlens=) as FlashAttention's
flash_attn_varlen_func lays them out (q [total, Hq, d], softmax_lse [Hq, total] with
lse_layout="htd"), and fla-org's parallel_nsa(..., cu_seqlens=) ([1, total, HQ, K], layout
"bshd" with B = 1; python/hils/layouts.py, data/verify_format.md "Packed sequences"). Each
sequence is its own problem, its positions and chunks counted from 0: the reference's own
outputs packed by hand pass; a kernel that ignores cu_seqlens (one long sequence), sequence-
global chunk ids and a fault planted in one sequence fail the sequences they touch, and only
those; bad cu_seqlens and shapes are refused naming the field and the value expected; empty
sequences (vLLM's padding) are nothing to judge and shift no other sequence. CPU only."""

import numpy as np
import pytest

import hils
from conftest import CASES, case_spec, seed_of, refused
from hils.testing import assert_kernel_matches

CASE = "ragged_tail"          # S = 8, W = 16, K = 3, Hq = 4, Hkv = 2, d = 16, dv = 12
C = CASES[CASE]
SPEC = case_spec("hils", CASE)
LENGTHS = (77, 30, 50)        # T of each sequence: 9, 3 and 6 complete chunks
CU = np.cumsum((0,) + LENGTHS).astype(np.int32)          # [0, 77, 107, 157]
TOTAL = int(CU[-1])
NAMES = ("o", "lse", "selection", "fusion_weights", "o_window", "lse_window")


def sequence(b):
    """Gaussian float32 q, k, v [heads, T_b, d] of sequence b."""
    rng = np.random.default_rng(seed_of(f"packed/b{b}"))
    T = LENGTHS[b]
    return tuple(rng.standard_normal(shape).astype(np.float32) for shape in
                 ((C["Hq"], T, C["d"]), (C["Hkv"], T, C["d"]), (C["Hkv"], T, C["dv"])))


@pytest.fixture(scope="module")
def batch():
    inputs = [sequence(b) for b in range(len(LENGTHS))]
    return inputs, [hils.reference(SPEC, *qkv) for qkv in inputs]


def packed(parts):
    """Per-sequence [heads, T_b, ...] -> [total, heads, ...], written out by hand (FlashAttention's
    varlen layout: the sequences' rows one after another)."""
    return np.concatenate([np.swapaxes(part, 0, 1) for part in parts])


def kernel_call(batch, edit=None, names=NAMES):
    """(q, k, v, outputs) packed from the reference's outputs; edit(b, outputs_b) may change a
    sequence's outputs (the verify file's order) first."""
    inputs, refs = batch
    outs = [{n: refs[b][n].copy() for n in names} for b in range(len(LENGTHS))]
    if edit:
        for b, out in enumerate(outs):
            edit(b, out)
    q, k, v = (packed([x[i] for x in inputs]) for i in range(3))
    return q, k, v, {n: packed([out[n] for out in outs]) for n in names}


def in_layout(array, layout):
    """A "thd" array [total, heads, ...] in another packed layout."""
    return {"thd": array, "htd": np.swapaxes(array, 0, 1), "bshd": array[None],
            "bhsd": np.swapaxes(array, 0, 1)[None]}[layout]


@pytest.mark.parametrize("layout", ("thd", "htd", "bshd", "bhsd"))
def test_each_packed_layout_passes(batch, layout):
    q, k, v, outputs = kernel_call(batch)
    report = hils.verify(SPEC, *(in_layout(x, layout) for x in (q, k, v)),
                         {n: in_layout(a, layout) for n, a in outputs.items()}, layout=layout,
                         cu_seqlens=CU)
    assert isinstance(report, hils.BatchReport) and report.passed, str(report)
    assert len(report) == 3 and report.lengths == list(LENGTHS)
    assert all(r.tensors["o"].max_abs < 1e-12 for r in report)      # each against its own inputs
    assert [r.selection.rows for r in report] == [2 * T for T in LENGTHS]   # Hkv x T_b rows
    lines = str(report).splitlines()
    assert lines[0] == f'batch of 3 sequences, layout "{layout}": 3 pass, 0 fail'
    assert [line.split(":")[0] for line in lines[1:4]] == [
        "  b=0 (T = 77, rows 0..76)", "  b=1 (T = 30, rows 77..106)", "  b=2 (T = 50, rows 107..156)"]


def test_flash_attention_varlen_lse(batch):
    """flash_attn_varlen_func's softmax_lse is [Hq, total_q] beside o [total_q, Hq, d]."""
    q, k, v, outputs = kernel_call(batch, names=("o", "lse"))
    softmax_lse = np.ascontiguousarray(outputs["lse"].T)
    fa = dict(outputs, lse=softmax_lse)
    assert hils.verify(SPEC, q, k, v, fa, layout="thd", lse_layout="htd", cu_seqlens=CU).passed
    with pytest.raises(ValueError) as error:
        hils.verify(SPEC, q, k, v, fa, layout="thd", cu_seqlens=CU)
    assert str(error.value) == (
        'outputs["lse"]: layout "thd" expects [total, Hq] = [157, 4], found shape [4, 157], which '
        'is [Hq, total], the order of layout "htd": say so with lse_layout="htd" (FlashAttention\'s '
        "varlen softmax_lse is [Hq, total_q] beside its [total_q, Hq, d] o)")


def test_a_kernel_that_ignores_cu_seqlens_fails_the_later_sequences(batch):
    """The pack computed as one long sequence (positions not restarting): sequence 0 is the
    same causal prefix and passes; sequences 1 and 2 read the keys of those before them and fail."""
    q, k, v, _ = kernel_call(batch)
    whole = hils.reference(SPEC, *(np.swapaxes(x, 0, 1) for x in (q, k, v)))
    outputs = {n: np.swapaxes(whole[n], 0, 1) for n in ("o", "lse", "selection")}
    report = hils.verify(SPEC, q, k, v, outputs, layout="thd", cu_seqlens=CU)
    assert report.failed == [1, 2], str(report)
    assert not report[1].tensors["o"].passed and not report[2].selection.passed


def test_selection_ids_are_sequence_local(batch):
    """fla-org's varlen block_indices count a sequence's blocks from its own start (the kernel
    offsets k by the sequence's first row; its varlen test draws ids below cdiv(t, block_size),
    t the position in the sequence): so do ours. Ids counted from the pack's first row (the
    local id + the chunks of the sequences before) fail every sequence but the first."""
    def global_ids(b, out):
        before = sum(T // C["S"] for T in LENGTHS[:b])
        out["selection"] = np.where(out["selection"] >= 0, out["selection"] + before, -1)
    q, k, v, outputs = kernel_call(batch, global_ids, ("o", "lse", "selection"))
    report = hils.verify(SPEC, q, k, v, outputs, layout="thd", cu_seqlens=CU)
    assert report.failed == [1, 2], str(report)
    assert "is not a candidate" in str(report[1])


def wrong_lse(b, out):
    if b == 1:
        out["lse"][2, 20] += 1e-3


def shifted_window(b, out):
    if b == 1:
        out.update(hils.reference(dict(SPEC, W=C["W"] + C["S"]), *sequence(1)))


def dropped_chunk(b, out):
    """Sequence 1's last query, group 0: its first chunk replaced by -1 (one chunk short)."""
    if b == 1:
        row = out["selection"][0, -1]
        out["selection"][0, -1] = np.append(row[1:], -1)


@pytest.mark.parametrize("fault", (wrong_lse, shifted_window, dropped_chunk),
                         ids=("wrong_lse", "shifted_window", "dropped_chunk"))
def test_a_fault_in_one_sequence_fails_it_alone(batch, fault):
    q, k, v, outputs = kernel_call(batch, fault)
    report = hils.verify(SPEC, q, k, v, outputs, layout="thd", cu_seqlens=CU)
    assert report.failed == [1], str(report)
    text = str(report)
    assert "2 pass, 1 fail (b=1)" in text and "\n  b=1 (T = 30, rows 77..106): FAIL" in text
    assert "---- b=1: FAIL (rows 77..106 of the pack: its t=0 is row 77) ----\n" + str(report[1]) in text
    if fault is shifted_window:
        assert "W=24 instead of W=16" in report[1].tensors["o_window"].diagnosis
    with pytest.raises(AssertionError, match=r"^kernel mine: b=1: FAIL \(.*\(1 of 3 sequences fail\)\nbatch of 3 sequences"):
        assert_kernel_matches(SPEC, q, k, v, outputs, layout="thd", cu_seqlens=CU, kernel="mine")


def test_a_failing_line_names_the_rows_of_the_pack(batch):
    """A fault planted at packed row 100 (sequence 1's t=23): the report's t counts from the
    sequence's first row, so its line and its header name where that row is in the pack (the
    line read "b=1 (T = 30): FAIL ..." and the header "---- b=1: FAIL ----": the caller had to
    add cu_seqlens[1] to t by hand)."""
    q, k, v, outputs = kernel_call(batch, names=("o", "lse"))
    outputs["o"][100, 2, 5] += 0.5                               # [total, Hq, dv]
    report = hils.verify(SPEC, q, k, v, outputs, layout="thd", cu_seqlens=CU)
    assert report.failed == [1] and report.offsets == [0, 77, 107, 157], str(report)
    assert "h=2 t=23 col=5" in str(report[1])
    text = str(report)
    assert "\n  b=1 (T = 30, rows 77..106): FAIL (o)" in text, text
    assert "\n---- b=1: FAIL (rows 77..106 of the pack: its t=0 is row 77) ----\n" in text, text
    assert "\n  b=0 (T = 77, rows 0..76): PASS" in text and "\n  b=2 (T = 50, rows 107..156): PASS" in text
    strided = hils.verify(SPEC, q[None], k[None], v[None], {n: a[None] for n, a in outputs.items()},
                          layout="bshd", cu_seqlens=CU)                # fla-org's [1, total, H, d]
    assert "\n  b=1 (T = 30, rows 77..106): FAIL (o)" in str(strided)


def test_any_order_and_a_verifier_over_the_pack(batch):
    """selection_order="any" sorts each sequence's rows; hils.Verifier(cu_seqlens=) judges two
    kernels against one reference."""
    def reversed_rows(b, out):
        out["selection"] = out["selection"][..., ::-1].copy()
    q, k, v, outputs = kernel_call(batch, reversed_rows, ("o", "lse", "selection"))
    oracle = hils.Verifier(SPEC, q, k, v, layout="thd", cu_seqlens=CU)
    assert oracle.verify(outputs, selection_order="any").passed
    assert oracle.verify(outputs).failed == [0, 1, 2]


def test_reference_packed(batch):
    """hils.reference(layout="thd", cu_seqlens=) packs what packs; summary_key, summary_bias and
    surrogate_scores (each sequence's own chunks) come as one array per sequence."""
    inputs, refs = batch
    q, k, v, _ = kernel_call(batch)
    got = hils.reference(SPEC, q, k, v, layout="thd", cu_seqlens=CU)
    assert set(got) == set(refs[0])
    for name in ("summary_key", "summary_bias", "surrogate_scores"):
        assert isinstance(got[name], list) and len(got[name]) == 3
        for b in range(3):
            np.testing.assert_array_equal(got[name][b], refs[b][name], err_msg=name)
    for name in NAMES:
        np.testing.assert_array_equal(got[name], packed([r[name] for r in refs]), err_msg=name)
    fla = hils.reference(SPEC, q[None], k[None], v[None], layout="bshd", lse_layout="bhsd",
                         cu_seqlens=CU)
    assert fla["o"].shape == (1, TOTAL, C["Hq"], C["dv"])
    np.testing.assert_array_equal(fla["lse"], packed([r["lse"] for r in refs]).T[None])



@pytest.mark.parametrize("cu,message", [
    ([1, 77, 107, 157], "cu_seqlens: expected cu_seqlens[0] = 0 (the first sequence starts at row 0), "
                        "found 1"),
    ([0, 77, 60, 157], "cu_seqlens: expected increasing offsets, found cu_seqlens[2] = 60 < "
                       "cu_seqlens[1] = 77"),
    ([0, 77, 107], "cu_seqlens: expected cu_seqlens[-1] = 157 (q's total rows), found 107"),
    ([0, 77, 107, 160], "cu_seqlens: expected cu_seqlens[-1] = 157 (q's total rows), found 160"),
    ([[0, 77, 107, 157]], "cu_seqlens: expected a 1-D array [B + 1] of offsets (0, then each "
                          "sequence's end; B >= 1), found shape [1, 4]"),
    ([157], "cu_seqlens: expected a 1-D array [B + 1] of offsets (0, then each sequence's end; "
            "B >= 1), found shape [1]"),
], ids=("first_not_0", "decreasing", "last_short", "last_long", "two_dims", "one_entry"))
def test_bad_cu_seqlens_are_refused(batch, cu, message):
    q, k, v, outputs = kernel_call(batch, names=("o",))
    refused(lambda: hils.verify(SPEC, q, k, v, outputs, layout="thd", cu_seqlens=np.array(cu)), message)
    refused(lambda: hils.reference(SPEC, q, k, v, layout="thd", cu_seqlens=np.array(cu)), message)


def test_bad_packed_arguments_are_refused(batch):
    q, k, v, outputs = kernel_call(batch, names=("o", "lse"))
    verify = lambda *args, **kw: hils.verify(SPEC, *args, **kw)  # noqa: E731
    refused(lambda: verify(q, k, v, outputs, layout="thd", cu_seqlens=CU.astype(np.float32)),
          "cu_seqlens: expected integers (int32 as FlashAttention's, int64 as fla-org's), found "
          "dtype float32", TypeError)
    assert verify(q, k, v, outputs, layout="thd", cu_seqlens=CU.astype(np.int64)).passed  # fla's
    refused(lambda: verify(q, k, v, outputs, layout="thd"),
          'cu_seqlens: layout "thd" packs the sequences along its rows: give cu_seqlens=[0, T_0, '
          "T_0 + T_1, ..., total] (int32 [B + 1])")
    refused(lambda: verify(q, k, v, outputs, layout="shd", cu_seqlens=CU),
          "layout: 'shd' is one sequence; with cu_seqlens (packed sequences) expected \"thd\" "
          "([total, heads, d]: FlashAttention's flash_attn_varlen_func), \"htd\" ([heads, total, "
          "d]), or \"bshd\" / \"bhsd\" with B = 1 (fla-org's parallel_nsa with cu_seqlens: q [1, "
          "total, HQ, K])")
    # A layout that is not a name: was "unhashable type: 'list'".
    refused(lambda: verify(q, k, v, outputs, layout=["thd"], cu_seqlens=CU),
          "layout: ['thd'] is not a layout; with cu_seqlens (packed sequences) expected \"thd\" "
          "([total, heads, d]: FlashAttention's flash_attn_varlen_func), \"htd\" ([heads, total, "
          "d]), or \"bshd\" / \"bhsd\" with B = 1 (fla-org's parallel_nsa with cu_seqlens: q [1, "
          "total, HQ, K])")
    two = lambda x: np.stack([x, x])  # noqa: E731
    refused(lambda: verify(two(q), two(k), two(v), outputs, layout="bshd", cu_seqlens=CU),
          'q: layout "bshd" with cu_seqlens expects [1, total, Hq, d] (the sequences packed along T '
          "of one batch row, as fla-org's parallel_nsa takes them with cu_seqlens), found B = 2 "
          "(shape [2, 157, 4, 16])")
    refused(lambda: verify(q, k, v, dict(outputs, o=outputs["o"][:-1]), layout="thd", cu_seqlens=CU),
          'outputs["o"]: layout "thd" expects [total, Hq, dv] with total = 157 (cu_seqlens[-1]), '
          "found shape [156, 4, 12]")
    refused(lambda: verify(q, k[:-1], v, outputs, layout="thd", cu_seqlens=CU),
          'k: layout "thd" expects [total, Hkv, d] with total = 157 (cu_seqlens[-1]), found shape '
          "[156, 2, 16]")
    refused(lambda: verify(q[None], k, v, outputs, layout="thd", cu_seqlens=CU),
          'q: layout "thd" with cu_seqlens expects rank 3 [total, Hq, d], found rank 4 shape '
          "[1, 157, 4, 16]")
    refused(lambda: verify(q, k, v, outputs, layout="thd", cu_seqlens=CU, queries=[3]),
          "queries: expected None with cu_seqlens (every query of every packed sequence is judged, "
          "as the varlen kernels compute them all; queries that are the last slots of each "
          "sequence: cu_seqlens_k=)")
    refused(lambda: verify(q, k, v, dict(outputs, summary_bias=outputs["lse"]), layout="thd",
                         cu_seqlens=CU),
          'outputs["summary_bias"]: has no packed form: summary_bias [Hq, n_chunks] has an axis '
          "whose length is each sequence's own (n_chunks or the prior's rows); judge it one "
          'sequence at a time (layout "hsd" or "shd" without cu_seqlens)')
    refused(lambda: verify(q, k, v, outputs, layout="thd", lse_layout="bhsd", cu_seqlens=CU),
          'lse_layout: expected None or one of "thd", "htd" (packed, as layout "thd" with '
          "cu_seqlens is), found 'bhsd'")
    # The oracle's own message for one sequence, with where it comes from.
    with pytest.raises(ValueError) as raised:
        verify(q, k[:, :1], v, outputs, layout="thd", cu_seqlens=CU)
    assert str(raised.value).endswith(
        '(sequence b=0 of layout "thd" with cu_seqlens: rows 0..76, T = 77, read as q [Hq, T, d] '
        "= [4, 77, 16], k [Hkv, T, d] = [1, 77, 16], v [Hkv, T, dv] = [2, 77, 12])")


# ---- empty sequences (cu_seqlens[b] = cu_seqlens[b+1]): nothing to judge ------------------------
# FlashAttention's varlen kernels accept them and vLLM pads cu_seqlens with trailing duplicates
# for its CUDA graphs; the pack's other sequences keep their b and their rows.
PADDED = np.array([0, 0, 77, 77, 107, 157, 157, 157], np.int32)   # b = 0, 2, 5, 6 empty
JUDGED = (1, 3, 4)                                                # LENGTHS' sequences 0, 1, 2


@pytest.mark.parametrize("layout", ("thd", "htd", "bshd", "bhsd"))
def test_empty_sequences_are_nothing_to_judge(batch, layout):
    """The same pack with empty sequences before, between and after: each sequence judged is
    judged against its own rows (o exact), the empty ones have no report and a line that says
    so, and the rows named are the pack's."""
    q, k, v, outputs = kernel_call(batch)
    report = hils.verify(SPEC, *(in_layout(x, layout) for x in (q, k, v)),
                         {n: in_layout(a, layout) for n, a in outputs.items()}, layout=layout,
                         cu_seqlens=PADDED)
    assert report.passed and len(report) == 7, str(report)
    assert report.empty == [0, 2, 5, 6] and report.failed == []
    assert [r is None for r in report.reports] == [b not in JUDGED for b in range(7)]
    assert report.lengths == [0, 77, 0, 30, 50, 0, 0]
    assert all(report[b].tensors["o"].max_abs < 1e-12 for b in JUDGED)
    assert [report[b].selection.rows for b in JUDGED] == [2 * T for T in LENGTHS]
    lines = str(report).splitlines()
    assert lines[0] == (f'batch of 7 sequences, layout "{layout}": 3 pass, 0 fail, 4 empty '
                        f'(b=0, 2, 5, 6)')
    assert [line.split(": PASS")[0] for line in lines[1:8]] == [
        "  b=0 (T = 0): empty, nothing to judge", "  b=1 (T = 77, rows 0..76)",
        "  b=2 (T = 0): empty, nothing to judge", "  b=3 (T = 30, rows 77..106)",
        "  b=4 (T = 50, rows 107..156)", "  b=5 (T = 0): empty, nothing to judge",
        "  b=6 (T = 0): empty, nothing to judge"]
    assert lines[8] == "batch PASS" and repr(report) == "<hils.BatchReport PASS B=7 empty b=[0, 2, 5, 6]>"


@pytest.mark.parametrize("fault", (wrong_lse, dropped_chunk), ids=("wrong_lse", "dropped_chunk"))
def test_a_fault_after_an_empty_sequence_fails_its_sequence(batch, fault):
    """LENGTHS' sequence 1 (b=3 in PADDED) faulty: b=3 fails, alone, its rows the pack's."""
    q, k, v, outputs = kernel_call(batch, fault)
    report = hils.verify(SPEC, q, k, v, outputs, layout="thd", cu_seqlens=PADDED)
    assert not report.passed and report.failed == [3] and report.empty == [0, 2, 5, 6], str(report)
    text = str(report)
    assert text.startswith('batch of 7 sequences, layout "thd": 2 pass, 1 fail (b=3), 4 empty '
                           '(b=0, 2, 5, 6)\n'), text
    assert "\n  b=3 (T = 30, rows 77..106): FAIL" in text
    assert "\n---- b=3: FAIL (rows 77..106 of the pack: its t=0 is row 77) ----\n" + str(report[3]) in text
    assert text.endswith("batch FAIL (b=3)")
    with pytest.raises(AssertionError, match=r"^kernel mine: b=3: FAIL \(.*\(1 of 7 sequences fail\)\nbatch of 7 sequences"):
        assert_kernel_matches(SPEC, q, k, v, outputs, layout="thd", cu_seqlens=PADDED, kernel="mine")


def test_a_fault_at_a_row_after_an_empty_sequence_names_its_slot(batch):
    """Packed row 100 is b=3's t=23 (its rows 77..106), with or without the empties before it;
    the same fault in the last row of the pack is b=4's t=49."""
    q, k, v, outputs = kernel_call(batch, names=("o", "lse"))
    outputs["o"][100, 2, 5] += 0.5
    outputs["o"][156, 0, 1] -= 0.5
    oracle = hils.Verifier(SPEC, q, k, v, layout="thd", cu_seqlens=PADDED)
    report = oracle.verify(outputs)
    assert report.failed == [3, 4], str(report)
    assert "h=2 t=23 col=5" in str(report[3]) and "h=0 t=49 col=1" in str(report[4])
    assert "\n---- b=4: FAIL (rows 107..156 of the pack: its t=0 is row 107) ----\n" in str(report)


def test_reference_of_a_pack_with_empty_sequences(batch):
    """hils.reference: the packed arrays are the pack's without the empties (zero rows each);
    the per-sequence lists hold None for an empty sequence."""
    q, k, v, _ = kernel_call(batch)
    plain = hils.reference(SPEC, q, k, v, layout="thd", cu_seqlens=CU)
    got = hils.reference(SPEC, q, k, v, layout="thd", lse_layout="htd", cu_seqlens=PADDED)
    assert set(got) == set(plain)
    for name in NAMES:
        want = plain[name].T if name in ("lse", "lse_window") else plain[name]
        assert got[name].dtype == want.dtype
        np.testing.assert_array_equal(got[name], want, err_msg=name)
    for name in ("summary_key", "summary_bias", "surrogate_scores"):
        assert [x is None for x in got[name]] == [b not in JUDGED for b in range(7)]
        for b, a in zip(JUDGED, plain[name]):
            np.testing.assert_array_equal(got[name][b], a, err_msg=name)


def test_empty_sequences_refused_where_nothing_is_judged_or_computed(batch):
    """A pack of empty sequences only is refused (nothing judged is not a pass), as is one
    sequence of T = 0 (reference/SEMANTICS.md, section 1); hils.gpu.forward's packs skip an
    empty sequence and refuse a pack of nothing else (test_gpu_forward.py computes one)."""
    q, k, v, outputs = kernel_call(batch, names=("o",))
    none = lambda x: x[:0]  # noqa: E731
    message = ("cu_seqlens: every sequence is empty (cu_seqlens = [0, 0, 0], no query row): "
               "nothing to judge; the oracle judges a pack with at least one query "
               "(reference/SEMANTICS.md, section 1: T >= 1)")
    refused(lambda: hils.verify(SPEC, none(q), none(k), none(v), {"o": none(outputs["o"])},
                              layout="thd", cu_seqlens=np.zeros(3, np.int32)), message)
    refused(lambda: hils.reference(SPEC, none(q), none(k), none(v), layout="thd",
                                 cu_seqlens=np.zeros(3, np.int32)), message)
    with pytest.raises(ValueError):
        hils.verify(SPEC, none(q), none(k), none(v), {"o": none(outputs["o"])}, layout="shd")
    assert hils.layouts.packed_layout("thd", q, np.array([0, 77, 77, 157])).offsets == [0, 77, 77, 157]
    refused(lambda: hils.layouts.packed_layout("thd", none(q), np.zeros(3, np.int32)),
            "cu_seqlens: every sequence is empty (cu_seqlens = [0, 0, 0], no query row): nothing "
            "to compute; hils.gpu.forward computes a pack with at least one slot "
            "(reference/SEMANTICS.md, section 1: T >= 1)")

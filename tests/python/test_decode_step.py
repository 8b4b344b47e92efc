"""Decode steps of other people's kernels: hils.verify_decode judges B sequences of ragged lengths
(cache_seqlens), one new query each, from a dense or paged K/V cache (FlashAttention's
flash_attn_with_kvcache, vLLM's and FlashInfer's page tables) in one call (python/hils/decoding.py,
data/verify_format.md "Decode steps"). The reference's own outputs pass from every cache form,
whose unread slots and pages hold NaN (a read of one would fail); a fault in one sequence (one
slot short, a stale page, wrong landmark queries) fails that sequence alone; FlashAttention's
pre-append cache_seqlens fails every sequence; the hils preset's landmark queries are required
and the other presets refuse them; bad arguments are refused naming the field. CPU only."""

import inspect
import os
import subprocess
import sys

import numpy as np
import pytest

import hils
from conftest import CASES, case_spec, seed_of, refused
from hils.decoding import query_inputs
from hils.testing import assert_decode_matches, assert_kernel_matches

CASE = "ragged_tail"          # S = 8, W = 16, K = 3, Hq = 4, Hkv = 2, d = 16, dv = 12
C = CASES[CASE]
Hq, Hkv, d, dv, S = C["Hq"], C["Hkv"], C["d"], C["dv"], C["S"]
HILS = case_spec("hils", CASE)
NSA = case_spec("nsa", CASE)
LMK = case_spec("lmk", CASE)
SPECS = {"hils": HILS, "nsa": NSA, "lmk": LMK}
LENGTHS = (77, 30, 50, 9)     # T of each sequence (the new token's slot included)
B = len(LENGTHS)
P = 16                        # page_size
NAMES = ("o", "lse", "selection", "fusion_weights", "o_window", "lse_window")


def sequence(b):
    """Sequence b's q, k, v, q~ [heads, T, d] (float32)."""
    rng = np.random.default_rng(seed_of(f"decode_step/b{b}"))
    T = LENGTHS[b]
    q = rng.standard_normal((Hq, T, d)).astype(np.float32)
    return (q, rng.standard_normal((Hkv, T, d)).astype(np.float32),
            rng.standard_normal((Hkv, T, dv)).astype(np.float32),
            (q + 0.3 * rng.standard_normal((Hq, T, d))).astype(np.float32))


@pytest.fixture(scope="module")
def draws():
    """Every sequence's inputs and the reference's outputs of its last query, for hils and nsa."""
    inputs = [sequence(b) for b in range(B)]
    refs = {name: [hils.reference(spec, q, k, v, q_retrieval=qr, queries=[q.shape[1] - 1])
                   for q, k, v, qr in inputs] for name, spec in SPECS.items()}
    return inputs, refs


def dense(inputs, index, width, layout):
    """A dense cache [B, capacity, Hkv, width] ("bshd") or [B, Hkv, capacity, width] ("bhsd"),
    NaN past each sequence's T slots (capacity 80 > every T)."""
    cache = np.full((B, 80, Hkv, width), np.nan, np.float32)
    for b, x in enumerate(inputs):
        cache[b, :LENGTHS[b]] = np.swapaxes(x[index], 0, 1)
    return cache if layout == "bshd" else np.swapaxes(cache, 1, 2)


def page_table():
    """Each sequence's pages, drawn without replacement from pages 1..23 in a shuffled order;
    page 0 holds NaN and pads every row past its pages (vLLM pads with 0)."""
    order = iter(np.random.default_rng(seed_of("decode_step/pages")).permutation(np.arange(1, 24)))
    table = np.zeros((B, 6), np.int32)
    for b, T in enumerate(LENGTHS):
        table[b, :-(-T // P)] = [next(order) for _ in range(-(-T // P))]
    return table


def paged(inputs, index, width, layout, table):
    """Pages [24, P, Hkv, width] ("bshd") or [24, Hkv, P, width] ("bhsd"): slot t of sequence b at
    row t % P of page table[b, t // P]; every other row NaN."""
    pages = np.full((24, P, Hkv, width), np.nan, np.float32)
    for b, x in enumerate(inputs):
        rows = np.swapaxes(x[index], 0, 1)
        for t in range(LENGTHS[b]):
            pages[table[b, t // P], t % P] = rows[t]
    return pages if layout == "bshd" else np.swapaxes(pages, 1, 2)


def landmark_queries(inputs, layout):
    """q~ at each complete chunk's landmark slot (c+1)S-1: [B, n_chunks, Hq, d] ("bshd") or
    [B, Hq, n_chunks, d] ("bhsd"), zero past a sequence's chunks."""
    most = max(T // S for T in LENGTHS)
    rows = np.zeros((B, most, Hq, d), np.float32)
    for b, (_, _, _, qr) in enumerate(inputs):
        n = LENGTHS[b] // S
        rows[b, :n] = np.swapaxes(qr[:, S - 1:n * S:S], 0, 1)
    return rows if layout == "bshd" else np.swapaxes(rows, 1, 2)


def step_call(draws, preset="hils", cache="paged", layout="bshd", edit=None):
    """hils.verify_decode's arguments for the reference's own step; edit(b, outputs_b) may change
    a sequence's outputs ([heads, 1, ...]) first."""
    inputs, refs = draws
    outs = [{n: refs[preset][b][n].copy() for n in NAMES} for b in range(B)]
    if edit:
        for b, out in enumerate(outs):
            edit(b, out)
    table = page_table() if cache == "paged" else None
    k_cache, v_cache = ((paged(inputs, i, w, layout, table) if table is not None else
                         dense(inputs, i, w, layout)) for i, w in ((1, d), (2, dv)))
    args = dict(spec=SPECS[preset],
                q=np.stack([x[0][:, -1] for x in inputs]), k_cache=k_cache, v_cache=v_cache,
                outputs={n: np.stack([out[n][:, 0] for out in outs]) for n in NAMES},
                cache_seqlens=np.array(LENGTHS, np.int32), block_table=table, cache_layout=layout,
                q_retrieval=np.stack([x[3][:, -1] for x in inputs]))
    if preset == "hils":
        args["landmark_queries"] = landmark_queries(inputs, layout)
    return args


@pytest.mark.parametrize("cache", ("dense", "paged"))
@pytest.mark.parametrize("layout", ("bshd", "bhsd"))
def test_the_reference_step_passes_from_every_cache(draws, cache, layout):
    report = hils.verify_decode(**step_call(draws, cache=cache, layout=layout))
    assert isinstance(report, hils.BatchReport) and report.passed, str(report)
    assert report.lengths == list(LENGTHS)
    assert all(r.selection.rows == Hkv for r in report)               # one query, Hkv groups
    assert all(r.tensors["o"].max_abs == 0 for r in report)
    kind = (f'dense cache "{layout}"' if cache == "dense" else
            f'paged cache "{layout}" ({P} slots a page)')
    lines = str(report).splitlines()
    assert lines[0] == f"batch of 4 sequences, decode step, {kind}: 4 pass, 0 fail"
    assert [line.split(":")[0] for line in lines[1:5]] == [f"  b={b} (T = {T})"
                                                          for b, T in enumerate(LENGTHS)]


def test_query_inputs_rows_of_one_query():
    """q: the step's row at T-1 only; q~: the priors at the landmark slots of the T // S
    complete chunks and q~ at T-1; every other row zero."""
    rng = np.random.default_rng(seed_of("decode_step/rows"))
    q, qt, priors = (rng.standard_normal(shape) for shape in ((Hq, 1, d), (Hq, 1, d), (Hq, 5, d)))
    q_full, q_tilde = query_inputs(30, S, q, qt, priors)              # chunks 0..2 complete
    assert q_full.shape == q_tilde.shape == (Hq, 30, d)
    np.testing.assert_array_equal(q_full[:, 29], q[:, 0])
    assert not q_full[:, :29].any()
    np.testing.assert_array_equal(q_tilde[:, [7, 15, 23]], priors[:, :3])
    np.testing.assert_array_equal(q_tilde[:, 29], qt[:, 0])
    keep = np.ones(30, bool)
    keep[[7, 15, 23, 29]] = False
    assert not q_tilde[:, keep].any()
    assert query_inputs(30, S, q)[1] is None
    np.testing.assert_array_equal(query_inputs(30, S, q, priors=priors)[1][:, 29], q[:, 0])


def one_slot_short(b, out):
    """Sequence 2's o and lse as a kernel that attends T-1 slots gives them."""
    if b == 2:
        q, k, v, qr = sequence(2)
        short = hils.reference(HILS, q[:, :-1], k[:, :-1], v[:, :-1], q_retrieval=qr[:, :-1],
                               queries=[LENGTHS[2] - 2])
        out["o"], out["lse"] = short["o"], short["lse"]


def test_a_fault_in_one_sequence_fails_it_alone(draws):
    report = hils.verify_decode(**step_call(draws, edit=one_slot_short))
    assert report.failed == [2], str(report)
    assert "\n  b=2 (T = 50): FAIL" in str(report) and str(report).endswith("batch FAIL (b=2)")


def test_assert_decode_matches_raises_the_report(draws):
    """hils.testing.assert_decode_matches: the BatchReport of a passing step; for a failing one
    an AssertionError whose message is a line saying what broke (after the kernel's name), then
    the report (the sequence that fails, in full)."""
    args = step_call(draws)
    report = assert_decode_matches(**args, kernel="my decode")
    assert isinstance(report, hils.BatchReport) and report.passed
    assert assert_decode_matches(**step_call(draws, cache="dense", layout="bhsd")).passed
    with pytest.raises(AssertionError) as raised:
        assert_decode_matches(**step_call(draws, edit=one_slot_short), kernel="my decode")
    failing = hils.verify_decode(**step_call(draws, edit=one_slot_short), kernel="my decode")
    headline = f"b=2: {str(failing).splitlines()[3].split(': ', 1)[1]} (1 of {len(failing)} sequences fail)"
    assert str(raised.value) == f"kernel my decode: {headline}\n{failing}"
    assert "---- b=2: FAIL ----" in str(raised.value)
    with pytest.raises(AssertionError) as raised:
        assert_decode_matches(**step_call(draws, edit=one_slot_short))
    assert str(raised.value) == f"{headline}\n{hils.verify_decode(**step_call(draws, edit=one_slot_short))}"


@pytest.mark.parametrize("helper, function", ((assert_decode_matches, "verify_decode"),
                                              (assert_kernel_matches, "verify")))
def test_the_assert_helpers_pass_every_argument_on(monkeypatch, helper, function):
    """Each pytest helper has its function's parameters (names, kinds, defaults: an argument
    added to one and not the other fails here) and hands each one on as given (a distinct
    value per parameter, recorded by a stand-in for the function)."""
    signature = inspect.signature(getattr(hils, function))
    assert inspect.signature(helper) == signature
    seen = {}

    class Passed:
        passed = True

    def record(*args, **kwargs):
        seen.update(signature.bind(*args, **kwargs).arguments)
        return Passed()

    monkeypatch.setattr(hils.testing, function, record)
    given = {name: f"value of {name}" for name in signature.parameters}
    positional = [given[name] for name, p in signature.parameters.items()
                  if p.kind is p.POSITIONAL_OR_KEYWORD]
    keywords = {name: value for name, value in given.items()
                if signature.parameters[name].kind is inspect.Parameter.KEYWORD_ONLY}
    assert isinstance(helper(*positional, **keywords), Passed)
    assert seen == given


def test_a_stale_page_fails_its_sequence_alone(draws):
    """Sequence 1's second page swapped for a page of sequence 0 (a stale block_table entry)."""
    args = step_call(draws)
    table = args["block_table"].copy()
    table[1, 1] = table[0, 3]
    report = hils.verify_decode(**dict(args, block_table=table))
    assert report.failed == [1], str(report)


def test_wrong_landmark_queries_fail_their_sequence(draws):
    """Sequence 0's landmark queries rolled over heads: its summaries read other priors."""
    args = step_call(draws)
    rolled = args["landmark_queries"].copy()
    rolled[0] = np.roll(rolled[0], 1, axis=1)
    report = hils.verify_decode(**dict(args, landmark_queries=rolled))
    assert report.failed == [0], str(report)


def test_pre_append_cache_seqlens_fail_every_sequence(draws):
    """FlashAttention's cache_seqlens counts the slots before the new token when the kernel
    appends it (k=, v=): here T includes it, and T - 1 judges the query one slot early."""
    args = step_call(draws)
    report = hils.verify_decode(**dict(args, cache_seqlens=args["cache_seqlens"] - 1))
    assert report.failed == [0, 1, 2, 3]


def test_landmark_queries_are_required_where_read_and_refused_elsewhere(draws):
    args = step_call(draws)
    with pytest.raises(TypeError) as raised:
        hils.verify_decode(**dict(args, landmark_queries=None))
    assert str(raised.value) == (
        "landmark_queries: spec 'hils' summarizes each chunk with a prior, the q~ of its landmark "
        "slot (key_rule taylor, bias_rule entropy, prior_rule landmark_query; "
        "reference/SEMANTICS.md section 3), which the step's inputs do not hold: give them, "
        '[B, n_chunks, Hq, d] (cache_layout "bshd"), row c the q~ of slot (c+1)S - 1')
    nsa = step_call(draws, preset="nsa")
    assert hils.verify_decode(**nsa).passed
    with pytest.raises(ValueError, match=r"landmark_queries: not read by spec 'nsa' \(its summaries "
                                         r"read no prior: key_rule mean, bias_rule none\)"):
        hils.verify_decode(**dict(nsa, landmark_queries=args["landmark_queries"]))
    # lmk's summaries are the keys at the landmark slots: the cache holds them.
    lmk = step_call(draws, preset="lmk")
    report = hils.verify_decode(**lmk)
    assert report.passed and all(r.selection.compared for r in report.reports[:3]), str(report)
    with pytest.raises(ValueError, match=r"landmark_queries: not read by spec 'lmk'"):
        hils.verify_decode(**dict(lmk, landmark_queries=args["landmark_queries"]))


def test_landmark_queries_are_not_required_before_the_first_chunk(draws):
    """Steps whose sequences are all shorter than S (T // S = 0: no summary, no prior read) are
    judged without landmark_queries; before (audit, session 23) the hils preset refused them
    with the TypeError of the test above, the caller having to pass an empty [B, 0, Hq, d]. One
    sequence with a complete chunk still needs them."""
    inputs, _ = draws
    short = [(q[:, :T], k[:, :T], v[:, :T], qr[:, :T]) for (q, k, v, qr), T in zip(inputs, (7, 1, 5, 3))]
    refs = [hils.reference(HILS, q, k, v, q_retrieval=qr, queries=[q.shape[1] - 1])
            for q, k, v, qr in short]
    lengths = [x[0].shape[1] for x in short]
    k_cache = np.full((B, 8, Hkv, d), np.nan, np.float32)
    v_cache = np.full((B, 8, Hkv, dv), np.nan, np.float32)
    for b, (_, k, v, _) in enumerate(short):
        k_cache[b, :lengths[b]], v_cache[b, :lengths[b]] = np.swapaxes(k, 0, 1), np.swapaxes(v, 0, 1)
    args = dict(q=np.stack([x[0][:, -1] for x in short]), k_cache=k_cache, v_cache=v_cache,
                outputs={n: np.stack([r[n][:, 0] for r in refs]) for n in ("o", "lse", "selection")},
                cache_seqlens=lengths, q_retrieval=np.stack([x[3][:, -1] for x in short]))
    report = hils.verify_decode(HILS, **args)
    assert report.passed and report.lengths == [7, 1, 5, 3], str(report)
    k_long = np.concatenate([k_cache, np.zeros_like(k_cache)], axis=1)
    v_long = np.concatenate([v_cache, np.zeros_like(v_cache)], axis=1)
    with pytest.raises(TypeError, match=r"landmark_queries: spec 'hils' summarizes each chunk"):
        hils.verify_decode(HILS, **dict(args, k_cache=k_long, v_cache=v_long,
                                        cache_seqlens=[7, 1, 9, 3]))


def test_selection_in_any_order(draws):
    args = step_call(draws)
    outputs = dict(args["outputs"], selection=args["outputs"]["selection"][..., ::-1].copy())
    outputs.pop("fusion_weights")                                    # its columns follow the rows
    assert hils.verify_decode(**dict(args, outputs=outputs), selection_order="any").passed
    assert hils.verify_decode(**dict(args, outputs=outputs)).failed == [0, 1, 2]   # b=3: no chunk


@pytest.mark.parametrize("layout", ("bshd", "bhsd"))
def test_a_non_finite_value_read_is_named_in_the_callers_cache(draws, layout):
    """A NaN or Inf in a slot the step reads is refused naming the caller's own index (the page
    and its row for a paged cache), not the oracle's per-sequence copy: before, sequence 1's
    slot 20 read "k: expected finite values, found nan at [1, 20, 2] (flat index 834) (sequence
    b=1 of the decode step: ...)", which names no page. Unread pages and rows stay free."""
    args = step_call(draws, layout=layout)
    table = args["block_table"]
    page = table[1, 1]                                    # slot 20 of sequence 1: row 4
    where = (page, 4, 1, 2) if layout == "bshd" else (page, 1, 4, 2)
    k_cache = args["k_cache"].copy()
    k_cache[where] = np.nan
    refused(lambda: hils.verify_decode(**dict(args, k_cache=k_cache)),
          f"k_cache: expected finite values in the 30 slots sequence b=1 reads (T = cache_seqlens[1]), "
          f"found nan at k_cache[{', '.join(map(str, where))}] (slot 20, head 1, column 2: row 4 of "
          f"page block_table[1, 1] = {page}) (1 non-finite value there)")
    v_cache = args["v_cache"].copy()                      # sequence 3's new token, slot 8
    v_cache[(table[3, 0], 8, 0, 0) if layout == "bshd" else (table[3, 0], 0, 8, 0)] = -np.inf
    with pytest.raises(ValueError) as raised:
        hils.verify_decode(**dict(args, v_cache=v_cache))
    assert str(raised.value).startswith(
        "v_cache: expected finite values in the 9 slots sequence b=3 reads (T = cache_seqlens[3]), "
        f"found -inf at v_cache["), str(raised.value)
    assert str(raised.value).endswith(
        f"(slot 8, head 0, column 0: row 8 of page block_table[3, 0] = {table[3, 0]}; slot 8 is the "
        "new token's: write its K/V before the step (cache_seqlens counts it)) (1 non-finite value "
        "there)"), str(raised.value)
    dense = step_call(draws, cache="dense", layout=layout)
    k_dense = dense["k_cache"].copy()
    k_dense[(2, 33, 0, 5) if layout == "bshd" else (2, 0, 33, 5)] = np.inf
    where = "2, 33, 0, 5" if layout == "bshd" else "2, 0, 33, 5"
    refused(lambda: hils.verify_decode(**dict(dense, k_cache=k_dense)),
          f"k_cache: expected finite values in the 50 slots sequence b=2 reads (T = cache_seqlens[2]), "
          f"found inf at k_cache[{where}] (slot 33, head 0, column 5) (1 non-finite value there)")
    rows = args["landmark_queries"].copy()                # sequence 3 (T = 9) reads chunk 0 only
    rows[(3, 1, 2, 0) if layout == "bshd" else (3, 2, 1, 0)] = np.nan
    assert hils.verify_decode(**dict(args, landmark_queries=rows)).passed
    rows[(3, 0, 2, 0) if layout == "bshd" else (3, 2, 0, 0)] = np.nan
    where = "3, 0, 2, 0" if layout == "bshd" else "3, 2, 0, 0"
    refused(lambda: hils.verify_decode(**dict(args, landmark_queries=rows)),
          f"landmark_queries: expected finite values in the 1 row sequence b=3 reads (its T // S "
          f"complete chunks), found nan at landmark_queries[{where}] (chunk 0) (1 non-finite value "
          "there)")
    q = args["q"].copy()
    q[2, 1, 3] = np.nan
    refused(lambda: hils.verify_decode(**dict(args, q=q)),
          "q: expected finite values, found nan at q[2, 1, 3] (1 non-finite value there)")



def test_bad_arguments_are_refused(draws):
    args = step_call(draws)
    call = lambda **changes: hils.verify_decode(**dict(args, **changes))  # noqa: E731
    refused(lambda: call(q=args["q"][:, None]),
          "q: expected the step's queries [B, Hq, d] (one per sequence, B >= 1; FlashAttention's "
          "[B, 1, Hq, d]: pass q[:, 0]), found shape [4, 1, 4, 16]")
    refused(lambda: call(cache_seqlens=np.array(LENGTHS, np.float32)),
          "cache_seqlens: expected integers [B] = [4], found dtype float32", TypeError)
    refused(lambda: call(cache_seqlens=np.array(LENGTHS[:3])),
          "cache_seqlens: expected shape [B] = [4] (B from q), found shape [3]")
    refused(lambda: call(cache_seqlens=np.array([77, 0, 50, 9])),
          "cache_seqlens: expected each T >= 1 (the new token's slot included), found "
          "cache_seqlens[1] = 0")
    table = args["block_table"]
    refused(lambda: call(block_table=np.where(np.arange(6) == 2, 24, table)),
          "block_table: expected page ids 0..23 (k_cache has 24 pages) in the 5 pages of sequence "
          "b=0 (T = 77), found block_table[0, 2] = 24")
    refused(lambda: call(block_table=table[:, :4]),
          "block_table: sequence b=0 has T = 77 slots, 5 pages of 16, and block_table has 4 columns")
    refused(lambda: call(block_table=table[:3]),
          "block_table: expected [B, max_pages] with B = 4 (from q), found shape [3, 6]")
    refused(lambda: call(block_table=table.astype(np.float64)),
          "block_table: expected integers [B, max_pages], found dtype float64", TypeError)
    refused(lambda: call(v_cache=args["v_cache"][:, :8]),
          'v_cache: expected [num_pages, page_size, Hkv, d] with num_pages = 24 and page_size = 16 '
          "(k_cache's), found shape [24, 8, 2, 12]")
    refused(lambda: call(k_cache=args["k_cache"][0]),
          'k_cache: expected rank 4 (cache_layout "bshd": [B, capacity, Hkv, d] dense or '
          "[num_pages, page_size, Hkv, d] paged), found shape [16, 2, 16]")
    dense_args = step_call(draws, cache="dense")
    refused(lambda: hils.verify_decode(**dict(dense_args, k_cache=dense_args["k_cache"][:, :70])),
          'k_cache: expected [B, capacity, Hkv, d] with B = 4 (from q) and capacity >= 77 '
          "(cache_seqlens[0]), found shape [4, 70, 2, 16] (a paged cache needs block_table=)")
    refused(lambda: call(cache_layout="bthd"),
          'cache_layout: expected "bshd" (k_cache [B, capacity, Hkv, d] or pages [num_pages, '
          'page_size, Hkv, d]: FlashAttention, vLLM, FlashInfer NHD) or "bhsd" ([B, Hkv, capacity, '
          "d] or [num_pages, Hkv, page_size, d]: hils.gpu.DecodeCache, FlashInfer HND), found 'bthd'")
    refused(lambda: call(landmark_queries=args["landmark_queries"][:, :8]),
          'landmark_queries: expected [B, n_chunks, Hq, d] (cache_layout "bshd") with B = 4, Hq = 4 '
          "and n_chunks >= 9 (sequence b=0: T = 77), found shape [4, 8, 4, 16]")
    refused(lambda: call(q_retrieval=args["q_retrieval"][:, :2]),
          "q_retrieval: expected the step's q~ [B, Hq, d] = [4, 4, 16] (q's shape), found shape "
          "[4, 2, 16]")
    refused(lambda: call(outputs=dict(args["outputs"], summary_key=args["q"])),
          "outputs['summary_key']: expected one of o, lse, selection, o_window, lse_window, "
          "fusion_weights (a decode step's outputs, one query per sequence)")
    refused(lambda: call(outputs=dict(args["outputs"], o=args["outputs"]["o"][:2])),
          "outputs['o']: expected [B, Hq, dv] with B = 4 (from q), found shape [2, 4, 12]")
    refused(lambda: call(spec={"preset": "hils", "prior_rule": "shared"}),
          "spec['prior_rule']: a decode step is judged with prior_rule landmark_query (each "
          "chunk's prior the q~ of its landmark slot), found 'shared'")
    # The oracle's own message for one sequence, with where it comes from.
    with pytest.raises(ValueError) as raised:
        call(k_cache=args["k_cache"][..., :8])
    assert str(raised.value).endswith(
        "(sequence b=0 of the decode step: T = 77, query slot 76, 5 pages of 16; read as k "
        "[Hkv, T, d] = [2, 77, 8], v [Hkv, T, dv] = [2, 77, 12])"), str(raised.value)


_STEP_TOO_LARGE = """
import resource
resource.setrlimit(resource.RLIMIT_AS, (3 << 30, 3 << 30))
import numpy as np
import hils
Hq, Hkv, d = 32, 8, 128
spec = {{"preset": "nsa", "S": 64, "W": 512, "K": 16}}
for B, T in (({B}, {T}),):
    cache = np.full((B, T, Hkv, d), 0.5, np.float32)
    step = dict(q=np.ones((B, Hq, d), np.float32), k_cache=cache, v_cache=cache,
                outputs={{"o": np.zeros((B, Hq, d), np.float32)}}, cache_seqlens=[T] * B)
    try:
        print(repr(hils.verify_decode(spec, **step)))
    except Exception as error:
        print(type(error).__name__, error)
"""


@pytest.mark.parametrize("B,T", ((2, 16384), (1, 4096), (8, 32768)))
def test_a_step_whose_oracle_inputs_cannot_fit_is_refused_before_it_is_computed(B, T):
    """A decode step's problem holds q [Hq, T, d] (its one query at row T-1) and the oracle keeps
    every input in float64 and float32, and float64 again while it is built (20 bytes a value
    for one sequence; 12 + 8 / B each in a batch of B): two sequences of T = 16384 (Hq = 32,
    Hkv = 8, d = 128) need about 3 GiB. Under a 3 GiB address-space limit the step is refused at
    b=0 before anything is converted, naming q and the shapes; before (audit, session 23) it ran
    for seconds and ended in "MemoryError std::bad_alloc" (without a ulimit, an out-of-memory
    kill at T = 131072). One sequence of 4096 fits and is judged. Eight sequences of 32768 (a 1
    GiB cache) are refused the same way: before (session 26's audit), the step built every
    sequence's q [Hq, T, d] (512 MiB each) before the first oracle's check and ended in numpy's
    "MemoryError Unable to allocate 512. MiB"; now each is built when its oracle is, after the
    check (hils/decoding.py GatheredInputs)."""
    env = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1")
    result = subprocess.run([sys.executable, "-c", _STEP_TOO_LARGE.format(B=B, T=T)],
                            capture_output=True, text=True, env=env, timeout=300)
    assert result.returncode == 0, result.stderr
    if B == 1:
        assert result.stdout.startswith("<hils.BatchReport FAIL B=1"), result.stdout  # judged
        return
    if B == 8:
        assert result.stdout.startswith(
            "ValueError q: expected inputs whose copies in the oracle (float64 and float32 of "
            "every value, and float64 again while it is built) fit in 80% of the address-space "
            "limit (ulimit -v) of 3 GiB shared by the 8 sequences of a batch held at once (384 "
            "MiB each), found q [32, 32768, 128], k [8, 32768, 128], v [8, 32768, 128]: 2.44 GiB "
            "(fewer or shorter sequences per call) (sequence b=0 of the decode step: T = 32768, "
            "query slot 32767; read as k [Hkv, T, d] = [8, 32768, 128], v [Hkv, T, dv] = [8, "
            "32768, 128])"), result.stdout
        return
    assert result.stdout.startswith(
        "ValueError q: expected inputs whose copies in the oracle (float64 and float32 of every "
        "value, and float64 again while it is built) fit in 80% of the address-space limit (ulimit "
        "-v) of 3 GiB shared by the 2 sequences of a batch held at once (1.5 GiB each), found "
        "q [32, 16384, 128], k [8, 16384, 128], v [8, 16384, 128]: 1.5 GiB (fewer or shorter "
        "sequences per call) (sequence b=0 of the decode step: T = 16384, query slot 16383;"), result.stdout


SPEC_ONLY_CALLS = """
import sys
import numpy as np
import hils
rng = np.random.default_rng(5)
q, k, v = (rng.standard_normal(shape) for shape in ((2, 4, 8), (2, 40, 2, 8), (2, 40, 2, 8)))
hils.verify_decode({"preset": "nsa", "S": 8, "W": 16, "K": 2}, q, k, v, {},
                   cache_seqlens=[40, 17])
hils.hard_cases({"preset": "nsa", "S": 8, "W": 16, "K": 2}, Hq=2, Hkv=1, d=8, max_T=40)
hils.verify({"preset": "nsa", "S": 8, "W": 16, "K": 2}, q[0, None].repeat(3, 0), k[0], v[0], {},
            layout="thd", cu_seqlens=[0, 3], cu_seqlens_k=[0, 40])
print(sorted(name for name in sys.modules if name == "torch" or name.startswith("hils.gpu")))
"""


def test_the_oracle_reads_a_spec_without_importing_hils_gpu():
    """hils.verify_decode, hils.hard_cases and a chunked prefill's hils.verify read the spec's
    fields from the C++ codec (hils._spec_fields). They took them from hils.gpu.spec, and
    importing it imports hils.gpu, which loads torch where it is installed: 1.25 s more for the
    first call on numpy arrays (this machine, Debian's torch 1.13), and a torch that fails to
    load (a CUDA library missing raises OSError, not the ImportError hils.gpu allows for) took
    the oracle with it."""
    result = subprocess.run([sys.executable, "-c", SPEC_ONLY_CALLS], capture_output=True,
                            text=True)
    assert result.returncode == 0, result.stderr
    assert result.stdout == "[]\n"


@pytest.mark.parametrize("spec", [{"preset": "nsa", "S": 0}, {"preset": "nsa", "S": -8},
                                  {"preset": "nsa", "S": "16"}, {"preset": "nsa", "landmarks": 1},
                                  {"preset": None}, {"preset": "nsa", "s": 16}])
def test_a_bad_spec_is_refused_as_hils_verify_refuses_it(spec):
    """One validator for the spec (the C++ codec): the decode step, the hard cases and a chunked
    prefill refuse a bad spec with hils.verify's exception and words. They read it first with
    hils.gpu.spec.resolve: S = 0 was a ZeroDivisionError, {"S": "16"} and {"landmarks": 1}
    TypeErrors in other words, {"preset": None} and an unknown key other words."""
    rng = np.random.default_rng(6)
    q, k = rng.standard_normal((4, 20, 8)), rng.standard_normal((2, 20, 8))
    with pytest.raises(Exception) as expected:
        hils.verify(spec, q, k, k, {})
    assert type(expected.value) in (TypeError, ValueError)
    calls = {"verify_decode": lambda: hils.verify_decode(spec, q[None, :, -1], k.swapaxes(0, 1)[None],
                                                         k.swapaxes(0, 1)[None], {}, cache_seqlens=[20]),
             "hard_cases": lambda: hils.hard_cases(spec, Hq=4, Hkv=2, d=8, max_T=40),
             "chunked": lambda: hils.verify(spec, q[:, -3:].swapaxes(0, 1), k.swapaxes(0, 1),
                                            k.swapaxes(0, 1), {}, layout="thd", cu_seqlens=[0, 3],
                                            cu_seqlens_k=[0, 20])}
    for name, call in calls.items():
        refused(call, str(expected.value), type(expected.value))


def test_a_spec_hils_verify_accepts_is_accepted_by_the_decode_step():
    # {"K": 4.0} (an integral float, as a TOML or JSON config may hold it): hils.verify took it,
    # hils.verify_decode and hils.hard_cases refused it ("spec['K']: expected an integer").
    rng = np.random.default_rng(6)
    q, k = rng.standard_normal((1, 4, 8)), rng.standard_normal((1, 20, 2, 8))
    spec = {"preset": "nsa", "S": 8, "W": 8, "K": 2.0}
    assert hils.verify_decode(spec, q, k, k, {}, cache_seqlens=[20]).failed == [0]  # nothing given
    assert len(hils.hard_cases(spec, Hq=4, Hkv=2, d=8, max_T=40)) > 0

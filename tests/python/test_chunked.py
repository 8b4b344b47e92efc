"""Chunked prefill / prefix caching: hils.verify(..., cu_seqlens=, cu_seqlens_k=) as
FlashAttention's flash_attn_varlen_func takes cu_seqlens_q != cu_seqlens_k: sequence b has Tk_b
keys and its Tq_b queries are its LAST Tq_b slots (the causal mask aligned to the bottom right,
FlashAttention >= 2.1's docstring). The truth here is independent of that path: the reference of
each whole sequence (every slot queried), whose last Tq_b rows a correct kernel returns. A kernel
aligned top-left, one slot off, or fed the wrong priors fails the sequences with a prefix, and
only those; inconsistent offsets are refused naming them (python/hils/layouts.py PackedBatch,
data/verify_format.md "Chunked prefill"). CPU only."""

import numpy as np
import pytest

import hils
from conftest import CASES, case_spec, seed_of, refused
from hils.decoding import query_inputs

CASE = "ragged_tail"          # S = 8, W = 16, K = 3, Hq = 4, Hkv = 2, d = 16, dv = 12
C = CASES[CASE]
S, Hq, Hkv, d = C["S"], C["Hq"], C["Hkv"], C["d"]
SPEC = case_spec("hils", CASE)
KEYS = (77, 30, 50)           # Tk of each sequence
QUERIES = (12, 30, 5)         # Tq: the last 12 of 77 (a prefix of 65 slots: 8 chunks), all, the last 5
PREFIX = tuple(T - n for T, n in zip(KEYS, QUERIES))               # (65, 0, 45)
CU_K = np.cumsum((0,) + KEYS).astype(np.int32)                     # [0, 77, 107, 157]
CU_Q = np.cumsum((0,) + QUERIES).astype(np.int32)                  # [0, 12, 42, 47]
NAMES = ("o", "lse", "selection", "fusion_weights", "o_window", "lse_window")
N_CHUNKS = 10                 # landmark_queries rows (>= 8, the most chunks before a first query)


def sequence(b):
    """Gaussian float32 q, k, v, q~ of the whole sequence b (every slot)."""
    rng = np.random.default_rng(seed_of(f"chunked/b{b}"))
    T = KEYS[b]
    return tuple(rng.standard_normal(shape).astype(np.float32) for shape in
                 ((Hq, T, d), (Hkv, T, d), (Hkv, T, C["dv"]), (Hq, T, d)))


@pytest.fixture(scope="module")
def whole():
    """Each sequence's inputs and the reference of the whole sequence (every query)."""
    inputs = [sequence(b) for b in range(3)]
    return inputs, [hils.reference(SPEC, q, k, v, q_retrieval=qr) for q, k, v, qr in inputs]


def packed(parts):
    """[heads, rows_b, ...] per sequence -> [total, heads, ...] (FlashAttention's varlen)."""
    return np.concatenate([np.swapaxes(part, 0, 1) for part in parts])


def landmarks(inputs, rows_first=True, late=0):
    """landmark_queries [B, N_CHUNKS, Hq, d]: row c the q~ of slot (c+1+late)S - 1 for the chunks
    before each sequence's first query; the rows past them NaN (never read)."""
    out = np.full((3, N_CHUNKS, Hq, d), np.nan, np.float32)
    for b, (_, _, _, qr) in enumerate(inputs):
        chunks = PREFIX[b] // S
        out[b, :chunks] = np.swapaxes(qr[:, (1 + late) * S - 1:(chunks + late) * S:S], 0, 1)
    return out if rows_first else np.swapaxes(out, 1, 2)


def call(whole, rows=None, names=NAMES):
    """hils.verify's arguments ("thd") for a kernel that returns rows[b] (default: the last
    Tq_b) of each whole sequence's reference outputs."""
    inputs, refs = whole
    rows = rows or [np.arange(P, T) for P, T in zip(PREFIX, KEYS)]
    tail = lambda x, b: x[:, PREFIX[b]:]                            # noqa: E731
    return dict(spec=SPEC, q=packed([tail(x[0], b) for b, x in enumerate(inputs)]),
                k=packed([x[1] for x in inputs]), v=packed([x[2] for x in inputs]),
                q_retrieval=packed([tail(x[3], b) for b, x in enumerate(inputs)]),
                outputs={n: packed([refs[b][n][:, rows[b]] for b in range(3)]) for n in names},
                layout="thd", cu_seqlens=CU_Q, cu_seqlens_k=CU_K,
                landmark_queries=landmarks(inputs))


def in_layout(array, layout):
    return {"thd": array, "htd": np.swapaxes(array, 0, 1), "bshd": array[None],
            "bhsd": np.swapaxes(array, 0, 1)[None]}[layout]


@pytest.mark.parametrize("layout", ("thd", "htd", "bshd", "bhsd"))
def test_the_last_rows_of_each_sequence_pass(whole, layout):
    args = call(whole)
    for name in ("q", "k", "v", "q_retrieval"):
        args[name] = in_layout(args[name], layout)
    args["outputs"] = {n: in_layout(a, layout) for n, a in args["outputs"].items()}
    args["landmark_queries"] = landmarks(whole[0], rows_first=layout in ("thd", "bshd"))
    report = hils.verify(**dict(args, layout=layout))
    assert report.passed, str(report)
    assert report.lengths == list(KEYS) and report.counts == list(QUERIES)
    assert all(r.tensors["o"].max_abs < 1e-12 for r in report)
    assert [r.selection.rows for r in report] == [Hkv * n for n in QUERIES]
    lines = str(report).splitlines()
    assert [line.split("  worst")[0] for line in lines[1:4]] == [
        "  b=0 (T = 77, Tq = 12: slots 65..76, query rows 0..11): PASS",
        "  b=1 (T = 30, query rows 12..41): PASS",
        "  b=2 (T = 50, Tq = 5: slots 45..49, query rows 42..46): PASS"]


def test_a_failing_line_names_the_query_rows_of_the_pack(whole):
    """A fault at packed q/o row 44 (sequence 2's third query, its slot 47): the report names
    slot t=47; its line and header say where that is in the caller's pack (row 42 + 47 - 45)."""
    args = call(whole, names=("o", "lse"))
    args["outputs"]["o"][44, 1, 3] += 0.5                          # [total_q, Hq, dv]
    report = hils.verify(**args)
    assert report.failed == [2] and "h=1 t=47 col=3" in str(report[2]), str(report)
    text = str(report)
    assert "\n  b=2 (T = 50, Tq = 5: slots 45..49, query rows 42..46): FAIL (o)" in text, text
    assert "\n---- b=2: FAIL (query rows 42..46 of the pack: its slot t is row 42 + t - 45) ----\n" in text


def test_reference_returns_the_last_rows(whole):
    args = call(whole)
    got = hils.reference(SPEC, args["q"], args["k"], args["v"], layout="thd",
                         q_retrieval=args["q_retrieval"], cu_seqlens=CU_Q, cu_seqlens_k=CU_K,
                         landmark_queries=args["landmark_queries"])
    for name in NAMES:
        np.testing.assert_allclose(got[name], args["outputs"][name], rtol=0, atol=1e-12,
                                   err_msg=name)
    np.testing.assert_array_equal(got["selection"], args["outputs"]["selection"])


def test_misaligned_kernels_fail_the_sequences_with_a_prefix(whole):
    """Top-left alignment (queries at slots 0..Tq-1) and bottom-right one slot early (P-1 ..
    T-2) fail b=0 and b=2; b=1 (no prefix: both alignments agree) passes."""
    top_left = [np.arange(n) for n in QUERIES]
    one_early = [np.arange(max(P - 1, 0), max(P - 1, 0) + n) for P, n in zip(PREFIX, QUERIES)]
    for rows in (top_left, one_early):
        report = hils.verify(**call(whole, rows))
        assert report.failed == [0, 2], str(report)


def test_the_priors_are_read(whole):
    """landmark_queries one chunk late (row c the q~ of slot (c+2)S - 1) fails the sequences with
    a prefix chunk, q~ replaced by q every sequence; without landmark_queries hils is refused, and nsa,
    which reads no prior, refuses them."""
    args = call(whole)
    late = landmarks(whole[0], late=1)
    assert hils.verify(**dict(args, landmark_queries=late)).failed == [0, 2]
    assert hils.verify(**dict(args, q_retrieval=args["q"])).failed == [0, 1, 2]
    with pytest.raises(TypeError, match=r"landmark_queries: spec 'hils' summarizes each chunk with "
                       r"a prior, .* which the chunk's q and q_retrieval do not hold: give them, "
                       r'\[B, n_chunks, Hq, d\] \(layout "thd"\)'):
        hils.verify(**dict(args, landmark_queries=None))
    spec = case_spec("nsa", CASE)
    nsa = dict(call((whole[0], [hils.reference(spec, q, k, v, q_retrieval=qr)
                                for q, k, v, qr in whole[0]])), spec=spec, landmark_queries=None)
    assert hils.verify(**nsa).passed
    with pytest.raises(ValueError, match=r"landmark_queries: not read by spec 'nsa'"):
        hils.verify(**dict(nsa, landmark_queries=args["landmark_queries"]))


def test_one_query_each_is_the_decode_step(whole):
    """Tq = 1 in every sequence is hils.verify_decode's problem: the same o and lse errors."""
    inputs, refs = whole
    k_cache = np.zeros((3, max(KEYS), Hkv, d), np.float32)
    v_cache = np.zeros((3, max(KEYS), Hkv, C["dv"]), np.float32)
    for b, (_, k, v, _) in enumerate(inputs):
        k_cache[b, :KEYS[b]], v_cache[b, :KEYS[b]] = np.swapaxes(k, 0, 1), np.swapaxes(v, 0, 1)
    last = lambda i: np.stack([x[i][:, -1] for x in inputs])       # noqa: E731  [B, Hq, d]
    outputs = {n: np.stack([refs[b][n][:, -1] for b in range(3)]) for n in ("o", "lse", "selection")}
    priors = np.zeros((3, max(KEYS) // S, Hq, d), np.float32)
    for b, (_, _, _, qr) in enumerate(inputs):
        priors[b, :KEYS[b] // S] = np.swapaxes(qr[:, S - 1:KEYS[b] // S * S:S], 0, 1)
    step = hils.verify_decode(SPEC, last(0), k_cache, v_cache, outputs, cache_seqlens=list(KEYS),
                              q_retrieval=last(3), landmark_queries=priors)
    packed_k = call(whole)
    chunk = hils.verify(SPEC, last(0), packed_k["k"], packed_k["v"],
                        outputs, layout="thd", q_retrieval=last(3),
                        cu_seqlens=np.arange(4), cu_seqlens_k=CU_K, landmark_queries=priors)
    assert step.passed and chunk.passed, str(chunk)
    for a, b in zip(step, chunk):
        assert a.tensors["o"].max_abs == b.tensors["o"].max_abs
        assert a.tensors["lse"].max_abs == b.tensors["lse"].max_abs


def test_query_inputs_places_the_last_rows():
    rng = np.random.default_rng(seed_of("chunked/rows"))
    q, qt, priors = (rng.standard_normal(shape) for shape in ((Hq, 5, d), (Hq, 5, d), (Hq, 4, d)))
    q_full, q_tilde = query_inputs(30, S, q, qt, priors)    # slots 25..29; chunks 0..2 before 25
    np.testing.assert_array_equal(q_full[:, 25:], q)
    assert not q_full[:, :25].any()
    np.testing.assert_array_equal(q_tilde[:, [7, 15, 23]], priors[:, :3])
    np.testing.assert_array_equal(q_tilde[:, 25:], qt)
    keep = np.ones(30, bool)
    keep[[7, 15, 23, 25, 26, 27, 28, 29]] = False
    assert not q_tilde[:, keep].any()


def test_equal_offsets_are_the_packed_batch(whole):
    """cu_seqlens_k = cu_seqlens (every slot queried) is the packed batch of test_packed.py: the
    same report; landmark_queries are refused there (q~ holds every landmark slot)."""
    inputs, refs = whole
    full = dict(spec=SPEC, q=packed([x[0] for x in inputs]), k=packed([x[1] for x in inputs]),
                v=packed([x[2] for x in inputs]), q_retrieval=packed([x[3] for x in inputs]),
                outputs={n: packed([r[n] for r in refs]) for n in NAMES}, layout="thd",
                cu_seqlens=CU_K)
    plain = hils.verify(**full)
    same = hils.verify(**dict(full, cu_seqlens_k=CU_K.astype(np.int64)))
    assert plain.passed and same.passed and same.counts is None
    assert str(plain) == str(same)
    refused(lambda: hils.verify(**dict(full, cu_seqlens_k=CU_K, landmark_queries=landmarks(inputs))),
          "landmark_queries: read only with cu_seqlens_k (the priors of the chunks before each "
          "sequence's queries); with every slot queried q and q_retrieval hold them all: leave it "
          "out")



def test_inconsistent_offsets_are_refused(whole):
    args = call(whole)
    verify = lambda **changes: hils.verify(**dict(args, **changes))     # noqa: E731
    refused(lambda: verify(cu_seqlens=CU_K, cu_seqlens_k=CU_Q),
          "cu_seqlens, cu_seqlens_k: swapped: cu_seqlens ends at 157, k's total rows, and "
          "cu_seqlens_k at 47, q's; cu_seqlens are the queries' offsets (FlashAttention's "
          "cu_seqlens_q), cu_seqlens_k the keys'")
    refused(lambda: verify(cu_seqlens_k=np.array([0, 77, 157], np.int32)),
          "cu_seqlens_k: expected 4 entries (B + 1, B = 3 sequences in cu_seqlens), found 3")
    # Offsets that are not integers: were Python's own "invalid literal for int() with base 10:
    # 'x'" (or "int() argument must be ..., not 'object'"), from the swapped-offsets hint.
    for name, other in (("cu_seqlens_k", {}), ("cu_seqlens", {"cu_seqlens_k": CU_K})):
        for bad, dtype in (("x", "<U1"), (object(), "object")):
            refused(lambda: verify(**{name: bad, **other}),
                    f"{name}: expected integers (int32 as FlashAttention's, int64 as fla-org's), "
                    f"found dtype {dtype}", TypeError)
    refused(lambda: verify(cu_seqlens_k=np.array([0, 77, 87, 157], np.int32)),
          "cu_seqlens_k: sequence b=1 has Tq = 30 queries (cu_seqlens) and Tk = 10 keys "
          "(cu_seqlens_k): the queries are the last Tq of the sequence's Tk slots (FlashAttention's "
          "causal mask aligned to the bottom right), so Tq <= Tk; a query with no key to read is "
          "not judged")
    refused(lambda: verify(cu_seqlens_k=np.array([0, 77, 107, 156], np.int32)),
          "cu_seqlens_k: expected cu_seqlens_k[-1] = 157 (k's total rows), found 156")
    refused(lambda: verify(cu_seqlens_k=np.array([0, 77, 77, 157], np.int32)),
          "cu_seqlens_k: sequence b=1 has Tq = 30 queries (cu_seqlens) and no key "
          "(cu_seqlens_k[1] = cu_seqlens_k[2] = 77): its queries are the last Tq of its Tk slots, "
          "so Tq <= Tk; a sequence with Tk = 0 is empty only with Tq = 0 (nothing to judge)")
    refused(lambda: verify(k=np.swapaxes(args["k"], 0, 1)),
          'k: layout "thd" expects [total, Hkv, d] with total = 157 (cu_seqlens_k[-1]), found '
          'shape [2, 157, 16], which is [Hkv, total, d], the order of layout "htd": transpose it '
          "(x.transpose(0, 1) in torch)")
    refused(lambda: verify(v=np.swapaxes(args["v"], 0, 1)),
          'v: layout "thd" expects [total, Hkv, dv] = [157, 2, *], found shape [2, 157, 12], '
          'which is [Hkv, total, dv], the order of layout "htd": transpose it to [total, Hkv, dv] '
          "(x.transpose(0, 1) in torch, np.swapaxes(x, 0, 1) in numpy)")
    refused(lambda: verify(v=args["v"][:-1]),
          'v: layout "thd" expects [total, Hkv, dv] with total = 157 (cu_seqlens_k[-1]), found '
          "shape [156, 2, 12]")
    refused(lambda: verify(landmark_queries=args["landmark_queries"][:, :7]),
          'landmark_queries: expected [B, n_chunks, Hq, d] (layout "thd") with B = 3, Hq = 4 and '
          "n_chunks >= 8 (sequence b=0: T = 77), found shape [3, 7, 4, 16]")
    refused(lambda: verify(q_retrieval=args["q_retrieval"][:, :2]),
          'q_retrieval: expected q\'s shape (layout "thd"), sequence b=0 read as [Hq, Tq, d] = '
          "[4, 12, 16], found [2, 12, 16]")
    refused(lambda: verify(do=args["outputs"]["o"]),
          'do: gradients need every query of each sequence (data/verify_format.md "Gradients"); '
          "with cu_seqlens_k each sequence's queries are its last Tq slots: judge the backward "
          "of a pack without a prefix (no cu_seqlens_k)")
    plain = dict(args, layout="hsd", q=whole[0][0][0], k=whole[0][0][1], v=whole[0][0][2],
                 q_retrieval=None, outputs={}, cu_seqlens=None, landmark_queries=None)
    refused(lambda: hils.verify(**plain),
          "cu_seqlens_k: read only with cu_seqlens (packed sequences: cu_seqlens the queries' "
          "offsets, cu_seqlens_k the keys')")
    refused(lambda: hils.verify(**dict(plain, cu_seqlens_k=None,
                                     landmark_queries=args["landmark_queries"])),
          "landmark_queries: read only with cu_seqlens (packed sequences: cu_seqlens the queries' "
          "offsets, cu_seqlens_k the keys')")
    refused(lambda: hils.verify(**dict(args, spec=dict(SPEC, prior_rule="shared"))),
          "spec['prior_rule']: a chunk of queries after a prefix (cu_seqlens_k) is judged with "
          "prior_rule landmark_query (each chunk's prior the q~ of its landmark slot), found "
          "'shared'")


# ---- sequences with no query (Tq_b = 0): nothing to judge, whatever their keys -----------------
# b=1: 20 keys and no query (a sequence whose chunk of queries is elsewhere), b=4: empty (Tk = 0,
# vLLM's padding); the others are KEYS / QUERIES' 0, 1, 2 at b = 0, 2, 3.
EXTRA_KEYS = 20
CU_Q_EMPTY = np.array([0, 12, 12, 42, 47, 47], np.int32)
CU_K_EMPTY = np.array([0, 77, 77 + EXTRA_KEYS, 107 + EXTRA_KEYS, 157 + EXTRA_KEYS,
                       157 + EXTRA_KEYS], np.int32)
AT = (0, 2, 3)                # where KEYS' sequences sit


def with_empty(args, inputs):
    """call()'s arguments with b=1 (Tk = 20, Tq = 0) and b=4 (empty) inserted: k and v get b=1's
    rows (random), landmark_queries its rows (NaN: never read)."""
    rng = np.random.default_rng(seed_of("chunked/empty"))
    keys = {name: rng.standard_normal((EXTRA_KEYS,) + args[name].shape[1:]).astype(np.float32)
            for name in ("k", "v")}
    rows = landmarks(inputs)
    nan = np.full((1,) + rows.shape[1:], np.nan, np.float32)
    return dict(args, cu_seqlens=CU_Q_EMPTY, cu_seqlens_k=CU_K_EMPTY,
                landmark_queries=np.concatenate([rows[:1], nan, rows[1:], nan]),
                **{name: np.concatenate([args[name][:77], keys[name], args[name][77:]])
                   for name in ("k", "v")})


def test_a_sequence_without_queries_is_nothing_to_judge(whole):
    report = hils.verify(**with_empty(call(whole), whole[0]))
    assert report.passed and report.empty == [1, 4], str(report)
    assert report.lengths == [77, 20, 30, 50, 0] and report.counts == [12, 0, 30, 5, 0]
    assert all(report[b].tensors["o"].max_abs < 1e-12 for b in AT)
    assert [report[b].selection.rows for b in AT] == [Hkv * n for n in QUERIES]
    lines = str(report).splitlines()
    assert lines[0] == 'batch of 5 sequences, layout "thd": 3 pass, 0 fail, 2 empty (b=1, 4)'
    assert [line.split("  worst")[0] for line in lines[1:6]] == [
        "  b=0 (T = 77, Tq = 12: slots 65..76, query rows 0..11): PASS",
        "  b=1 (T = 20, Tq = 0): empty, nothing to judge",
        "  b=2 (T = 30, query rows 12..41): PASS",
        "  b=3 (T = 50, Tq = 5: slots 45..49, query rows 42..46): PASS",
        "  b=4 (T = 0): empty, nothing to judge"]


def test_a_failing_sequence_after_one_without_queries_fails(whole):
    """test_a_failing_line_names_the_query_rows_of_the_pack's fault (packed row 44, slot 47 of
    KEYS' sequence 2) with the empties inserted: b=3 fails, alone, at the same rows; top-left
    aligned outputs still fail the sequences with a prefix (b=0, 3)."""
    args = with_empty(call(whole, names=("o", "lse")), whole[0])
    args["outputs"]["o"][44, 1, 3] += 0.5
    report = hils.verify(**args)
    assert report.failed == [3] and "h=1 t=47 col=3" in str(report[3]), str(report)
    text = str(report)
    assert "\n  b=3 (T = 50, Tq = 5: slots 45..49, query rows 42..46): FAIL (o)" in text, text
    assert "\n---- b=3: FAIL (query rows 42..46 of the pack: its slot t is row 42 + t - 45) ----\n" in text
    top_left = hils.verify(**with_empty(call(whole, [np.arange(n) for n in QUERIES]), whole[0]))
    assert top_left.failed == [0, 3] and top_left.empty == [1, 4], str(top_left)


def test_reference_with_a_sequence_without_queries(whole):
    args = with_empty(call(whole), whole[0])
    got = hils.reference(SPEC, args["q"], args["k"], args["v"], layout="thd",
                         q_retrieval=args["q_retrieval"], cu_seqlens=CU_Q_EMPTY,
                         cu_seqlens_k=CU_K_EMPTY, landmark_queries=args["landmark_queries"])
    for name in NAMES:
        np.testing.assert_allclose(got[name], args["outputs"][name], rtol=0, atol=1e-12,
                                   err_msg=name)
    assert [x is None for x in got["summary_key"]] == [False, True, False, False, True]


_PACK_TOO_LARGE = """
import resource
resource.setrlimit(resource.RLIMIT_AS, (3 << 30, 3 << 30))
import numpy as np
import hils
B, T, Tq, Hq, Hkv, d = 8, 32768, 4, 32, 8, 128
k = np.full((B * T, Hkv, d), 0.5, np.float32)
q = np.ones((B * Tq, Hq, d), np.float32)
try:
    hils.verify({"preset": "nsa", "S": 64, "W": 512, "K": 16}, q=q, k=k, v=k,
                outputs={"o": np.zeros((B * Tq, Hq, d), np.float32)}, layout="thd",
                cu_seqlens=np.arange(B + 1) * Tq, cu_seqlens_k=np.arange(B + 1) * T)
except Exception as error:
    print(type(error).__name__, error)
"""


def test_a_pack_whose_oracle_inputs_cannot_fit_is_refused_before_its_queries_are_placed():
    """Each sequence of a chunked pack is the oracle's problem of its Tk slots, its Tq queries
    placed at the last rows of q [Hq, Tk, d]. Eight sequences of 4 queries after 32768 keys (Hq =
    32, Hkv = 8, d = 128: a 1 GiB pack of keys) under a 3 GiB address-space limit: refused at
    b=0 by the oracle's memory check, naming q and the shapes. Before (session 27), every
    sequence's q was placed before the first oracle's check and the call ended in numpy's
    "MemoryError Unable to allocate 512. MiB"."""
    import os
    import subprocess
    import sys
    env = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1")
    result = subprocess.run([sys.executable, "-c", _PACK_TOO_LARGE], capture_output=True,
                            text=True, env=env, timeout=300)
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith(
        "ValueError q: expected inputs whose copies in the oracle (float64 and float32 of every "
        "value, and float64 again while it is built) fit in 80% of the address-space limit "
        "(ulimit -v) of 3 GiB shared by the 8 sequences of a batch held at once (384 MiB each), "
        "found q [32, 32768, 128], k [8, 32768, 128], v [8, 32768, 128]: 2.44 GiB (fewer or "
        "shorter sequences per call) (sequence b=0 of layout \"thd\" with cu_seqlens: query rows "
        "0..3 at slots 32764..32767, key rows 0..32767, T = 32768, read as q [Hq, T, d] = [32, "
        "32768, 128]"), result.stdout

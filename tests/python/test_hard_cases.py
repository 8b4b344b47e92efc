"""hils.hard_cases: the oracle's hard cases as a kernel author's test inputs. A float32 numpy
kernel (numpy_kernels.block_sparse, the nsa preset) passes every case; each planted fault is
caught by the case built for it, and three of them pass the plain Gaussian case."""

import numpy as np
import pytest

import hils
from conftest import refused
from numpy_kernels import block_sparse, round_to_bf16

SPEC = {"preset": "nsa", "S": 16, "W": 32, "K": 4}
SHAPE = {"Hq": 4, "Hkv": 2, "d": 32}


@pytest.fixture(scope="module")
def cases():
    return hils.hard_cases(SPEC, **SHAPE, precision="bf16")


def run_kernel(case, **faults):
    o, lse, sel = block_sparse(case.q, case.k, case.v, SPEC["S"], SPEC["W"], SPEC["K"],
                               1 / np.sqrt(SHAPE["d"]), "mean", **faults)
    return {"o": o, "lse": lse, "selection": sel}


def test_every_case_of_the_table_is_built_for_a_selecting_spec(cases):
    assert [c.name for c in cases] == list(hils._core.hard_case_names)
    assert cases.skipped == []
    by_name = {c.name: c for c in cases}
    S, W, K = SPEC["S"], SPEC["W"], SPEC["K"]
    assert by_name["single_slot"].T == 1
    assert by_name["shorter_than_chunk"].T == S - 1
    assert by_name["candidate_counts"].T == W + (K + 1) * S
    assert by_name["ragged_tail"].T % S != 0
    assert by_name["many_candidates"].T == W + 300 * S
    for case in cases:
        assert case.q.shape == (SHAPE["Hq"], case.T, SHAPE["d"]) and case.q.dtype == np.float32
        assert case.k.shape == case.v.shape == (SHAPE["Hkv"], case.T, SHAPE["d"])
        assert case.prior is None  # nsa reads no prior
        for x in (case.q, case.k, case.v):
            assert np.array_equal(round_to_bf16(x), x), case.name  # exact in bf16


def test_the_same_arguments_give_the_same_values_and_another_shape_others(cases):
    again = hils.hard_cases(SPEC, **SHAPE, precision="bf16")
    assert all(np.array_equal(a.k, b.k) and np.array_equal(a.q, b.q) for a, b in zip(cases, again))
    other = hils.hard_cases(SPEC, Hq=4, Hkv=1, d=32, precision="bf16")
    assert not np.array_equal(other[0].q, cases[0].q)


def test_layout_and_arguments_feed_verify_directly(cases):
    laid = hils.hard_cases(SPEC, **SHAPE, precision="bf16", layout="bshd", max_T=300)
    case = next(c for c in laid if c.name == "tied_chunks")
    plain = next(c for c in cases if c.name == "tied_chunks")
    assert case.q.shape == (1, case.T, SHAPE["Hq"], SHAPE["d"]) and case.q.flags.c_contiguous
    assert np.array_equal(case.q[0].swapaxes(0, 1), plain.q)
    ref = hils.reference(SPEC, **{n: case.arguments[n] for n in ("q", "k", "v", "layout")})
    report = hils.verify(SPEC, outputs={"o": ref["o"], "lse": ref["lse"]}, **case.arguments)
    assert report.passed and report.reports[0].tensors["o"].max_abs < 1e-12


def test_the_correct_float32_kernel_passes_every_case(cases):
    for case in cases:
        report = hils.verify(SPEC, outputs=run_kernel(case), **case.arguments)
        assert report.passed, f"{case.name}\n{report}"


# Each planted fault, the case built to catch it, and whether the Gaussian case (what random
# test inputs are) catches it too: measured, see data/hard_cases.md.
FAULTS = [
    ({"threshold_top_k": True}, "tied_chunks", False),
    ({"shift": "from_zero"}, "negative_logits", False),
    ({"shift": "none"}, "large_logits", False),
    ({"skip_chunk0": True}, "dominant_chunk", True),
    ({"first_head_only": True}, "gaussian", True),
    ({"window_out_of_log_z": True}, "gaussian", True),
]


@pytest.mark.parametrize("faults, catcher, gaussian_catches", FAULTS,
                         ids=[next(iter(f)) + ("=" + str(v) if isinstance(v, str) else "")
                              for f, _, _ in FAULTS for v in f.values()])
def test_each_planted_fault_fails_the_case_built_for_it(cases, faults, catcher, gaussian_catches):
    by_name = {c.name: c for c in cases}
    failed = hils.verify(SPEC, outputs=run_kernel(by_name[catcher], **faults),
                         **by_name[catcher].arguments)
    assert not failed.passed
    plain = hils.verify(SPEC, outputs=run_kernel(by_name["gaussian"], **faults),
                        **by_name["gaussian"].arguments)
    assert plain.passed != gaussian_catches


def test_specs_and_shapes_without_a_point_skip_cases_and_say_why():
    window = hils.hard_cases({"preset": "swa", "S": 16, "W": 32}, **SHAPE)
    assert dict(window.skipped)["tied_chunks"] == "the spec selects no chunks (fusion window)"
    assert "gaussian" in [c.name for c in window]
    no_k = hils.hard_cases({**SPEC, "K": 0}, **SHAPE, max_T=100)
    assert dict(no_k.skipped)["tied_chunks"] == "K = 0 selects no chunks, so there is no top-K cut"
    tiles = hils.hard_cases(SPEC, **SHAPE, length_multiple=32, max_T=400)
    assert all(c.T % 32 == 0 for c in tiles)
    skipped = dict(tiles.skipped)
    assert skipped["ragged_tail"] == "needs T not a multiple of S, which no multiple of 32 is"
    assert skipped["single_slot"] == "needs T = 1, which no multiple of 32 is"
    assert skipped["many_candidates"] == "needs T = 4832 > max_T = 400"


def test_the_hils_preset_gets_landmark_layout_cases_and_a_shared_prior_its_rows():
    spec = {"preset": "hils", "S": 8, "W": 16, "K": 2}
    built = hils.hard_cases(spec, Hq=4, Hkv=2, d=16, dv=8, max_T=200)
    assert built.skipped[0][0] == "many_candidates" and len(built) == 12
    for case in built:
        assert case.v.shape[2] == 8 and case.prior is None
        assert np.array_equal(case.q, case.q.astype(np.float32))
    shared = hils.hard_cases({**spec, "prior_rule": "shared", "landmarks": False}, Hq=4, Hkv=2,
                             d=16, max_T=200)
    assert all(c.prior.shape == (4, 1, 16) for c in shared)
    ref = hils.reference(spec, built[5].q, built[5].k, built[5].v)
    report = hils.verify(spec, outputs={"o": ref["o"], "selection": ref["selection"]},
                         **built[5].arguments)
    assert report.passed


def test_bad_arguments_are_refused_naming_them():
    refused(lambda: hils.hard_cases(SPEC, Hq=3, Hkv=2, d=8),
            "Hq: expected a multiple of Hkv = 2, got 3")
    refused(lambda: hils.hard_cases(SPEC, Hq=0, Hkv=2, d=8), "Hq: expected an integer >= 1, got 0")
    refused(lambda: hils.hard_cases(SPEC, Hq=2, Hkv=2, d=8, precision="int4"),
            'precision: expected "fp32" or "bf16", got "int4"')
    refused(lambda: hils.hard_cases(SPEC, Hq=2, Hkv=2, d=8, length_multiple=0),
            "length_multiple: expected an integer >= 1, got 0")
    refused(lambda: hils.hard_cases(SPEC, Hq=2, Hkv=2, d=8, max_T=0),
            "max_T: expected a length >= 1 (None: no limit), found 0")
    refused(lambda: hils.hard_cases(SPEC, Hq=2.0, Hkv=2, d=8),
            "Hq: expected an integer, found float 2.0", TypeError)
    refused(lambda: hils.hard_cases(SPEC, Hq=True, Hkv=1, d=8),
            "Hq: expected an integer, found bool True", TypeError)
    refused(lambda: hils.hard_cases(SPEC, Hq=2, Hkv=2, d=8, max_T=2**64),
            "max_T: expected an integer within int64's range, found 18446744073709551616")
    refused(lambda: hils.hard_cases(SPEC, Hq=2**63, Hkv=2, d=8),
            "Hq: expected an integer within int64's range, found 9223372036854775808")
    refused(lambda: hils.hard_cases({**SPEC, "W": 0}, Hq=2, Hkv=2, d=8),
            hils_message_of({**SPEC, "W": 0}))
    with pytest.raises(ValueError, match=r"^hard cases: their inputs need .* more than 80% of "):
        hils.hard_cases(SPEC, Hq=4096, Hkv=1, d=1 << 16)
    refused(lambda: hils.hard_cases(SPEC, Hq=2, Hkv=2, d=8, layout="thd"),
            'layout: expected one of "hsd", "shd", "bhsd", "bshd" (batch, heads, sequence, dims: the '
            "order of a kernel's axes), found 'thd'")


def hils_message_of(spec):
    """The refusal hils.reference gives the same spec: one message for one bad field."""
    with pytest.raises(ValueError) as raised:
        hils.reference(spec, np.zeros((2, 4, 8)), np.zeros((2, 4, 8)), np.zeros((2, 4, 8)))
    return str(raised.value)


@pytest.mark.parametrize("preset", ["nsa", "hils"])
def test_each_case_as_a_decode_step_passes_verify_decode_and_its_fault_fails(cases, preset):
    """decode_arguments: the case's last query against its T slots. The correct numpy kernel's
    last row passes every case; the maximum started at 0 fails negative_logits there too."""
    spec = {**SPEC, "preset": preset}
    built = cases if preset == "nsa" else hils.hard_cases(spec, **SHAPE, precision="bf16", max_T=300)
    for case in built:
        arguments = case.decode_arguments()
        assert arguments["q"].shape == (1, SHAPE["Hq"], SHAPE["d"])
        assert arguments["k_cache"].shape == (1, case.T, SHAPE["Hkv"], SHAPE["d"])
        assert ("landmark_queries" in arguments) == (preset == "hils" and case.T >= SPEC["S"])
        ref = hils.reference(spec, case.q, case.k, case.v, queries=[case.T - 1])
        step = {"o": ref["o"].swapaxes(0, 1), "lse": ref["lse"].T}
        if "selection" in ref:
            step["selection"] = ref["selection"].swapaxes(0, 1)
        report = hils.verify_decode(spec, outputs=step, **arguments)
        assert report.passed, f"{case.name}\n{report}"
    if preset == "nsa":
        case = next(c for c in cases if c.name == "negative_logits")
        out = run_kernel(case, shift="from_zero")
        step = {"o": out["o"][:, -1][None], "lse": out["lse"][:, -1][None],
                "selection": out["selection"][:, -1][None]}
        assert not hils.verify_decode(spec, outputs=step, **case.decode_arguments()).passed


def test_decode_arguments_refuse_a_given_prior():
    spec = {"preset": "hils", "S": 8, "W": 16, "K": 2, "landmarks": False, "prior_rule": "shared"}
    case = hils.hard_cases(spec, Hq=2, Hkv=1, d=8, max_T=100)[0]
    refused(case.decode_arguments,
            "decode_arguments: spec 'hils' reads a shared prior, which hils.verify_decode does not "
            "take (a decode step's summaries read prior_rule landmark_query)")


@pytest.mark.parametrize("preset", ["nsa", "hils"])
def test_decode_arguments_of_an_earlier_slot_judge_that_slots_query(preset):
    """decode_arguments(n): slot n-1's query against the case's first n slots, for a walk of
    steps. The reference's row n-1 of the whole case passes as that step (causal: it reads no
    later slot); row n-2 given as step n fails."""
    spec = {**SPEC, "preset": preset}
    case = next(c for c in hils.hard_cases(spec, **SHAPE, precision="bf16", max_T=300)
                if c.name == "large_logits")
    ref = hils.reference(spec, case.q, case.k, case.v)
    for n in (1, SPEC["S"] - 1, SPEC["S"], case.T - 7, case.T):
        arguments = case.decode_arguments(n)
        assert arguments["k_cache"].shape == (1, n, SHAPE["Hkv"], SHAPE["d"])
        assert arguments["cache_seqlens"].tolist() == [n]
        assert np.array_equal(arguments["q"][0], case.q[:, n - 1])
        assert ("landmark_queries" in arguments) == (preset == "hils" and n >= SPEC["S"])
        step = {"o": ref["o"][:, n - 1][None], "lse": ref["lse"][:, n - 1][None]}
        report = hils.verify_decode(spec, outputs=step, **arguments)
        assert report.passed, f"step {n}\n{report}"
    n = case.T - 7
    wrong = {"o": ref["o"][:, n - 2][None], "lse": ref["lse"][:, n - 2][None]}
    assert not hils.verify_decode(spec, outputs=wrong, **case.decode_arguments(n)).passed
    assert case.decode_arguments(case.T)["k_cache"].shape == case.decode_arguments()["k_cache"].shape


def test_decode_arguments_refuse_a_length_outside_the_case():
    case = hils.hard_cases(SPEC, **SHAPE, max_T=300)[0]
    for bad in (0, -1, case.T + 1):
        refused(lambda: case.decode_arguments(bad),
                f"decode_arguments: length: expected 1..{case.T} (the case's slots), got {bad}")
    with pytest.raises(TypeError, match=r"^decode_arguments: length: expected an integer, found float 2.5"):
        case.decode_arguments(2.5)

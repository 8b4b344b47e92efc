"""numpy float32 kernels judged by hils.verify: correct ones pass, planted faults fail with the
oracle's diagnosis (issue 9)."""

import inspect
import os
import subprocess
import sys

import numpy as np
import pytest

import hils
from hils.testing import assert_kernel_matches
from conftest import CASES, case_inputs, case_spec
from numpy_kernels import (block_sparse, dense_attention, round_to_bf16, window_attention)


def scale_of(q):
    return 1.0 / np.sqrt(q.shape[2])


@pytest.mark.parametrize("case", ["gqa_group4", "peaked_attention", "ragged_tail_no_landmarks"])
def test_dense_float32_passes(case):
    q, k, v = case_inputs(case)
    o, lse = dense_attention(q, k, v, scale_of(q))
    report = assert_kernel_matches(case_spec("full", case), q, k, v, {"o": o, "lse": lse})
    assert set(report.tensors) == {"o", "lse"}
    assert 0 < report.tensors["o"].headroom <= 1 and 0 < report.tensors["lse"].headroom <= 1


@pytest.mark.parametrize("case", ["gqa_group4", "window_one", "shorter_than_window"])
def test_window_float32_passes(case):
    q, k, v = case_inputs(case)
    c = CASES[case]
    o, lse = window_attention(q, k, v, c["S"], c["W"], scale_of(q))
    outputs = {"o": o, "lse": lse, "o_window": o, "lse_window": lse}
    report = assert_kernel_matches(case_spec("swa", case), q, k, v, outputs)
    assert set(report.tensors) == set(outputs)


@pytest.mark.parametrize("case", ["gqa_group4", "flat_attention", "peaked_attention", "k_covers_all"])
def test_naive_bsa_float32_passes(case):
    q, k, v = case_inputs(case)
    c = CASES[case]
    o, lse, sel = block_sparse(q, k, v, c["S"], c["W"], c["K"], scale_of(q), "exact")
    report = assert_kernel_matches(case_spec("naive_bsa", case), q, k, v,
                                   {"o": o, "lse": lse, "selection": sel})
    assert report.selection.compared and report.selection.passed
    assert report.selection.rows == c["Hkv"] * c["T"]


def test_nsa_bf16_passes_as_in_the_readme():
    # The README's example: bf16 inputs, an NSA kernel computing in float32, o stored in bf16.
    q, k, v = (round_to_bf16(x) for x in case_inputs("longer_blocks"))
    c = CASES["longer_blocks"]
    o, lse, sel = block_sparse(q, k, v, c["S"], c["W"], c["K"], scale_of(q), "mean")
    report = assert_kernel_matches({"preset": "nsa", "S": c["S"], "W": c["W"], "K": c["K"]},
                                   q, k, v, {"o": round_to_bf16(o), "lse": lse, "selection": sel},
                                   input_precision="bf16", kernel="numpy nsa")
    assert report.input_precision == "bf16" and report.kernel == "numpy nsa"
    assert report.tensors["o"].precision == "bf16"


def test_queries_subset_passes():
    q, k, v = case_inputs("gqa_group4")
    o, lse = dense_attention(q, k, v, scale_of(q))
    rows = np.array([0, 7, 64, 130])
    report = hils.verify(case_spec("full", "gqa_group4"), q, k, v,
                         {"o": o[:, rows], "lse": lse[:, rows]}, queries=rows)
    assert report.passed and report.tensors["o"].count == q.shape[0] * len(rows) * v.shape[2]


# ---- planted faults ------------------------------------------------------------------------

def test_wrong_scale_fails():
    q, k, v = case_inputs("gqa_group4")
    o, lse = dense_attention(q, k, v, 1.0 / q.shape[2])       # 1/d instead of 1/sqrt(d)
    report = hils.verify(case_spec("full", "gqa_group4"), q, k, v, {"o": o, "lse": lse})
    assert not report.passed
    assert not report.tensors["o"].passed and report.tensors["o"].headroom > 1
    with pytest.raises(AssertionError) as failure:
        assert_kernel_matches(case_spec("full", "gqa_group4"), q, k, v, {"o": o, "lse": lse})
    headline, rest = str(failure.value).split("\n", 1)
    assert rest == str(report)
    headroom = max(t.headroom for t in report.tensors.values())
    assert headline == f"FAIL (o, lse)  worst headroom {headroom:.3g} (o)"
    # No output at all (the kernel's dict held only None): the oracle's own words, not "see below".
    with pytest.raises(AssertionError) as failure:
        assert_kernel_matches(case_spec("full", "gqa_group4"), q, k, v, {"o": None}, kernel="k")
    assert str(failure.value).startswith("kernel k: FAIL (see below)  the kernel outputs are empty: "
                                         "nothing to compare;\n")


# What pytest shows of a failing helper: the first line of its message in the -r summary, and
# the caller's frame (hils.testing's own frames hidden). The first line was "kernel wrong scale"
# alone (or the report's "oracle: full: fusion=full S=8 ..." without a kernel name), saying
# nothing of what broke, and the traceback showed hils/testing.py's _passed, which raised.
PYTEST_FILE = """
import numpy as np
from hils.testing import assert_kernel_matches

def test_kernel():
    rng = np.random.default_rng(3)
    q, k, v = (rng.standard_normal((2, 40, 8)) for _ in range(3))
    s = q @ k.transpose(0, 2, 1) / 8 + np.triu(np.full((40, 40), -np.inf), 1)  # 1/d, not 1/sqrt(d)
    p = np.exp(s - s.max(-1, keepdims=True))
    o = p @ v / p.sum(-1, keepdims=True)
    assert_kernel_matches({"preset": "full"}, q, k, v, {"o": o}, kernel="wrong scale")
"""


def test_a_failing_helper_says_what_broke_in_the_first_line_pytest_shows(tmp_path):
    (tmp_path / "test_wrong_scale.py").write_text(PYTEST_FILE)
    result = subprocess.run([sys.executable, "-m", "pytest", "-q", "-rf", "-p", "no:cacheprovider",
                             str(tmp_path / "test_wrong_scale.py")], capture_output=True,
                            text=True, cwd=tmp_path, env={**os.environ, "COLUMNS": "300"})
    assert result.returncode == 1, result.stdout + result.stderr
    summary = [line for line in result.stdout.splitlines() if line.startswith("FAILED ")]
    assert len(summary) == 1, result.stdout
    assert summary[0].startswith("FAILED test_wrong_scale.py::test_kernel - AssertionError: "
                                 "kernel wrong scale: FAIL (o)  worst headroom "), result.stdout
    assert "_passed" not in result.stdout and "hils/testing.py" not in result.stdout, result.stdout


def test_window_shifted_by_s_fails_with_diagnosis():
    q, k, v = case_inputs("gqa_group4")
    c = CASES["gqa_group4"]
    o, lse = window_attention(q, k, v, c["S"], c["W"] + c["S"], scale_of(q))
    report = hils.verify(case_spec("swa", "gqa_group4"), q, k, v,
                         {"o": o, "lse": lse, "o_window": o, "lse_window": lse})
    assert not report.passed
    expected = f"matches a sliding window of W={c['W'] + c['S']} instead of W={c['W']}"
    assert expected in report.tensors["o_window"].diagnosis
    assert expected in str(report)


def test_dropped_chunk_fails():
    # Reports K chunks but attends K-1: the selection passes, o and lse do not.
    q, k, v = case_inputs("peaked_attention")
    c = CASES["peaked_attention"]
    o, lse, sel = block_sparse(q, k, v, c["S"], c["W"], c["K"], scale_of(q), "exact", drop_chunk=True)
    report = hils.verify(case_spec("naive_bsa", "peaked_attention"), q, k, v,
                         {"o": o, "lse": lse, "selection": sel})
    assert report.selection.passed and not report.passed
    assert not report.tensors["o"].passed and not report.tensors["lse"].passed


def test_wrong_chunk_fails_in_the_selection():
    q, k, v = case_inputs("longer_blocks")
    c = CASES["longer_blocks"]
    o, lse, sel = block_sparse(q, k, v, c["S"], c["W"], c["K"], scale_of(q), "exact", wrong_chunk=True)
    report = hils.verify(case_spec("naive_bsa", "longer_blocks"), q, k, v,
                         {"o": o, "lse": lse, "selection": sel})
    assert not report.selection.passed and not report.passed
    assert report.selection.worst_margin > report.selection.bound
    assert any(f"selection row t={c['T'] - 1}, group" in p for p in report.selection.problems)


def test_nan_and_wrong_shape_outputs_fail_without_raising():
    q, k, v = case_inputs("gqa_group4")
    o, lse = dense_attention(q, k, v, scale_of(q))
    o[1, 5, 2] = np.nan
    report = hils.verify(case_spec("full", "gqa_group4"), q, k, v, {"o": o, "lse": lse[:, :-1]})
    assert not report.tensors["o"].passed and not report.tensors["lse"].passed
    assert "o contains NaN at h=1 t=5 col=2" in str(report)


def test_empty_outputs_fail():
    q, k, v = case_inputs("gqa_group4")
    report = hils.verify(case_spec("full", "gqa_group4"), q, k, v, {})
    assert not report.passed and "nothing to compare" in str(report)


def test_bf16_rounding_declared_to_nearest_catches_a_small_logit_scale():
    # A bf16-score hils kernel that keeps lse in fp32 computed with sigma 0.2% too small: the
    # shift a truncating kernel's roundings make points the same way, so with nothing stored in
    # bf16 to read the conversions from ("detect") it is accepted; declared to nearest, the
    # logit-scale statistic fails it (data/verify_format.md "Statistics over all rows").
    q, k, v = (round_to_bf16(x) for x in case_inputs("gqa_group4"))
    spec = case_spec("hils", "gqa_group4")
    run = hils.reference(dict(spec, scale=0.998 / np.sqrt(q.shape[2])), q, k, v)
    out = {"o": run["o"], "lse": run["lse"], "selection": run["selection"]}

    def judged(rounding):
        return hils.verify(spec, q, k, v, out, input_precision="bf16", score_precision="bf16",
                           bf16_rounding=rounding)

    assert judged("detect").passed and judged("toward_zero").passed
    assert "conversions either (no bf16-stored lse or o" in str(judged("detect"))
    nearest = judged("nearest")
    assert not nearest.passed
    assert "lse: logit scale statistic" in str(nearest) and "to nearest (declared)" in str(nearest)
    correct = hils.reference(spec, q, k, v)
    assert hils.verify(spec, q, k, v, {"o": correct["o"], "lse": correct["lse"],
                                       "selection": correct["selection"]},
                       input_precision="bf16", score_precision="bf16", bf16_rounding="nearest").passed


def test_one_verifier_judges_kernel_after_kernel_as_verify_does():
    # One hils.Verifier (the reference runs once) for a correct kernel, one with a wrong chunk
    # (its selection differs, so the oracle fuses those rows again), one that drops a chunk, and
    # the correct one again: each report is hils.verify's, text for text.
    q, k, v = case_inputs("longer_blocks")
    c = CASES["longer_blocks"]
    spec = case_spec("naive_bsa", "longer_blocks")
    kernels = {name: block_sparse(q, k, v, c["S"], c["W"], c["K"], scale_of(q), "exact", **faults)
               for name, faults in [("correct", {}), ("wrong chunk", {"wrong_chunk": True}),
                                    ("dropped chunk", {"drop_chunk": True})]}
    oracle = hils.Verifier(spec, q, k, v)
    for name in ["correct", "wrong chunk", "dropped chunk", "correct"]:
        o, lse, sel = kernels[name]
        outputs = {"o": o, "lse": lse, "selection": sel}
        report = oracle.verify(outputs, kernel=name)
        assert report.passed == (name == "correct"), str(report)
        assert report.kernel == name
        assert str(report) == str(hils.verify(spec, q, k, v, outputs, kernel=name))
    with pytest.raises(TypeError, match="outputs: expected a dict of arrays"):
        oracle.verify([o, lse])


def test_the_verifier_splits_verify_arguments_as_its_docstring_says():
    # hils.Verifier's docstring said "hils.Verifier(spec, q, k, v, **options).verify(outputs)
    # is hils.verify(spec, q, k, v, outputs, **options)": options such as lse_layout= or
    # kernel= are .verify's, and the constructor refused them. Its docstring lists the split;
    # here the split covers hils.verify's parameters, each once, with its default.
    def parameters(function):
        return {name: p.default for name, p in inspect.signature(function).parameters.items()
                if name != "self"}
    problem, judging = parameters(hils.Verifier.__init__), parameters(hils.Verifier.verify)
    assert not set(problem) & set(judging)
    assert {**problem, **judging} == parameters(hils.verify)
    for name in (set(problem) | set(judging)) - {"spec", "q", "k", "v", "outputs"}:
        assert name in hils.Verifier.__doc__, name

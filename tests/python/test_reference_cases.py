"""hils.reference returns the C++ reference's numbers bit for bit: python_case_reference (a C++
helper built with the tests) writes a case's inputs and run_mechanism<double>'s outputs to HDF5;
the same inputs and spec go through hils.reference and every array must be identical
(np.testing.assert_array_equal: same values, -inf where -inf, same shapes)."""

import json
import subprocess

import numpy as np
import pytest

import hils
from conftest import tool

h5py = pytest.importorskip("h5py")

# (case of tests/cases, preset): every fusion, key rule and prior rule, GQA, K = 0, a ragged
# tail, a single slot.
PAIRS = [
    ("gqa_group4", "hils"),
    ("ragged_tail", "lmk"),
    ("ragged_tail_no_landmarks", "hils"),   # no landmarks: the shared prior
    ("peaked_attention", "nsa"),
    ("k_covers_all", "naive_bsa"),
    ("window_one", "swa"),
    ("shorter_than_chunk", "full"),
    ("k_zero", "hils"),
    ("single_slot", "hils"),
]


@pytest.mark.parametrize("case,preset", PAIRS, ids=[f"{c}-{p}" for c, p in PAIRS])
def test_reference_matches_cpp_bit_for_bit(tmp_path, case, preset):
    path = tmp_path / "reference.h5"
    subprocess.run([tool("HILS_CASE_REFERENCE"), str(path), case, preset], check=True)
    with h5py.File(path, "r") as f:
        spec = json.loads(f.attrs["spec"])
        inputs = {name: f["inputs/" + name][()] for name in f["inputs"]}
        expected = {name: f["reference/" + name][()] for name in f["reference"]}
    got = hils.reference(spec, inputs["q"], inputs["k"], inputs["v"],
                         q_retrieval=inputs["q_retrieval"], prior=inputs["prior"])
    assert set(got) == set(expected)
    for name, array in expected.items():
        assert got[name].dtype == (np.int64 if name == "selection" else np.float64), name
        np.testing.assert_array_equal(got[name], array, err_msg=name)


def test_reference_on_sampled_queries_equals_the_full_rows(tmp_path):
    # Sampled queries are blocked differently from all T, so the sums run in another order:
    # equal to a few units of double rounding, the selection exactly.
    path = tmp_path / "reference.h5"
    subprocess.run([tool("HILS_CASE_REFERENCE"), str(path), "gqa_group4", "hils"], check=True)
    with h5py.File(path, "r") as f:
        spec = json.loads(f.attrs["spec"])
        q, k, v, q_retrieval = (f["inputs/" + name][()] for name in ("q", "k", "v", "q_retrieval"))
        full = {name: f["reference/" + name][()] for name in ("o", "lse", "selection")}
    rows = np.array([3, 64, 130])
    got = hils.reference(spec, q, k, v, q_retrieval=q_retrieval, queries=rows)
    np.testing.assert_allclose(got["o"], full["o"][:, rows], rtol=0, atol=1e-14)
    np.testing.assert_allclose(got["lse"], full["lse"][:, rows], rtol=1e-14, atol=0)
    np.testing.assert_array_equal(got["selection"], full["selection"][:, rows])

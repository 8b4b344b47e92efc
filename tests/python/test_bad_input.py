"""Bad input to hils.verify and hils.reference raises TypeError (wrong type or dtype) or
ValueError (wrong shape, NaN/Inf input, unknown key, value out of range) naming the argument;
nothing crashes the interpreter. Odd but valid layouts (non-contiguous, Fortran order, float16,
float64, nested lists) give the same verdict as the plain float32 array."""

import os
import shutil
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

import hils
from conftest import case_inputs, case_spec
from numpy_kernels import dense_attention

SPEC = case_spec("full", "gqa_group4")


@pytest.fixture(scope="module")
def good():
    q, k, v = case_inputs("gqa_group4")
    o, lse = dense_attention(q, k, v, 1.0 / np.sqrt(q.shape[2]))
    return q, k, v, {"o": o, "lse": lse}


def check(error, call, *words):
    with pytest.raises(error) as raised:
        call()
    for word in words:
        assert word in str(raised.value), (word, str(raised.value))


def test_wrong_shapes(good):
    q, k, v, out = good
    check(ValueError, lambda: hils.verify(SPEC, q[0], k, v, out),
          "q: expected rank 3 shape [*, *, *] (heads, rows, columns), found rank 2 shape [131, 16]")
    check(ValueError, lambda: hils.verify(SPEC, q, k[:, :-1], v, out),
          "k: expected rank 3 shape [*, 131, 16]", "found rank 3 shape [2, 130, 16]")
    check(ValueError, lambda: hils.verify(SPEC, q, k, v[:1], out), "v: expected rank 3 shape [2, 131, *]")
    check(ValueError, lambda: hils.verify(SPEC, q[:3], k, v, out), "Hq", "a multiple of Hkv = 2")
    check(ValueError, lambda: hils.verify(SPEC, q, k, v, {"o": out["o"][0]}),
          'outputs["o"]: expected rank 3')
    check(ValueError, lambda: hils.verify(SPEC, q, k, v, out, q_retrieval=q[:, :5]), "q_retrieval")


def test_zero_sizes(good):
    q, k, v, out = good
    check(ValueError, lambda: hils.verify(SPEC, q[:0], k, v, out), "q", "at least one query head")
    check(ValueError, lambda: hils.verify(SPEC, q[:, :0], k[:, :0], v[:, :0], out), "q[0]", "at least 1 slot")
    check(ValueError, lambda: hils.reference(SPEC, q[:, :, :0], k[:, :, :0], v), "q[0]", "at least 1 slot and 1 dim")
    report = hils.verify(SPEC, q, k, v, {"o": out["o"][:, :0], "lse": out["lse"]})
    assert not report.tensors["o"].passed and report.tensors["lse"].passed


def test_wrong_dtypes(good):
    q, k, v, out = good
    check(TypeError, lambda: hils.verify(SPEC, q.astype(np.int32), k, v, out),
          "q: expected float data", "found int32 data")
    check(TypeError, lambda: hils.verify(SPEC, q, k.astype(np.complex64), v, out), "k: expected float data")
    check(TypeError, lambda: hils.verify(SPEC, q, k, v, {"o": out["o"] > 0}), 'outputs["o"]', "bool")
    sel = np.zeros((2, 131, 4), dtype=np.float32)
    check(TypeError, lambda: hils.verify(case_spec("naive_bsa", "gqa_group4"), q, k, v, {"selection": sel}),
          'outputs["selection"]: expected integer data')
    check(TypeError, lambda: hils.verify(SPEC, "q", k, v, out), "q: expected float data")
    check(TypeError, lambda: hils.verify(SPEC, [[1.0], [2.0, 3.0]], k, v, out), "q: expected an array")
    check(TypeError, lambda: hils.verify(SPEC, q, k, v, [out["o"]]), "outputs: expected a dict")
    check(TypeError, lambda: hils.verify(SPEC, q, k, v, out, input_precision=16), "input_precision")
    check(TypeError, lambda: hils.verify(SPEC, q, k, v, out, queries=[0.5, 1.0]), "queries: expected integer data")


def test_non_finite_inputs(good):
    q, k, v, out = good
    bad = q.copy()
    bad[0, 3, 1] = np.nan
    check(ValueError, lambda: hils.verify(SPEC, bad, k, v, out), "q: expected finite values, found nan at [0, 3, 1] (flat index 49)")
    bad = v.copy()
    bad[1, 0, 0] = -np.inf
    check(ValueError, lambda: hils.reference(SPEC, q, k, bad), "v: expected finite values, found -inf")


def test_inputs_beyond_float_range(good):
    # Finite in float64 but Inf once rounded to the kernel's fp32: refused, naming the element.
    q, k, v, out = good
    big = q.astype(np.float64)
    big[1, 7, 3] = -4e200
    check(ValueError, lambda: hils.verify(SPEC, big, k, v, out),
          "q[1](7, 3): expected a value within float's range", "got -4e+200")
    huge = v.astype(np.float64)
    huge[0, 2, 5] = 1.7e308
    check(ValueError, lambda: hils.verify(SPEC, q, k, huge, out), "v[0](2, 5)", "got 1.7e+308")


def test_spec_errors(good):
    q, k, v, out = good
    check(ValueError, lambda: hils.verify({"preset": "full", "KK": 4}, q, k, v, out), "spec", "KK")
    check(ValueError, lambda: hils.verify({"preset": "hilz"}, q, k, v, out), "preset", "hilz")
    check(ValueError, lambda: hils.verify({"preset": "full", "S": "eight"}, q, k, v, out), "spec", "S")
    check(ValueError, lambda: hils.verify({"preset": "full", "W": 0}, q, k, v, out), "W")
    check(ValueError, lambda: hils.verify({"preset": "full", "scale": float("nan")}, q, k, v, out), "spec")
    check(TypeError, lambda: hils.verify("full", q, k, v, out), "spec: expected a dict")
    check(TypeError, lambda: hils.verify({"preset": "full", "S": object()}, q, k, v, out), "spec")
    # Was "spec.spec.preset: expected a string, got null null".
    with pytest.raises(ValueError) as raised:
        hils.verify({"preset": None}, q, k, v, out)
    assert str(raised.value) == "spec.preset: expected a string, got null"
    # A K whose outputs cannot fit names the spec's K, not the C++ option struct.
    with pytest.raises(ValueError) as raised:
        hils.reference(case_spec("naive_bsa", "gqa_group4") | {"K": 10**12}, q, k, v)
    assert "spec.K" in str(raised.value) and "RunOptions" not in str(raised.value), str(raised.value)
    # numpy scalars are fine in a spec.
    assert hils.verify({"preset": "full", "S": np.int64(8), "W": np.int32(16), "K": 4}, q, k, v, out).passed


def test_other_argument_errors(good):
    q, k, v, out = good
    check(ValueError, lambda: hils.verify(SPEC, q, k, v, {"O": out["o"]}), "outputs: unknown key 'O'")
    check(ValueError, lambda: hils.verify(SPEC, q, k, v, out, input_precision="fp64"),
          'input_precision: expected "fp32", "bf16" or "fp16", got "fp64"')
    check(ValueError, lambda: hils.verify(SPEC, q, k, v, out, score_precision="fp16"),
          'score_precision: expected "fp32", "bf16", "fp8_e4m3"')
    # The same message as `hils verify` gives for the file's bf16_rounding attribute.
    check(ValueError, lambda: hils.verify(SPEC, q, k, v, out, bf16_rounding="up"),
          'bf16_rounding: expected "detect", "any", "nearest" or "toward_zero", got "up"')
    check(TypeError, lambda: hils.verify(SPEC, q, k, v, out, bf16_rounding=None), "bf16_rounding")
    check(ValueError, lambda: hils.verify(SPEC, q, k, v, out, queries=[5, 3]), "queries[1]", "strictly ascending")
    check(ValueError, lambda: hils.verify(SPEC, q, k, v, out, queries=[0, 131]), "queries[1]")
    check(ValueError, lambda: hils.verify(SPEC, q, k, v, out, max_messages=0), "max_messages")
    check(ValueError, lambda: hils.verify(SPEC, q, k, v, out, queries=[]), "queries: expected at least one query slot")
    check(ValueError, lambda: hils.reference(SPEC, q, k, v, queries=np.zeros(0, np.int64)), "queries: expected at least one")
    sel = np.full((2, 131, 4), -5)
    check(ValueError, lambda: hils.verify(case_spec("naive_bsa", "gqa_group4"), q, k, v, {"selection": sel}),
          'outputs["selection"]: expected chunk indices from -1 (padding) to 2147483647 (int32), found -5')
    # uint64 values beyond int64 were wrapped by numpy's cast ("got -1"); a huge max_messages
    # (meaning all) was pybind11's "incompatible function arguments".
    check(ValueError, lambda: hils.verify(SPEC, q, k, v, out, queries=np.array([2**64 - 1], np.uint64)),
          "queries: expected values within int64's range, found 18446744073709551615")
    check(ValueError, lambda: hils.verify(case_spec("naive_bsa", "gqa_group4"), q, k, v,
                                          {"selection": np.full((2, 131, 4), 2**63, np.uint64)}),
          'outputs["selection"]: expected values within int64\'s range, found 9223372036854775808')
    assert hils.verify(SPEC, q, k, v, out, max_messages=2**70).passed


def test_a_bad_output_is_reported_before_the_reference_runs(good):
    # hils.verify checks the kernel's arrays before it builds the reference: with inputs that
    # the reference would refuse (a NaN in q), the output's own error is the one raised. It was
    # the other way round, so that a typo in an output's name surfaced only after a long reference.
    q, k, v, out = good
    q_nan = q.copy()
    q_nan[0, 0, 0] = np.nan
    check(ValueError, lambda: hils.verify(SPEC, q_nan, k, v, {"O": out["o"]}), "outputs: unknown key 'O'")
    check(TypeError, lambda: hils.verify(SPEC, q_nan, k, v, {"o": out["o"].astype(np.complex64)}),
          'outputs["o"]: expected float data')
    check(ValueError, lambda: hils.verify(SPEC, q_nan, k, v, out, grads={"dx": out["o"]}), "grads: unknown key 'dx'")
    check(TypeError, lambda: hils.verify(SPEC, q_nan, k, v, out, kernel=3), "kernel")
    # With good outputs the same call names the input.
    check(ValueError, lambda: hils.verify(SPEC, q_nan, k, v, out), "q")


def test_a_prior_the_spec_does_not_read_is_named_as_not_compared(good):
    # It passed without a word: the kernel's author may think the prior was used.
    q, k, v, out = good
    prior = np.ones((q.shape[0], 1, q.shape[2]), np.float32)
    report = hils.verify(SPEC, q, k, v, out, prior=prior)
    assert report.passed
    assert report.not_compared == ["inputs/prior (the spec's prior rule landmark_query with key "
                                   "rule exact does not read it)"]


class MetaTensor:
    """Stands in for a torch tensor numpy cannot hold (sparse, meta device): torch raises
    its own RuntimeError or NotImplementedError on .numpy()."""
    __module__ = "torch"

    def detach(self):
        return self

    def is_floating_point(self):
        return True

    dtype = "torch.float32"

    def cpu(self):
        raise NotImplementedError("Could not run 'aten::_to_copy' with arguments from the 'Meta' backend")


def test_a_tensor_numpy_cannot_hold_is_a_type_error_naming_the_argument(good):
    q, k, v, out = good
    # Was torch's NotImplementedError, naming neither the argument nor what was expected.
    check(TypeError, lambda: hils.verify(SPEC, q, MetaTensor(), v, out),
          "k: expected a dense torch tensor of numbers", "Meta")


def test_an_array_too_large_for_memory_is_a_value_error_naming_it(good):
    q, k, v, out = good
    # A broadcast view of 2^40 slots takes no memory; its float64 copy (8 x 2^40 x 16 values,
    # 1024 TiB) cannot fit. Was numpy's MemoryError, swallowed into "q: expected values
    # convertible to float64, found an array that is not".
    assert q.shape == (8, 131, 16)
    huge = np.broadcast_to(q[:, :1], (8, 2**40, 16))
    check(ValueError, lambda: hils.reference(SPEC, huge, k, v),
          "q: expected an array whose float64 values fit in 80% of",
          "found shape [8, 1099511627776, 16], about 1.02e+03 TiB")
    # Integer arrays are copied to int64 alike. Were "expected values convertible to int64, found
    # an array that is not" (numpy's MemoryError swallowed), and minutes in the uint64 range
    # check's max() over the broadcast values.
    nsa = case_spec("naive_bsa", "gqa_group4")
    for dtype in (np.int32, np.uint64):
        selection = np.broadcast_to(np.zeros((), dtype), (2, 131, 2**40))
        check(ValueError, lambda: hils.verify(nsa, q, k, v, {"selection": selection}),
              'outputs["selection"]: expected an array whose int64 values fit in 80% of',
              "found shape [2, 131, 1099511627776], about 2.1e+03 TiB")
    check(ValueError, lambda: hils.verify(SPEC, q, k, v, out, queries=np.broadcast_to(np.int64(0), (2**40,))),
          "queries: expected an array whose int64 values fit in 80% of",
          "found shape [1099511627776], about 8 TiB")


class ExpandedBf16Tensor:
    """Stands in for torch.zeros((), dtype=torch.bfloat16).expand(8, 2**40, 16): 2^47 values
    held in one, which widening (.float()) would allocate: torch raises its allocator's
    RuntimeError (or, for a size that fits the machine's overcommit, takes the memory)."""
    __module__ = "torch"
    dtype = "torch.bfloat16"
    shape = (8, 2**40, 16)

    def detach(self):
        return self

    def is_floating_point(self):
        return True

    def cpu(self):
        return self

    def float(self):
        raise RuntimeError("DefaultCPUAllocator: can't allocate memory: you tried to allocate "
                           "562949953421312 bytes")


def test_a_bf16_tensor_too_large_for_memory_is_refused_before_it_is_widened(good):
    # Was the TypeError "k: expected a dense torch tensor of numbers, found ... (RuntimeError:
    # DefaultCPUAllocator: can't allocate memory ...)", after torch had tried to widen it.
    q, k, v, out = good
    check(ValueError, lambda: hils.verify(SPEC, q, ExpandedBf16Tensor(), v, out),
          "k: expected an array whose float64 values fit in 80% of",
          "found shape [8, 1099511627776, 16], about 1.02e+03 TiB")


def test_a_huge_expanded_torch_tensor_is_refused_naming_it(good):
    torch = pytest.importorskip("torch")
    q, k, v, out = good
    for dtype in (torch.bfloat16, torch.float16, torch.float32):
        huge = torch.zeros((), dtype=dtype).expand(8, 2**40, 16)
        check(ValueError, lambda: hils.reference(SPEC, huge, k, v),
              "q: expected an array whose float64 values fit in 80% of",
              "found shape [8, 1099511627776, 16], about 1.02e+03 TiB")


def test_a_module_built_for_another_python_is_named_at_first_use(tmp_path):
    # The package beside a _core built for another Python version: Python alone said "cannot
    # import name '_core' from partially initialized module 'hils'". `import hils` works (hils.gpu
    # needs no _core); the first call that needs _core raises the ImportError naming it.
    package = tmp_path / "hils"
    shutil.copytree(os.path.dirname(hils.__file__), package,
                    ignore=shutil.ignore_patterns("_core*", "libhils_gpu_c.so", "__pycache__"))
    (package / "_core.cpython-399-x86_64-linux-gnu.so").write_bytes(b"")
    call = "import hils\nprint('imported')\nhils.reference({'preset': 'full'}, [[[0.0]]], [[[0.0]]], [[[0.0]]])"
    result = subprocess.run([sys.executable, "-c", call], capture_output=True, text=True,
                            env={**os.environ, "PYTHONPATH": str(tmp_path)})
    assert result.stdout == "imported\n", result.stderr
    assert result.returncode != 0
    assert "hils: the compiled module hils._core in " + str(package) in result.stderr, result.stderr
    assert "found _core.cpython-399-x86_64-linux-gnu.so" in result.stderr, result.stderr
    assert sys.executable in result.stderr


def test_odd_layouts_give_the_same_verdict(good):
    q, k, v, out = good
    plain = str(hils.verify(SPEC, q, k, v, out))
    wide = np.zeros((q.shape[0], q.shape[1], 2 * q.shape[2]), dtype=np.float32)
    wide[:, :, ::2] = q                                   # a strided, non-contiguous view
    assert not wide[:, :, ::2].flags.c_contiguous
    assert str(hils.verify(SPEC, wide[:, :, ::2], k, v, out)) == plain
    assert str(hils.verify(SPEC, np.asfortranarray(q), k, v, out)) == plain
    assert str(hils.verify(SPEC, q.astype(np.float64), k.tolist(), v, out)) == plain
    half = hils.verify(SPEC, q.astype(np.float16), k, v, out)   # other inputs: o no longer matches
    assert not half.passed


def test_the_gil_is_released_while_computing():
    # While another thread runs the reference, this thread keeps running: its longest pause is
    # under half of the time the other thread's call took (with the GIL held it would be the
    # whole call). Measured against that same call, not a call alone, so that a loaded machine,
    # which slows both, does not fail the test (it did against a solo call: 0.246 s of pause
    # against a 0.233 s solo call, on 2 cores shared with other builds).
    rng = np.random.default_rng(9)
    q, k, v = (rng.standard_normal((2, 4096, 64)) for _ in range(3))
    worker = threading.Thread(target=hils.reference, args=({"preset": "full"}, q, k, v))
    start = last = time.perf_counter()
    longest = 0.0
    worker.start()  # the clock runs from before the start: the call may begin inside start()
    while worker.is_alive():
        now = time.perf_counter()
        longest, last = max(longest, now - last), now
    worker.join()
    duration = time.perf_counter() - start
    assert longest < 0.5 * duration, (longest, duration)

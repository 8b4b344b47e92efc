"""Shared helpers of the Python tests: the one case table (tests/cases/case_table.hpp, read
here so that Python draws its inputs from the same names, shapes and seeds), and the paths of
the C++ tools that ctest passes in the environment."""

import os
import pathlib
import re

import numpy as np
import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
CASE_TABLE = ROOT / "tests" / "cases" / "case_table.hpp"
_CASE_ROW = re.compile(
    r'Case\{"(\w+)",\s*(\d+),\s*(\d+),\s*(\d+),\s*(\d+),\s*(\d+),\s*(\d+),\s*(\d+),\s*(\d+),'
    r'\s*(true|false),\s*([0-9.]+)\}')
_FIELDS = ("T", "S", "W", "K", "Hq", "Hkv", "d", "dv")


def refused(call, message, error=ValueError):
    """call() raises `error` whose text is exactly `message` (the tests of the layouts, packed
    batches, chunked prefill and decode steps hold every refusal's words)."""
    with pytest.raises(error) as raised:
        call()
    assert str(raised.value) == message


def seed_of(name):
    """FNV-1a of the case name, as cases::seed_of."""
    value = 1469598103934665603
    for byte in name.encode():
        value = ((value ^ byte) * 1099511628211) % 2**64
    return value


def load_cases():
    """name -> {T, S, W, K, Hq, Hkv, d, dv, landmarks, gain} from the C++ case table."""
    cases = {}
    for row in _CASE_ROW.finditer(CASE_TABLE.read_text()):
        values = dict(zip(_FIELDS, map(int, row.groups()[1:9])))
        values.update(landmarks=row.group(10) == "true", gain=float(row.group(11)))
        cases[row.group(1)] = values
    assert len(cases) >= 10, f"could not read the case table {CASE_TABLE}"
    return cases


CASES = load_cases()

SPEC_HEADER = ROOT / "reference" / "include" / "hils" / "spec.hpp"


def load_table(name):
    """The first field of every row of the C++ table `name` (kPresets' preset names,
    kKeyRuleNames' key rule names, ...) in reference/include/hils/spec.hpp, in table order."""
    body = SPEC_HEADER.read_text().split(f" {name}{{{{")[1].split("}};")[0]
    names = re.findall(r'\{[^{}"]*?"(\w+)"', body)
    assert names and len(names) == body.count("{"), f"could not read {name} in {SPEC_HEADER}"
    return names


def case_inputs(name):
    """Gaussian float32 q (times the case's gain), k, v of a case, seeded by its name (numpy's
    generator, so not the C++ draws; the C++ draws come from python_case_reference)."""
    c = CASES[name]
    rng = np.random.default_rng(seed_of(name))
    q = (c["gain"] * rng.standard_normal((c["Hq"], c["T"], c["d"]))).astype(np.float32)
    k = rng.standard_normal((c["Hkv"], c["T"], c["d"])).astype(np.float32)
    v = rng.standard_normal((c["Hkv"], c["T"], c["dv"])).astype(np.float32)
    return q, k, v


def case_spec(preset, name):
    """A preset with the case's S, W, K (landmarks as the preset has them)."""
    c = CASES[name]
    return {"preset": preset, "S": c["S"], "W": c["W"], "K": c["K"]}


def tool(variable):
    """Path of a C++ tool that ctest passes in `variable`; skips when run outside ctest."""
    path = os.environ.get(variable)
    if not path:
        pytest.skip(f"{variable} is not set: run through ctest (the CMake build sets it)")
    return path


def window_left(t, window, chunk):
    """l(t) = max(0, floor((t - W + 1) / S) S), the chunk-aligned window's first slot (Eq. 1), for
    a torch tensor of slots t (the GPU tests' FlexAttention masks; numpy_kernels.window_left is
    the numpy form over all slots). Tensor methods, so that this file needs no torch."""
    return (t - window + 1).div(chunk, rounding_mode="floor").mul(chunk).clamp(min=0)

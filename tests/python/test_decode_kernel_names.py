"""The decode benchmarks' kernel names come from the library (gpu/bench/decode_ctypes.py reads
hils_gpu_enum_names "decode_kernel" and "decode_kernel_removed"), and that list is what the
decode step does: every listed kept code passes the kernel check, every listed removed code is
refused naming it, every other code is refused as unknown. Needs only libhils_gpu_c.so, no GPU:
each call below fails before any CUDA call (a removed kernel in the kernel check, the others in
validate_decode on an empty problem)."""

import ctypes
import os
import sys

import pytest

from conftest import ROOT, tool

sys.path.insert(0, str(ROOT / "gpu" / "bench"))
import decode_ctypes as dc  # noqa: E402


@pytest.fixture(scope="module")
def lib():
    lib = ctypes.CDLL(tool("HILS_GPU_C_LIB"))
    lib.hils_gpu_decode_last_error.restype = ctypes.c_char_p
    dc.load_kernel_names(lib)
    return lib


def step_error(lib, code):
    """hils_gpu_decode_step's return code and error for kernel `code` on an empty problem."""
    problem, outputs = dc.Decode(), dc.DecodeOutputs()
    problem.kernel = code
    rc = lib.hils_gpu_decode_step(ctypes.byref(problem), ctypes.byref(outputs), None, None)
    return rc, lib.hils_gpu_decode_last_error().decode()


def test_the_listed_codes_are_the_step_kernels(lib):
    assert "fused" in dc.KERNELS and "d8" in dc.REMOVED_KERNELS
    assert not set(dc.KERNELS) & set(dc.REMOVED_KERNELS)
    for name, code in dc.REMOVED_KERNELS.items():
        rc, error = step_error(lib, code)
        assert rc == 2 and error.startswith(f"decode: kernel {code} ({name}) was removed in session 17"), error
        for kept_name, kept_code in dc.KERNELS.items():  # the step's own list of the kept ones
            assert f"{kept_code} ({kept_name}" in error, (kept_name, error)
    listed = set(dc.KERNELS.values()) | set(dc.REMOVED_KERNELS.values())
    for code in range(-1, max(listed) + 2):
        rc, error = step_error(lib, code)
        assert rc == 2, (code, error)
        if code in dc.KERNELS.values():  # past the kernel check: the empty problem is refused
            assert "kernel" not in error.split(":")[1], (code, error)
        elif code not in listed:
            assert error.startswith(f"decode: kernel = {code}, expected "), (code, error)


def test_the_bench_names_kernels_as_before(lib):
    # bench_decode.py's messages, word for word as when it kept its own table.
    kept = ", ".join(dc.KERNELS)
    assert kept == "fused, d5, d29, d34, d35, d36, d39, d40"
    with pytest.raises(SystemExit) as removed:
        dc.kernel_code("d25")
    assert str(removed.value) == (
        "decode kernel d25 (code 11) was removed in session 17 (gpu/NOTES.md \"Kernels removed in "
        f"session 17\"; its code is at commit 5a3f9d2); expected one of {kept}")
    with pytest.raises(SystemExit) as unknown:
        dc.kernel_code("d99")
    assert str(unknown.value) == f"unknown decode kernel 'd99' (expected one of {kept})"
    assert dc.kernel_code("d39") == 25 and dc.kernel_code("fused") == 0
    assert dc.variant("d36_int4") == ("d36_int4", "d36", "int4")
    for label in ("d37_fp8", "fused_fp16", "fused"):
        with pytest.raises(SystemExit):
            dc.variant(label)

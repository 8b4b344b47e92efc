"""The decode step's kernel names come from the library (hils.gpu reads hils_gpu_enum_names
"decode_kernel" and "decode_kernel_removed" into DECODE_KERNEL and REMOVED_KERNEL["decode_kernel"]),
and that list is what the decode step does: every listed kept code passes the kernel check, every
listed removed code is refused naming it, every other code is refused as unknown. Needs only
libhils_gpu_c.so, no GPU: each call below fails before any CUDA call (a removed kernel in the
kernel check, the others in validate_decode on an empty problem). The decode benchmark's labels
(gpu/bench/bench_decode.py) need torch: skipped without it."""

import ctypes
import sys

import pytest

import hils.gpu as hg
from conftest import ROOT, tool

KEPT, REMOVED = hg.DECODE_KERNEL, hg.REMOVED_KERNEL["decode_kernel"]


@pytest.fixture(scope="module")
def lib():
    return hg.Library(tool("HILS_GPU_LIB")).lib


def step_error(lib, code):
    """hils_gpu_decode_step's return code and error for kernel `code` on an empty problem."""
    problem, outputs = hg.Decode(), hg.DecodeOutputs()
    problem.kernel = code
    rc = lib.hils_gpu_decode_step(ctypes.byref(problem), ctypes.byref(outputs), None, None)
    return rc, lib.hils_gpu_decode_last_error().decode()


def test_the_listed_codes_are_the_step_kernels(lib):
    assert "fused" in KEPT and "d8" in REMOVED
    assert not set(KEPT) & set(REMOVED)
    for name, code in REMOVED.items():
        rc, error = step_error(lib, code)
        assert rc == 2 and error.startswith(f"decode: kernel {code} ({name}) was removed in session 17"), error
        for kept_name, kept_code in KEPT.items():  # the step's own list of the kept ones
            assert f"{kept_code} ({kept_name}" in error, (kept_name, error)
    listed = set(KEPT.values()) | set(REMOVED.values())
    for code in range(-1, max(listed) + 2):
        rc, error = step_error(lib, code)
        assert rc == 2, (code, error)
        if code in KEPT.values():  # past the kernel check: the empty problem is refused
            assert "kernel" not in error.split(":")[1], (code, error)
        elif code not in listed:
            assert error.startswith(f"decode: kernel = {code}, expected "), (code, error)


def test_the_kernels_are_named_as_before(lib):
    # The decode benchmarks' messages, word for word as when they kept their own table.
    kept = ", ".join(KEPT)
    assert kept == "fused, d5, d29, d34, d35, d36, d39, d40"
    with pytest.raises(ValueError) as removed:
        hg.kernel_code("decode_kernel", "d25")
    assert str(removed.value) == (
        "decode kernel d25 (code 11) was removed in session 17 (gpu/NOTES.md \"Kernels removed in "
        f"session 17\"; its code is at commit 5a3f9d2); expected one of {kept}")
    with pytest.raises(ValueError) as unknown:
        hg.kernel_code("decode_kernel", "d99")
    assert str(unknown.value) == f"unknown decode kernel 'd99' (expected one of {kept})"
    assert hg.kernel_code("decode_kernel", "d39") == 25 and hg.kernel_code("decode_kernel", "fused") == 0


def test_the_bench_labels(lib):
    pytest.importorskip("torch")
    sys.path.insert(0, str(ROOT / "gpu" / "bench"))
    import bench_decode
    assert bench_decode.variant("d36_int4") == ("d36_int4", "d36", "int4")
    with pytest.raises(SystemExit, match="decode kernel d25 .code 11. was removed in session 17"):
        bench_decode.kernel_code("d25")
    for label in ("d37_fp8", "fused_fp16", "fused"):
        with pytest.raises(SystemExit):
            bench_decode.variant(label)

"""hils.gpu (python/hils/gpu) where no GPU is needed: `import hils` imports neither torch nor
hils._core (the ImportError naming _core comes at first use), `import hils.gpu` works without
either; the library is found by path, HILS_GPU_LIB or the package folder, or refused naming all
three; spec and argument errors (forward's, DecodeCache's) name the argument before the library
is looked for (that the spec tables match the C++ ones runs without CUDA:
test_mechanism_table.py); the built libhils_gpu_c.so loads, lists its enums and
kernels, and its refusals come back as exceptions carrying hils_gpu_last_error()'s text; the package finds the library without
HILS_GPU_LIB: the build tree's link, or an installed package's own copy (each test skips, naming
why, where hils is the other kind). The kernels themselves:
test_gpu_forward.py and test_gpu_decode.py (label gpu). The C API's host checks that come before
any CUDA call (null outputs, workspace_bytes' shapes, the packed kernels' head limit, the decode
step's enums) and scripts/gpu_check.sh --help are checked here too."""

import ctypes
import os
import pathlib
import re
import shutil
import subprocess
import sys
import textwrap

import pytest

import hils
import hils.gpu
from conftest import ROOT, tool

SPEC = {"preset": "hils", "S": 64, "W": 512, "K": 32}


@pytest.fixture
def bare_package(tmp_path):
    """A copy of python/hils's sources alone (no _core, no library) and a torch stand-in that
    records its import, on PYTHONPATH, HILS_GPU_LIB unset: run(code) -> CompletedProcess."""
    shutil.copytree(ROOT / "python" / "hils", tmp_path / "hils",
                    ignore=shutil.ignore_patterns("_core*", "libhils_gpu_c.so", "__pycache__"))
    (tmp_path / "torch.py").write_text("imported = True\nclass Tensor:\n    pass\n")
    env = {key: value for key, value in os.environ.items() if key != "HILS_GPU_LIB"}
    env["PYTHONPATH"] = str(tmp_path)

    def run(code):
        return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True,
                              text=True, env=env, cwd=tmp_path)
    run.package = tmp_path / "hils"
    return run


def test_import_hils_needs_neither_torch_nor_core(bare_package):
    result = bare_package("""
        import sys
        import hils
        assert "torch" not in sys.modules and "hils._core" not in sys.modules
        import hils.gpu
        assert "torch" in sys.modules and "hils._core" not in sys.modules
        print("imported")
        hils.verify({"preset": "full"}, [[[0.0]]], [[[0.0]]], [[[0.0]]], {})
    """)
    assert "imported" in result.stdout, result.stderr
    assert result.returncode != 0  # verify needs _core: the ImportError comes at first use
    assert "ImportError: hils: the compiled module hils._core in " + str(bare_package.package) in result.stderr
    assert "found no _core file" in result.stderr and sys.executable in result.stderr


def test_the_report_classes_load_core_at_first_use(bare_package):
    result = bare_package("import hils\nhils.Report")
    assert result.returncode != 0
    assert "hils: the compiled module hils._core in " in result.stderr, result.stderr
    assert "AttributeError" in bare_package("import hils\nhils.no_such_name").stderr


def test_no_library_is_refused_naming_each_place_looked(bare_package):
    result = bare_package("import hils.gpu\nhils.gpu.find_library()")
    assert result.returncode != 0
    message = result.stderr.strip().splitlines()[-1]
    assert message.startswith("FileNotFoundError: hils.gpu: found no libhils_gpu_c.so"), message
    for words in ("no path was given", "HILS_GPU_LIB is not set",
                  f"none in the package folder ({bare_package.package}/libhils_gpu_c.so)",
                  "target hils_gpu_c: build/gpu/libhils_gpu_c.so",
                  "pip install . -C cmake.define.HILS_BUILD_GPU=ON"):
        assert words in message, (words, message)


def test_a_missing_path_or_variable_is_named(tmp_path):
    missing = str(tmp_path / "nowhere.so")
    with pytest.raises(FileNotFoundError, match=f"library path '{re.escape(missing)}': no such file"):
        hils.gpu.find_library(missing)
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("HILS_GPU_LIB", missing)
        with pytest.raises(FileNotFoundError, match=f"HILS_GPU_LIB='{re.escape(missing)}': no such file"):
            hils.gpu.find_library()
    not_a_library = tmp_path / "libhils_gpu_c.so"
    not_a_library.write_text("not a shared object")
    with pytest.raises(OSError, match="cannot load .* as the C API library libhils_gpu_c.so"):
        hils.gpu.Library(not_a_library)


def test_spec_and_argument_errors_come_before_the_library_is_looked_for(bare_package):
    # No library anywhere: each call must fail on its argument, not with FileNotFoundError.
    result = bare_package("""
        import numpy as np
        import hils.gpu
        def error(call):
            try:
                call()
            except Exception as e:
                return f"{type(e).__name__}: {e}"
        q = np.zeros((2, 8, 4), np.float32)
        print(error(lambda: hils.gpu.forward(q, q, q, {"preset": "hils", "window": 8})))
        print(error(lambda: hils.gpu.forward(q, q, q, {"preset": "hills"})))
        print(error(lambda: hils.gpu.forward(q, q, q, {"preset": "hils", "S": 64.0})))
        print(error(lambda: hils.gpu.forward(q, q, q, ["preset", "hils"])))
        print(error(lambda: hils.gpu.forward(q, q, q, {"preset": "hils"})))
    """)
    lines = result.stdout.splitlines()
    assert len(lines) == 5, result.stderr
    assert lines[0].startswith("ValueError: spec: unknown key 'window' (expected keys: preset, name,")
    presets = " | ".join(hils.gpu.PRESETS)
    assert lines[1] == f"ValueError: spec['preset']: expected one of {presets}, got 'hills'"
    assert lines[2] == "TypeError: spec['S']: expected an integer, found float 64.0"
    assert lines[3].startswith("TypeError: spec: expected a dict such as")
    assert lines[4].startswith("TypeError: q: expected a torch CUDA tensor (float32 or bfloat16) "
                               "[Hq, T, d] (layout \"hsd\"), found numpy.ndarray"), lines[4]


def test_spec_resolution():
    fields = hils.gpu.resolve_spec({"preset": "nsa", "K": 8, "group_rule": "mean"})
    assert fields["fusion"] == "flat" and fields["key_rule"] == "mean" and not fields["landmarks"]
    assert (fields["S"], fields["W"], fields["K"], fields["group_rule"]) == (64, 512, 8, "mean")
    assert hils.gpu.resolve_spec({})["key_rule"] == "taylor"  # MechanismSpec's defaults
    with pytest.raises(TypeError, match=r"spec\['landmarks'\]: expected true or false \(bool\), found int 1"):
        hils.gpu.resolve_spec({"landmarks": 1})
    with pytest.raises(TypeError, match=r"spec\['K'\]: expected an integer, found bool True"):
        hils.gpu.resolve_spec({"K": True})
    options = hils.gpu.verify_options(SPEC, [[[0.0] * 64]])  # not bf16: fp32 everywhere
    assert options == {"input_precision": "fp32", "score_precision": "fp32"}


@pytest.fixture(scope="module")
def lib():
    return hils.gpu.load_library(tool("HILS_GPU_LIB"))


def test_the_library_lists_its_enums_and_kernels(lib):
    assert hils.gpu.load_library(tool("HILS_GPU_LIB")) is lib  # loaded once per path
    assert hils.gpu.KEY == {"exact": 0, "mean": 1, "landmark_key": 2, "taylor": 3}
    assert list(hils.gpu.FUSION) == ["full", "window", "flat", "hierarchical"]
    assert {"two_pass_v22", "two_pass_v8"} <= set(hils.gpu.SELECT_KERNEL)
    assert "chunked_v36" in hils.gpu.SPARSE_KERNEL and "wgmma_v20" in hils.gpu.WINDOW_KERNEL
    assert "fused" in hils.gpu.DECODE_KERNEL
    assert hils.gpu.enum_values(hils.gpu.resolve_spec({"preset": "nsa"})) == {
        "key_rule": 1, "bias_rule": hils.gpu.BIAS["none"], "prior_rule": hils.gpu.PRIOR["landmark_query"],
        "group_rule": hils.gpu.GROUP["max_normalized"], "fusion": 2}
    with pytest.raises(ValueError, match=r"spec\['key_rule'\]: expected one of exact \| mean \| "
                                         r"landmark_key \| taylor, got 'taylr'"):
        hils.gpu.enum_values(hils.gpu.resolve_spec({"key_rule": "taylr"}))


def test_kernel_names_removed_and_unknown(lib):
    assert hils.gpu.kernel_code("select_kernel", "two_pass_v8") == 4
    with pytest.raises(ValueError, match=r"select_kernel: two_pass_v6 \(code 2\) was removed in session 17 "
                                         r"\(gpu/NOTES.md .*; expected one of two_pass_v4 \(0\)"):
        hils.gpu.kernel_code("select_kernel", "two_pass_v6")
    with pytest.raises(ValueError, match=r"window_kernel: expected one of mma_v9 \(1\), .*got 'v99'"):
        hils.gpu.kernel_code("window_kernel", "v99")


def test_the_library_refusals_carry_its_message(lib):
    # Return code 2 (bad input) -> GpuInvalidArgument, a ValueError, with hils_gpu_last_error().
    with pytest.raises(hils.gpu.GpuInvalidArgument) as refused:
        lib.call("hils_gpu_set_sparse_kernel", ctypes.c_int32(0))  # chunked_v4, removed
    assert isinstance(refused.value, ValueError) and refused.value.code == 2
    assert refused.value.function == "hils_gpu_set_sparse_kernel"
    assert "chunked_v4" in refused.value.message and "removed" in refused.value.message
    assert str(refused.value).startswith("hils_gpu_set_sparse_kernel: ")
    with pytest.raises(hils.gpu.GpuInvalidArgument, match=r"hils_gpu_set_sparse_segment_queries: queries: expected >= 0, got -1 \(return code 2\)"):
        lib.call("hils_gpu_set_sparse_segment_queries", ctypes.c_int64(-1))
    assert hils.gpu.sparse_kernel(lib) in hils.gpu.SPARSE_KERNEL  # nothing was changed


def build_tree_of_package():
    """The CMake build folder whose python/hils this hils was imported from
    (<build>/python/hils beside <build>/CMakeCache.txt), or None (an installed package)."""
    build = pathlib.Path(hils.__file__).resolve().parents[2]
    return build if (build / "CMakeCache.txt").is_file() else None


def found_without_variable():
    """hils.gpu.find_library() in a fresh interpreter with HILS_GPU_LIB unset."""
    env = {key: value for key, value in os.environ.items() if key != "HILS_GPU_LIB"}
    result = subprocess.run([sys.executable, "-c", "import hils.gpu; print(hils.gpu.find_library())"],
                            capture_output=True, text=True, env=env)
    assert result.returncode == 0, result.stderr
    return result.stdout.strip()


def test_the_build_tree_package_finds_its_library():
    # PYTHONPATH=build/python: the link that the build puts beside the package (gpu/CMakeLists.txt).
    if build_tree_of_package() is None:
        pytest.skip(f"hils is imported from {os.path.dirname(hils.__file__)}, not from a build tree "
                    f"(<build>/python/hils beside <build>/CMakeCache.txt): no build link to check")
    found = found_without_variable()
    assert found == hils.gpu.library.package_library()
    assert os.path.samefile(found, tool("HILS_GPU_LIB"))


def test_an_installed_package_finds_its_own_library():
    # pip install . -C cmake.define.HILS_BUILD_GPU=ON puts the library into the package folder.
    if build_tree_of_package() is not None:
        pytest.skip("hils is imported from a build tree: test_the_build_tree_package_finds_its_library checks it")
    inside = hils.gpu.library.package_library()
    if not os.path.isfile(inside):
        pytest.skip(f"hils is installed without its GPU library (no {inside}): built without "
                    f"-C cmake.define.HILS_BUILD_GPU=ON or without nvcc")
    assert found_without_variable() == inside
    assert b"fused=0" in hils.gpu.load_library(inside).lib.hils_gpu_enum_names(b"decode_kernel")


# ---- Host checks of the C API that run before any CUDA call (gpu/NOTES.md "Careless-user audit
# (session 21)"): each refusal is reached here without a GPU, over input addresses that are never
# read. Before session 21 these calls went on to launch (a null output faulted on the device and
# left a sticky error that poisoned the caller's context), crashed the process (S = 0, bytes
# NULL), or ran with a wrapped size or an out-of-range enum.
FAKE = ctypes.c_void_p(1 << 20)  # a device address that no refused call dereferences


def _problem(**fields):
    """hils_gpu_problem of the hils preset (T 2048, Hq 4, Hkv 2, d 64, bf16, S 64, W 256, K 8)."""
    p = hils.gpu.Problem()
    p.T, p.Hq, p.Hkv, p.d, p.dv, p.S, p.W, p.K = 2048, 4, 2, 64, 64, 64, 256, 8
    p.landmarks, p.bf16, p.softmax1, p.scale = 1, 1, 0, 0.0
    p.key_rule, p.bias_rule = hils.gpu.KEY["taylor"], hils.gpu.BIAS["entropy"]
    p.prior_rule, p.group_rule = hils.gpu.PRIOR["landmark_query"], hils.gpu.GROUP["max_normalized"]
    p.fusion = hils.gpu.FUSION["hierarchical"]
    p.q = p.k = p.v = FAKE.value
    for name, value in fields.items():
        setattr(p, name, value)
    return p


def _call(lib, name, *args):
    """(return code, hils_gpu_last_error()) of a raw C API call."""
    return getattr(lib.lib, name)(*args), lib.lib.hils_gpu_last_error().decode()


def test_a_null_output_is_refused_before_any_launch(lib):
    P, F, N = ctypes.byref(_problem()), FAKE, None
    exact = ctypes.byref(_problem(key_rule=hils.gpu.KEY["exact"], bias_rule=hils.gpu.BIAS["none"]))
    null = lambda name: (2, f"{name}: expected a device pointer, got null")  # noqa: E731
    assert _call(lib, "hils_gpu_window", P, N, F, N) == null("o_swa")
    assert _call(lib, "hils_gpu_window", P, F, N, N) == null("lse_swa")
    assert _call(lib, "hils_gpu_window_rows", P, F, ctypes.c_int32(0), N, N) == null("lse_swa")
    assert _call(lib, "hils_gpu_full", P, N, F, N) == null("o")
    assert _call(lib, "hils_gpu_full", P, F, N, N) == null("lse")
    assert _call(lib, "hils_gpu_exact", exact, N, N) == null("exact")
    assert _call(lib, "hils_gpu_summarize", P, N, F, N) == null("key")
    assert _call(lib, "hils_gpu_summarize", P, F, N, N) == null("bias")
    assert _call(lib, "hils_gpu_select", P, N, F, N, F, F, F, N) == null("key")
    assert _call(lib, "hils_gpu_select", P, F, F, N, N, F, F, N) == null("lse_swa")
    assert _call(lib, "hils_gpu_select", P, F, F, N, F, N, F, N) == null("selection")
    assert _call(lib, "hils_gpu_select", P, F, F, N, F, F, N, N) == null("selected_score")
    assert _call(lib, "hils_gpu_select_with", P, ctypes.c_int32(4), F, F, N, F, N, F, N) == null("selection")
    assert _call(lib, "hils_gpu_fuse", P, N, F, F, F, F, F, N) == null("selection")
    assert _call(lib, "hils_gpu_fuse", P, F, N, F, F, F, F, N) == null("selected_score")
    assert _call(lib, "hils_gpu_fuse", P, F, F, N, F, F, F, N) == null("o_swa")
    assert _call(lib, "hils_gpu_fuse", P, F, F, F, F, N, F, N) == null("o")
    assert _call(lib, "hils_gpu_fuse", P, F, F, F, F, F, N, N) == null("lse")
    i32 = ctypes.c_int32
    assert _call(lib, "hils_gpu_fuse_rows", P, F, F, F, i32(1), F, N, i32(2), F, N) == null("o")
    assert _call(lib, "hils_gpu_fuse_rows", P, F, F, F, i32(0), N, F, i32(0), F, N) == null("lse_swa")
    # The flat fusion reads neither the selected scores nor the window's rows: those may be null.
    flat = ctypes.byref(_problem(fusion=hils.gpu.FUSION["flat"]))
    assert _call(lib, "hils_gpu_fuse", flat, F, N, N, N, N, F, N) == null("o")


def test_workspace_bytes_checks_the_shape_and_its_pointer(lib):
    size = ctypes.c_size_t(7)
    assert _call(lib, "hils_gpu_workspace_bytes", ctypes.byref(_problem()), None) == (
        2, "bytes: expected a pointer, got null")
    refused = {
        "S: expected >= 2 with landmarks, got 0": dict(S=0),
        "T: expected >= 1, got -1000": dict(T=-1000),
        "K: expected >= 0, got -8": dict(K=-8),
        "scale: expected 0 (meaning 1/sqrt(d)) or a finite positive logit scale, got -1.000000": dict(scale=-1.0),
        "scale: expected 0 (meaning 1/sqrt(d)) or a finite positive logit scale, got nan": dict(scale=float("nan")),
        # 2^60 bytes of o: the product wrapped to 9.3e18 before
        "Hq * T * max(d, dv): expected at most 2^59 bytes, got Hq = 1048576, T = 1099511627776, max(d, dv) = 256":
            dict(T=2**40, Hq=2**20, Hkv=2**20, dv=256),
        "Hq * T * K: expected at most 2^59 bytes, got Hq = 4, T = 2048, K = 35184372088832":
            dict(K=2**45, fusion=hils.gpu.FUSION["window"]),
        "Hq * T * T/S: expected at most 2^59 bytes, got Hq = 65536, T = 1073741824, T/S = 16777216":
            dict(T=2**30, Hq=2**16, Hkv=2**16, key_rule=hils.gpu.KEY["exact"], bias_rule=hils.gpu.BIAS["none"]),
    }
    for message, fields in refused.items():
        assert _call(lib, "hils_gpu_workspace_bytes", ctypes.byref(_problem(**fields)), ctypes.byref(size)) == (
            2, message), fields
    assert size.value == 7  # nothing written on a refusal
    assert _call(lib, "hils_gpu_workspace_bytes", ctypes.byref(_problem()), ctypes.byref(size)) == (0, "")
    # o_swa, lse_swa, k', b', selection, selected scores (gpu/src/api.cpp workspace_bytes)
    Hq, T, nc, K = 4, 2048, 32, 8
    assert size.value == sum((n + 255) // 256 * 256 for n in (
        Hq * T * 64 * 4, Hq * T * 4, Hq * nc * 64 * 4, Hq * nc * 4, 2 * T * K * 4, Hq * T * K * 4))


def test_every_key_rule_runs_on_the_gpu_or_is_refused_by_name(lib):
    # A row of kKeyRuleNames that the summarize kernels have no branch for ran with unwritten
    # summaries before session 21; now the library refuses it naming the rules it implements
    # (gpu/src/key_rules.hpp; tests/gpu/test_gpu_host.cpp reaches the refusal with a value beyond
    # the table, which this C API refuses itself as out of range).
    size = ctypes.c_size_t()
    for name, value in hils.gpu.KEY.items():
        problem = ctypes.byref(_problem(key_rule=value))
        rc, message = _call(lib, "hils_gpu_workspace_bytes", problem, ctypes.byref(size))
        assert (rc, message) == (0, "") or (
            rc == 2 and message.startswith("key_rule: expected one that the GPU implements (")
            and message.endswith(f"), got {name}")), (name, rc, message)


def test_the_packed_kernels_refuse_more_kv_heads_than_their_grid_holds(lib):
    # Hkv = 70000 bf16 heads of d = 64 fit in a few GB; the packed kernels' grids hold 65535 in
    # their second dimension: the launch failed with "invalid argument" (code 3) before.
    p = ctypes.byref(_problem(T=128, Hq=70000, Hkv=70000))
    rc, message = _call(lib, "hils_gpu_window", p, FAKE, FAKE, None)
    assert (rc, message.split(" where")[0]) == (2, "Hkv: expected <= 65535")
    assert message.endswith("hils::gpu::set_packed_kernels(false) runs the SIMT kernels), got 70000")


def _decode(**fields):
    """hils_gpu_decode of the hils preset (B 2, T 1000, Hq 4, Hkv 2, d 64, S 64, W 256, K 4)."""
    p = hils.gpu.Decode()
    p.B, p.T, p.Hq, p.Hkv, p.d, p.dv, p.S, p.W, p.K = 2, 1000, 4, 2, 64, 64, 64, 256, 4
    p.landmarks, p.key_rule, p.bias_rule = 1, hils.gpu.KEY["taylor"], hils.gpu.BIAS["entropy"]
    p.group_rule, p.fusion = hils.gpu.GROUP["max_normalized"], hils.gpu.FUSION["hierarchical"]
    p.k = p.v = p.summary_key = p.summary_bias = p.summary_key_fp32 = p.q = FAKE.value
    for name, value in fields.items():
        setattr(p, name, value)
    return p


def test_the_decode_step_refuses_enum_values_out_of_range(lib):
    size = ctypes.c_size_t()
    def call(**fields):
        rc = lib.lib.hils_gpu_decode_workspace_bytes(ctypes.byref(_decode(**fields)), ctypes.byref(size))
        return rc, lib.lib.hils_gpu_decode_last_error().decode()
    assert call() == (0, "")
    # group_rule 7 ran as max_raw, key_rule and bias_rule 99 were accepted before session 21
    assert call(group_rule=7) == (2, "group_rule: expected one of 0 (max_normalized), 1 (sum_probabilities), "
                                     "2 (max_raw), got 7")
    assert call(group_rule=-1)[1].endswith("got -1")
    assert call(key_rule=99) == (2, "key_rule: expected one of 0 (exact), 1 (mean), 2 (landmark_key), "
                                    "3 (taylor), got 99")
    assert call(bias_rule=99) == (2, "bias_rule: expected one of 0 (none), 1 (entropy), got 99")
    assert call(fusion=9)[1].startswith("fusion: expected one of 0 (full)")


def test_stages_lets_the_library_judge_the_spec_before_allocating(lib):
    # S = 0 was a ZeroDivisionError in Stages (T // S) and K = 10^9 an out-of-memory error of
    # 15 TiB; the library names them before any buffer (torch is not needed to get there).
    with pytest.raises(hils.gpu.GpuInvalidArgument,
                       match=r"^hils_gpu_workspace_bytes: S: expected >= 2 with landmarks, got 0 \(return code 2\)$"):
        hils.gpu.Stages(lib, _problem(S=0))
    with pytest.raises(hils.gpu.GpuInvalidArgument, match=r"K: expected G\*d \+ G \+ 2K <= 3072"):
        hils.gpu.Stages(lib, _problem(K=10**9))


def test_gpu_check_prints_its_usage():
    # README sends users to scripts/gpu_check.sh and its --help; it was an unknown argument (exit 2).
    result = subprocess.run(["bash", str(ROOT / "scripts" / "gpu_check.sh"), "--help"], capture_output=True,
                            text=True)
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("Builds and runs every GPU test")
    assert "set -euo" not in result.stdout
    # --python proves what a GPU user installs: the wheel with the library, HILS_GPU_LIB unset
    python = result.stdout[result.stdout.index("--python:"):result.stdout.index("--quick:")]
    assert "cmake.define.HILS_BUILD_GPU=ON" in python and "HILS_GPU_LIB unset" in python, python
    wrong = subprocess.run(["bash", str(ROOT / "scripts" / "gpu_check.sh"), "--hepl"], capture_output=True, text=True)
    assert wrong.returncode == 2 and "or --help)" in wrong.stderr


def test_decode_cache_arguments_are_named_before_the_library_is_looked_for(bare_package):
    # No torch, no library: the spec, the store, the kernel and the capacity are named first,
    # then the prefix's tensors (hils.gpu.DecodeCache; the tensor checks on a GPU:
    # test_gpu_decode.py).
    result = bare_package("""
        import numpy as np
        import hils.gpu
        q = np.zeros((1, 2, 8, 4), np.float32)
        def error(spec={"preset": "hils"}, **options):
            arguments = dict(capacity=16)
            arguments.update(options)
            try:
                hils.gpu.DecodeCache(spec, q, q, q, **arguments)
            except Exception as e:
                return f"{type(e).__name__}: {e}"
        for spec in ({"preset": "full"}, {"preset": "naive_bsa"}, {"preset": "hils", "prior_rule": "shared"},
                     {"preset": "hils", "landmarks": False}, {"preset": "hils", "K": 8.0}):
            print(error(spec))
        print(error(summaries="fp16"))
        print(error(kernel="d99"))
        print(error(kernel="d39", summaries="int4h"))
        print(error(kernel=25))
        print(error(capacity=0))
        print(error(capacity=16.0))
        print(error({"preset": "nsa"}, summaries="int4", kernel="d5"))
    """)
    lines = result.stdout.splitlines()
    assert lines == [
        "ValueError: spec['fusion']: expected flat or hierarchical for the decode step (a mechanism "
        "that selects chunks, decode.hpp), got 'full'",
        "ValueError: spec['key_rule']: expected mean, landmark_key or taylor for the decode step (the "
        "cache keeps summaries; exact has none), got 'exact'",
        "ValueError: spec['prior_rule']: the decode cache summarizes each completed chunk with the "
        "query of its landmark slot (landmark_query); 'shared' priors are not supported",
        "ValueError: spec['landmarks']: expected true for prior_rule landmark_query (the prior is q~ "
        "at each chunk's landmark slot), got false",
        "TypeError: spec['K']: expected an integer, found float 8.0",
        "ValueError: summaries: expected one of bf16 | fp8 | int4 | int4h, got 'fp16'",
        "ValueError: kernel: unknown decode kernel 'd99' (expected one of fused, d5, d29, d34, d35, "
        "d36, d39, d40)",
        "ValueError: kernel: int4h summaries are scanned by d40 only (decode.hpp, "
        "SummaryType::int4_h), got 'd39'",
        "TypeError: kernel: expected a decode kernel's name (str), found int",
        "ValueError: capacity: expected an integer >= 1, got 0",
        "TypeError: capacity: expected an integer, found float 16.0",
        "TypeError: q: expected a torch CUDA tensor (bfloat16) [B, Hq, T, d] (layout \"bhsd\"), "
        "found numpy.ndarray",
    ], result.stderr


def test_the_decode_kernels_known_before_loading_are_the_librarys(lib, bare_package):
    # DecodeCache checks kernel names before any library is loaded: the table it starts with
    # must be the one the library lists (hils_gpu_enum_names "decode_kernel").
    before = bare_package("import hils.gpu\nprint(sorted(hils.gpu.DECODE_KERNEL.items()))")
    assert before.stdout.strip() == str(sorted(hils.gpu.DECODE_KERNEL.items())), before.stderr


# A torch stand-in whose tensors carry a shape, a dtype and a device, enough for every argument
# check of hils.gpu.forward and DecodeCache's prefix (no kernel, no isfinite): the layout checks
# (hils/gpu/batched.py over hils/layouts.py) run here without a GPU.
FAKE_TORCH = '''
class dtype:
    def __init__(self, name):
        self.name = name
    def __repr__(self):
        return "torch." + self.name
float32, bfloat16, float16, int32 = (dtype(n) for n in ("float32", "bfloat16", "float16", "int32"))
class device:
    def __init__(self, name):
        self.name = name
    def __eq__(self, other):
        return str(self) == str(other)
    def __str__(self):
        return self.name
class Tensor:
    def __init__(self, *shape, dtype=bfloat16, on="cuda:0"):
        self.shape, self.dtype, self.device = tuple(shape), dtype, device(on)
        self.ndim, self.is_cuda = len(shape), on.startswith("cuda")
    def dim(self):
        return self.ndim
    def transpose(self, a, b):
        shape = list(self.shape)
        shape[a], shape[b] = shape[b], shape[a]
        return Tensor(*shape, dtype=self.dtype, on=str(self.device))
def stack(tensors):
    return Tensor(len(tensors), *tensors[0].shape, dtype=tensors[0].dtype, on=str(tensors[0].device))
'''

# (call, the first words of its error): bshd is [B, T, H, d], bhsd [B, H, T, d]; B = 2, T = 16,
# Hq = 8, Hkv = 2, d = 4, dv = 6. Every call that passes the checks ends at the missing library
# (FileNotFoundError). A layout that reads q wrongly ("shd" given [Hq, T, d]) gets no hint of the
# other order: q's own shape cannot tell.
LAYOUT_CALLS = [
    ('forward(Q, K, V, layout="bthd")', "ValueError: layout: expected one of \"hsd\", \"shd\", "
     "\"bhsd\", \"bshd\" (batch, heads, sequence, dims: the order of a kernel's axes), found 'bthd'"),
    ('forward(Q, K, V, layout="bshd", lse_layout="hsd")', "ValueError: lse_layout: expected None or "
     "one of \"bhsd\", \"bshd\" (batched, as layout \"bshd\" is), found \"hsd\""),
    ('forward(T(16, 8, 4), K, V, layout="bshd")', "ValueError: q: expected 4 dimensions [B, T, Hq, d] "
     "(layout \"bshd\"), found shape (16, 8, 4)"),
    ('forward(Q, T(2, 2, 16, 4), V, layout="bshd")', "ValueError: k: layout \"bshd\" expects [B, T, Hkv, "
     "d] = [2, 16, *, 4] (q is [B, T, Hq, d] = [2, 16, 8, 4]), found shape [2, 2, 16, 4], which is "
     "[B, Hkv, T, d], the order of layout \"bhsd\""),
    ('forward(Q, K, T(2, 15, 2, 6), layout="bshd")', "ValueError: v: layout \"bshd\" expects [B, T, Hkv, "
     "dv] = [2, 16, 2, *] (q is [B, T, Hq, d] = [2, 16, 8, 4]; k is [B, T, Hkv, d] = [2, 16, 2, 4]), "
     "found shape [2, 15, 2, 6]"),
    ('forward(Q, T(3, 16, 2, 4), V, layout="bshd")', "ValueError: k: layout \"bshd\" expects [B, T, Hkv, "
     "d] = [2, 16, *, 4]"),
    ('forward(Q, K, V, layout="bshd", q_retrieval=T(2, 16, 8, 5))', "ValueError: q_retrieval: layout "
     "\"bshd\" expects [B, T, Hq, d] = [2, 16, 8, 4]"),
    ('forward(Q, K, V, layout="bshd", prior=T(2, 3, 4, 4))', "ValueError: prior: layout \"bshd\" expects "
     "[B, rows, Hq, d] = [2, *, 8, 4]"),
    ('forward(T(0, 16, 8, 4), T(0, 16, 2, 4), T(0, 16, 2, 6), layout="bshd")', "ValueError: q: layout "
     "\"bshd\" expects [B, T, Hq, d] with at least one sequence, found B = 0"),
    ('forward(Q, T(2, 16, 3, 4), T(2, 16, 3, 6), layout="bshd")', "ValueError: k: expected a number of "
     "KV heads dividing q's 8 heads, found 3 (k is [B, T, Hkv, d] = [2, 16, 3, 4])"),
    ('forward(Q, T(2, 16, 2, 4, on="cuda:1"), V, layout="bshd")', "ValueError: k: expected the device of "
     "q (cuda:0), found cuda:1"),
    ('forward(Q, K, T(2, 16, 2, 6, dtype=torch.float32), layout="bshd")', "TypeError: v: expected the "
     "dtype of q (torch.bfloat16), found torch.float32"),
    ('forward(Q, K, T(2, 16, 2, 6, on="cpu"), layout="bshd")', "ValueError: v: expected a CUDA tensor, "
     "found one on cpu"),
    ('forward(Q.shape, K, V, layout="bshd")', "TypeError: q: expected a torch CUDA tensor (float32 or "
     "bfloat16) [B, T, Hq, d] (layout \"bshd\"), found builtins.tuple"),
    ('forward(T(2, 8, 16, 4), T(2, 2, 16, 4), T(2, 2, 16, 6), layout="bhsd", prior=T(2, 8, 3, 4))',
     "FileNotFoundError"),
    ('forward(Q, K, V, layout="bshd", lse_layout="bhsd", q_retrieval=Q)', "FileNotFoundError"),
    ('forward(T(16, 8, 4), T(16, 2, 4), T(16, 2, 6), layout="shd")', "FileNotFoundError"),
    ('forward(T(8, 16, 4), T(2, 16, 4), T(2, 16, 6))', "FileNotFoundError"),
    ('forward(T(8, 16, 4), T(2, 16, 4), T(2, 16, 6), layout="shd")', "ValueError: k: layout \"shd\" "
     "expects [T, Hkv, d] = [8, *, 4] (q is [T, Hq, d] = [8, 16, 4]), found shape [2, 16, 4]\n"),
    # packed (cu_seqlens=, hils.verify's packed layouts): sequences of 16 and 9 rows, total 25
    ('forward(T(25, 8, 4), T(25, 2, 4), T(25, 2, 6), layout="thd", cu_seqlens=[0, 16, 25])',
     "FileNotFoundError"),
    ('forward(T(8, 25, 4), T(2, 25, 4), T(2, 25, 6), layout="htd", lse_layout="thd", '
     'cu_seqlens=[0, 16, 25])', "FileNotFoundError"),
    ('forward(T(1, 25, 8, 4), T(1, 25, 2, 4), T(1, 25, 2, 6), layout="bshd", cu_seqlens=[0, 16, 25])',
     "FileNotFoundError"),
    ('forward(T(25, 8, 4), T(25, 2, 4), T(25, 2, 6), layout="thd")', "ValueError: cu_seqlens: layout "
     "\"thd\" packs the sequences along its rows: give cu_seqlens=[0, T_0, T_0 + T_1, ..., total] "
     "(int32 [B + 1])\n"),
    ('forward(T(8, 25, 4), T(2, 25, 4), T(2, 25, 6), cu_seqlens=[0, 16, 25])', "ValueError: layout: "
     "'hsd' is one sequence; with cu_seqlens (packed sequences) expected \"thd\""),
    ('forward(T(25, 8, 4), T(25, 2, 4), T(25, 2, 6), layout="thd", cu_seqlens=[0, 16, 24])',
     "ValueError: cu_seqlens: expected cu_seqlens[-1] = 25 (q's total rows), found 24\n"),
    ('forward(T(25, 8, 4), T(25, 2, 4), T(25, 2, 6), layout="thd", cu_seqlens=[0.0, 16.0, 25.0])',
     "TypeError: cu_seqlens: expected integers"),
    ('forward(T(25, 8, 4), T(24, 2, 4), T(25, 2, 6), layout="thd", cu_seqlens=[0, 16, 25])',
     "ValueError: k: layout \"thd\" expects [total, Hkv, d] = [25, *, 4] (total = cu_seqlens[-1] = "
     "25; q is [total, Hq, d] = [25, 8, 4]), found shape [24, 2, 4]\n"),
    ('forward(T(25, 8, 4), T(2, 25, 4), T(25, 2, 6), layout="thd", cu_seqlens=[0, 16, 25])',
     "ValueError: k: layout \"thd\" expects [total, Hkv, d] = [25, *, 4] (total = cu_seqlens[-1] = "
     "25; q is [total, Hq, d] = [25, 8, 4]), found shape [2, 25, 4], which is [Hkv, total, d], the "
     "order of layout \"htd\"\n"),
    ('forward(T(2, 25, 8, 4), T(2, 25, 2, 4), T(2, 25, 2, 6), layout="bshd", cu_seqlens=[0, 16, 25])',
     "ValueError: q: layout \"bshd\" expects [1, total, Hq, d] = [1, 25, *, *] (total = "
     "cu_seqlens[-1] = 25), found shape [2, 25, 8, 4]\n"),
    ('forward(T(25, 8, 4), T(25, 2, 4), T(25, 2, 6), layout="thd", cu_seqlens=[0, 16, 25], '
     'prior=T(3, 8, 4))', "ValueError: prior: has no packed form"),
    ('forward(T(25, 8, 4), T(25, 2, 4), T(25, 2, 6), layout="thd", cu_seqlens=[0, 16, 25], '
     'lse_layout="bhsd")', "ValueError: lse_layout: expected None or one of \"thd\", \"htd\" (packed, "
     "as layout \"thd\" with cu_seqlens is), found 'bhsd'\n"),
    ('forward((25, 8, 4), K, V, layout="thd", cu_seqlens=[0, 16, 25])', "TypeError: q: expected a "
     "torch CUDA tensor (float32 or bfloat16) [total, Hq, d] (layout \"thd\"), found builtins.tuple\n"),
    ('forward(T(25, 8, 4, on="cpu"), T(25, 2, 4), T(25, 2, 6), layout="thd", cu_seqlens=[0, 16, 25])',
     "ValueError: q: expected a CUDA tensor, found one on cpu"),
    # the decode cache's prefix: "bhsd" or "bshd"
    ('DecodeCache(Q, K, V, layout="bshd")', "FileNotFoundError"),
    ('DecodeCache(T(2, 8, 16, 4), T(2, 2, 16, 4), T(2, 2, 16, 6))', "FileNotFoundError"),
    ('DecodeCache([T(16, 8, 4)] * 2, [T(16, 2, 4)] * 2, [T(16, 2, 6)] * 2, layout="bshd")',
     "FileNotFoundError"),
    ('DecodeCache([T(16, 8, 4), T(15, 8, 4)], [T(16, 2, 4)] * 2, [T(16, 2, 6)] * 2, layout="bshd")',
     "ValueError: q: the sequences' prefixes have lengths [16, 15]"),
    ('DecodeCache([T(16, 8, 4), T(8, 16, 4)], [T(16, 2, 4)] * 2, [T(16, 2, 6)] * 2, layout="bshd")',
     "ValueError: q: the sequences' prefixes have lengths [16, 8]"),
    ('DecodeCache([T(8, 16, 4), T(8, 15, 4)], [T(2, 16, 4)] * 2, [T(2, 16, 6)] * 2)',
     "ValueError: q: the sequences' prefixes have lengths [16, 15]"),
    ('DecodeCache(T(16, 8, 4), T(16, 2, 4), T(16, 2, 6), layout="shd")', "ValueError: layout: expected "
     "\"bhsd\" (prefix [B, heads, T0, d]) or \"bshd\" ([B, T0, heads, d]): the cache holds a batch of "
     "sequences, found 'shd'"),
    ('DecodeCache(Q, T(2, 2, 16, 4), V, layout="bshd")', "ValueError: k: layout \"bshd\" expects [B, T, "
     "Hkv, d] = [2, 16, *, 4] (q is [B, T, Hq, d] = [2, 16, 8, 4]), found shape [2, 2, 16, 4], which is "
     "[B, Hkv, T, d], the order of layout \"bhsd\""),
    ('DecodeCache(Q, K, T(2, 16, 2, 6, dtype=torch.float32), layout="bshd")', "TypeError: v: expected "
     "dtype torch.bfloat16 (the decode step reads bf16 K/V and queries), found torch.float32"),
]


def test_layout_arguments_are_named_in_the_layout_before_the_library_is_looked_for(bare_package):
    (bare_package.package.parent / "torch.py").write_text(FAKE_TORCH)
    result = bare_package(textwrap.dedent("""
        import hils.gpu, torch
        T = torch.Tensor
        Q, K, V = T(2, 16, 8, 4), T(2, 16, 2, 4), T(2, 16, 2, 6)
        SPEC = {"preset": "hils", "S": 4, "W": 8, "K": 2}
        def forward(*args, **kwargs):
            return hils.gpu.forward(*args[:3], SPEC, *args[3:], check_finite=False, **kwargs)
        def DecodeCache(*args, **kwargs):
            return hils.gpu.DecodeCache(SPEC, *args, capacity=32, **kwargs)
        def error(call):
            try:
                call()
            except Exception as e:
                return f"{type(e).__name__}: {e}"
            return "no error"
    """) + "\n".join(f"print(error(lambda: {call}))" for call, _ in LAYOUT_CALLS))
    lines = result.stdout.splitlines()
    assert len(lines) == len(LAYOUT_CALLS), result.stderr
    for (call, words), line in zip(LAYOUT_CALLS, lines):  # words ending in a newline: the whole line
        assert line == words[:-1] if words.endswith("\n") else line.startswith(words), (call, line)

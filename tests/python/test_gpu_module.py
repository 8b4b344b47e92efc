"""hils.gpu (python/hils/gpu) where no GPU is needed: `import hils` imports neither torch nor
hils._core (the ImportError naming _core comes at first use), `import hils.gpu` works without
either; the library is found by path, HILS_GPU_LIB or the package folder, or refused naming all
three; spec and argument errors name the argument before the library is looked for; the spec
tables match the C++ ones (reference/include/hils/spec.hpp's kPresets and MechanismSpec,
spec_fields.hpp); the built libhils_gpu_c.so loads, lists its enums and kernels, and its refusals come
back as exceptions carrying hils_gpu_last_error()'s text. The kernels themselves:
test_gpu_forward.py (label gpu)."""

import ctypes
import os
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
    assert lines[4].startswith("TypeError: q: expected a torch CUDA tensor (float32 or bfloat16), "
                               "found numpy.ndarray"), lines[4]


def _cpp(path):
    return (ROOT / path).read_text()


def test_the_spec_tables_are_the_cpp_ones():
    fields = re.findall(r'SpecField<[\w:]+>\{"(\w+)"', _cpp("reference/include/hils/spec_fields.hpp"))
    assert hils.gpu.SPEC_KEYS == ("preset",) + tuple(fields)
    table = _cpp("reference/include/hils/spec.hpp").split("kPresets{{")[1].split("}};")[0]
    presets = re.findall(r'\{"(\w+)", Fusion::(\w+), KeyRule::(\w+), BiasRule::(\w+), (true|false)\}', table)
    assert len(presets) == table.count("{"), table  # every row read
    assert {name: (f, k, b, l == "true") for name, f, k, b, l in presets} == hils.gpu.PRESETS
    struct = _cpp("reference/include/hils/spec.hpp").split("struct MechanismSpec {")[1].split("};")[0]
    for key, value in hils.gpu.spec.DEFAULTS.items():
        text = ("true" if value else "false") if isinstance(value, bool) else value
        assert re.search(rf"\b{key} = (\w+::)?\"?{re.escape(str(text))}\b", struct), key


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


def test_the_build_tree_package_finds_its_library():
    # PYTHONPATH=build/python: the link that the build puts beside the package (CMakeLists.txt).
    env = {key: value for key, value in os.environ.items() if key != "HILS_GPU_LIB"}
    result = subprocess.run([sys.executable, "-c", "import hils.gpu; print(hils.gpu.find_library())"],
                            capture_output=True, text=True, env=env)
    assert result.returncode == 0, result.stderr
    found = result.stdout.strip()
    assert found == hils.gpu.library.package_library()
    assert os.path.samefile(found, tool("HILS_GPU_LIB"))

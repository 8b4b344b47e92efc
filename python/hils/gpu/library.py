"""libhils_gpu_c.so through ctypes, without torch: finding and loading the library, its C structs
(gpu/include/hils/gpu/c_api.h, decode_c_api.h), the integer values of the spec enums and the
kernels' codes by name, read from the library itself (hils_gpu_enum_names), and its return codes
turned into exceptions carrying hils_gpu_last_error()'s text. hils.gpu (the tensors) builds on it;
tests/python/test_gpu_module.py checks it on a machine without a GPU."""

import ctypes
import os

# Where find_library looks after an explicit path: this variable, then the package folder.
ENV_VAR = "HILS_GPU_LIB"
LIBRARY_NAME = "libhils_gpu_c.so"

# Integer values of the hils:: enums, name -> int, filled from the library's own field table
# (hils_gpu_enum_names, reference/include/hils/spec.hpp) when the first Library is loaded.
KEY, BIAS, PRIOR, GROUP, FUSION = {}, {}, {}, {}, {}
ENUMS = {"key_rule": KEY, "bias_rule": BIAS, "prior_rule": PRIOR, "group_rule": GROUP, "fusion": FUSION}
# The kernel codes of hils_gpu_select_with, hils_gpu_set_sparse_kernel and
# hils_gpu_set_window_kernel, name -> code (the values of hils::gpu::SelectKernel, SparseKernel and
# WindowKernel: stable, not consecutive). Filled from the library's own tables (hils_gpu_enum_names
# "select_kernel", ...: name=code pairs) when the first Library is loaded; these are the kept
# kernels as c_api.h lists them, for argument parsers that run before a library is loaded.
SELECT_KERNEL = {"two_pass_v4": 0, "one_pass_v5": 1, "two_pass_v8": 4, "two_pass_v15": 11,
                 "two_pass_v21": 17, "two_pass_v22": 18, "two_pass_v25": 19, "two_pass_v26": 20,
                 "two_pass_v27": 21}
SPARSE_KERNEL = {"chunked_v21": 17, "chunked_v30": 26, "chunked_v35": 29, "chunked_v36": 30}
WINDOW_KERNEL = {"mma_v9": 1, "wgmma_v18": 10, "wgmma_v19": 11, "wgmma_v20": 12}
# hils::gpu::DecodeKernel (hils_gpu_decode::kernel), name -> code, from hils_gpu_enum_names
# "decode_kernel" when the first Library is loaded; until then the kept kernels as decode.hpp
# lists them (kDecodeKernels), for the argument checks that run before a library is loaded
# (hils.gpu.DecodeCache).
DECODE_KERNEL = {"fused": 0, "d5": 1, "d29": 15, "d34": 20, "d35": 21, "d36": 22, "d39": 25, "d40": 26}
KERNELS = {"select_kernel": SELECT_KERNEL, "sparse_kernel": SPARSE_KERNEL,
           "window_kernel": WINDOW_KERNEL, "decode_kernel": DECODE_KERNEL}
# The codes of the kernels removed in session 17 (gpu/NOTES.md "Kernels removed in session 17"),
# name -> code, from hils_gpu_enum_names "<field>_removed".
REMOVED_KERNEL = {field: {} for field in KERNELS}
# Where the removed kernels' code is (gpu/NOTES.md "Kernels removed in session 17").
_REMOVED_AT = {"select_kernel": "ad5fb84", "sparse_kernel": "ad5fb84", "window_kernel": "ad5fb84",
               "decode_kernel": "5a3f9d2"}
# The selection kernels that are not bit-identical to v8 by construction: v21 and v22 sum their
# selected scores from the bf16 k' (gpu/NOTES.md v20, v21), v25 ranks otherwise rounded group
# scores (gpu/NOTES.md v25), v27 (the default) sums an fp16 copy of k': the oracle judges them, not
# a byte compare. v26 sums the fp32 k' as v8 does.
APPROXIMATE_SELECT_KERNELS = ("two_pass_v21", "two_pass_v22", "two_pass_v25", "two_pass_v27")
# hils::gpu::SummaryType (hils_gpu_decode::summary_type) by label (int4h: SummaryType::int4_h,
# scanned by d40 only).
SUMMARY_TYPES = {"bf16": 0, "fp8": 1, "int4": 2, "int4h": 3}
# hils_gpu_window_rows / hils_gpu_fuse_rows row types (hils::gpu::RowType) by torch dtype name.
ROW_TYPE = {"float32": 0, "float16": 1, "bfloat16": 2}


class Problem(ctypes.Structure):
    """hils_gpu_problem (c_api.h)."""
    _fields_ = [(n, ctypes.c_int64) for n in ("T", "Hq", "Hkv", "d", "dv", "S", "W", "K")] + [
        (n, ctypes.c_int32)
        for n in ("landmarks", "bf16", "key_rule", "bias_rule", "prior_rule", "group_rule",
                  "fusion", "softmax1")
    ] + [("scale", ctypes.c_double)] + [
        (n, ctypes.c_void_p) for n in ("q", "k", "v", "q_retrieval", "prior")
    ] + [("prior_rows", ctypes.c_int64)]


class Decode(ctypes.Structure):
    """hils_gpu_decode (decode_c_api.h): one decode step's shapes, spec fields and pointers."""
    _fields_ = [(n, ctypes.c_int64) for n in ("B", "T", "Hq", "Hkv", "d", "dv", "S", "W", "K")] + [
        (n, ctypes.c_int32)
        for n in ("landmarks", "key_rule", "bias_rule", "group_rule", "fusion", "softmax1")
    ] + [("scale", ctypes.c_double), ("slot_capacity", ctypes.c_int64),
         ("chunk_capacity", ctypes.c_int64)] + [
        (n, ctypes.c_void_p) for n in ("k", "v", "summary_key", "summary_bias", "q", "q_retrieval")
    ] + [("summary_type", ctypes.c_int32), ("kernel", ctypes.c_int32),
         ("summary_scale", ctypes.c_void_p), ("summary_key_fp32", ctypes.c_void_p),
         ("summary_scale_bias", ctypes.c_void_p)]


class DecodeOutputs(ctypes.Structure):
    """hils_gpu_decode_outputs (decode_c_api.h); only o and lse are required."""
    _fields_ = [(n, ctypes.c_void_p) for n in ("o", "lse", "selection", "o_window", "lse_window",
                                               "surrogate", "fusion_weights")]


class GpuError(RuntimeError):
    """A C API call that returned non-zero: .function, .code (2 bad input, 3 CUDA or internal
    error, c_api.h) and .message (hils_gpu_last_error() or hils_gpu_decode_last_error())."""

    def __init__(self, function, code, message):
        super().__init__(f"{function}: {message} (return code {code})")
        self.function, self.code, self.message = function, code, message


class GpuInvalidArgument(GpuError, ValueError):
    """Return code 2: the library refused its arguments (a ValueError too)."""


def package_library():
    """The path a wheel built with HILS_BUILD_GPU=ON installs the library to (the hils folder)."""
    return os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), LIBRARY_NAME)


def find_library(path=None):
    """The library's path: `path` when given, else $HILS_GPU_LIB when set, else libhils_gpu_c.so
    in the hils package folder; FileNotFoundError saying where it looked and how to get one."""
    if path is not None:
        path = os.fspath(path)
        if not os.path.isfile(path):
            raise FileNotFoundError(f"hils.gpu: library path {path!r}: no such file (expected the "
                                    f"C API library {LIBRARY_NAME}, e.g. build/gpu/{LIBRARY_NAME})")
        return path
    from_env = os.environ.get(ENV_VAR)
    if from_env:
        if not os.path.isfile(from_env):
            raise FileNotFoundError(f"hils.gpu: {ENV_VAR}={from_env!r}: no such file (expected "
                                    f"the path of {LIBRARY_NAME}, e.g. build/gpu/{LIBRARY_NAME})")
        return from_env
    beside = package_library()
    if os.path.isfile(beside):
        return beside
    raise FileNotFoundError(
        f"hils.gpu: found no {LIBRARY_NAME} (the GPU kernels' C API): no path was given, {ENV_VAR} "
        f"is not set and there is none in the package folder ({beside}). Build it (CMake with "
        f"CUDA, target hils_gpu_c: build/gpu/{LIBRARY_NAME}; PYTHONPATH=build/python finds it "
        f"there) and pass its path or set {ENV_VAR}, or install the package with it: "
        f"pip install . -C cmake.define.HILS_BUILD_GPU=ON")


def _name_codes(text):
    """{name: code} of the library's "name=code name=code ..." (b"" or None: {})."""
    return {name: int(code) for name, code in (entry.split("=") for entry in (text or b"").decode().split())}


def _declare(lib):
    """Result and argument types of the entries whose defaults (int, int arguments) do not fit."""
    for entry in ("hils_gpu_last_error", "hils_gpu_decode_last_error"):
        getattr(lib, entry).restype = ctypes.c_char_p
    lib.hils_gpu_enum_names.restype = ctypes.c_char_p
    lib.hils_gpu_enum_names.argtypes = [ctypes.c_char_p]


class Library:
    """libhils_gpu_c.so loaded (find_library's search when `path` is None); loading it fills the
    module's enum and kernel tables from the library's own lists. call() runs an entry of
    c_api.h, decode_call() one of decode_c_api.h; a non-zero return raises GpuError (bad input:
    GpuInvalidArgument, a ValueError) with the library's message. .lib is the ctypes.CDLL."""

    def __init__(self, path=None):
        self.path = find_library(path)
        try:
            self.lib = ctypes.CDLL(self.path)
            _declare(self.lib)
        except (OSError, AttributeError) as error:
            raise OSError(f"hils.gpu: cannot load {self.path} as the C API library "
                          f"{LIBRARY_NAME}: {error}") from None
        self._read_tables()

    def _read_tables(self):
        for field, table in ENUMS.items():
            names = self.lib.hils_gpu_enum_names(field.encode()).decode().split()
            table.clear()
            table.update({name: value for value, name in enumerate(names)})
        for field, table in KERNELS.items():
            kept = self.lib.hils_gpu_enum_names(field.encode())
            if kept is None:
                raise OSError(f"hils.gpu: {self.path} does not list its {field}s (hils_gpu_enum_names "
                              f"\"{field}\", session 18 on): build it from this checkout")
            table.clear()
            table.update(_name_codes(kept))
            REMOVED_KERNEL[field].clear()
            REMOVED_KERNEL[field].update(_name_codes(self.lib.hils_gpu_enum_names(f"{field}_removed".encode())))

    def call(self, name, *args):
        """Runs c_api.h's `name`; raises GpuError with hils_gpu_last_error() on a non-zero return."""
        self._check(name, getattr(self.lib, name)(*args), self.lib.hils_gpu_last_error)

    def decode_call(self, name, *args):
        """Runs decode_c_api.h's `name`; errors as call() with hils_gpu_decode_last_error()."""
        self._check(name, getattr(self.lib, name)(*args), self.lib.hils_gpu_decode_last_error)

    @staticmethod
    def _check(name, rc, last_error):
        if rc != 0:
            error = GpuInvalidArgument if rc == 2 else GpuError
            raise error(name, rc, (last_error() or b"").decode())

    def __repr__(self):
        return f"hils.gpu.Library({self.path!r})"


_loaded = {}


def load_library(library=None):
    """A Library: `library` itself when it is one, else the one loaded from find_library(library)
    (loaded once per path, then reused)."""
    if isinstance(library, Library):
        return library
    path = os.path.realpath(find_library(library))
    if path not in _loaded:
        _loaded[path] = Library(path)
    return _loaded[path]


def kernel_code(field, name):
    """The code of kernel `name` of `field` ("select_kernel", "sparse_kernel", "window_kernel",
    "decode_kernel"), or ValueError naming it: removed in session 17 (with its old code), or
    unknown, and the kept ones."""
    kept = KERNELS[field]
    if name in kept:
        return kept[name]
    if field == "decode_kernel":  # the decode benchmarks' wording (tests/python/test_decode_kernel_names.py)
        expected = ", ".join(kept)
        if name in REMOVED_KERNEL[field]:
            raise ValueError(f"decode kernel {name} (code {REMOVED_KERNEL[field][name]}) was removed in "
                             f"session 17 (gpu/NOTES.md \"Kernels removed in session 17\"; its code is at "
                             f"commit {_REMOVED_AT[field]}); expected one of {expected}")
        raise ValueError(f"unknown decode kernel '{name}' (expected one of {expected})")
    listed = ", ".join(f"{n} ({c})" for n, c in kept.items())
    if name in REMOVED_KERNEL[field]:
        raise ValueError(f"{field}: {name} (code {REMOVED_KERNEL[field][name]}) was removed in session 17 "
                         f"(gpu/NOTES.md \"Kernels removed in session 17\"; its code is at commit "
                         f"{_REMOVED_AT[field]}); expected one of {listed}")
    raise ValueError(f"{field}: expected one of {listed}, got {name!r}")


def set_sparse(lib, kernel, segment_queries=0):
    """Process-wide sparse stage (a SPARSE_KERNEL name) and its queries per segment (0: its own)."""
    lib.call("hils_gpu_set_sparse_kernel", ctypes.c_int32(kernel_code("sparse_kernel", kernel)))
    lib.call("hils_gpu_set_sparse_segment_queries", ctypes.c_int64(segment_queries))


def sparse_kernel(lib):
    """The SPARSE_KERNEL name of the sparse stage that runs now (the library's default until set)."""
    value = lib.lib.hils_gpu_sparse_kernel()
    return next(name for name, v in SPARSE_KERNEL.items() if v == value)


def set_window(lib, kernel):
    """Process-wide packed window kernel (a WINDOW_KERNEL name)."""
    lib.call("hils_gpu_set_window_kernel", ctypes.c_int32(kernel_code("window_kernel", kernel)))


def window_kernel(lib):
    """The WINDOW_KERNEL name of the window kernel that runs now (the library's default until set)."""
    value = lib.lib.hils_gpu_window_kernel()
    return next(name for name, v in WINDOW_KERNEL.items() if v == value)


# Whether set_packed last turned the packed kernels on (the library's default) in this process:
# the C API has no getter, and verify_options needs it (the packed selection rounds k' to bf16).
_packed = [True]


def set_packed(lib, enabled):
    """Packed tensor-core kernels where they apply (True, the default) or SIMT kernels everywhere."""
    lib.call("hils_gpu_set_packed_kernels", ctypes.c_int32(int(enabled)))
    _packed[0] = bool(enabled)


def packed_kernels():
    """True unless set_packed(lib, False) was the last call of this process."""
    return _packed[0]

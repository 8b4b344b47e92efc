"""ctypes binding of libhils_gpu_c.so (gpu/include/hils/gpu/c_api.h) over torch tensors."""
import ctypes

import torch

# Integer values of the hils:: enums, name -> int, filled from the library's own field table
# (hils_gpu_enum_names, reference/include/hils/spec.hpp) when the first Library is loaded.
KEY, BIAS, PRIOR, GROUP, FUSION = {}, {}, {}, {}, {}
_ENUMS = {"key_rule": KEY, "bias_rule": BIAS, "prior_rule": PRIOR, "group_rule": GROUP,
          "fusion": FUSION}
# The kernel codes of hils_gpu_select_with, hils_gpu_set_sparse_kernel and
# hils_gpu_set_window_kernel, name -> code (the values of hils::gpu::SelectKernel, SparseKernel and
# WindowKernel: stable, not consecutive). Filled from the library's own tables (hils_gpu_enum_names
# "select_kernel", ...: name=code pairs) when the first Library is loaded; these are the kept
# kernels as c_api.h lists them, for argument parsers that run before a library is loaded.
SELECT_KERNEL = {"two_pass_v4": 0, "one_pass_v5": 1, "two_pass_v8": 4, "two_pass_v15": 11,
                 "two_pass_v21": 17, "two_pass_v22": 18, "two_pass_v25": 19}
SPARSE_KERNEL = {"chunked_v21": 17, "chunked_v30": 26, "chunked_v35": 29, "chunked_v36": 30}
WINDOW_KERNEL = {"mma_v9": 1, "wgmma_v18": 10, "wgmma_v19": 11, "wgmma_v20": 12}
# The codes of the kernels removed in session 17 (gpu/NOTES.md "Kernels removed in session 17";
# their code is at commit ad5fb84), name -> code, from hils_gpu_enum_names "<field>_removed".
REMOVED_KERNEL = {"select_kernel": {}, "sparse_kernel": {}, "window_kernel": {}}
_KERNELS = {"select_kernel": SELECT_KERNEL, "sparse_kernel": SPARSE_KERNEL, "window_kernel": WINDOW_KERNEL}
# The selection kernels that are not bit-identical to v8 by construction: v21 and v22 sum their
# selected scores from the bf16 k' (gpu/NOTES.md v20, v21), v25 ranks otherwise rounded group
# scores (gpu/NOTES.md v25): the oracle judges them, not a byte compare.
APPROXIMATE_SELECT_KERNELS = ("two_pass_v21", "two_pass_v22", "two_pass_v25")
# Row element types of hils_gpu_fuse_rows (hils::gpu::RowType), by torch dtype.
ROW_TYPE = {torch.float32: 0, torch.float16: 1, torch.bfloat16: 2}
PRESETS = {
    "hils": dict(key="taylor", bias="entropy", fusion="hierarchical", landmarks=1),
    "lmk": dict(key="landmark_key", bias="none", fusion="hierarchical", landmarks=1),
    "nsa": dict(key="mean", bias="none", fusion="flat", landmarks=0),
    "naive_bsa": dict(key="exact", bias="none", fusion="flat", landmarks=0),
}


class Problem(ctypes.Structure):
    _fields_ = [(n, ctypes.c_int64) for n in ("T", "Hq", "Hkv", "d", "dv", "S", "W", "K")] + [
        (n, ctypes.c_int32)
        for n in ("landmarks", "bf16", "key_rule", "bias_rule", "prior_rule", "group_rule",
                  "fusion", "softmax1")
    ] + [("scale", ctypes.c_double)] + [
        (n, ctypes.c_void_p) for n in ("q", "k", "v", "q_retrieval", "prior")
    ] + [("prior_rows", ctypes.c_int64)]


class Library:
    def __init__(self, path):
        self.lib = ctypes.CDLL(path)
        self.lib.hils_gpu_last_error.restype = ctypes.c_char_p
        self.lib.hils_gpu_enum_names.restype = ctypes.c_char_p
        self.lib.hils_gpu_enum_names.argtypes = [ctypes.c_char_p]
        for field, table in _ENUMS.items():
            names = self.lib.hils_gpu_enum_names(field.encode()).decode().split()
            table.update({name: value for value, name in enumerate(names)})
        for field, table in _KERNELS.items():
            table.clear()
            table.update(_name_codes(self.lib.hils_gpu_enum_names(field.encode())))
            REMOVED_KERNEL[field].clear()
            REMOVED_KERNEL[field].update(_name_codes(self.lib.hils_gpu_enum_names(f"{field}_removed".encode())))

    def call(self, name, *args):
        rc = getattr(self.lib, name)(*args)
        if rc != 0:
            raise RuntimeError(f"{name} returned {rc}: {self.lib.hils_gpu_last_error().decode()}")


def _name_codes(text):
    """{name: code} of the library's "name=code name=code ..." (b"" or None: {})."""
    return {name: int(code) for name, code in (entry.split("=") for entry in (text or b"").decode().split())}


def kernel_code(field, name):
    """The code of kernel `name` of `field` ("select_kernel", "sparse_kernel", "window_kernel"), or
    ValueError naming it: removed in session 17 (with its old code), or unknown, and the kept ones."""
    kept = _KERNELS[field]
    if name in kept:
        return kept[name]
    listed = ", ".join(f"{n} ({c})" for n, c in kept.items())
    if name in REMOVED_KERNEL[field]:
        raise ValueError(f"{field}: {name} (code {REMOVED_KERNEL[field][name]}) was removed in session 17 "
                         f"(gpu/NOTES.md \"Kernels removed in session 17\"; its code is at commit ad5fb84); "
                         f"expected one of {listed}")
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


def set_packed(lib, enabled):
    """Packed tensor-core kernels where they apply (True, the default) or SIMT kernels everywhere."""
    lib.call("hils_gpu_set_packed_kernels", ctypes.c_int32(int(enabled)))


def ptr(t):
    return ctypes.c_void_p(t.data_ptr()) if t is not None else ctypes.c_void_p(0)


def stream_ptr():
    return ctypes.c_void_p(torch.cuda.current_stream().cuda_stream)


def make_problem(q, k, v, S, W, K, preset="hils", q_retrieval=None, softmax1=False,
                 group="max_normalized", landmarks=None):
    """q [Hq, T, d], k [Hkv, T, d], v [Hkv, T, dv] contiguous, fp32 or bf16."""
    if not KEY:
        raise RuntimeError("hils_ctypes: load a Library first (it reads the enum values)")
    cfg = PRESETS[preset]
    p = Problem()
    p.Hq, p.T, p.d = q.shape
    p.Hkv, p.dv = k.shape[0], v.shape[2]
    p.S, p.W, p.K = S, W, K
    p.landmarks = cfg["landmarks"] if landmarks is None else int(landmarks)
    p.bf16 = int(q.dtype == torch.bfloat16)
    p.key_rule, p.bias_rule = KEY[cfg["key"]], BIAS[cfg["bias"]]
    p.prior_rule, p.group_rule = PRIOR["landmark_query"], GROUP[group]
    p.fusion, p.softmax1, p.scale = FUSION[cfg["fusion"]], int(softmax1), 0.0
    p.q, p.k, p.v = ptr(q), ptr(k), ptr(v)
    p.q_retrieval, p.prior, p.prior_rows = ptr(q_retrieval), ctypes.c_void_p(0), 0
    return p


class Stages:
    """Device buffers of every stage for one problem, and one call per stage."""

    def __init__(self, lib, p, need_exact=False):
        self.lib, self.p = lib, p
        dev = torch.device("cuda")
        nc = p.T // p.S
        f32 = dict(device=dev, dtype=torch.float32)
        self.o_swa = torch.empty(p.Hq, p.T, p.dv, **f32)
        self.lse_swa = torch.empty(p.Hq, p.T, **f32)
        self.key = torch.empty(p.Hq, max(nc, 1), p.d, **f32)
        self.bias = torch.empty(p.Hq, max(nc, 1), **f32)
        self.exact = torch.empty(p.Hq, p.T, nc, **f32) if need_exact else None
        self.selection = torch.empty(p.Hkv, p.T, max(p.K, 1), device=dev, dtype=torch.int32)
        self.selected_score = torch.empty(p.Hq, p.T, max(p.K, 1), **f32)
        self.o = torch.empty(p.Hq, p.T, p.dv, **f32)
        self.lse = torch.empty(p.Hq, p.T, **f32)
        self.workspace = None  # run()'s, allocated at its first call

    def window(self):
        self.lib.call("hils_gpu_window", ctypes.byref(self.p), ptr(self.o_swa), ptr(self.lse_swa),
                      stream_ptr())

    def window_rows(self, o_swa):
        """hils_gpu_window_rows: o_swa an fp32 or fp16 tensor [Hq, T, dv] (lse to self.lse_swa)."""
        self.lib.call("hils_gpu_window_rows", ctypes.byref(self.p), ptr(o_swa),
                      ctypes.c_int32(ROW_TYPE[o_swa.dtype]), ptr(self.lse_swa), stream_ptr())

    def exact_masses(self):
        self.lib.call("hils_gpu_exact", ctypes.byref(self.p), ptr(self.exact), stream_ptr())

    def summarize(self):
        self.lib.call("hils_gpu_summarize", ctypes.byref(self.p), ptr(self.key), ptr(self.bias),
                      stream_ptr())

    def select(self, kernel=None):
        """kernel: a hils::gpu::SelectKernel name (gpu/include/hils/gpu/c_api.h); None: the
        library's default (hils_gpu_select)."""
        if kernel is None:
            self.lib.call("hils_gpu_select", ctypes.byref(self.p), ptr(self.key), ptr(self.bias),
                          ptr(self.exact), ptr(self.lse_swa), ptr(self.selection),
                          ptr(self.selected_score), stream_ptr())
            return
        self.lib.call("hils_gpu_select_with", ctypes.byref(self.p),
                      ctypes.c_int32(kernel_code("select_kernel", kernel)), ptr(self.key), ptr(self.bias),
                      ptr(self.exact), ptr(self.lse_swa), ptr(self.selection),
                      ptr(self.selected_score), stream_ptr())

    def fuse(self):
        self.lib.call("hils_gpu_fuse", ctypes.byref(self.p), ptr(self.selection),
                      ptr(self.selected_score), ptr(self.o_swa), ptr(self.lse_swa), ptr(self.o),
                      ptr(self.lse), stream_ptr())

    def fuse_rows(self, o_swa, o):
        """hils_gpu_fuse_rows: o_swa an fp32 or fp16 tensor [Hq, T, dv] (the window's rows), o an
        fp32 or bf16 one that receives the fusion (the lse goes to self.lse)."""
        self.lib.call("hils_gpu_fuse_rows", ctypes.byref(self.p), ptr(self.selection),
                      ptr(self.selected_score), ptr(o_swa), ctypes.c_int32(ROW_TYPE[o_swa.dtype]),
                      ptr(self.lse_swa), ptr(o), ctypes.c_int32(ROW_TYPE[o.dtype]), ptr(self.lse),
                      stream_ptr())

    def run(self):
        """The forward as a caller runs it: one hils_gpu_run (window, summaries, selection and
        sparse stage, each the library's default) into o and lse, its intermediates in a workspace
        of hils_gpu_workspace_bytes. forward() below is the same work as four calls."""
        if self.workspace is None:
            size = ctypes.c_size_t()
            self.lib.call("hils_gpu_workspace_bytes", ctypes.byref(self.p), ctypes.byref(size))
            self.workspace = torch.empty(max(size.value, 1), device="cuda", dtype=torch.uint8)
        self.lib.call("hils_gpu_run", ctypes.byref(self.p), ptr(self.o), ptr(self.lse),
                      ptr(self.workspace), stream_ptr())

    def forward(self, select_kernel=None, rows=None):
        """The stages in order. rows = (o_swa, o) tensors: the window's rows and the fusion's o in
        their dtypes (hils_gpu_window_rows, hils_gpu_fuse_rows), e.g. an fp16 o_swa and a bf16 o;
        None: self.o_swa and self.o in fp32."""
        if rows is None:
            self.window()
        else:
            self.window_rows(rows[0])
        if self.exact is not None:
            self.exact_masses()
        else:
            self.summarize()
        self.select(select_kernel)
        if rows is None:
            self.fuse()
        else:
            self.fuse_rows(*rows)

"""ctypes binding of libhils_gpu_c.so (gpu/include/hils/gpu/c_api.h) over torch tensors."""
import ctypes

import torch

# Integer values of the hils:: enums, name -> int, filled from the library's own field table
# (hils_gpu_enum_names, reference/include/hils/spec.hpp) when the first Library is loaded.
KEY, BIAS, PRIOR, GROUP, FUSION = {}, {}, {}, {}, {}
_ENUMS = {"key_rule": KEY, "bias_rule": BIAS, "prior_rule": PRIOR, "group_rule": GROUP,
          "fusion": FUSION}
# The selection kernel versions of hils_gpu_select_with (gpu/NOTES.md: v4.2, v5, v6, v7, v8-v19).
SELECT_KERNEL = {"two_pass_v4": 0, "one_pass_v5": 1, "two_pass_v6": 2, "two_pass_v7": 3, "two_pass_v8": 4,
                 "two_pass_v9": 5, "two_pass_v10": 6, "two_pass_v11": 7,
                 "two_pass_v12": 8, "two_pass_v13": 9, "two_pass_v14": 10, "two_pass_v15": 11,
                 "two_pass_v16": 12, "two_pass_v17": 13,
                 "two_pass_v18": 14, "two_pass_v19": 15,
                 "two_pass_v20": 16, "two_pass_v21": 17, "two_pass_v22": 18, "two_pass_v25": 19}
# The selection kernels that are not bit-identical to v8 by construction (their log Z_hat
# differs in its last bits; gpu/NOTES.md v18): the oracle judges them, not a byte compare.
APPROXIMATE_SELECT_KERNELS = ("two_pass_v18", "two_pass_v19", "two_pass_v20", "two_pass_v21", "two_pass_v22",
                              "two_pass_v25")
# The chunk-major sparse stages of hils_gpu_set_sparse_kernel (gpu/NOTES.md: v4-v32, v35, v36).
SPARSE_KERNEL = {"chunked_v4": 0, "atomic_v5": 1, "chunked_v6": 2, "chunked_v7": 3, "chunked_v8": 4, "chunked_v9": 5,
                 "chunked_v10": 6, "chunked_v11": 7, "chunked_v12": 8, "chunked_v13": 9,
                 "chunked_v14": 10, "chunked_v15": 11, "chunked_v16": 12,
                 "chunked_v17": 13, "chunked_v18": 14,
                 "chunked_v19": 15, "chunked_v20": 16, "chunked_v21": 17,
                 "chunked_v22": 18, "chunked_v23": 19, "chunked_v24": 20,
                 "chunked_v25": 21, "chunked_v26": 22, "chunked_v27": 23,
                 "chunked_v28": 24, "chunked_v29": 25, "chunked_v30": 26,
                 "chunked_v31": 27, "chunked_v32": 28, "chunked_v35": 29, "chunked_v36": 30}
# Row element types of hils_gpu_fuse_rows (hils::gpu::RowType), by torch dtype.
ROW_TYPE = {torch.float32: 0, torch.float16: 1, torch.bfloat16: 2}
# The packed window kernels of hils_gpu_set_window_kernel (gpu/NOTES.md: v4, v9, v10, v11-v13).
WINDOW_KERNEL = {"mma_v4": 0, "mma_v9": 1, "mma_v10": 2, "wgmma_v11": 3, "wgmma_v12": 4,
                 "wgmma_v13": 5, "wgmma_v14": 6, "wgmma_v15": 7,
                 "wgmma_v16": 8, "wgmma_v17": 9, "wgmma_v18": 10,
                 "wgmma_v19": 11, "wgmma_v20": 12}
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

    def call(self, name, *args):
        rc = getattr(self.lib, name)(*args)
        if rc != 0:
            raise RuntimeError(f"{name} returned {rc}: {self.lib.hils_gpu_last_error().decode()}")


def set_sparse(lib, kernel, segment_queries=0):
    """Process-wide sparse stage (a SPARSE_KERNEL name) and its queries per segment (0: its own)."""
    lib.call("hils_gpu_set_sparse_kernel", ctypes.c_int32(SPARSE_KERNEL[kernel]))
    lib.call("hils_gpu_set_sparse_segment_queries", ctypes.c_int64(segment_queries))


def sparse_kernel(lib):
    """The SPARSE_KERNEL name of the sparse stage that runs now (the library's default until set)."""
    value = lib.lib.hils_gpu_sparse_kernel()
    return next(name for name, v in SPARSE_KERNEL.items() if v == value)


def set_window(lib, kernel):
    """Process-wide packed window kernel (a WINDOW_KERNEL name)."""
    lib.call("hils_gpu_set_window_kernel", ctypes.c_int32(WINDOW_KERNEL[kernel]))


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
                      ctypes.c_int32(SELECT_KERNEL[kernel]), ptr(self.key), ptr(self.bias),
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

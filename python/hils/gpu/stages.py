"""The C API over torch tensors: the inputs checked (TypeError / ValueError naming the argument,
before any library call), hils_gpu_problem built from a spec dict, and Stages, the device buffers
of every stage with one call per stage (the benchmarks' way in, gpu/bench/*.py)."""

import ctypes

from . import library as _library
from . import spec as _spec

try:
    import torch
except ImportError as _error:  # hils.gpu imports without torch; a call that needs it says so
    torch, _TORCH_ERROR = None, _error


def require_torch():
    """torch, or ImportError saying hils.gpu's tensors need it."""
    if torch is None:
        raise ImportError(f"hils.gpu: the GPU kernels take torch CUDA tensors, and torch cannot be "
                          f"imported here ({_TORCH_ERROR})")
    return torch


def ptr(t):
    return ctypes.c_void_p(t.data_ptr()) if t is not None else ctypes.c_void_p(0)


def stream_ptr():
    return ctypes.c_void_p(torch.cuda.current_stream().cuda_stream)


def cuda_tensor(name, t, ndim, layout, dtypes, described, dtype_why="", device=None):
    """t, or TypeError / ValueError naming `name`, unless a torch CUDA tensor of one of `dtypes`
    (names: "float32", ...) with ndim dimensions `layout` (and on `device` when given): the
    checks that forward's inputs and the decode cache's tensors share. `described` is what the
    first refusal says was expected ("a torch CUDA tensor (...)"), `dtype_why` what the dtype
    refusal adds. torch's dtypes are looked up only once t is a tensor."""
    if torch is None or not isinstance(t, torch.Tensor):
        why = "" if torch is not None else f" (and torch cannot be imported here: {_TORCH_ERROR})"
        raise TypeError(f"{name}: expected {described}, found {type(t).__module__}.{type(t).__name__}{why}")
    if not t.is_cuda:
        raise ValueError(f"{name}: expected a CUDA tensor, found one on {t.device} (move it with .cuda())")
    if t.dtype not in tuple(getattr(torch, dtype) for dtype in dtypes):
        raise TypeError(f"{name}: expected dtype {' or '.join('torch.' + d for d in dtypes)}{dtype_why}, "
                        f"found {t.dtype}")
    if t.dim() != ndim:
        raise ValueError(f"{name}: expected {ndim} dimensions {layout}, found shape {tuple(t.shape)}")
    if device is not None and t.device != device:
        raise ValueError(f"{name}: expected a tensor on the cache's device {device}, found {t.device}")
    return t


def _tensor(name, t, ndim=3):
    """t, or TypeError / ValueError naming `name`, unless a contiguous fp32 or bf16 CUDA tensor
    of ndim dimensions."""
    cuda_tensor(name, t, ndim, "[heads, T, d]", ("float32", "bfloat16"),
                "a torch CUDA tensor (float32 or bfloat16)")
    if not t.is_contiguous():
        raise ValueError(f"{name}: expected a contiguous tensor (call .contiguous()), found strides "
                         f"{t.stride()} for shape {tuple(t.shape)}")
    return t


def same(name, t, reference_name, reference, what):
    if getattr(t, what) != getattr(reference, what):
        raise (TypeError if what == "dtype" else ValueError)(
            f"{name}: expected the {what} of {reference_name} ({getattr(reference, what)}), "
            f"found {getattr(t, what)}")


def check_inputs(q, k, v, q_retrieval=None, prior=None):
    """The layout of data/verify_format.md: q [Hq, T, d], k [Hkv, T, d], v [Hkv, T, dv],
    q_retrieval [Hq, T, d], prior [Hq, rows, d]; one dtype (fp32 or bf16), one CUDA device,
    contiguous, Hkv dividing Hq. Raises TypeError / ValueError naming the argument."""
    _tensor("q", q)
    for name, t in (("k", k), ("v", v), ("q_retrieval", q_retrieval), ("prior", prior)):
        if t is None and name in ("q_retrieval", "prior"):
            continue
        _tensor(name, t)
        same(name, t, "q", q, "dtype")
        same(name, t, "q", q, "device")
    Hq, T, d = q.shape
    Hkv = k.shape[0]
    expected = {"k": (k, (Hkv, T, d)), "v": (v, (Hkv, T, v.shape[2])),
                "q_retrieval": (q_retrieval, (Hq, T, d)),
                "prior": (prior, (Hq, None if prior is None else prior.shape[1], d))}
    for name, (t, shape) in expected.items():
        if t is not None and tuple(t.shape) != shape:
            raise ValueError(f"{name}: expected shape {list(shape)} (q is [Hq={Hq}, T={T}, d={d}], "
                             f"k [Hkv, T, d], v [Hkv, T, dv]), found {list(t.shape)}")
    if Hkv < 1 or Hq % Hkv != 0:
        raise ValueError(f"k: expected a number of KV heads dividing q's {Hq} heads, found {Hkv}")


def enum_values(fields):
    """{field: integer} of the enum fields of a resolved spec, from the loaded library's tables
    (ValueError naming spec[field] and its names for a name the library does not have)."""
    if not _library.KEY:
        raise RuntimeError("hils.gpu: load a Library first (it reads the enum values)")
    values = {}
    for key, table in _library.ENUMS.items():
        if fields[key] not in table:
            raise ValueError(f"spec[{key!r}]: expected one of {' | '.join(table)}, got {fields[key]!r}")
        values[key] = table[fields[key]]
    return values


def problem(spec, q, k, v, q_retrieval=None, prior=None):
    """hils_gpu_problem of `spec` (hils.verify's dict, or the dict hils.gpu.spec.resolve made)
    over the checked tensors; enum names are looked up in the loaded library's tables, so a
    Library must be loaded first. The Problem keeps the tensors alive (._tensors)."""
    check_inputs(q, k, v, q_retrieval, prior)
    fields = _spec.resolve(spec)
    enums = enum_values(fields)
    p = _library.Problem()
    p.Hq, p.T, p.d = q.shape
    p.Hkv, p.dv = k.shape[0], v.shape[2]
    p.S, p.W, p.K = fields["S"], fields["W"], fields["K"]
    p.landmarks, p.softmax1, p.scale = int(fields["landmarks"]), int(fields["softmax1"]), fields["scale"]
    p.bf16 = int(q.dtype == torch.bfloat16)
    for key, value in enums.items():
        setattr(p, key, value)
    p.q, p.k, p.v = ptr(q), ptr(k), ptr(v)
    p.q_retrieval, p.prior = ptr(q_retrieval), ptr(prior)
    p.prior_rows = 0 if prior is None else prior.shape[1]
    p._tensors = (q, k, v, q_retrieval, prior)
    return p


def make_problem(q, k, v, S, W, K, preset="hils", q_retrieval=None, softmax1=False,
                 group="max_normalized", landmarks=None):
    """problem() of {"preset": preset, "S": S, "W": W, "K": K, ...}, as the benchmarks call it."""
    spec = {"preset": preset, "S": S, "W": W, "K": K, "softmax1": softmax1, "group_rule": group}
    if landmarks is not None:
        spec["landmarks"] = bool(landmarks)
    return problem(spec, q, k, v, q_retrieval)


def workspace_bytes(lib, p):
    """hils_gpu_workspace_bytes of problem p: the library judges the shapes and the spec here
    (GpuInvalidArgument naming the field for what every stage would refuse), before any buffer
    is allocated."""
    size = ctypes.c_size_t()
    lib.call("hils_gpu_workspace_bytes", ctypes.byref(p), ctypes.byref(size))
    return size.value


class Stages:
    """Device buffers of every stage for one problem (on q's device), and one call per stage on
    torch's current stream. need_exact: allocate the exact chunk masses (hils_gpu_exact) instead
    of summaries; None: where the key rule is exact. outputs: {attribute: tensor} written instead
    of allocating that buffer (o_swa, lse_swa, selection, o, lse: contiguous, the buffer's shape
    and dtype), e.g. one sequence of the caller's batch (hils.gpu.forward's layouts); sequence()
    moves the stages on to the next sequence of a batch, the other buffers reused."""

    def __init__(self, lib, p, need_exact=None, outputs=None):
        self.lib, self.p = lib, p
        # The library checks the shapes and the spec first (hils_gpu_workspace_bytes refuses what
        # every stage would, GpuInvalidArgument naming the field): an S of 0 or a K of 10^9 is
        # named here, not met as a ZeroDivisionError or an out-of-memory error of the buffers.
        self.workspace_bytes = workspace_bytes(lib, p)
        if need_exact is None:
            need_exact = p.key_rule == _library.KEY["exact"]
        dev = p._tensors[0].device if hasattr(p, "_tensors") else torch.device("cuda")
        nc = p.T // p.S
        f32 = dict(device=dev, dtype=torch.float32)
        given = outputs or {}

        def output(name, *shape, dtype=torch.float32):
            return given[name] if name in given else torch.empty(*shape, device=dev, dtype=dtype)
        self.o_swa = output("o_swa", p.Hq, p.T, p.dv)
        self.lse_swa = output("lse_swa", p.Hq, p.T)
        self.key = torch.empty(p.Hq, max(nc, 1), p.d, **f32)
        self.bias = torch.empty(p.Hq, max(nc, 1), **f32)
        self.exact = torch.empty(p.Hq, p.T, nc, **f32) if need_exact else None
        self.selection = output("selection", p.Hkv, p.T, max(p.K, 1), dtype=torch.int32)
        self.selected_score = torch.empty(p.Hq, p.T, max(p.K, 1), **f32)
        self.o = output("o", p.Hq, p.T, p.dv)
        self.lse = output("lse", p.Hq, p.T)
        self.workspace = None  # run()'s, allocated at its first call

    def sequence(self, p, outputs=None):
        """The next sequence of a batch: problem p (the first one's shapes and spec, other
        tensors), written into `outputs` ({attribute: tensor}, as the constructor's) where given,
        into the buffers held otherwise; the intermediate buffers are reused, on the one stream."""
        self.p = p
        for name, t in (outputs or {}).items():
            setattr(self, name, t)

    def window(self):
        self.lib.call("hils_gpu_window", ctypes.byref(self.p), ptr(self.o_swa), ptr(self.lse_swa),
                      stream_ptr())

    def window_rows(self, o_swa):
        """hils_gpu_window_rows: o_swa an fp32 or fp16 tensor [Hq, T, dv] (lse to self.lse_swa)."""
        self.lib.call("hils_gpu_window_rows", ctypes.byref(self.p), ptr(o_swa),
                      ctypes.c_int32(_row_type(o_swa)), ptr(self.lse_swa), stream_ptr())

    def full(self):
        """hils_gpu_full: dense causal attention into self.o and self.lse."""
        self.lib.call("hils_gpu_full", ctypes.byref(self.p), ptr(self.o), ptr(self.lse), stream_ptr())

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
                      ctypes.c_int32(_library.kernel_code("select_kernel", kernel)), ptr(self.key),
                      ptr(self.bias), ptr(self.exact), ptr(self.lse_swa), ptr(self.selection),
                      ptr(self.selected_score), stream_ptr())

    def fuse(self):
        self.lib.call("hils_gpu_fuse", ctypes.byref(self.p), ptr(self.selection),
                      ptr(self.selected_score), ptr(self.o_swa), ptr(self.lse_swa), ptr(self.o),
                      ptr(self.lse), stream_ptr())

    def fuse_rows(self, o_swa, o):
        """hils_gpu_fuse_rows: o_swa an fp32 or fp16 tensor [Hq, T, dv] (the window's rows), o an
        fp32 or bf16 one that receives the fusion (the lse goes to self.lse)."""
        self.lib.call("hils_gpu_fuse_rows", ctypes.byref(self.p), ptr(self.selection),
                      ptr(self.selected_score), ptr(o_swa), ctypes.c_int32(_row_type(o_swa)),
                      ptr(self.lse_swa), ptr(o), ctypes.c_int32(_row_type(o)), ptr(self.lse),
                      stream_ptr())

    def run(self):
        """The forward as a caller runs it: one hils_gpu_run (window, summaries, selection and
        sparse stage, each the library's default) into o and lse, its intermediates in a workspace
        of hils_gpu_workspace_bytes. forward() below is the same work as four calls."""
        if self.workspace is None:
            self.workspace = torch.empty(max(self.workspace_bytes, 1), device=self.o.device, dtype=torch.uint8)
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


def _row_type(t):
    """hils::gpu::RowType of a row tensor's dtype (ValueError for another)."""
    name = str(t.dtype).replace("torch.", "")
    if name not in _library.ROW_TYPE:
        raise ValueError(f"rows: expected float32, float16 or bfloat16 rows, found {t.dtype}")
    return _library.ROW_TYPE[name]

"""The CUDA kernels of hils-sim (libhils_gpu_c.so, the C API of gpu/include/hils/gpu/c_api.h)
over torch CUDA tensors, with the spec dict of hils.verify:

    import torch, hils, hils.gpu
    spec = {"preset": "hils", "S": 64, "W": 512, "K": 32}
    out = hils.gpu.forward(q, k, v, spec)   # {"o": fp32 [Hq, T, dv], "lse": fp32 [Hq, T],
                                            #  "selection": int32 [Hkv, T, K]}, on q's device
    report = hils.verify(spec, q, k, v, out, **hils.gpu.verify_options(spec, q))

q [Hq, T, d], k [Hkv, T, d], v [Hkv, T, dv] (data/verify_format.md's layout), all float32 or all
bfloat16, on one CUDA device; the work runs on torch's current stream. A kernel's own layout and
batch is hils.verify's layout= (hils/layouts.py), in and out:

    out = hils.gpu.forward(q, k, v, spec, layout="bshd")   # q [B, T, Hq, d] -> o [B, T, Hq, dv], ...
    report = hils.verify(spec, q, k, v, out, layout="bshd", **hils.gpu.verify_options(spec, q))

Bad arguments raise TypeError / ValueError naming the argument (and its shape in the layout)
before any library call; a refusal of the library itself raises GpuError (GpuInvalidArgument,
also a ValueError, for return code 2) with hils_gpu_last_error()'s text.

The library: forward(..., library=PATH), else $HILS_GPU_LIB, else libhils_gpu_c.so in the hils
package folder (a wheel built with HILS_BUILD_GPU=ON, or the build tree's build/python/hils);
find_library says where it looked. Stage by stage, as the benchmarks (gpu/bench) run them:

    lib = hils.gpu.load_library()
    stages = hils.gpu.Stages(lib, hils.gpu.problem(spec, q, k, v))
    stages.forward()       # window, summaries, selection, sparse stage: stages.o, .lse, ...
    stages.run()           # the same forward as one hils_gpu_run call (o and lse only)

The decode step, one new query per sequence against a cache of K/V slots and chunk summaries
(hils/gpu/decode.py):

    cache = hils.gpu.DecodeCache(spec, q, k, v, capacity=4096, summaries="fp8")  # prefix [B, heads, T0, d]
    cache.append(k_new, v_new)          # [B, Hkv, d], [B, Hkv, dv] bf16: slot T-1
    out = cache.step(q_new)             # [B, Hq, d] -> {"o": [B, Hq, dv], "lse": [B, Hq], "selection": [B, Hkv, K]}
    report = hils.verify(**cache.verify_arguments(out, b=0))

Its structs (Decode, DecodeOutputs) and kernel names (DECODE_KERNEL, kernel_code("decode_kernel",
name)) are here too; gpu/bench/bench_decode.py drives them on random caches. `import hils.gpu`
needs neither torch nor hils._core: the library and its tables load without torch, the tensors
need it.
"""

from .library import (APPROXIMATE_SELECT_KERNELS, BIAS, DECODE_KERNEL, ENV_VAR, FUSION, GROUP, KEY,
                      KERNELS, PRIOR, REMOVED_KERNEL, SELECT_KERNEL, SPARSE_KERNEL, SUMMARY_TYPES,
                      WINDOW_KERNEL, Decode, DecodeOutputs, GpuError, GpuInvalidArgument, Library,
                      Problem, find_library, kernel_code, load_library, packed_kernels, set_packed,
                      set_sparse, set_window, sparse_kernel, window_kernel)
from . import batched as _batched
from .decode import SUMMARY_STORES, DecodeCache
from .spec import PRESETS, SPEC_KEYS, resolve as resolve_spec
from .stages import (Stages, check_inputs, enum_values, make_problem, problem, ptr, require_torch,
                     stream_ptr)

__all__ = ["forward", "verify_options", "resolve_spec", "PRESETS", "SPEC_KEYS",
           "DecodeCache", "SUMMARY_STORES",
           # the library
           "Library", "load_library", "find_library", "ENV_VAR", "GpuError", "GpuInvalidArgument",
           "KEY", "BIAS", "PRIOR", "GROUP", "FUSION", "KERNELS", "SELECT_KERNEL", "SPARSE_KERNEL",
           "WINDOW_KERNEL", "DECODE_KERNEL", "REMOVED_KERNEL", "APPROXIMATE_SELECT_KERNELS",
           "SUMMARY_TYPES", "kernel_code", "set_sparse", "sparse_kernel", "set_window",
           "window_kernel", "set_packed", "packed_kernels", "Problem", "Decode", "DecodeOutputs",
           # stage by stage
           "Stages", "problem", "make_problem", "check_inputs", "enum_values", "ptr", "stream_ptr", "require_torch"]


def _require_finite(name, t):
    """ValueError naming `name`, the first NaN or Inf and its index, unless every value of t is
    finite (one reduction on the device and one synchronisation)."""
    finite = require_torch().isfinite(t)
    if bool(finite.all()):
        return
    index = tuple(int(i) for i in (~finite).nonzero()[0].tolist())
    raise ValueError(f"{name}: expected finite values (hils.verify refuses NaN and Inf inputs too), found "
                     f"{t[index].item()} at {list(index)}; check_finite=False skips this check")


def forward(q, k, v, spec, *, layout="hsd", lse_layout=None, q_retrieval=None, prior=None,
            library=None, check_finite=True, cu_seqlens=None):
    """The mechanism of `spec` (hils.verify's dict: "preset" and the spec keys S, W, K, key_rule,
    ..., data/verify_format.md) on the GPU -> {"o": [Hq, T, dv], "lse": [Hq, T]} (float32), plus
    "selection" [Hkv, T, K] (int32, the chunks each KV head's group selected) for the mechanisms
    that select (flat or hierarchical fusion). q_retrieval [Hq, T, d] and prior [Hq, rows, d] as in
    hils.verify. library: a Library or a path (default: find_library()). Each stage is the
    library's default kernel (README "Calling the GPU kernels"); outputs are on q's device, written
    on torch's current stream. check_finite: refuse NaN and Inf in the inputs (ValueError naming
    the tensor and the first such element) as hils.verify does; this reads every input once and
    synchronises with the device (False skips it, e.g. inside a CUDA graph capture). Unchecked,
    such a value spreads beyond the rows that attend to it: a NaN in v reaches earlier rows of
    its tile (masked probabilities 0 times NaN; gpu/NOTES.md "Careless-user audit (session 21)").

    layout, lse_layout: hils.verify's (hils/layouts.py): the inputs come and the outputs go in
    that layout, "hsd" (the shapes above), "shd" ([T, Hq, d]), "bhsd" (SDPA's [B, Hq, T, d]) or
    "bshd" (FlashAttention's [B, T, Hq, d]: o [B, T, Hq, dv], lse [B, T, Hq], or [B, Hq, T] with
    lse_layout="bhsd", selection [B, T, Hkv, K]); the outputs are contiguous in it. Pass the same
    layout (and lse_layout) to hils.verify. A batch runs its sequences one after the other
    (hils/gpu/batched.py says what is copied).

    cu_seqlens: packed sequences (varlen), as hils.verify's: int32 or int64 [B + 1] offsets with
    layout "thd" ([total, Hq, d]: FlashAttention's varlen q, k, v; o [total, Hq, dv], lse
    [total, Hq] or [Hq, total] with lse_layout="htd", selection [total, Hkv, K]), "htd", or
    "bshd" / "bhsd" with B = 1 (fla-org's); each sequence is computed as its own problem
    (positions and selection ids from its first row) and written to its rows of the packed
    outputs; an empty sequence (cu_seqlens[b] = cu_seqlens[b+1]) is skipped, a pack of nothing
    else refused. Judge them with hils.verify(..., layout=, cu_seqlens=) (the same arguments)."""
    fields = resolve_spec(spec)  # spec errors first: no torch or library needed
    layout, lse_layout = _batched.layouts(layout, lse_layout, q, cu_seqlens)
    inputs = {"q": q, "k": k, "v": v, "q_retrieval": q_retrieval, "prior": prior}
    sizes = _batched.check(layout, inputs)
    torch = require_torch()
    if check_finite:
        for name, t in inputs.items():
            if t is not None:
                _require_finite(name, t)
    lib = load_library(library)
    with torch.cuda.device(q.device):
        return _batched.forward(fields, layout, lse_layout, inputs, sizes, lib)


def verify_options(spec, q):
    """hils.verify's input_precision and score_precision for forward's outputs on q (in any
    layout: d is q's last axis): "bf16" inputs for bf16 q, and bf16 scores where the packed selection runs (it ranks the summaries
    rounded to bf16: bf16 inputs, d = 64, packed kernels on, a key rule other than exact, 1 <= K
    <= 64; tests/gpu/device_support.cpp score_precision_of, gpu/NOTES.md), else fp32."""
    fields = resolve_spec(spec)
    bf16 = str(getattr(q, "dtype", "")) == "torch.bfloat16"
    packed_select = (bf16 and q.shape[-1] == 64 and packed_kernels() and fields["key_rule"] != "exact"
                     and 1 <= fields["K"] <= 64)
    return {"input_precision": "bf16" if bf16 else "fp32",
            "score_precision": "bf16" if packed_select else "fp32"}

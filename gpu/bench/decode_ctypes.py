"""The decode C API's pieces that need no torch (gpu/include/hils/gpu/decode_c_api.h): its structs,
and its kernels by name (hils::gpu::DecodeKernel, the codes of hils_gpu_decode::kernel), read from
the library itself: hils_gpu_enum_names("decode_kernel") lists the kept ones and
("decode_kernel_removed") those removed in session 17, as name=code (gpu/include/hils/gpu/c_api.h;
the one table is gpu/include/hils/gpu/decode.hpp's). For bench_decode.py, dump_decode_verify.py and
profile_decode.py; tests/python/test_decode_kernel_names.py checks it on a machine without a GPU."""
import ctypes

# hils::gpu::DecodeKernel: the kept versions' codes (hils_gpu_decode::kernel), and those of the
# versions removed in session 17, which the library refuses (gpu/NOTES.md "Kernels removed in
# session 17"; their code is at commit 5a3f9d2). Empty until load_kernel_names(lib) fills them.
KERNELS = {}
REMOVED_KERNELS = {}
# hils::gpu::SummaryType by label (int4h: SummaryType::int4_h, scanned by d40 only)
SUMMARY_TYPES = {"bf16": 0, "fp8": 1, "int4": 2, "int4h": 3}


def _name_codes(text):
    """{name: code} of the library's "name=code name=code ..."."""
    return {name: int(code) for name, code in (entry.split("=") for entry in text.decode().split())}


def load_kernel_names(lib):
    """Fills KERNELS and REMOVED_KERNELS (in place, in the library's order) from `lib`, a
    ctypes.CDLL of libhils_gpu_c.so."""
    lib.hils_gpu_enum_names.restype = ctypes.c_char_p
    lib.hils_gpu_enum_names.argtypes = [ctypes.c_char_p]
    kept, removed = (lib.hils_gpu_enum_names(field) for field in (b"decode_kernel", b"decode_kernel_removed"))
    if kept is None or removed is None:
        raise SystemExit("this libhils_gpu_c.so does not list its decode kernels (hils_gpu_enum_names "
                         "\"decode_kernel\", session 18 on): build it from this checkout")
    KERNELS.clear()
    KERNELS.update(_name_codes(kept))
    REMOVED_KERNELS.clear()
    REMOVED_KERNELS.update(_name_codes(removed))


def kernel_code(name):
    """The DecodeKernel code of `name`; a removed version is named as such."""
    if name in REMOVED_KERNELS:
        raise SystemExit(f"decode kernel {name} (code {REMOVED_KERNELS[name]}) was removed in session 17 "
                         "(gpu/NOTES.md \"Kernels removed in session 17\"; its code is at commit 5a3f9d2); "
                         f"expected one of {', '.join(KERNELS)}")
    if name not in KERNELS:
        raise SystemExit(f"unknown decode kernel '{name}' (expected one of {', '.join(KERNELS)})")
    return KERNELS[name]


def variant(label):
    """'d29_fp8' -> ('d29_fp8', 'd29', 'fp8')."""
    if "_" not in label:
        raise SystemExit(f"--variants: unknown '{label}' (expected <{'|'.join(KERNELS)}>_<bf16|fp8|int4|int4h>)")
    kernel, summary = label.rsplit("_", 1)
    kernel_code(kernel)  # a removed version: named as such
    if summary not in SUMMARY_TYPES:
        raise SystemExit(f"--variants: unknown '{label}' (expected <{'|'.join(KERNELS)}>_<bf16|fp8|int4|int4h>)")
    return label, kernel, summary


class Decode(ctypes.Structure):
    _fields_ = [(n, ctypes.c_int64) for n in ("B", "T", "Hq", "Hkv", "d", "dv", "S", "W", "K")] + [
        (n, ctypes.c_int32)
        for n in ("landmarks", "key_rule", "bias_rule", "group_rule", "fusion", "softmax1")
    ] + [("scale", ctypes.c_double), ("slot_capacity", ctypes.c_int64),
         ("chunk_capacity", ctypes.c_int64)] + [
        (n, ctypes.c_void_p) for n in ("k", "v", "summary_key", "summary_bias", "q", "q_retrieval")
    ] + [("summary_type", ctypes.c_int32), ("kernel", ctypes.c_int32),
         ("summary_scale", ctypes.c_void_p), ("summary_key_bf16", ctypes.c_void_p),
         ("summary_scale_bias", ctypes.c_void_p)]


class DecodeOutputs(ctypes.Structure):
    _fields_ = [(n, ctypes.c_void_p) for n in ("o", "lse", "selection", "o_window", "lse_window",
                                               "surrogate", "fusion_weights")]

"""The decode step (gpu/include/hils/gpu/decode.hpp, C API decode_c_api.h) over torch CUDA tensors:
a DecodeCache of B sequences that keeps their K/V slots and chunk summaries, grows by one token
per sequence per step, and steps one new query per sequence.

    cache = hils.gpu.DecodeCache(spec, q, k, v, capacity=4096)   # the prefix: [B, heads, T0, d]
    cache.append(k_new, v_new)                  # [B, Hkv, d], [B, Hkv, dv]: slot T-1 of each sequence
    out = cache.step(q_new)                     # [B, Hq, d] -> {"o", "lse", "selection"}
    report = hils.verify(**cache.verify_arguments(out, b=0))

What the decode kernels need and how the cache gives it (gpu/NOTES.md "decode — one new query per
sequence ..."): bf16 K/V [B, Hkv, capacity, d]; k' per query head, stored as `summaries` says
(SUMMARY_STORES: "bf16", "fp8" e4m3 with a power-of-two row scale, the README's default store,
"int4" codes with an fp32 row scale, "int4h" int4 codes with an (fp16 scale, fp16 b') pair, read
by the d40 kernel only), b' fp32, and for the scaled stores under hierarchical fusion the same
k' in bf16 (the K selected chunks' fusion logits are read from them). The summaries are the
library's own: the prefix's chunks by one hils_gpu_summarize over the prefix, each later chunk by
hils_gpu_summarize over that chunk alone (a one-chunk problem, T = S, the B sequences stacked as
heads), then the library's quantizer (hils_gpu_quantize_summaries_<store>). A chunk c completes
when slot (c+1)S - 1, its landmark slot, is appended; its summary reads the prior there, q~ (the
step's q_retrieval, else its q) of that slot (reference/SEMANTICS.md §3, prior_rule
landmark_query), so the step that follows that append summarizes it before it runs. Hence the
order append, step, append, step: one token per sequence per step, and a step always follows
its append. The C API steps B sequences of one length T: sequences of different lengths need one
cache each (a ragged prefix is refused naming this).

step(q, out=buffers) writes preallocated outputs, so that a step can be captured in a CUDA graph
and replayed (as gpu/bench/bench_decode.py times the kernels): the replay runs that step's length
T again (step's docstring says what a graph keeps).

The same step in one call for all B sequences: hils.verify_decode(spec, q_new, cache.k, cache.v,
out, cache_seqlens=[T] * B, cache_layout="bhsd", q_retrieval=..., landmark_queries=cache.priors,
...) (tests/python/test_gpu_decode.py; it builds the problems with verify_arguments' function,
hils.decoding.query_inputs, and does not judge the stored summaries).

Bad arguments raise TypeError / ValueError naming the argument before the library is looked
for; a refusal of the library raises hils.gpu.GpuError (GpuInvalidArgument for bad input)."""

import ctypes
from collections.abc import Mapping
from numbers import Integral

from .. import as_numpy
from .. import layouts as _layouts
from ..decoding import query_inputs
from . import batched as _batched
from . import library as _library
from . import spec as _spec
from . import stages as _stages

# The stores of k' (hils::gpu::SummaryType, decode.hpp) and the score_precision the oracle judges
# each with (data/verify_format.md; gpu/bench/dump_decode_verify.py declares the same).
SUMMARY_STORES = {"bf16": "bf16", "fp8": "fp8_e4m3", "int4": "int4", "int4h": "int4_h"}
# The quantizer of each scaled store (decode_c_api.h).
_QUANTIZER = {"fp8": "hils_gpu_quantize_summaries_fp8", "int4": "hils_gpu_quantize_summaries_int4",
              "int4h": "hils_gpu_quantize_summaries_int4h"}
# The only kernel that scans int4_h summaries (decode.hpp, DecodeKernel::d40).
_INT4H_KERNEL = "d40"
_DIAGNOSTICS = ("o_window", "lse_window", "surrogate_scores", "fusion_weights")


def _needs_prior(fields):
    """The summaries read a prior (hils::gpu's needs_prior, gpu/src/api.cpp: taylor keys or the
    entropy bias)."""
    return fields["key_rule"] == "taylor" or fields["bias_rule"] == "entropy"


def decode_fields(spec):
    """hils.verify's spec dict resolved and checked for what the decode cache steps: a selecting
    mechanism with summaries (flat or hierarchical fusion, key rule not exact: decode.hpp
    validate_decode) whose prior, where its summaries read one, is the landmark query (the
    cache takes it from the query at each chunk's landmark slot; shared and given priors are not
    kept). ValueError naming the spec key otherwise."""
    fields = _spec.resolve(spec)
    if fields["fusion"] not in ("flat", "hierarchical"):
        raise ValueError(f"spec['fusion']: expected flat or hierarchical for the decode step (a "
                         f"mechanism that selects chunks, decode.hpp), got {fields['fusion']!r}")
    if fields["key_rule"] == "exact":
        raise ValueError("spec['key_rule']: expected mean, landmark_key or taylor for the decode step "
                         "(the cache keeps summaries; exact has none), got 'exact'")
    if _needs_prior(fields):
        if fields["prior_rule"] != "landmark_query":
            raise ValueError(f"spec['prior_rule']: the decode cache summarizes each completed chunk "
                             f"with the query of its landmark slot (landmark_query); "
                             f"{fields['prior_rule']!r} priors are not supported")
        if not fields["landmarks"]:
            raise ValueError("spec['landmarks']: expected true for prior_rule landmark_query (the "
                             "prior is q~ at each chunk's landmark slot), got false")
    return fields


def summary_store(summaries):
    """`summaries` checked: one of SUMMARY_STORES."""
    if not isinstance(summaries, str) or summaries not in SUMMARY_STORES:
        raise ValueError(f"summaries: expected one of {' | '.join(SUMMARY_STORES)}, got {summaries!r}")
    return summaries


def kernel_name(kernel, summaries):
    """The decode kernel's name: `kernel` checked against DECODE_KERNEL (the library's list once
    it is loaded), or the default, fused (d39), or d40 for int4h summaries, which only d40 scans."""
    if kernel is None:
        return _INT4H_KERNEL if summaries == "int4h" else "fused"
    if not isinstance(kernel, str):
        raise TypeError(f"kernel: expected a decode kernel's name (str), found {type(kernel).__name__}")
    try:
        _library.kernel_code("decode_kernel", kernel)  # unknown, or removed in session 17
    except ValueError as error:
        raise ValueError(f"kernel: {error}") from None
    if summaries == "int4h" and kernel != _INT4H_KERNEL:
        raise ValueError(f"kernel: int4h summaries are scanned by d40 only (decode.hpp, "
                         f"SummaryType::int4_h), got {kernel!r}")
    return kernel


def _count(name, value, least):
    if isinstance(value, bool) or not isinstance(value, Integral):
        raise TypeError(f"{name}: expected an integer, found {type(value).__name__} {value!r}")
    if value < least:
        raise ValueError(f"{name}: expected an integer >= {least}, got {value}")
    return int(value)


def _bf16(name, t, ndim, layout, device=None):
    """t, or TypeError / ValueError naming `name`, unless a bf16 CUDA tensor of ndim dimensions
    (on `device` when given). The decode step reads bf16 K/V and queries (decode_c_api.h)."""
    return _stages.cuda_tensor(name, t, ndim, layout, ("bfloat16",), f"a torch CUDA tensor (bfloat16) {layout}",
                               " (the decode step reads bf16 K/V and queries)", device)


def _shape(name, t, expected, what):
    if tuple(t.shape) != tuple(expected):
        raise ValueError(f"{name}: expected shape {list(expected)} ({what}), found {list(t.shape)}")


def _stacked(name, t, layout):
    """A list or tuple of B per-sequence tensors (one sequence of `layout`: [heads, T0, d] for
    "bhsd", [T0, heads, d] for "bshd") stacked to one batch; prefixes of different lengths are
    refused: the C API steps B sequences of one length."""
    if not isinstance(t, (list, tuple)):
        return t
    torch = _stages.require_torch()
    if not t:
        raise ValueError(f"{name}: expected at least one sequence, found an empty {type(t).__name__}")
    one = _layouts.Layout("shd" if layout.rows_first else "hsd")
    for b, item in enumerate(t):
        _bf16(f"{name}[{b}]", item, 3, f"{one.pattern(name)} (one sequence of layout \"{layout.name}\")")
    lengths = [item.shape[one.axes(name).index("T")] for item in t]
    if len(set(lengths)) > 1:
        raise ValueError(f"{name}: the sequences' prefixes have lengths {lengths}: the decode step "
                         f"(hils_gpu_decode, decode_c_api.h) keeps one length T for all B "
                         f"sequences; use one DecodeCache per length")
    return torch.stack(list(t))


def decode_layout(layout):
    """layout= of the prefix: "bhsd" or "bshd" (the cache holds a batch), as a Layout."""
    if layout not in ("bhsd", "bshd"):
        _layouts.Layout(layout)  # a name that is no layout at all: its own message
        raise ValueError(f"layout: expected \"bhsd\" (prefix [B, heads, T0, d]) or \"bshd\" "
                         f"([B, T0, heads, d]): the cache holds a batch of sequences, found {layout!r}")
    return _layouts.Layout(layout)


def check_prefix(q, k, v, q_retrieval=None, layout="bhsd"):
    """The prefix in `layout` ("bhsd": q [B, Hq, T0, d], k [B, Hkv, T0, d], v [B, Hkv, T0, dv],
    q_retrieval like q; "bshd": [B, T0, heads, d]), bf16, on one CUDA device (lists of B
    one-sequence tensors are stacked); TypeError / ValueError naming the argument and its shape
    in the layout (T there is the prefix's length T0). Returns q, k, v, q_retrieval (None when
    not given) as [B, heads, T0, d] views (no copy) and B."""
    layout = decode_layout(layout)
    inputs = {name: (None if t is None else _stacked(name, t, layout))
              for name, t in (("q", q), ("k", k), ("v", v), ("q_retrieval", q_retrieval))}
    sizes = _batched.check(layout, inputs, ("bfloat16",), " (the decode step reads bf16 K/V and queries)")
    heads_first = [None if t is None else (t.transpose(1, 2) if layout.rows_first else t)
                   for t in inputs.values()]
    return (*heads_first, sizes["B"])


class DecodeCache:
    """B sequences' K/V slots and chunk summaries on one CUDA device, for the decode step.
    For hierarchical fusion the cache also keeps k' in fp32 (.key_fp32 [B, Hq, chunks, d], with
    every store): the K selected chunks' fusion logits are summed from it, so that the store's
    rounding moves the selection only (gpu/NOTES.md "decode", session 25).

    spec: hils.verify's dict (hils.gpu.forward's), a mechanism that selects with summaries
    (decode_fields). q, k, v (and q_retrieval): the prefix, [B, heads, T0, d] bf16 CUDA tensors
    (T0 >= 0; q and q_retrieval are read for the prefix chunks' priors). capacity: slots per
    sequence (>= T0). summaries: the store of k' (SUMMARY_STORES; "fp8" by default, the README's
    store). kernel: the steps' default decode kernel (DECODE_KERNEL name; None: fused, d40 for
    int4h). library: a Library or a path (default: find_library()). layout: the prefix's,
    hils.verify's name (hils/layouts.py): "bhsd" [B, heads, T0, d] (SDPA's), or "bshd" [B, T0,
    heads, d] (FlashAttention's; read through a transposed view: the cache's own K/V copy is
    the only copy of k and v, as in "bhsd"). The tensors of one token have no T axis and are
    the same in both layouts: append's k [B, Hkv, d], step's q [B, Hq, d] and its outputs (a
    layout's one-token tensor [B, 1, H, d] or [B, H, 1, d] is that with .squeeze(1) or
    .squeeze(2)).

    append(k, v) adds slot T of every sequence; step(q) runs the query of slot T-1 and returns
    {"o": fp32 [B, Hq, dv], "lse": fp32 [B, Hq], "selection": int32 [B, Hkv, K]} (step(q, out=)
    writes the caller's tensors, output_shapes() lists them); .length is T. Everything runs on
    torch's current stream; the workspace is allocated once, so a step can be captured in a CUDA
    graph."""

    def __init__(self, spec, q, k, v, *, capacity, summaries="fp8", q_retrieval=None, kernel=None,
                 library=None, layout="bhsd"):
        self.fields = decode_fields(spec)  # every argument checked before the library is looked for
        self.spec = dict(spec)
        self.summaries = summary_store(summaries)
        self.kernel = kernel_name(kernel, self.summaries)
        self.capacity = _count("capacity", capacity, 1)
        q, k, v, q_retrieval, B = check_prefix(q, k, v, q_retrieval, layout)
        self.layout = layout
        _, Hq, T0, d = q.shape
        if T0 > self.capacity:
            raise ValueError(f"capacity: expected at least the prefix's {T0} slots, got {self.capacity}")
        if self.summaries in ("int4", "int4h") and d % 2:
            raise ValueError(f"q: int4 and int4h summaries need an even d (two codes per byte), found d = {d}")
        torch = _stages.require_torch()
        self.lib = _library.load_library(library)
        self.device = q.device
        self.B, self.Hq, self.Hkv, self.d, self.dv = B, Hq, k.shape[1], d, v.shape[3]
        self.length = T0
        self._appended = False  # a token appended that no step has run yet
        self._pending = None    # the chunk that the next step summarizes (its landmark was appended)
        self._last = None       # (T, q, q~, kernel) of the last step, for verify_arguments
        with torch.cuda.device(self.device):
            self._allocate(torch)
            self.k[:, :, :T0].copy_(k)
            self.v[:, :, :T0].copy_(v)
            self._summarize_prefix(q if q_retrieval is None else q_retrieval, k, v)
            self.p = self._problem()
            self.workspace = torch.empty(self._workspace_bytes(), device=self.device, dtype=torch.uint8)

    # --- the cache's tensors -------------------------------------------------------------------
    def _allocate(self, torch):
        S = self.fields["S"]
        B, Hq, Hkv, d, dv, cap = self.B, self.Hq, self.Hkv, self.d, self.dv, self.capacity
        self.chunk_capacity = max(cap // S, 1)  # summary rows per (sequence, head)
        rows = (B, Hq, self.chunk_capacity)
        on = dict(device=self.device)
        self.k = torch.zeros(B, Hkv, cap, d, dtype=torch.bfloat16, **on)
        self.v = torch.zeros(B, Hkv, cap, dv, dtype=torch.bfloat16, **on)
        self.bias = torch.zeros(rows, dtype=torch.float32, **on)
        # q~ at each chunk's landmark slot (its prior), kept for verify_arguments
        self.priors = torch.zeros(rows + (d,), dtype=torch.bfloat16, **on)
        self.scale = self.pairs = self.key_fp32 = None
        if self.fields["fusion"] == "hierarchical":  # the selected chunks' fusion logits, every store
            self.key_fp32 = torch.zeros(rows + (d,), dtype=torch.float32, **on)
        if self.summaries == "bf16":
            self.key = torch.zeros(rows + (d,), dtype=torch.bfloat16, **on)
            return
        # fp8: e4m3 bytes (read back as torch.float8_e4m3fn); int4, int4h: two codes per byte
        self.key = torch.zeros(rows + (d if self.summaries == "fp8" else d // 2,), dtype=torch.uint8, **on)
        if self.summaries == "int4h":
            self.pairs = torch.zeros(rows + (2,), dtype=torch.float16, **on)
        else:
            self.scale = torch.zeros(rows, dtype=torch.float32, **on)

    def _problem(self):
        """hils_gpu_decode over the cache's tensors; T, q, q_retrieval and kernel are set per step."""
        enums = _stages.enum_values(self.fields)
        p = _library.Decode()
        p.B, p.Hq, p.Hkv, p.d, p.dv = self.B, self.Hq, self.Hkv, self.d, self.dv
        p.S, p.W, p.K = self.fields["S"], self.fields["W"], self.fields["K"]
        p.landmarks, p.softmax1 = int(self.fields["landmarks"]), int(self.fields["softmax1"])
        p.scale = self.fields["scale"]
        for key in ("key_rule", "bias_rule", "group_rule", "fusion"):
            setattr(p, key, enums[key])
        p.slot_capacity, p.chunk_capacity = self.capacity, self.chunk_capacity
        ptr = _stages.ptr
        p.k, p.v, p.summary_key, p.summary_bias = ptr(self.k), ptr(self.v), ptr(self.key), ptr(self.bias)
        p.summary_type = _library.SUMMARY_TYPES[self.summaries]
        p.summary_scale, p.summary_key_fp32 = ptr(self.scale), ptr(self.key_fp32)
        p.summary_scale_bias = ptr(self.pairs)
        return p

    def _workspace_bytes(self, lengths=None):
        """The most hils_gpu_decode_workspace_bytes over `lengths` (default: the last 2S lengths up
        to the capacity, which hold the largest window, and the most chunks)."""
        S = self.fields["S"]
        if lengths is None:
            lengths = range(max(1, self.capacity - 2 * S + 1), self.capacity + 1)
        p, size, most = self.p, ctypes.c_size_t(), 1
        saved = p.T, p.q
        p.q = p.k  # validate_decode asks for a query pointer; the size does not depend on it
        try:
            for T in lengths:
                p.T = T
                self.lib.decode_call("hils_gpu_decode_workspace_bytes", ctypes.byref(p), ctypes.byref(size))
                most = max(most, size.value)
        finally:
            p.T, p.q = saved
        return most

    # --- summaries -------------------------------------------------------------------------------
    def _summarize(self, q_prior, k, v):
        """hils_gpu_summarize of the complete chunks of q_prior [B, Hq, T, d] (read at the landmark
        slots only), k, v [B, Hkv, T, *]: the B sequences stacked as B * Hq query heads over
        B * Hkv KV heads (head h of sequence b reads KV head (b * Hq + h) / G = b * Hkv + h / G).
        Returns key fp32 [B, Hq, T / S, d] and bias fp32 [B, Hq, T / S]."""
        torch = _stages.torch
        B, Hq, T, d = q_prior.shape
        nc = T // self.fields["S"]
        heads = lambda t: t.reshape(t.shape[0] * t.shape[1], T, t.shape[3]).contiguous()  # noqa: E731
        problem = _stages.problem(dict(self.spec, K=0), heads(q_prior), heads(k), heads(v))
        key = torch.empty(B * Hq, nc, d, device=self.device, dtype=torch.float32)
        bias = torch.empty(B * Hq, nc, device=self.device, dtype=torch.float32)
        self.lib.call("hils_gpu_summarize", ctypes.byref(problem), _stages.ptr(key), _stages.ptr(bias),
                      _stages.stream_ptr())
        return key.view(B, Hq, nc, d), bias.view(B, Hq, nc)

    def _summarize_prefix(self, q_prior, k, v):
        S = self.fields["S"]
        nc = q_prior.shape[2] // S
        if nc == 0:
            return
        key, bias = self._summarize(q_prior, k, v)
        self.priors[:, :, :nc].copy_(q_prior[:, :, S - 1:nc * S:S])
        self._store(0, key, bias)

    def _summarize_chunk(self, c, prior):
        """Chunk c's summary, prior = q~ [B, Hq, d] of its landmark slot (c+1)S - 1: a one-chunk
        problem (T = S) whose q~ is zero but at that slot."""
        torch = _stages.torch
        S = self.fields["S"]
        rows = slice(c * S, (c + 1) * S)
        q_prior = torch.zeros(self.B, self.Hq, S, self.d, device=self.device, dtype=torch.bfloat16)
        q_prior[:, :, S - 1] = prior
        key, bias = self._summarize(q_prior, self.k[:, :, rows], self.v[:, :, rows])
        self.priors[:, :, c] = prior
        self._store(c, key, bias)

    def _store(self, first, key, bias):
        """Summary rows first.. of every (sequence, head) from key fp32 [B, Hq, n, d] and bias
        [B, Hq, n], in the cache's store (the library's quantizers write contiguous rows)."""
        n = key.shape[2]
        rows = slice(first, first + n)
        self.bias[:, :, rows] = bias
        if self.key_fp32 is not None:
            self.key_fp32[:, :, rows] = key
        if self.summaries == "bf16":
            self.key[:, :, rows] = key.to(self.key.dtype)
            return
        codes, side = self._quantize(key.contiguous(), bias.contiguous())
        self.key[:, :, rows] = codes
        (self.pairs if self.summaries == "int4h" else self.scale)[:, :, rows] = side

    def _quantize(self, key, bias):
        """The library's quantizer of the store on key fp32 [..., d] (int4h: and bias) -> (codes,
        the fp32 row scales or the int4h (s16, b'16) pairs)."""
        torch = _stages.torch
        count = key.numel() // self.d
        codes = torch.empty(key.shape[:-1] + self.key.shape[-1:], device=self.device, dtype=self.key.dtype)
        if self.summaries == "int4h":
            side = torch.empty(key.shape[:-1] + (2,), device=self.device, dtype=torch.float16)
            args = (_stages.ptr(key), _stages.ptr(bias), ctypes.c_int64(count), ctypes.c_int64(self.d),
                    _stages.ptr(codes), _stages.ptr(side))
        else:
            side = torch.empty(key.shape[:-1], device=self.device, dtype=torch.float32)
            args = (_stages.ptr(key), ctypes.c_int64(count), ctypes.c_int64(self.d), _stages.ptr(codes),
                    _stages.ptr(side))
        self.lib.decode_call(_QUANTIZER[self.summaries], *args, _stages.stream_ptr())
        return codes, side

    def stored_summaries(self):
        """(k' fp32 [B, Hq, T / S, d], b' fp32 [B, Hq, T / S]) as the step scores them: the store's
        values read back (fp8: e4m3 x row scale; int4: codes x scale; int4h: codes x s16, and b' the
        fp16 b'16 of the pairs), as `hils verify` takes /outputs/summary_key and summary_bias."""
        nc = self.length // self.fields["S"]
        key, bias = self.key[:, :, :nc], self.bias[:, :, :nc]
        if self.summaries == "bf16":
            return key.float(), bias
        if self.summaries == "fp8":
            return key.view(_stages.torch.float8_e4m3fn).float() * self.scale[:, :, :nc, None], bias
        codes = _stages.torch.stack([key & 0xF, key >> 4], dim=-1).flatten(-2).float() - 8.0
        if self.summaries == "int4":
            return codes * self.scale[:, :, :nc, None], bias
        pairs = self.pairs[:, :, :nc].float()
        return codes * pairs[..., :1], pairs[..., 1]

    # --- the steps -------------------------------------------------------------------------------
    def append(self, k, v):
        """Appends slot T of every sequence: k [B, Hkv, d], v [B, Hkv, dv] bf16; T grows by one.
        Refused when the cache is full or the previous append has not been stepped."""
        _bf16("k", k, 3, "[B, Hkv, d]", self.device)
        _bf16("v", v, 3, "[B, Hkv, dv]", self.device)
        what = f"the cache holds B = {self.B} sequences of Hkv = {self.Hkv} KV heads, d = {self.d}, dv = {self.dv}"
        _shape("k", k, (self.B, self.Hkv, self.d), what)
        _shape("v", v, (self.B, self.Hkv, self.dv), what)
        if self._appended:
            raise ValueError(f"append: slot {self.length - 1} was appended and not stepped: call "
                             f"step(q) first (one token per sequence per step; a completed chunk's "
                             f"summary reads the query of its landmark slot)")
        if self.length >= self.capacity:
            raise ValueError(f"append: the cache is full ({self.length} of capacity {self.capacity} "
                             f"slots); make a DecodeCache with a larger capacity")
        T = self.length
        self.k[:, :, T] = k
        self.v[:, :, T] = v
        self.length = T + 1
        self._appended = True
        if self.length % self.fields["S"] == 0:
            self._pending = self.length // self.fields["S"] - 1

    def step(self, q, q_retrieval=None, kernel=None, diagnostics=False, out=None):
        """The decode step of the query at slot T-1 (the one appended last): q [B, Hq, d] bf16,
        q_retrieval the same or None (q~ = q). kernel: a DECODE_KERNEL name (None: the cache's).
        Returns {"o": fp32 [B, Hq, dv], "lse": fp32 [B, Hq], "selection": int32 [B, Hkv, K]}
        (ascending, -1 padded), with diagnostics also "o_window" [B, Hq, dv], "lse_window" [B, Hq],
        "surrogate_scores" [B, Hq, T / S] (-inf outside the candidates) and "fusion_weights"
        [B, Hq, K + 2]. out: None (new tensors), or a dict of exactly those tensors, contiguous on
        the cache's device, which the step writes and returns. When slot T-1 completes a chunk,
        its summary is made first (its prior is this step's q~).

        A step may be captured in a CUDA graph (torch.cuda.graph): the replay runs the step of
        this length T again on what q, q~ and the cache hold then, into the same outputs (pass
        out= to own them); T is a host argument of the C API, so a graph replays one length.
        A captured step that completes a chunk summarizes it inside the graph; with int4h
        summaries it is refused, since the int4h quantizer synchronizes (it reads back its
        refused-row flag, gpu/src/decode_quantize.cu).

        A NaN or an infinity in k (or q~) reaches the summary of its chunk: the bf16, fp8 and int4
        stores keep that row (fp8 and int4 marked: scale NaN, the codes of 0; no synchronisation),
        and once the chunk is a candidate every head of its KV group in that sequence gets NaN o
        and lse (decode.hpp decode_step), every other group the outputs it gets without it; int4h's
        quantizer refuses the row (GpuInvalidArgument naming it) where the chunk is summarized."""
        what = f"the cache holds B = {self.B} sequences of Hq = {self.Hq} query heads, d = {self.d}"
        _bf16("q", q, 3, "[B, Hq, d]", self.device)
        _shape("q", q, (self.B, self.Hq, self.d), what)
        if q_retrieval is not None:
            _bf16("q_retrieval", q_retrieval, 3, "[B, Hq, d]", self.device)
            _shape("q_retrieval", q_retrieval, (self.B, self.Hq, self.d), what)
        kernel = self.kernel if kernel is None else kernel_name(kernel, self.summaries)
        if not self._appended:
            raise ValueError(f"step: no token appended since the last step (T = {self.length}): "
                             f"append(k, v) the new token first; the step runs the query of slot T-1")
        torch = _stages.torch
        if out is not None:
            out = self._check_outputs(torch, out, diagnostics)
        if self._pending is not None and self.summaries == "int4h" and torch.cuda.is_current_stream_capturing():
            raise ValueError(f"step: T = {self.length} completes chunk {self._pending}, whose int4h summary "
                             f"cannot be captured in a CUDA graph (the int4h quantizer synchronizes the "
                             f"stream to report a refused row, gpu/src/decode_quantize.cu); run this step "
                             f"eagerly and capture steps that complete no chunk")
        with torch.cuda.device(self.device):
            q = q.contiguous()
            q_retrieval = None if q_retrieval is None else q_retrieval.contiguous()
            if self._pending is not None:
                self._summarize_chunk(self._pending, q if q_retrieval is None else q_retrieval)
                self._pending = None
            if out is None:
                out = self._outputs(torch, diagnostics)
            self._run(q, q_retrieval, kernel, out)
        self._appended = False
        self._last = (self.length, q, q if q_retrieval is None else q_retrieval, kernel)
        return out

    def output_shapes(self, diagnostics=False):
        """name -> (shape, torch dtype) of the step's outputs at the cache's length T (what
        step(..., out=) takes)."""
        torch = _stages.require_torch()
        B, Hq, K = self.B, self.Hq, self.fields["K"]
        shapes = {"o": ((B, Hq, self.dv), torch.float32), "lse": ((B, Hq), torch.float32),
                  "selection": ((B, self.Hkv, K), torch.int32)}
        if diagnostics:
            shapes.update(o_window=((B, Hq, self.dv), torch.float32), lse_window=((B, Hq), torch.float32),
                          surrogate_scores=((B, Hq, self.length // self.fields["S"]), torch.float32),
                          fusion_weights=((B, Hq, K + 2), torch.float32))
        return shapes

    def _outputs(self, torch, diagnostics):
        return {name: torch.empty(shape, device=self.device, dtype=dtype)
                for name, (shape, dtype) in self.output_shapes(diagnostics).items()}

    def _check_outputs(self, torch, out, diagnostics):
        """out (step's out=) checked: exactly the step's outputs, each a contiguous CUDA tensor on
        the cache's device of output_shapes' shape and dtype; TypeError / ValueError naming it."""
        if not isinstance(out, Mapping):
            raise TypeError(f"out: expected a dict of output tensors or None, found {type(out).__name__}")
        shapes = self.output_shapes(diagnostics)
        if set(out) != set(shapes):
            raise ValueError(f"out: expected the keys {sorted(shapes)} (diagnostics={diagnostics}), "
                             f"found {sorted(out)}")
        for name, (shape, dtype) in shapes.items():
            t = out[name]
            if not isinstance(t, torch.Tensor):
                raise TypeError(f"out[{name!r}]: expected a torch CUDA tensor, found {type(t).__name__}")
            if t.device != self.device:
                raise ValueError(f"out[{name!r}]: expected a tensor on the cache's device {self.device}, "
                                 f"found {t.device}")
            if t.dtype != dtype:
                raise TypeError(f"out[{name!r}]: expected dtype {dtype}, found {t.dtype}")
            if tuple(t.shape) != shape:
                raise ValueError(f"out[{name!r}]: expected shape {list(shape)} (T = {self.length}), "
                                 f"found {list(t.shape)}")
            if not t.is_contiguous():
                raise ValueError(f"out[{name!r}]: expected a contiguous tensor (the step writes rows "
                                 f"densely), found strides {t.stride()}")
        return {name: out[name] for name in shapes}

    def _run(self, q, q_retrieval, kernel, out):
        torch, ptr = _stages.torch, _stages.ptr
        p = self.p
        p.T, p.q, p.q_retrieval = self.length, ptr(q), ptr(q_retrieval)
        p.kernel = _library.kernel_code("decode_kernel", kernel)
        needed = self._workspace_bytes([self.length])  # also the library's checks of this step
        if needed > self.workspace.numel():  # not expected: the first size is the most
            self.workspace = torch.empty(needed, device=self.device, dtype=torch.uint8)
        outputs = _library.DecodeOutputs(*(ptr(out.get(name)) for name in (
            "o", "lse", "selection", "o_window", "lse_window", "surrogate_scores", "fusion_weights")))
        self.lib.decode_call("hils_gpu_decode_step", ctypes.byref(p), ctypes.byref(outputs),
                             ptr(self.workspace), _stages.stream_ptr())

    # --- judging a step --------------------------------------------------------------------------
    def verify_arguments(self, out, b=0):
        """hils.verify's arguments for sequence b of the last step, whose outputs are `out`:

            report = hils.verify(**cache.verify_arguments(out, b))

        spec, k and v of the cache's T slots, q and q_retrieval [Hq, T, d] (numpy float32, the
        bf16 values) holding what query T-1 reads (q: the step's q at slot T-1; q_retrieval: the
        step's q~ at T-1 and each chunk's prior at its landmark slot; zero elsewhere:
        reference/SEMANTICS.md §2-5 read no other row for it; hils.decoding.query_inputs,
        which hils.verify_decode uses too), queries [T-1], outputs (o, lse, selection, the stored summaries as the
        step scored them, and the diagnostics when the step made them, each [heads, 1, ...]),
        input_precision bf16 and the store's score_precision (SUMMARY_STORES)."""
        if not isinstance(out, Mapping) or "o" not in out or "lse" not in out:
            raise TypeError("out: expected the dict a step returned ({\"o\": ..., \"lse\": ..., ...})")
        b = _count("b", b, 0)
        if b >= self.B:
            raise ValueError(f"b: expected a sequence 0..{self.B - 1}, got {b}")
        if self._last is None or self._last[0] != self.length:
            raise ValueError(f"out: the cache has no step at its length T = {self.length} (a step's "
                             f"outputs are judged before the next append)")
        T, q, q_tilde, kernel = self._last
        if tuple(out["o"].shape) != (self.B, self.Hq, self.dv):
            raise ValueError(f"out['o']: expected shape {[self.B, self.Hq, self.dv]} (a step's "
                             f"output), found {list(out['o'].shape)}")
        S = self.fields["S"]
        nc = T // S
        q_full, q_retrieval = query_inputs(T, S, as_numpy(q[b])[:, None],
                                           as_numpy(q_tilde[b])[:, None],
                                           as_numpy(self.priors[b, :, :nc]))
        outputs = {name: out[name][b, :, None] for name in ("o", "lse", "selection") + _DIAGNOSTICS
                   if name in out}
        if nc > 0:
            key, bias = self.stored_summaries()
            outputs.update(summary_key=key[b], summary_bias=bias[b])
        return {"spec": self.spec, "q": q_full, "k": self.k[b, :, :T], "v": self.v[b, :, :T],
                "outputs": outputs, "q_retrieval": q_retrieval, "queries": [T - 1],
                "input_precision": "bf16", "score_precision": SUMMARY_STORES[self.summaries],
                "kernel": f"hils.gpu.DecodeCache step {kernel}, {self.summaries} summaries "
                          f"(sequence {b} of {self.B}, T = {T})"}

    def __repr__(self):
        return (f"hils.gpu.DecodeCache(B={self.B}, Hq={self.Hq}, Hkv={self.Hkv}, d={self.d}, "
                f"dv={self.dv}, T={self.length}, capacity={self.capacity}, "
                f"summaries={self.summaries!r}, kernel={self.kernel!r})")

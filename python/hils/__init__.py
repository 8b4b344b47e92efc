"""hils-sim's double-precision reference and its oracle, for Python (pytest, notebooks).

    import hils
    report = hils.verify({"preset": "hils", "S": 64, "W": 512, "K": 32}, q, k, v,
                         {"o": o, "lse": lse, "selection": sel}, input_precision="bf16")
    print(report)            # the text `hils verify` prints for the same data
    assert report.passed

Arrays follow the verify file's layout (data/verify_format.md): q [Hq, T, d], k [Hkv, T, d],
v [Hkv, T, dv], q_retrieval [Hq, T, d], prior [Hq, rows, d]; kernel outputs by the same names
(its /outputs datasets; hils._core.output_names lists them: o, lse, selection, ...). A kernel's
own order and batch are one call: layout="bshd" (FlashAttention's [B, T, H, d], with
lse_layout="bhsd" for its softmax_lse [B, H, T]), "bhsd" (SDPA, FlexAttention) or "shd";
selection_order="any" for top-K rows in score order; packed (varlen) batches with cu_seqlens=
and layout="thd" (FlashAttention's flash_attn_varlen_func) or "bshd" with B = 1 (fla-org's
parallel_nsa) (hils/layouts.py); a decode step of B sequences of ragged lengths over a dense or
paged cache is hils.verify_decode (hils/decoding.py). Any float dtype and
anything numpy converts are accepted; torch tensors on any device and in any float dtype (bf16,
fp16 included) are converted by `as_numpy`. The work runs in C++ (the same code as `hils verify`)
with the GIL released; Ctrl-C on the main thread (with Python's default SIGINT handler) raises
KeyboardInterrupt at the reference's next query block.

Bad input raises TypeError (a wrong type or dtype) or ValueError (a wrong shape, NaN or Inf
in an input, an unknown spec key or output name, a value out of range), naming the argument.

The compiled part (hils._core) loads at first use, not at `import hils`: a Python it was not
built for can still import hils.gpu (the CUDA kernels over torch tensors, libhils_gpu_c.so
through ctypes), and is told at the first verify/reference call which _core it found.
"""

import importlib
import json
import os
import sys
from collections.abc import Mapping

import numpy as np

from . import decoding as _decoding
from . import layouts as _layouts


def _core_module():
    """hils._core, imported once; ImportError naming the interpreter and the _core files found
    when it cannot be loaded (a build for another Python version: Python's own message, "cannot
    import name '_core'", names neither). Called by verify, Verifier, reference and the report
    classes, so that `import hils` and `import hils.gpu` work where _core cannot load (the GPU
    machine's Python runs gpu/bench with only libhils_gpu_c.so)."""
    try:
        return importlib.import_module(__name__ + "._core")  # once; then sys.modules' copy
    except ImportError as error:
        here = os.path.dirname(os.path.abspath(__file__))
        built = sorted(name for name in os.listdir(here) if name.startswith("_core"))
        raise ImportError(
            f"hils: the compiled module hils._core in {here} cannot be loaded by this Python "
            f"({sys.executable}, {sys.version.split()[0]}): found {', '.join(built) or 'no _core file'}"
            f" ({error}); build hils with this interpreter (cmake -DPython_EXECUTABLE="
            f"{sys.executable}, or pip install .) or run the one it was built for") from error


def __getattr__(name):
    # PEP 562: the report classes come from _core at first use.
    if name == "_core":
        return _core_module()
    if name in ("Report", "SelectionReport", "TensorReport"):
        return getattr(_core_module(), name)
    raise AttributeError(f"module 'hils' has no attribute {name!r}")


__all__ = ["verify", "verify_decode", "Verifier", "reference", "hard_cases", "as_numpy", "Report",
           "TensorReport", "SelectionReport", "BatchReport"]

BatchReport = _layouts.BatchReport
from .cases import hard_cases  # noqa: E402  (cases.py reads this module's helpers at call time)


def as_numpy(array, name="array"):
    """A torch tensor (any device; bf16 and fp16 widened to float32, exactly, on the CPU) or
    anything np.asarray accepts -> a numpy array of the same values. `name` goes into the
    TypeError raised for something that is not an array of numbers, and into the ValueError of
    hils._core's memory check (the one every array meets), which a bf16 or fp16 tensor meets
    before it is widened."""
    if type(array).__module__.startswith("torch") and hasattr(array, "detach"):
        return _torch_values(array, name)
    try:
        return np.asarray(array)
    except (TypeError, ValueError) as error:
        raise TypeError(f"{name}: expected an array of numbers, found {type(array).__name__} "
                        f"({error})") from None


def _torch_values(array, name):
    """as_numpy of a torch tensor. A bf16 or fp16 one is copied to the CPU and widened there only
    once the oracle's float64 copy of it is known to fit (hils._core's check): an expanded
    (stride-0) or too large tensor was widened first, torch's allocation error came back as
    "expected a dense torch tensor" (a TypeError) or the widened copy took the memory the check
    would have refused."""
    try:
        tensor = array.detach()
        narrow = tensor.is_floating_point() and str(tensor.dtype) not in ("torch.float32",
                                                                          "torch.float64")
    except Exception as error:
        raise _not_dense(name, array, error) from None
    if narrow:  # the size alone, through a broadcast view that holds no values
        _core_module().require_fits_in_memory(name, np.broadcast_to(np.float32(0),
                                                                    tuple(tensor.shape)))
    try:
        tensor = tensor.cpu()
        return (tensor.float() if narrow else tensor).numpy()
    except Exception as error:
        raise _not_dense(name, array, error) from None


def _not_dense(name, array, error):
    # sparse, meta, quantized...: torch's own error, named.
    return TypeError(f"{name}: expected a dense torch tensor of numbers, found "
                     f"{type(array).__name__} ({type(error).__name__}: {error})")


def _queries(queries):
    # None (every query) or a non-empty list of slots; an empty list would read as "every query".
    if queries is None:
        return None
    array = as_numpy(queries, "queries")
    if array.size == 0:
        raise ValueError("queries: expected at least one query slot (None computes all T), "
                         "found an empty array")
    return array


def _json_scalar(value):
    # numpy scalars (np.int64(64), np.float32(0.125), np.bool_) -> their Python values.
    if isinstance(value, np.generic):
        return value.item()
    raise TypeError(f"spec: expected JSON values (str, int, float, bool), found "
                    f"{type(value).__name__} {value!r}")


def _spec_json(spec):
    # The spec dict -> the JSON text the verify file's spec attribute would hold.
    if not isinstance(spec, Mapping):
        raise TypeError(f"spec: expected a dict such as {{\"preset\": \"hils\", \"S\": 64}}, "
                        f"found {type(spec).__name__}")
    try:
        return json.dumps(dict(spec), default=_json_scalar, allow_nan=False)
    except ValueError as error:
        raise ValueError(f"spec: expected finite numbers, found a NaN or Inf ({error})") from None


def _spec_fields(spec):
    """spec -> {field: value} for every field (name, fusion, key_rule, bias_rule, prior_rule,
    group_rule, softmax1, S, W, K, landmarks, scale), decoded and validated by the C++ codec as
    hils.verify's spec is: what hils.verify_decode, hils.hard_cases and a chunked prefill read
    before an oracle is built. They read hils.gpu.spec.resolve's fields, a second validator:
    {"S": 0} was a ZeroDivisionError, {"S": "16"} a TypeError where hils.verify raises
    ValueError, {"K": 4.0} refused where hils.verify accepts it, and importing hils.gpu loaded
    torch where installed (1.25 s)."""
    return json.loads(_core_module().spec_fields(_spec_json(spec)))


def _text(value, name, expected):
    if not isinstance(value, str):
        raise TypeError(f"{name}: expected {expected}, found {type(value).__name__} {value!r}")
    return value


def _quoted(names):
    """names -> '"a", "b" or "c"' (as the oracle's messages list them)."""
    quoted = [f'"{name}"' for name in names]
    return ", ".join(quoted[:-1]) + " or " + quoted[-1] if len(quoted) > 1 else "".join(quoted)


def _inputs(q, k, v, q_retrieval, prior):
    arrays = {"q": q, "k": k, "v": v, "q_retrieval": q_retrieval, "prior": prior}
    return {name: (None if a is None else as_numpy(a, name)) for name, a in arrays.items()}


class Verifier:
    """The oracle for one problem (spec, inputs and options), to judge several kernels' outputs:
    the reference runs in double and in float once, when it is built (the bulk of verify's
    time); each .verify(outputs) then costs only what depends on those outputs (the oracle fuses
    again only the query blocks where a kernel's selection differs from the reference's).
    hils.Verifier(spec, q, k, v, **problem).verify(outputs, **judging) is hils.verify(spec, q,
    k, v, outputs, **problem, **judging), report for report: the constructor takes hils.verify's
    arguments of the problem (layout, input_precision, score_precision, bf16_rounding,
    q_retrieval, prior, queries, max_messages, cu_seqlens, cu_seqlens_k, landmark_queries),
    .verify those of one kernel's arrays (kernel, do, dlse, grads, lse_layout,
    selection_order). A batched or packed (cu_seqlens=) layout builds one oracle per sequence.

        oracle = hils.Verifier(spec, q, k, v, input_precision="bf16")
        for name, kernel in kernels.items():
            assert oracle.verify(kernel(q, k, v), kernel=name).passed
    """

    def __init__(self, spec, q, k, v, *, layout="hsd", input_precision="fp32",
                 score_precision="fp32", bf16_rounding="detect", q_retrieval=None, prior=None,
                 queries=None, max_messages=8, cu_seqlens=None, cu_seqlens_k=None,
                 landmark_queries=None):
        self._start(spec, _layouts.batch_of(layout, _inputs(q, k, v, q_retrieval, prior),
                                            _queries(queries), cu_seqlens, cu_seqlens_k,
                                            landmark_queries, spec),
                    input_precision, score_precision, bf16_rounding, max_messages)

    def _start(self, spec, batch, input_precision, score_precision, bf16_rounding, max_messages):
        precisions, max_messages = _options(input_precision, score_precision, bf16_rounding,
                                            max_messages)
        spec_json = _spec_json(spec)
        self._batch = batch
        self._cores = _oracles(spec_json, batch, precisions, max_messages)

    @classmethod
    def _of(cls, spec, batch, input_precision, score_precision, bf16_rounding, max_messages):
        oracle = cls.__new__(cls)
        oracle._start(spec, batch, input_precision, score_precision, bf16_rounding, max_messages)
        return oracle

    def verify(self, outputs, *, kernel=None, do=None, dlse=None, grads=None, lse_layout=None,
               selection_order="ascending"):
        """Judges one kernel's outputs ({name: array}); kernel, do, dlse, grads, lse_layout and
        selection_order as hils.verify's. Returns a Report (a BatchReport for a batched layout)."""
        return self._judge(_kernel_batch(self._batch, outputs, do, dlse, grads, lse_layout,
                                         selection_order), _kernel_name(kernel))

    def _judge(self, arrays, kernel_name):
        reports = _reports(self._batch, self._cores, arrays, kernel_name)
        if not self._batch.layout.batched:
            return reports[0]
        return _layouts.BatchReport(reports, self._batch.layout.name, self._batch.lengths,
                                    counts=self._batch.query_counts(), offsets=self._batch.offsets)


def _oracles(spec_json, batch, precisions, max_messages):
    """One C++ oracle per sequence of `batch` (a layouts.Batch or a decoding.DecodeStep: .inputs,
    .size, query_slots(b), judged(b)), None for one with nothing to judge (an empty packed
    sequence). batch.size: the memory checks give each sequence its share (all are kept)."""
    return [(_per_sequence(batch, b, lambda: _core_module().Verifier(
                 spec_json, batch.inputs[b], *precisions, batch.query_slots(b), max_messages,
                 batch.size))
             if batch.judged(b) else None)
            for b in range(batch.size)]


def _reports(batch, cores, arrays, kernel_name):
    """Each sequence's Report of a kernel's arrays (None where its oracle is None)."""
    return [(None if core is None else
             _per_sequence(batch, b, lambda: core.verify(arrays[b], kernel_name)))
            for b, core in enumerate(cores)]


def _options(input_precision, score_precision, bf16_rounding, max_messages):
    """The oracle's options checked: ((input_precision, score_precision, bf16_rounding),
    max_messages capped; more than there are = all)."""
    if isinstance(max_messages, bool) or not isinstance(max_messages, (int, np.integer)):
        raise TypeError(f"max_messages: expected an integer, found {type(max_messages).__name__}")
    core = _core_module()
    return ((_text(input_precision, "input_precision", _quoted(core.input_precisions)),
             _text(score_precision, "score_precision", _quoted(core.score_precisions)),
             _text(bf16_rounding, "bf16_rounding", '"detect", "any", "nearest" or "toward_zero"')),
            min(int(max_messages), 2**62))


def _per_sequence(batch, b, call):
    """call() for sequence b; a TypeError or ValueError it raises gains where it comes from (the
    sequence and the layout's reading of it; nothing in the verify file's own layout)."""
    context = batch.context(b)
    if not context:
        return call()
    try:
        return call()
    except (TypeError, ValueError) as error:
        raise type(error)(f"{error}{context}") from None


def _kernel_name(kernel):
    return "" if kernel is None else _text(kernel, "kernel", "a name (str)")


def _kernel_arrays(outputs, do, dlse, grads):
    """A kernel's outputs, upstream gradients and gradients, converted and checked (names, dtypes,
    do and dlse values) -> the core's KernelArrays. No reference runs here."""
    if not isinstance(outputs, Mapping):
        raise TypeError(f"outputs: expected a dict of arrays such as {{\"o\": o, \"lse\": lse}}, "
                        f"found {type(outputs).__name__}")
    kernel_outputs = {name: (None if a is None else as_numpy(a, f"outputs[{name!r}]"))
                      for name, a in outputs.items()}
    if grads is not None and not isinstance(grads, Mapping):
        raise TypeError(f"grads: expected a dict of arrays such as {{\"dq\": dq}}, "
                        f"found {type(grads).__name__}")
    kernel_grads = {name: (None if a is None else as_numpy(a, f"grads[{name!r}]"))
                    for name, a in (grads or {}).items()}
    return _core_module().KernelArrays(
        kernel_outputs, None if do is None else as_numpy(do, "do"),
        None if dlse is None else as_numpy(dlse, "dlse"), kernel_grads)


def _numpy_values(arrays, label):
    # {name: array} -> {name: numpy array}; anything else (not a dict) as it is, for
    # _kernel_arrays to name.
    if not isinstance(arrays, Mapping):
        return arrays
    return {name: (None if a is None else as_numpy(a, label(name))) for name, a in arrays.items()}


def _kernel_batch(batch, outputs, do, dlse, grads, lse_layout, selection_order):
    """A kernel's arrays in the batch's layout -> one checked KernelArrays per sequence, its
    tensors in the verify file's order (hils/layouts.py), selection rows sorted when
    selection_order is "any". The per-sequence path (_kernel_arrays) does every check."""
    lse_layout = _layouts.lse_layout_of(lse_layout, batch.layout)
    order = _layouts.selection_order_of(selection_order)
    outputs = batch.split(_numpy_values(outputs, lambda n: f"outputs[{n!r}]"),
                          lambda n: f'outputs["{n}"]', lse_layout)
    grads = ([None] * batch.size if grads is None else
             batch.split(_numpy_values(grads, lambda n: f"grads[{n!r}]"), lambda n: f'grads["{n}"]', None))
    do = batch.one(None if do is None else as_numpy(do, "do"), "do")
    dlse = batch.one(None if dlse is None else as_numpy(dlse, "dlse"), "dlse", lse_layout)
    if order == "any":
        outputs = [(_layouts.sort_selection(out) if isinstance(out, Mapping) else out)
                   for out in outputs]
    return [(_per_sequence(batch, b, lambda: _kernel_arrays(outputs[b], do[b], dlse[b], grads[b]))
             if batch.judged(b) else None)  # an empty sequence's rows: none
            for b in range(batch.size)]


def verify(spec, q, k, v, outputs, *, layout="hsd", lse_layout=None, selection_order="ascending",
           input_precision="fp32", score_precision="fp32", bf16_rounding="detect",
           q_retrieval=None, prior=None, queries=None, kernel=None, max_messages=8, do=None,
           dlse=None, grads=None, cu_seqlens=None, cu_seqlens_k=None, landmark_queries=None):
    """Judges a kernel's outputs against the reference in double (truth) and float (baseline).

    spec: a dict with the verify file's spec keys ({"preset": "nsa", "S": 64, "W": 512, ...}).
    outputs: {name: array}; a stage that is absent (or None) is not compared.
    layout: the order of the axes of every array (inputs, outputs, do, dlse, grads): "hsd" (the
        verify file's, [Hq, T, d], default), "shd" ([T, Hq, d]), "bhsd" ([B, Hq, T, d]: SDPA,
        FlexAttention) or "bshd" ([B, T, Hq, d]: FlashAttention, fla-org NSA); every other
        tensor follows the same rule (hils/layouts.py, data/verify_format.md "Kernel layouts and
        batches"). A batched layout judges every sequence and returns a BatchReport.
        With cu_seqlens: "thd" ([total, Hq, d]: FlashAttention's flash_attn_varlen_func), "htd"
        ([Hq, total, d]), or "bshd" / "bhsd" with B = 1 (fla-org's parallel_nsa with cu_seqlens).
    cu_seqlens: packed sequences, int32 or int64 [B + 1] (0, then each sequence's end row):
        sequence b is rows cu_seqlens[b]..cu_seqlens[b+1]-1 of every tensor's rows axis, judged
        as its own problem (positions and selection ids counted from its first row); returns a
        BatchReport (data/verify_format.md "Packed sequences (varlen)"). An empty sequence
        (cu_seqlens[b] = cu_seqlens[b+1]; with cu_seqlens_k, any Tq_b = 0) is nothing to judge:
        its .reports[b] is None; a pack with no query at all is refused.
    cu_seqlens_k: with cu_seqlens, the keys' offsets when they differ from the queries'
        (FlashAttention's cu_seqlens_k beside cu_seqlens_q: chunked prefill, prefix caching):
        k and v split at cu_seqlens_k, q, q_retrieval and the outputs at cu_seqlens; sequence
        b's Tq_b queries are its last Tq_b of Tk_b slots (the causal mask aligned to the bottom
        right) and are judged in its whole problem of Tk_b slots (data/verify_format.md
        "Chunked prefill and prefix caching").
    landmark_queries: with cu_seqlens_k, where the summaries read a prior (the hils preset):
        the q~ of the landmark slots (c+1)S - 1 of the chunks before each sequence's first
        query, [B, n_chunks, Hq, d] ("thd", "bshd") or [B, Hq, n_chunks, d] ("htd", "bhsd").
    lse_layout: the layout whose order lse, lse_window and dlse come in when it differs from
        layout's: FlashAttention's softmax_lse is [B, Hq, T] beside its "bshd" o, lse_layout="bhsd"
        (and [Hq, total] beside its varlen "thd" o: lse_layout="htd").
    selection_order: "ascending" (the verify file's rows: chunks ascending, -1 padding last) or
        "any" (each row a set in any order, e.g. torch.topk's score order: sorted before judging,
        fusion_weights' first K columns with it; duplicates, chunks out of range and padding
        other than -1 still fail).
    input_precision: "fp32", "bf16" or "fp16" (the inputs the kernel computed from; the oracle
        rounds q, k, v to it; fp16: FlashAttention's fp16 path, fp16 o, fp32 lse, its floors
        an absolute term for values below fp16's normal range; a gradient whose term reaches
        its largest entry is named in report.not_compared); score_precision: "fp32", "bf16"
        or a store of k' that data/verify_format.md describes (hils._core.score_precisions
        lists them all).
    bf16_rounding: how a bf16-score kernel converts its summaries and scores to bf16, as the
    verify file's bf16_rounding attribute says it: "detect" (read from a bf16-stored lse or o,
    else either is accepted), "any", "nearest" or "toward_zero". Declaring "nearest" gives the
    statistics over all lse rows their full power (data/verify_format.md "Statistics over all
    rows").
    queries: the query slots computed (strictly ascending), when not all T; one list for every
    sequence of a batch.
    kernel: a name for the report. max_messages: problems listed per tensor.
    do, dlse, grads: a backward kernel's upstream gradients do [Hq, T, dv] (dlse [Hq, T]
    optional) and its gradients {"dq", "dk", "dv", "dq_retrieval", "dprior": array}, judged
    against the fp64 backward with the kernel's outputs["selection"] held fixed (the verify
    file's /inputs/do, /inputs/dlse, /grads; data/verify_format.md "Gradients").
    Returns a Report: .passed, .tensors[name] (max_abs, max_rel, nmse, tolerance, headroom,
    passed, ...), .selection (rows_differing, rows_accepted, max_accepted_margin, bound, ...);
    str(report) is the text `hils verify` prints below the line naming the file. For a batched
    layout a BatchReport: .passed (every sequence passes), .failed (the b that fail),
    .reports[b] (sequence b's Report, None for an empty packed sequence, .empty lists them);
    str() one line per sequence, then each failure in full.
    """
    # The kernel's arrays are checked first: a bad output is reported before the reference runs.
    kernel_name, queries = _kernel_name(kernel), _queries(queries)
    batch = _layouts.batch_of(layout, _inputs(q, k, v, q_retrieval, prior), queries, cu_seqlens,
                              cu_seqlens_k, landmark_queries, spec)
    arrays = _kernel_batch(batch, outputs, do, dlse, grads, lse_layout, selection_order)
    oracle = Verifier._of(spec, batch, input_precision, score_precision, bf16_rounding,
                          max_messages)
    return oracle._judge(arrays, kernel_name)


def reference(spec, q, k, v, *, layout="hsd", lse_layout=None, q_retrieval=None, prior=None,
              queries=None, cu_seqlens=None, cu_seqlens_k=None, landmark_queries=None):
    """The mechanism in double precision (the oracle's truth) -> dict of numpy arrays:
    o [Hq, Tq, dv], lse [Hq, Tq], fusion_weights [Hq, Tq, K+2] (float64), and where the
    mechanism has them: selection [Hkv, Tq, K] (int64, ascending, -1 padded),
    surrogate_scores [Hq, Tq, n_chunks] (-inf outside V(t)), o_window, lse_window,
    summary_key [Hq, n_chunks, d], summary_bias [Hq, n_chunks]. With layout= (and lse_layout=)
    as hils.verify's, the inputs are read and every array returned in that layout, e.g. o
    [B, Tq, Hq, dv] for "bshd" (one reference per sequence). With cu_seqlens= (a packed layout,
    as hils.verify's) the arrays whose axes are the same in every sequence come packed, and
    summary_key, summary_bias and surrogate_scores as a list of one array per sequence (an
    empty sequence: zero rows in the packed arrays, None in these lists); with
    cu_seqlens_k (and landmark_queries) as hils.verify's, each sequence's last Tq_b rows."""
    spec_json, queries = _spec_json(spec), _queries(queries)
    batch = _layouts.batch_of(layout, _inputs(q, k, v, q_retrieval, prior), queries, cu_seqlens,
                              cu_seqlens_k, landmark_queries, spec)
    lse_layout = _layouts.lse_layout_of(lse_layout, batch.layout)
    parts = [(_per_sequence(batch, b, lambda: _core_module().reference(
                  spec_json, batch.inputs[b], batch.query_slots(b), batch.size))  # all kept
              if batch.judged(b) else None)
             for b in range(batch.size)]
    template = next(part for part in parts if part is not None)  # a pack has one (layouts.py)
    return batch.join([batch.empty_part(template) if part is None else part for part in parts],
                      lse_layout)


def verify_decode(spec, q, k_cache, v_cache, outputs, *, cache_seqlens, block_table=None,
                  cache_layout="bshd", q_retrieval=None, landmark_queries=None,
                  selection_order="ascending", input_precision="fp32", score_precision="fp32",
                  bf16_rounding="detect", kernel=None, max_messages=8):
    """Judges a decode step of B sequences of ragged lengths, one new query each, in one call
    (FlashAttention's flash_attn_with_kvcache, vLLM's and FlashInfer's paged decode), and returns
    a BatchReport: sequence b is hils.verify's judgement of its query at slot T-1, T =
    cache_seqlens[b], with queries=[T-1] (hils/decoding.py; data/verify_format.md "Decode steps").

    q: the step's queries [B, Hq, d]. k_cache, v_cache: dense [B, capacity, Hkv, d] or, with
        block_table [B, max_pages] (int), pages [num_pages, page_size, Hkv, d]; cache_layout="bhsd"
        for [B, Hkv, capacity, d] / [num_pages, Hkv, page_size, d]. Only each sequence's T slots
        are read (torch tensors are indexed before they are converted).
    cache_seqlens: [B] ints, T of each sequence, the new token's slot included (FlashAttention's
        cache_seqlens when the kernel is not given k=, v=; with them, cache_seqlens + 1).
    outputs: {"o": [B, Hq, dv], "lse": [B, Hq], "selection": [B, Hkv, K]} and optionally
        "o_window", "lse_window" [B, Hq(, dv)], "fusion_weights" [B, Hq, K+2].
    q_retrieval: the step's q~ [B, Hq, d] (None: q~ = q).
    landmark_queries: where the mechanism's summaries read a prior (taylor keys or the entropy
        bias: the hils preset), each chunk's prior, the q~ of its landmark slot: [B, n_chunks,
        Hq, d] ([B, Hq, n_chunks, d] with cache_layout="bhsd"); required there, refused elsewhere.
    selection_order, input_precision, score_precision, bf16_rounding, kernel, max_messages: as
        hils.verify's."""
    fields = _spec_fields(spec)
    kernel_name, spec_json = _kernel_name(kernel), _spec_json(spec)
    order = _layouts.selection_order_of(selection_order)
    step = _decoding.DecodeStep(fields, q, k_cache, v_cache, cache_seqlens, block_table,
                                cache_layout, q_retrieval, landmark_queries)
    outputs = step.outputs(outputs)
    if order == "any":
        outputs = [_layouts.sort_selection(out) for out in outputs]
    arrays = [_per_sequence(step, b, lambda: _kernel_arrays(outputs[b], None, None, None))
              for b in range(step.size)]
    precisions, max_messages = _options(input_precision, score_precision, bf16_rounding,
                                        max_messages)
    cores = _oracles(spec_json, step, precisions, max_messages)
    return _layouts.BatchReport(_reports(step, cores, arrays, kernel_name), step.layout,
                                step.lengths, step.title())

"""hils.gpu.forward in a kernel's own layout, with a batch: the layouts and their rules are
hils/layouts.py's, the ones hils.verify's layout= reads (data/verify_format.md "Kernel layouts
and batches"), so that

    out = hils.gpu.forward(q, k, v, spec, layout="bshd")
    report = hils.verify(spec, q, k, v, out, layout="bshd", **hils.gpu.verify_options(spec, q))

judges what was computed. The library computes one sequence at a time, head-major (q [Hq, T, d]
contiguous, gpu/include/hils/gpu/c_api.h): a batch is a loop over its sequences on torch's
current stream, one Stages whose intermediate buffers serve every sequence of one length (a
packed batch, cu_seqlens=, builds a new one where a sequence's length differs from the one
before it: Stages' buffers have its problem's shapes). What is copied:
a sequence's input whose [heads, T, d] view is not contiguous ("shd", "bshd" with more than one
head, or a strided tensor) is copied to a contiguous one, one sequence at a time; an output
whose [heads, T, ...] view of the result is contiguous ("hsd", "bhsd") is written there by the
kernels, any other is written to one sequence's buffer and copied into the result. README
"Calling the GPU kernels" gives what this costs, measured."""

from .. import layouts as _layouts
from . import stages as _stages

INPUTS = ("q", "k", "v", "q_retrieval", "prior")
# The Stages buffer that holds each output, by fusion (the selecting fusions: flat, hierarchical).
_BUFFERS = {"full": {"o": "o", "lse": "lse"}, "window": {"o": "o_swa", "lse": "lse_swa"}}
_SELECTING = {"o": "o", "lse": "lse", "selection": "selection"}


def layouts(layout, lse_layout, q=None, cu_seqlens=None):
    """layout= and lse_layout= (hils.verify's) -> (Layout, Layout or None); ValueError /
    TypeError naming the argument and the names it takes. With cu_seqlens (a packed layout:
    "thd", "htd", "bshd" / "bhsd" with B = 1): Packed layouts bound to its offsets, checked
    against q's rows (q checked as a CUDA tensor of the layout's rank first)."""
    _layouts.check_packing(layout, cu_seqlens)
    if cu_seqlens is None:
        layout = _layouts.Layout(layout)
    else:
        _tensor(_layouts.Packed(layout, [0, 0]), "q", q, q, ("float32", "bfloat16"), "")
        layout = _layouts.packed_layout(layout, q, cu_seqlens)
    return layout, _layouts.lse_layout_of(lse_layout, layout)


def _tensor(layout, name, t, q, dtypes, dtype_why):
    """Input `name`: a torch CUDA tensor of one of `dtypes` of the layout's rank for its name,
    of q's dtype and device (TypeError / ValueError naming it and its shape in `layout`)."""
    shape = f"{layout.pattern(name)} (layout \"{layout.name}\")"
    _stages.cuda_tensor(name, t, len(layout.axes(name)), shape, dtypes,
                        f"a torch CUDA tensor ({' or '.join(dtypes)}) {shape}", dtype_why)
    if name != "q":
        _stages.same(name, t, "q", q, "dtype")
        _stages.same(name, t, "q", q, "device")


def check(layout, inputs, dtypes=("float32", "bfloat16"), dtype_why=""):
    """inputs ({name: tensor or None} of INPUTS; q, k and v required) in `layout`: torch CUDA
    tensors of one of `dtypes` (all q's) on q's device, each of the layout's shape for its name
    (k [B, T, Hkv, d] in "bshd", ...), B >= 1, Hkv dividing Hq. TypeError / ValueError naming
    the argument and its expected shape in `layout` (dtype_why: what a dtype refusal adds),
    before any library call. Returns {axis: length} (B, Hq, Hkv, T, d, dv, and rows where a
    prior is given; B = 1 for an unbatched layout; for a packed one B sequences, "1" and
    "total" instead of T)."""
    q = inputs["q"]
    packed = isinstance(layout, _layouts.Packed)
    for name in INPUTS:
        t = inputs.get(name)
        if t is None and name in ("q_retrieval", "prior"):
            continue
        if packed:
            layout.check_packable(name, name)
        _tensor(layout, name, t, q, dtypes, dtype_why)
    if packed:  # B, "1" and total from the offsets: every tensor's rows are read against them
        sizes, read = layout.sizes(), [f"total = cu_seqlens[-1] = {layout.offsets[-1]}"]
    else:
        sizes, read = {"B": layout.batch_size(q)}, []
    for name in INPUTS:
        t = inputs.get(name)
        if t is not None:
            sizes = layout.read_sizes(t, name, name, sizes, "; ".join(read))
            read.append(f"{name} is {layout.pattern(name)} = {list(t.shape)}")
    if sizes["Hkv"] < 1 or sizes["Hq"] % sizes["Hkv"] != 0:
        raise ValueError(f"k: expected a number of KV heads dividing q's {sizes['Hq']} heads, found "
                         f"{sizes['Hkv']} (k is {layout.pattern('k')} = {list(inputs['k'].shape)})")
    return sizes


def forward(fields, layout, lse_layout, inputs, sizes, lib):
    """The mechanism of `fields` (a resolved spec) on every sequence of the checked inputs ->
    {"o", "lse"[, "selection"]} in `layout` (lse in lse_layout when given): o fp32 [B, T, Hq, dv]
    in "bshd", [total, Hq, dv] in "thd" (packed: each sequence one problem, written to its rows),
    ..., on q's device, on torch's current stream."""
    torch = _stages.require_torch()
    buffers = _BUFFERS.get(fields["fusion"], _SELECTING)
    sizes = dict(sizes, K=fields["K"])
    if "T" in sizes:  # a packed layout's rows are "total"
        sizes["Tq"] = sizes["T"]
    B = sizes["B"]
    parts = {name: layout.sequences(t, name, name, B) for name, t in inputs.items() if t is not None}
    # A pack's empty sequences (FlashAttention's varlen kernels accept them, vLLM pads with them)
    # have no row to compute or write; every other layout's sequences have T rows (the library
    # refuses T = 0 itself).
    computed = [b for b in range(B) if parts["q"][b].shape[1] > 0] or [0]
    first = _problem(fields, parts, computed[0])
    _stages.workspace_bytes(lib, first)  # the spec's numbers judged before any output is allocated
    laid = {name: (lse_layout if name == "lse" and lse_layout else layout) for name in buffers}
    out = {name: torch.empty(laid[name].shape(name, sizes), device=inputs["q"].device,
                             dtype=torch.int32 if name == "selection" else torch.float32)
           for name in buffers}
    views = {name: laid[name].sequences(t, name, name, B) for name, t in out.items()}
    stages, p = None, first
    del first  # each sequence's copies live while its problem does
    for b in computed:
        if b != computed[0]:
            p = _problem(fields, parts, b)
        direct = {buffers[name]: views[name][b] for name in buffers
                  if views[name][b].is_contiguous() and _fits(name, views[name][b], fields)}
        if stages is None or stages.p.T != p.T:  # buffers for each length (a pack's differ)
            stages = _stages.Stages(lib, p, outputs=direct)
        else:
            stages.sequence(p, direct)
        _run(stages, fields)
        for name, attribute in buffers.items():
            if attribute not in direct:
                views[name][b].copy_(getattr(stages, attribute)[..., :fields["K"]]
                                     if name == "selection" else getattr(stages, attribute))
    return out


def _problem(fields, parts, b):
    """hils_gpu_problem of sequence b: its [heads, T, ...] views, a contiguous copy of each one
    that is strided (the Problem keeps them alive while the stages run)."""
    seq = {name: parts[name][b].contiguous() for name in parts}
    return _stages.problem(fields, seq["q"], seq["k"], seq["v"], seq.get("q_retrieval"), seq.get("prior"))


def _fits(name, view, fields):
    """Whether the kernels can write this output view as it is: the selection buffer has
    max(K, 1) columns (Stages), the others exactly the view's shape."""
    return name != "selection" or fields["K"] >= 1


def _run(stages, fields):
    if fields["fusion"] == "full":
        stages.full()
    elif fields["fusion"] == "window":
        stages.window()
    else:  # flat or hierarchical: window, summaries, selection, sparse stage
        stages.forward()

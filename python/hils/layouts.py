"""A kernel's own tensor layouts and batches, converted to what the oracle reads (hils.verify's
layout=, lse_layout= and selection_order=).

The oracle judges one sequence at a time, every tensor head-major, [heads, rows, ...], the verify
file's order (data/verify_format.md). A kernel's tensors come in one of four layouts; `layout`
names it for its inputs, outputs, upstream gradients and gradients alike:

    layout   q              o               lse           selection        who uses it
    "hsd"    [Hq, T, d]     [Hq, Tq, dv]    [Hq, Tq]      [Hkv, Tq, K]     the verify file (default)
    "shd"    [T, Hq, d]     [Tq, Hq, dv]    [Tq, Hq]      [Tq, Hkv, K]     one sequence of "bshd"
    "bhsd"   [B, Hq, T, d]  [B, Hq, Tq, dv] [B, Hq, Tq]   [B, Hkv, Tq, K]  SDPA, FlexAttention (lse
                                                                           with return_lse), NSA's
                                                                           head_first=True
    "bshd"   [B, T, Hq, d]  [B, Tq, Hq, dv] [B, Tq, Hq]   [B, Tq, Hkv, K]  FlashAttention's q, k, v,
                                                                           o; fla-org NSA
                                                                           (block_indices [B, T, H, S])

The rule for every tensor: take its verify-file shape [heads, rows, rest...] (rows = T, Tq,
n_chunks or the prior's rows); "s" before "h" swaps heads and rows; "b" puts the batch first. So
k is [B, T, Hkv, d] in "bshd", summary_key [B, n_chunks, H, d], prior [B, rows, Hq, d],
fusion_weights [B, Tq, Hq, K+2], grads["dk"] like k, do like o, dlse like lse.

FlashAttention's softmax_lse is [B, Hq, T] beside its [B, T, Hq, d] o: say so with
lse_layout="bhsd" (the layout whose order lse, lse_window and dlse follow; default: layout's).
A tensor whose heads and rows axes come swapped against its layout (its shape fits the other
order and not this one) is refused naming the tensor, both shapes and the fix; where heads and
rows have the same length the shape cannot tell, and the declared layout is read as given.

selection_order="any": each row of the selection is a set, its chunks in any order (torch.topk's
score order, fla-org NSA's top-k kernel) and its -1 padding anywhere: the row is sorted
(chunks ascending, then any negative entries) before the oracle reads it, and the first K
columns of fusion_weights (the weights "in selection order") are permuted with it. Duplicates,
chunks out of range or outside V(t), a wrong count and padding other than -1 still fail.

Packed sequences (cu_seqlens=, FlashAttention's varlen and fla-org's parallel_nsa with
cu_seqlens): the rows axis holds the B sequences one after another, sequence b being rows
cu_seqlens[b]..cu_seqlens[b+1]-1; the packed layouts are "thd" ([total, heads, ...]), "htd"
([heads, total, ...]) and "bshd" / "bhsd" with B = 1 ([1, total, heads, ...], fla-org's). Each
sequence is its own problem (positions, chunks and selection ids from its first row);
summary_key, summary_bias, surrogate_scores and prior (an axis of each sequence's own length)
do not pack (data/verify_format.md "Packed sequences (varlen)"). With cu_seqlens_k (chunked
prefill: FlashAttention's cu_seqlens_q != cu_seqlens_k) k and v split at cu_seqlens_k and each
sequence's queries are its last slots (PackedBatch). An empty sequence (cu_seqlens[b] =
cu_seqlens[b+1], or Tq_b = 0 with cu_seqlens_k) is nothing to judge (PackedBatch.judged): its
BatchReport entry is None (data/verify_format.md "Packed sequences (varlen)").

Nothing here checks what the oracle checks: a tensor is only split, transposed and sorted; its
shape, dtype and values are judged by the per-sequence path (hils.Verifier), whose messages name
shapes in the verify file's order.
"""

import numpy as np

# name -> (batched, rows first)
_LAYOUTS = {"hsd": (False, False), "shd": (False, True), "bhsd": (True, False), "bshd": (True, True)}

# Each tensor's axes in the verify file's order (data/verify_format.md, "Datasets").
_AXES = {
    "q": ("Hq", "T", "d"), "q_retrieval": ("Hq", "T", "d"), "k": ("Hkv", "T", "d"),
    "v": ("Hkv", "T", "dv"), "prior": ("Hq", "rows", "d"),
    "o": ("Hq", "Tq", "dv"), "o_window": ("Hq", "Tq", "dv"), "lse": ("Hq", "Tq"),
    "lse_window": ("Hq", "Tq"), "selection": ("Hkv", "Tq", "K"),
    "surrogate_scores": ("Hq", "Tq", "n_chunks"), "summary_key": ("H", "n_chunks", "d"),
    "summary_bias": ("Hq", "n_chunks"), "fusion_weights": ("Hq", "Tq", "K+2"),
    "do": ("Hq", "T", "dv"), "dlse": ("Hq", "T"),
    "dq": ("Hq", "T", "d"), "dk": ("Hkv", "T", "d"), "dv": ("Hkv", "T", "dv"),
    "dq_retrieval": ("Hq", "T", "d"), "dprior": ("Hq", "rows", "d"),
}
_LSE_NAMES = ("lse", "lse_window", "dlse")
SELECTION_ORDERS = ("ascending", "any")


def _names(values):
    return ", ".join(f'"{value}"' for value in values)


def _shape_text(axes, sizes):
    """A shape from {axis: length}, "*" for an axis sizes lacks: "[2, 2048, *, 64]"."""
    return "[" + ", ".join(str(sizes.get(axis, "*")) for axis in axes) + "]"


class Layout:
    """One of the four layouts: where the batch, heads and rows axes of a tensor sit."""

    def __init__(self, name, argument="layout"):
        if not isinstance(name, str):
            raise TypeError(f"{argument}: expected one of {_names(_LAYOUTS)}, found "
                            f"{type(name).__name__} {name!r}")
        if name not in _LAYOUTS:
            raise ValueError(f"{argument}: expected one of {_names(_LAYOUTS)} (batch, heads, "
                             f"sequence, dims: the order of a kernel's axes), found {name!r}")
        self.name = name
        self.batched, self.rows_first = _LAYOUTS[name]
        self.leading = int(self.batched)  # axes before heads and rows
        self.lse_note = "FlashAttention's softmax_lse is [B, Hq, T] beside its [B, T, Hq, d] o"

    def swapped(self):
        """The layout with heads and rows the other way round ("bshd" <-> "bhsd")."""
        return Layout(next(n for n, v in _LAYOUTS.items()
                           if v == (self.batched, not self.rows_first)))

    def axes(self, name):
        heads, rows, *rest = _AXES[name]
        middle = [rows, heads] if self.rows_first else [heads, rows]
        return (["B"] if self.batched else []) + middle + rest

    def pattern(self, name):
        return "[" + ", ".join(self.axes(name)) + "]"

    def expected(self, name, sizes):
        """Tensor `name`'s shape in this layout from {axis: length} ("*" where sizes lacks one),
        e.g. "[2, 2048, *, 64]" for k in "bshd" before Hkv is known."""
        return _shape_text(self.axes(name), sizes)

    def shape(self, name, sizes):
        """Tensor `name`'s shape in this layout, every axis's length taken from sizes."""
        return tuple(sizes[axis] for axis in self.axes(name))

    def read_sizes(self, array, label, name, sizes, source):
        """Checks an array's rank and the lengths of the axes that `sizes` ({axis: length}) has
        (ValueError naming `label`, the expected shape in this layout and `source`, where those
        lengths come from); returns sizes with this array's other axes added (k adds Hkv, v dv).
        Works on anything with .ndim and .shape (numpy arrays, torch tensors)."""
        self._check_rank(array, label, name)
        axes = self.axes(name)
        if all(sizes.get(axis, n) == n for axis, n in zip(axes, array.shape)):
            return {**sizes, **dict(zip(axes, array.shape))}
        other = self.swapped()
        fix = ""
        if all(sizes.get(axis, n) == n for axis, n in zip(other.axes(name), array.shape)):
            fix = f", which is {other.pattern(name)}, the order of layout \"{other.name}\""
        raise ValueError(f"{label}: layout \"{self.name}\" expects {self.pattern(name)} = "
                         f"{self.expected(name, sizes)} ({source}), found shape "
                         f"{list(array.shape)}{fix}")

    def batch_size(self, q):
        """B, read from q (1 for an unbatched layout)."""
        if not self.batched:
            return 1
        self._check_rank(q, "q", "q")
        if q.shape[0] == 0:
            raise ValueError(f"q: layout \"{self.name}\" expects {self.pattern('q')} with at least "
                             f"one sequence, found B = 0 (shape {list(q.shape)})")
        return q.shape[0]

    def _check_rank(self, array, label, name):
        _check_rank(self, array, label, name, "")

    def sequences(self, array, label, name, size):
        """An array in this layout (numpy, or a torch tensor for hils.gpu) -> one [heads, rows,
        ...] view per sequence (`size` of them). The verify file's own layout passes the array
        through untouched (the oracle's messages then name it as today)."""
        if self.name == "hsd":
            return [array]
        self._check_rank(array, label, name)
        if self.batched and array.shape[0] != size:
            raise ValueError(f"{label}: layout \"{self.name}\" expects {self.pattern(name)} with "
                             f"B = {size} (from q), found shape {list(array.shape)}")
        parts = list(array) if self.batched else [array]
        return [self._swap(part) for part in parts]

    def join(self, parts):
        """sequences(): the other way: one [heads, rows, ...] array per sequence -> one array
        in this layout."""
        if self.name == "hsd":
            return parts[0]
        laid = [self._swap(part) for part in parts]
        return np.stack(laid) if self.batched else laid[0]

    def _swap(self, part):
        """One sequence's tensor between this layout's order and [heads, rows, ...] (either way:
        the swap is its own inverse)."""
        return part.swapaxes(0, 1) if self.rows_first else part  # numpy and torch alike: a view


class Batch:
    """The sequences of one problem: its inputs split per sequence in the verify file's order
    ({name: array} per sequence, None where absent), and the sizes its outputs are read against."""

    def __init__(self, layout, inputs, queries):
        self.layout = layout if isinstance(layout, Layout) else Layout(layout)
        for name in ("q", "k", "v"):
            if inputs[name] is None:
                raise TypeError(f"{name}: expected a numpy array, found an object of type NoneType")
        self.size = self.layout.batch_size(inputs["q"])
        split = {name: (None if array is None else self.layout.sequences(array, name, name, self.size))
                 for name, array in inputs.items()}
        self.inputs = [{name: (None if parts is None else parts[b]) for name, parts in split.items()}
                       for b in range(self.size)]
        self.sizes = {}
        self.queries = queries
        self.lengths = None  # every sequence has q's T
        self.offsets = None  # not packed
        first, k = self.inputs[0]["q"], self.inputs[0]["k"]
        if self.layout.name != "hsd":  # ranks checked above: heads and rows are known
            self.sizes = {"Hq": first.shape[0], "Hkv": k.shape[0], "T": first.shape[1],
                          "Tq": first.shape[1] if queries is None else np.size(queries)}

    def query_slots(self, b):
        """The query slots sequence b computes (queries=; None: all)."""
        return self.queries

    def query_counts(self):
        """Tq of each sequence where the queries are each sequence's own (None here)."""
        return None

    def judged(self, b):
        """Whether sequence b has a query to judge (every sequence of an unpacked batch has)."""
        return True

    def context(self, b):
        """Where a per-sequence message comes from, for an error raised on sequence b."""
        if self.layout.name == "hsd":
            return ""
        seq = self.inputs[b]
        where = f"sequence b={b} of " if self.layout.batched else ""
        return (f" ({where}layout \"{self.layout.name}\", read as q [Hq, T, d] = "
                f"{list(seq['q'].shape)}, k [Hkv, T, d] = {list(seq['k'].shape)}, v [Hkv, T, dv] = "
                f"{list(seq['v'].shape)})")

    def split(self, arrays, label, lse_layout):
        """{name: numpy array in the layout} -> one {name: [heads, rows, ...]} per sequence. A name
        the oracle does not know, or something that is not a dict, is passed to every sequence as
        it is: the oracle names it."""
        if not hasattr(arrays, "items"):
            return [arrays] * self.size
        parts = {name: (self.one(array, name, lse_layout, label(name)) if name in _AXES
                        else [array] * self.size)
                 for name, array in arrays.items()}
        return [{name: values[b] for name, values in parts.items()} for b in range(self.size)]

    def one(self, array, name, lse_layout=None, label=None):
        """One tensor (do, dlse) -> its per-sequence parts; None -> None for every sequence.
        `label` names it in messages (default: its name)."""
        if array is None:
            return [None] * self.size
        label = name if label is None else label
        layout = self._layout_of(name, lse_layout)
        self._check_order(array, label, name, layout)
        return layout.sequences(array, label, name, self.size)

    def join(self, results, lse_layout):
        """One {name: [heads, rows, ...]} per sequence (the reference's) -> {name: array in the
        layout}; lse_layout as split's."""
        return {name: self._layout_of(name, lse_layout).join([result[name] for result in results])
                for name in results[0]}

    def _layout_of(self, name, lse_layout):
        """The layout tensor `name` comes in: lse_layout for lse, lse_window and dlse when given,
        else the batch's."""
        return lse_layout if (name in _LSE_NAMES and lse_layout) else self.layout

    def _rows(self, name):
        """The length of tensor `name`'s rows axis (None where unknown)."""
        return self.sizes.get(_AXES[name][1])

    def _check_order(self, array, label, name, layout):
        """Refuses a tensor whose heads and rows axes come swapped against `layout`: its shape
        fits the other order and not this one (never where heads and rows have one length)."""
        heads, rows = self.sizes.get(_AXES[name][0]), self._rows(name)
        axis = layout.leading
        if (heads is None or rows is None or heads == rows
                or array.ndim != len(_AXES[name]) + axis):
            return
        laid = (rows, heads) if layout.rows_first else (heads, rows)
        if array.shape[axis:axis + 2] != laid[::-1]:
            return
        other = layout.swapped()
        sizes = {"B": self.size, "1": 1, "total": rows, _AXES[name][0]: heads, _AXES[name][1]: rows}
        expected = _shape_text(layout.axes(name), sizes)
        if name in _LSE_NAMES:
            fix = f"say so with lse_layout=\"{other.name}\" ({layout.lse_note})"
        else:
            fix = (f"transpose it to {layout.pattern(name)} (x.transpose({axis}, {axis + 1}) in "
                   f"torch, np.swapaxes(x, {axis}, {axis + 1}) in numpy)")
        raise ValueError(f"{label}: layout \"{layout.name}\" expects {layout.pattern(name)} = "
                         f"{expected}, found shape {list(array.shape)}, which is "
                         f"{other.pattern(name)}, the order of layout \"{other.name}\": {fix}")


# Packed layouts (cu_seqlens=): name -> (a leading batch axis of length 1, rows first). The rows
# axis holds the sequences one after another, total = cu_seqlens[-1] rows.
_PACKED = {"thd": (False, True), "htd": (False, False), "bshd": (True, True), "bhsd": (True, False)}
# The tensors whose rows are slots or queries (T, Tq) and whose other axes are the same in every
# sequence (not surrogate_scores: its columns are each sequence's chunks): they pack along rows.
_PACKABLE = tuple(name for name, axes in _AXES.items()
                  if axes[1] in ("T", "Tq") and "n_chunks" not in axes)
_PACKED_NAMES = ('"thd" ([total, heads, d]: FlashAttention\'s flash_attn_varlen_func), "htd" '
                 '([heads, total, d]), or "bshd" / "bhsd" with B = 1 (fla-org\'s parallel_nsa '
                 'with cu_seqlens: q [1, total, HQ, K])')


# The tensors whose rows are keys (cu_seqlens_k's, where it is given); every other packed tensor's
# rows are queries (cu_seqlens').
_KEY_NAMES = ("k", "v", "dk", "dv")


def _check_rank(layout, array, label, name, reading):
    """Refuses an array whose rank is not `layout`'s for tensor `name` (Layout and Packed alike;
    `reading` says how the layout is read, e.g. " with cu_seqlens")."""
    rank = len(_AXES[name]) + layout.leading
    if array.ndim != rank:
        raise ValueError(f"{label}: layout \"{layout.name}\"{reading} expects rank {rank} "
                         f"{layout.pattern(name)}, found rank {array.ndim} shape "
                         f"{list(array.shape)}")


class Packed:
    """A packed layout: sequence b is rows cu_seqlens[b]..cu_seqlens[b+1]-1 of every tensor's
    rows axis (data/verify_format.md "Packed sequences"), k and v's rows cu_seqlens_k's where
    they are given (key_offsets). Bound to the offsets it splits at."""

    batched = True  # one report per sequence

    def __init__(self, name, offsets, key_offsets=None):
        self.name = name
        self.offsets = offsets
        self.key_offsets = offsets if key_offsets is None else key_offsets
        lead, self.rows_first = _PACKED[name]
        self.leading = int(lead)
        self.lse_note = ("FlashAttention's varlen softmax_lse is [Hq, total_q] beside its "
                         "[total_q, Hq, d] o" if not lead else
                         "[1, Hq, total] beside a [1, total, Hq, d] o")

    def swapped(self):
        return Packed(next(n for n, v in _PACKED.items()
                           if v == (bool(self.leading), not self.rows_first)), self.offsets,
                      self.key_offsets)

    def lse_layout(self, lse_layout):
        """lse_layout= beside this layout: a packed layout with the same leading axis."""
        same = [n for n, v in _PACKED.items() if v[0] == bool(self.leading)]
        if not isinstance(lse_layout, str) or lse_layout not in same:
            raise ValueError(f"lse_layout: expected None or one of {_names(same)} (packed, as layout "
                             f"\"{self.name}\" with cu_seqlens is), found {lse_layout!r}")
        return Packed(lse_layout, self.offsets, self.key_offsets)

    def axes(self, name):
        heads, _, *rest = _AXES[name]
        middle = ["total", heads] if self.rows_first else [heads, "total"]
        return (["1"] if self.leading else []) + middle + rest

    # Shapes as Layout's (hils.gpu.forward's checks and outputs), from this layout's axes: the
    # sizes of a pack hold "1" = 1 and "total" (cu_seqlens[-1]).
    pattern = Layout.pattern
    expected = Layout.expected
    shape = Layout.shape
    read_sizes = Layout.read_sizes

    @staticmethod
    def check_packable(name, label):
        """ValueError naming `label` for a tensor with an axis of each sequence's own length."""
        if name not in _PACKABLE:
            raise ValueError(f"{label}: has no packed form: {name} [{', '.join(_AXES[name])}] has "
                             f"an axis whose length is each sequence's own (n_chunks or the prior's "
                             f"rows); judge it one sequence at a time (layout \"hsd\" or \"shd\" "
                             f"without cu_seqlens)")

    def sizes(self):
        """The lengths the offsets fix: B (sequences), "1" and "total"."""
        return {"B": len(self.offsets) - 1, "1": 1, "total": self.offsets[-1]}

    def _check_rank(self, array, label, name):
        _check_rank(self, array, label, name, " with cu_seqlens")

    def sequences(self, array, label, name, size):
        """A packed array (numpy, or a torch tensor for hils.gpu) -> one [heads, rows, ...] view
        per sequence (`size`, as Layout.sequences' argument, is len(offsets) - 1)."""
        self.check_packable(name, label)
        self._check_rank(array, label, name)
        if self.leading and array.shape[0] != 1:
            raise ValueError(f"{label}: layout \"{self.name}\" with cu_seqlens expects "
                             f"{self.pattern(name)} (the sequences packed along T of one batch row, "
                             f"as fla-org's parallel_nsa takes them with cu_seqlens), found B = "
                             f"{array.shape[0]} (shape {list(array.shape)})")
        laid = array[0] if self.leading else array
        keys = name in _KEY_NAMES and self.key_offsets is not self.offsets
        offsets = self.key_offsets if keys else self.offsets
        if laid.shape[0 if self.rows_first else 1] != offsets[-1]:
            raise ValueError(f"{label}: layout \"{self.name}\" expects {self.pattern(name)} with "
                             f"total = {offsets[-1]} ({'cu_seqlens_k' if keys else 'cu_seqlens'}"
                             f"[-1]), found shape {list(array.shape)}")
        rows = laid if self.rows_first else laid.swapaxes(0, 1)  # numpy and torch alike: views
        return [rows[a:b].swapaxes(0, 1) for a, b in zip(offsets[:-1], offsets[1:])]

    def join(self, parts):
        """sequences(): the other way (the reference's arrays, packed)."""
        rows = np.concatenate([np.swapaxes(part, 0, 1) for part in parts])
        laid = rows if self.rows_first else np.swapaxes(rows, 0, 1)
        return laid[None] if self.leading else laid


def offsets_of(cu_seqlens, total, name="cu_seqlens", rows="q's total rows"):
    """cu_seqlens (numpy, or a torch tensor on any device) checked against `total` rows (q's;
    k's for cu_seqlens_k: `name` and `rows` name them in messages) -> a list of B + 1 ints: 0,
    then non-decreasing, ending at total. ValueError / TypeError naming the entry and the value
    expected. An empty sequence (cu_seqlens[b] = cu_seqlens[b+1]: FlashAttention's varlen
    kernels accept it, vLLM pads cu_seqlens with them) is accepted (the oracle's packs: nothing
    to judge; hils.gpu.forward: nothing to compute)."""
    from . import as_numpy  # the package's converter (torch tensors on any device)
    array = as_numpy(cu_seqlens, name)
    if array.dtype.kind not in "iu":
        raise TypeError(f"{name}: expected integers (int32 as FlashAttention's, int64 as "
                        f"fla-org's), found dtype {array.dtype}")
    if array.ndim != 1 or array.size < 2:
        raise ValueError(f"{name}: expected a 1-D array [B + 1] of offsets (0, then each "
                         f"sequence's end; B >= 1), found shape {list(array.shape)}")
    offsets = [int(x) for x in array]
    if offsets[0] != 0:
        raise ValueError(f"{name}: expected {name}[0] = 0 (the first sequence starts at row "
                         f"0), found {offsets[0]}")
    for b in range(len(offsets) - 1):
        if offsets[b + 1] < offsets[b]:
            raise ValueError(f"{name}: expected increasing offsets, found {name}[{b + 1}] = "
                             f"{offsets[b + 1]} < {name}[{b}] = {offsets[b]}")
    if offsets[-1] != total:
        raise ValueError(f"{name}: expected {name}[-1] = {total} ({rows}), found {offsets[-1]}")
    return offsets


def _check_not_all_empty(offsets, verdict="nothing to judge; the oracle judges a pack with at "
                                           "least one query"):
    """A pack whose every sequence is empty (cu_seqlens all 0) is refused: nothing would be
    judged, and nothing judged is not a pass (data/verify_format.md "Empty sequences");
    `verdict` says so for the caller (hils.gpu.forward: nothing to compute)."""
    if offsets[-1] == 0:
        raise ValueError(f"cu_seqlens: every sequence is empty (cu_seqlens = {offsets}, no query "
                         f"row): {verdict} (reference/SEMANTICS.md, section 1: T >= 1)")


class PackedBatch(Batch):
    """The sequences of a packed problem (cu_seqlens=): as Batch, split at the offsets. Every
    query of every sequence is judged; positions restart at 0 in each sequence.

    With cu_seqlens_k (chunked prefill, prefix caching: FlashAttention's flash_attn_varlen_func
    with cu_seqlens_q != cu_seqlens_k) sequence b has Tk_b slots, k and v split at cu_seqlens_k,
    and its Tq_b queries (q, q_retrieval and the outputs split at cu_seqlens) are its last Tq_b
    slots, Tk_b - Tq_b .. Tk_b - 1 (FlashAttention's causal mask aligned to the bottom right):
    the oracle's problem is [Hq, Tk_b, d] with those rows placed (hils.decoding.query_inputs,
    the decode step's function) and computes only those slots (queries=)."""

    def __init__(self, name, inputs, queries, cu_seqlens, cu_seqlens_k=None,
                 landmark_queries=None, spec=None):
        if queries is not None:
            raise ValueError("queries: expected None with cu_seqlens (every query of every packed "
                             "sequence is judged, as the varlen kernels compute them all; queries "
                             "that are the last slots of each sequence: cu_seqlens_k=)")
        for tensor in ("q", "k", "v"):
            if inputs[tensor] is None:
                raise TypeError(f"{tensor}: expected a numpy array, found an object of type NoneType")
        probe = Packed(name, [0, 0])
        q, k = inputs["q"], inputs["k"]
        total = self._total(q, "q", probe)
        key_total = None if cu_seqlens_k is None else _key_total(k, cu_seqlens_k, probe)
        _check_not_swapped(cu_seqlens, cu_seqlens_k, total, key_total)
        offsets = offsets_of(cu_seqlens, total)
        _check_not_all_empty(offsets)
        self.layout = Packed(name, offsets, _key_offsets(cu_seqlens_k, offsets, key_total))
        self.size = len(offsets) - 1
        heads = 1 if probe.rows_first else 0
        self.sizes = {"Hq": q.shape[probe.leading + heads], "T": total, "Tq": total}
        if k.ndim == q.ndim:
            self.sizes["Hkv"] = k.shape[probe.leading + heads]
        self.chunked = self.layout.key_offsets is not offsets
        self.queries = None
        split = {tensor: (None if array is None else self.one(array, tensor))
                 for tensor, array in inputs.items()}
        self.inputs = [{tensor: (None if parts is None else parts[b]) for tensor, parts in split.items()}
                       for b in range(self.size)]
        self._parts = self.inputs  # each sequence's rows as given (chunked: before _place)
        self.lengths = _lengths(self.layout.key_offsets)
        self.counts = _lengths(offsets)
        self.offsets = offsets  # the queries' rows in the pack (BatchReport names them)
        self.slots = [None] * self.size
        if self.chunked:
            self._place(landmark_queries, spec)
        elif landmark_queries is not None:
            raise ValueError("landmark_queries: read only with cu_seqlens_k (the priors of the "
                             "chunks before each sequence's queries); with every slot queried q "
                             "and q_retrieval hold them all: leave it out")

    @staticmethod
    def _total(array, label, probe):
        """The rows of a packed q or k (its rank checked first)."""
        probe._check_rank(array, label, label)
        return array.shape[probe.leading + (0 if probe.rows_first else 1)]

    def _place(self, landmark_queries, spec):
        """Chunked: each sequence's Tq rows of q and q_retrieval placed at its last slots of a
        [Hq, Tk, d] problem, the priors of the chunks complete before them (landmark_queries,
        where the mechanism reads priors) at their landmark slots; queries = those slots."""
        from .decoding import (GatheredInputs, check_landmark_queries, landmark_pattern,
                               landmark_rows, query_inputs)
        from . import _spec_fields  # the codec's fields (hils/__init__.py)
        fields = _spec_fields(spec)
        S, name, rows_first = fields["S"], self.layout.name, self.layout.rows_first
        prefixes = [T - n for T, n in zip(self.lengths, self.counts)]
        pattern = landmark_pattern(rows_first)
        reads = check_landmark_queries(
            fields, landmark_queries, f"{pattern} (layout \"{name}\"), n_chunks >= the chunks "
            f"before a sequence's first query", "a chunk of queries after a prefix (cu_seqlens_k)",
            "the chunk's q and q_retrieval", required=any(P // S for P in prefixes))
        def priors_of(b):
            return (landmark_rows(landmark_queries, b, prefixes[b] // S, rows_first, self.size,
                                  self.sizes["Hq"], f'layout "{name}"', self.lengths[b])
                    if reads and landmark_queries is not None else None)

        for b, (seq, T, P) in enumerate(zip(self.inputs, self.lengths, prefixes)):
            if not self.judged(b):  # no query: nothing placed, nothing computed
                continue
            if seq["q_retrieval"] is not None and seq["q_retrieval"].shape != seq["q"].shape:
                raise ValueError(f"q_retrieval: expected q's shape (layout \"{name}\"), sequence "
                                 f"b={b} read as [Hq, Tq, d] = {list(seq['q'].shape)}, found "
                                 f"{list(seq['q_retrieval'].shape)}")
            priors_of(b)  # their shape checked before any oracle is built
            self.slots[b] = np.arange(P, T) if P else None
        parts = self._parts

        def placed(b):  # q [Hq, T, d] per sequence, built when its oracle is (decoding.py)
            seq = dict(parts[b])
            if self.judged(b):
                q_shape = (seq["q"].shape[0], self.lengths[b], seq["q"].shape[2])
                retrieval = seq["q_retrieval"] is not None or (reads and landmark_queries is not None)
                GatheredInputs.require_fit({"q": q_shape, "k": seq["k"].shape, "v": seq["v"].shape,
                                            **({"q_retrieval": q_shape} if retrieval else {})},
                                           self.size)
                seq["q"], seq["q_retrieval"] = query_inputs(self.lengths[b], S, seq["q"],
                                                            seq["q_retrieval"], priors_of(b))
            return seq

        self.inputs = GatheredInputs(self.size, placed)

    def query_slots(self, b):
        return self.slots[b]

    def query_counts(self):
        return self.counts if self.chunked else None

    def judged(self, b):
        """An empty sequence (Tq_b = 0: no query row in cu_seqlens, whatever its keys) is
        nothing to judge: no oracle is built for it, its report is None (BatchReport) and its
        reference arrays have no rows (data/verify_format.md "Empty sequences")."""
        return self.counts[b] > 0

    def empty_part(self, template):
        """The reference of an empty sequence, shaped after a judged one's (`template`): every
        packable array with zero rows, None for the per-sequence ones (summary_key,
        summary_bias, surrogate_scores: nothing was computed)."""
        return {name: (array[:, :0] if name in _PACKABLE else None)
                for name, array in template.items()}

    def one(self, array, name, lse_layout=None, label=None):
        if array is not None and self.chunked and name in _GRADIENT_NAMES:
            raise ValueError(f"{name if label is None else label}: gradients need every query of "
                             f"each sequence (data/verify_format.md \"Gradients\"); with "
                             f"cu_seqlens_k each sequence's queries are its last Tq slots: judge "
                             f"the backward of a pack without a prefix (no cu_seqlens_k)")
        return super().one(array, name, lse_layout, label)

    def _rows(self, name):
        return (self.layout.key_offsets if name in _KEY_NAMES else self.layout.offsets)[-1]

    def join(self, results, lse_layout):
        """As Batch.join, packed; summary_key, summary_bias and surrogate_scores (their rows or
        columns are each sequence's chunks) stay one [heads, ...] array per sequence, in a list."""
        return {name: (self._layout_of(name, lse_layout).join([r[name] for r in results])
                       if name in _PACKABLE else [r[name] for r in results])
                for name in results[0]}

    def context(self, b):
        seq, (first, end) = self._parts[b], self.layout.offsets[b:b + 2]
        rows = f"rows {first}..{end - 1}, T = {end - first}"
        if self.chunked:
            start, stop = self.layout.key_offsets[b:b + 2]
            T, P = stop - start, stop - start - (end - first)
            rows = (f"query rows {first}..{end - 1} at slots {P}..{T - 1}, key rows "
                    f"{start}..{stop - 1}, T = {T}")
        q_shape = list(seq["q"].shape)
        if self.chunked:  # the chunk's Tq rows are placed at the last slots of [Hq, T, d]
            q_shape[1] = self.lengths[b]
        return (f" (sequence b={b} of layout \"{self.layout.name}\" with cu_seqlens: {rows}, read "
                f"as q [Hq, T, d] = {q_shape}, k [Hkv, T, d] = {list(seq['k'].shape)}, "
                f"v [Hkv, T, dv] = {list(seq['v'].shape)})")


_GRADIENT_NAMES = ("do", "dlse", "dq", "dk", "dv", "dq_retrieval", "dprior")


def _lengths(offsets):
    return [end - first for first, end in zip(offsets[:-1], offsets[1:])]


def _last_offset(offsets, name):
    """The last entry of offsets (cu_seqlens or cu_seqlens_k) for the hints that read it before
    offsets_of checks it; None when it has none or is not integers (offsets_of refuses those,
    naming them: int() of a str or an object was Python's own error here)."""
    from . import as_numpy
    end = as_numpy(offsets, name).reshape(-1)[-1:]
    return int(end[0]) if end.size and end.dtype.kind in "iu" else None


def _key_total(k, cu_seqlens_k, probe):
    """The rows of a packed k, refused with the fix when its heads and rows come swapped (its
    heads axis has cu_seqlens_k[-1] entries, its rows axis not)."""
    total = PackedBatch._total(k, "k", probe)
    heads = k.shape[probe.leading + (1 if probe.rows_first else 0)]
    end = _last_offset(cu_seqlens_k, "cu_seqlens_k")
    if end is not None and end == heads != total:
        other, axis = probe.swapped(), probe.leading
        raise ValueError(f"k: layout \"{probe.name}\" expects {probe.pattern('k')} with total = "
                         f"{heads} (cu_seqlens_k[-1]), found shape {list(k.shape)}, which is "
                         f"{other.pattern('k')}, the order of layout \"{other.name}\": transpose "
                         f"it (x.transpose({axis}, {axis + 1}) in torch)")
    return total


def _check_not_swapped(cu_seqlens, cu_seqlens_k, total, key_total):
    """cu_seqlens and cu_seqlens_k given the other way round (each ending at the other's
    tensor's rows) are refused naming both, before either is read as the other's."""
    if cu_seqlens_k is None or total == key_total:
        return
    ends = (_last_offset(cu_seqlens, "cu_seqlens"), _last_offset(cu_seqlens_k, "cu_seqlens_k"))
    if ends == (key_total, total):
        raise ValueError(f"cu_seqlens, cu_seqlens_k: swapped: cu_seqlens ends at {key_total}, k's "
                         f"total rows, and cu_seqlens_k at {total}, q's; cu_seqlens are the "
                         f"queries' offsets (FlashAttention's cu_seqlens_q), cu_seqlens_k the keys'")


def _key_offsets(cu_seqlens_k, offsets, key_total):
    """cu_seqlens_k checked against k's rows and against cu_seqlens (the same B, Tq_b <= Tk_b
    in each sequence) -> its offsets, or None when absent or equal to cu_seqlens."""
    if cu_seqlens_k is None:
        return None
    keys = offsets_of(cu_seqlens_k, key_total, "cu_seqlens_k", "k's total rows")
    if len(keys) != len(offsets):
        raise ValueError(f"cu_seqlens_k: expected {len(offsets)} entries (B + 1, B = "
                         f"{len(offsets) - 1} sequences in cu_seqlens), found {len(keys)}")
    for b, (Tq, Tk) in enumerate(zip(_lengths(offsets), _lengths(keys))):
        if Tq > Tk == 0:
            raise ValueError(f"cu_seqlens_k: sequence b={b} has Tq = {Tq} queries (cu_seqlens) and "
                             f"no key (cu_seqlens_k[{b}] = cu_seqlens_k[{b + 1}] = {keys[b]}): "
                             f"its queries are the last Tq of its Tk slots, so Tq <= Tk; a "
                             f"sequence with Tk = 0 is empty only with Tq = 0 (nothing to judge)")
        if Tq > Tk:
            raise ValueError(f"cu_seqlens_k: sequence b={b} has Tq = {Tq} queries (cu_seqlens) and "
                             f"Tk = {Tk} keys (cu_seqlens_k): the queries are the last Tq of the "
                             f"sequence's Tk slots (FlashAttention's causal mask aligned to the "
                             f"bottom right), so Tq <= Tk; a query with no key to read is not "
                             f"judged")
    return None if keys == offsets else keys


def check_packing(name, cu_seqlens):
    """layout= beside cu_seqlens=: "thd" and "htd" need it, "hsd" and "shd" (and a name that is
    not a layout) refuse it (ValueError naming both)."""
    if cu_seqlens is None:
        if isinstance(name, str) and name in ("thd", "htd"):
            raise ValueError(f"cu_seqlens: layout \"{name}\" packs the sequences along its rows: "
                             f"give cu_seqlens=[0, T_0, T_0 + T_1, ..., total] (int32 [B + 1])")
    elif not isinstance(name, str) or name not in _PACKED:
        what = "is one sequence" if isinstance(name, str) and name in _LAYOUTS else "is not a layout"
        raise ValueError(f"layout: {name!r} {what}; with cu_seqlens (packed sequences) expected "
                         f"{_PACKED_NAMES}")


def packed_layout(name, q, cu_seqlens):
    """layout= with cu_seqlens= (checked: check_packing) -> a Packed bound to cu_seqlens'
    offsets, checked against q's rows (numpy or torch q); hils.gpu.forward's: an empty sequence
    is skipped there (zero rows in, zero rows out), a pack of nothing but empty ones refused, as
    hils.verify's packs do."""
    check_packing(name, cu_seqlens)
    probe = Packed(name, [0, 0])
    offsets = offsets_of(cu_seqlens, PackedBatch._total(q, "q", probe))
    _check_not_all_empty(offsets, "nothing to compute; hils.gpu.forward computes a pack with at "
                                  "least one slot")
    return Packed(name, offsets)


def batch_of(layout, inputs, queries, cu_seqlens, cu_seqlens_k=None, landmark_queries=None,
             spec=None):
    """The Batch of hils.verify's arguments: packed (PackedBatch) when cu_seqlens is given
    (cu_seqlens_k, landmark_queries and the spec, which says whether priors are read, are its)."""
    name = layout.name if isinstance(layout, (Layout, Packed)) else layout
    check_packing(name, cu_seqlens)
    if cu_seqlens is None:
        for label, value in (("cu_seqlens_k", cu_seqlens_k), ("landmark_queries", landmark_queries)):
            if value is not None:
                raise ValueError(f"{label}: read only with cu_seqlens (packed sequences: "
                                 f"cu_seqlens the queries' offsets, cu_seqlens_k the keys')")
        return Batch(layout, inputs, queries)
    return PackedBatch(name, inputs, queries, cu_seqlens, cu_seqlens_k, landmark_queries, spec)


def lse_layout_of(lse_layout, layout):
    """lse_layout= -> a Layout with the same batching as `layout`, or None (layout's own)."""
    if lse_layout is None:
        return None
    if isinstance(layout, Packed):
        return layout.lse_layout(lse_layout)
    result = Layout(lse_layout, "lse_layout")
    if result.batched != layout.batched:
        same = [n for n, v in _LAYOUTS.items() if v[0] == layout.batched]
        kind = "batched" if layout.batched else "one sequence"
        raise ValueError(f"lse_layout: expected None or one of {_names(same)} ({kind}, as layout "
                         f"\"{layout.name}\" is), found \"{lse_layout}\"")
    return result


def selection_order_of(order):
    if not isinstance(order, str) or order not in SELECTION_ORDERS:
        raise ValueError(f"selection_order: expected \"ascending\" (the verify file's rows: chunks "
                         f"ascending, -1 padding last) or \"any\" (rows in any order, e.g. "
                         f"torch.topk's, sorted before judging), found {order!r}")
    return order


def sort_selection(outputs):
    """selection_order="any" on one sequence's outputs ({name: [heads, rows, ...]}): each
    selection row sorted (chunks ascending, then the negative entries in their order), the
    first K columns of fusion_weights permuted alike (query head h follows KV group h // G).
    Anything malformed (not an integer [Hkv, Tq, K] array, fusion_weights of another shape) is
    left as it is for the oracle to judge."""
    selection = outputs.get("selection")
    if (not isinstance(selection, np.ndarray) or selection.dtype.kind not in "iu"
            or selection.ndim != 3):
        return outputs
    key = selection
    if selection.dtype.kind == "i":
        key = np.where(selection < 0, np.iinfo(selection.dtype).max, selection)
    order = np.argsort(key, axis=-1, kind="stable")
    result = dict(outputs, selection=np.take_along_axis(selection, order, axis=-1))
    weights = outputs.get("fusion_weights")
    groups, rows, count = order.shape
    if (isinstance(weights, np.ndarray) and weights.ndim == 3 and groups
            and weights.shape[0] % groups == 0 and weights.shape[1:] == (rows, count + 2)):
        per_head = np.repeat(order, weights.shape[0] // groups, axis=0)
        weights = weights.copy()
        weights[:, :, :count] = np.take_along_axis(weights[:, :, :count], per_head, axis=-1)
        result["fusion_weights"] = weights
    return result


class BatchReport:
    """The oracle's verdict on a batch: .reports[b] is sequence b's Report (as hils.verify gives
    for one sequence), None for an empty sequence of a pack (no query: nothing to judge,
    data/verify_format.md "Empty sequences"); .passed when every judged sequence passes;
    .failed lists the b that fail, .empty those not judged. str() is one line per sequence,
    then the full report of each that fails; a packed sequence's line names its rows in the pack
    (`b=1 (T = 30, rows 77..106)`), since its report's coordinates (t) count from its own first
    row, and an empty one's reads `b=1 (T = 0): empty, nothing to judge`."""

    def __init__(self, reports, layout, lengths=None, title=None, counts=None, offsets=None):
        self.reports = list(reports)
        self.layout = layout
        self.title = f"layout \"{layout}\"" if title is None else title  # what the batch is
        self.lengths = None if lengths is None else list(lengths)  # T of each sequence, if ragged
        self.counts = None if counts is None else list(counts)  # Tq of each (its last slots)
        # A pack's cu_seqlens: sequence b's queries are rows offsets[b].. of the caller's q and outputs.
        self.offsets = None if offsets is None else [int(x) for x in offsets]

    @property
    def passed(self):
        return all(report.passed for report in self.reports if report is not None)

    @property
    def failed(self):
        return [b for b, report in enumerate(self.reports)
                if report is not None and not report.passed]

    @property
    def empty(self):
        return [b for b, report in enumerate(self.reports) if report is None]

    def __len__(self):
        return len(self.reports)

    def __bool__(self):
        # Without it `assert hils.verify(...)` held for a failing batch (its length is B > 0).
        raise TypeError("hils.BatchReport: the truth value of a report is ambiguous (a failing "
                        "report is not false): use report.passed, or "
                        "hils.testing.assert_kernel_matches")

    def __getitem__(self, b):
        return self.reports[b]

    def __iter__(self):
        return iter(self.reports)

    def __str__(self):
        failed, empty = self.failed, self.empty
        lines = [f"batch of {len(self)} sequences, {self.title}: "
                 f"{len(self) - len(failed) - len(empty)} pass, {len(failed)} fail"
                 + (f" (b={', '.join(map(str, failed))})" if failed else "")
                 + (f", {len(empty)} empty (b={', '.join(map(str, empty))})" if empty else "")]
        lines += [f"  b={b}{self._length(b)}: "
                  + ("empty, nothing to judge" if report is None else _summary(report))
                  for b, report in enumerate(self.reports)]
        for b in failed:
            lines += ["", f"---- b={b}: FAIL{self._rows(b)} ----", str(self.reports[b])]
        lines.append("batch PASS" if self.passed else f"batch FAIL (b={', '.join(map(str, failed))})")
        return "\n".join(lines)

    def _length(self, b):
        if self.lengths is None:
            return ""
        T = self.lengths[b]
        if self.reports[b] is None:  # an empty sequence: no query row to name
            return f" (T = {T})" if self.counts is None or T == 0 else f" (T = {T}, Tq = 0)"
        rows = "" if self.offsets is None else f", {self._query_rows(b)}"
        if self.counts is None or self.counts[b] == T:
            return f" (T = {T}{rows})"
        n = self.counts[b]
        return f" (T = {T}, Tq = {n}: slot{f's {T - n}..' if n > 1 else ' '}{T - 1}{rows})"

    def _query_rows(self, b):
        first, end = self.offsets[b:b + 2]
        chunked = self.counts is not None and self.counts != self.lengths
        rows = f"rows {first}..{end - 1}" if end - first > 1 else f"row {first}"
        return f"query {rows}" if chunked else rows

    def _rows(self, b):
        """Where a packed sequence's coordinates sit in the caller's tensors: its report's t
        counts from the sequence's first slot (with cu_seqlens_k its queries are its last Tq
        slots, T - Tq .. T - 1)."""
        if self.offsets is None:
            return ""
        first = self.offsets[b]
        where = f"{self._query_rows(b)} of the pack: its "
        skipped = 0 if self.counts is None else self.lengths[b] - self.counts[b]
        if skipped:
            return f" ({where}slot t is row {first} + t - {skipped})"
        return f" ({where}t=0 is row {first})"

    def __repr__(self):
        return (f"<hils.BatchReport {'PASS' if self.passed else 'FAIL'} B={len(self)}"
                + (f" failed b={self.failed}" if self.failed else "")
                + (f" empty b={self.empty}>" if self.empty else ">"))


def _summary(report):
    """One sequence's verdict in a line: the worst headroom and the selection's rows, and for a
    failure these numbers do not show (a NaN, a wrong shape, a malformed selection row, where
    the headroom stays below 1 and no row differs; no output at all, which the oracle names
    among the selection's problems) the first problem the report names."""
    parts = []
    tensors = report.tensors
    untold = [t.problems[0] for t in tensors.values()
              if not t.passed and not t.headroom > 1 and t.problems]
    selection = report.selection
    if selection.compared and not selection.passed and not selection.rows_differing:
        untold[:0] = selection.problems[:1]
    elif not selection.compared and not report.passed:  # "the kernel outputs are empty: ..."
        untold[:0] = selection.problems[:1]
    finite = {name: t.headroom for name, t in tensors.items() if np.isfinite(t.headroom)}
    if finite:
        name = max(finite, key=finite.get)
        parts.append(f"worst headroom {finite[name]:.3g} ({name})")
    if selection.compared:
        parts.append(f"selection {selection.rows_differing} of {selection.rows} rows differ")
    failing = [n for n, t in tensors.items() if not t.passed]
    if selection.compared and not selection.passed:
        failing.insert(0, "selection")
    verdict = "PASS" if report.passed else f"FAIL ({', '.join(failing) or 'see below'})"
    if untold:
        verdict += f"  {untold[0]};"
    return verdict + ("  " + ", ".join(parts) if parts else "")

"""The oracle's hard cases as inputs for a kernel's own tests (data/hard_cases.md).

    import hils, pytest, torch
    from hils.testing import assert_kernel_matches

    SPEC = {"preset": "nsa", "S": 64, "W": 512, "K": 16}
    CASES = hils.hard_cases(SPEC, Hq=16, Hkv=2, d=64, precision="bf16", layout="bshd",
                            length_multiple=64)

    @pytest.mark.parametrize("case", CASES, ids=str)
    def test_my_kernel(case):
        q, k, v = (torch.from_numpy(x).cuda().bfloat16() for x in (case.q, case.k, case.v))
        o, lse, sel = my_kernel(q, k, v)
        assert_kernel_matches(SPEC, outputs={"o": o, "lse": lse, "selection": sel},
                              **case.arguments)

Each case is built for the spec's geometry (S, W, K, landmarks) and the kernel's head shape,
with every value exact in `precision` (so ties survive the kernel's own conversion), and says
what a wrong kernel does on it (`case.catches`). The construction is C++ (hils._core, the
oracle's library: analysis/src/oracle_hard_cases.cpp), the same for hils.hard_cases, `hils
cases` and C++ callers.
"""

import numbers

import numpy as np

from . import layouts as _layouts


def _laid(layout, heads):
    """[heads, rows, columns] float64 -> float32 in `layout`, C-contiguous (a kernel's own
    layout, not a transposed view)."""
    return np.ascontiguousarray(layout.join([heads.astype(np.float32)]))


class HardCase:
    """One case: .name, .catches (what a wrong kernel does here), .T, the inputs .q, .k, .v
    (float32 numpy arrays in .layout, exact in .precision) and .prior (None unless the spec's
    prior rule reads one); .arguments = the keyword arguments of hils.verify and
    hils.testing.assert_kernel_matches for these inputs (q, k, v, prior, layout,
    input_precision); .decode_arguments() the same inputs as one decode step (its last query)."""

    def __init__(self, item, layout, precision, fields):
        self.name, self.catches = item["name"], item["catches"]
        self.layout, self.precision = layout.name, precision
        self.T = item["q"].shape[1]
        self.q, self.k, self.v = (_laid(layout, item[n]) for n in ("q", "k", "v"))
        prior = item.get("prior")
        self.prior = None if prior is None else _laid(layout, prior)
        self._fields = fields

    def decode_arguments(self, length=None):
        """The case as one decode step: the query of slot length-1 against a cache of the case's
        first `length` slots (default: the case's T, its last query), the keyword arguments of
        hils.verify_decode and hils.testing.assert_decode_matches (q [1, Hq, d], k_cache, v_cache
        [1, length, Hkv, d] with cache_layout "bshd", cache_seqlens [length], landmark_queries
        [1, length // S, Hq, d] where the spec's summaries read the landmark slots' queries,
        input_precision). A step judges one query, which may miss the rows a fault moves: walk
        several, `for n in range(case.T - 160, case.T + 1): case.decode_arguments(n)` (our decode
        kernel passed the last step of large_logits and failed 8 of its last 160, data/hard_cases.md).
        ValueError for a length outside 1..T and for a spec whose prior is given or shared (a decode
        step is judged with prior_rule landmark_query)."""
        from . import decoding as _decoding
        if self.prior is not None:
            raise ValueError(f"decode_arguments: spec {self._fields['name']!r} reads a "
                             f"{self._fields['prior_rule']} prior, which hils.verify_decode does not take "
                             f"(a decode step's summaries read prior_rule landmark_query)")
        T = self.T if length is None else _count(length, "decode_arguments: length")
        if not 1 <= T <= self.T:
            raise ValueError(f"decode_arguments: length: expected 1..{self.T} (the case's slots), got {T}")
        laid = _layouts.Layout(self.layout)
        q, k, v = (laid.sequences(getattr(self, n), n, n, 1)[0][:, :T] for n in ("q", "k", "v"))  # [heads, T, d]
        arguments = {"q": np.ascontiguousarray(q[None, :, -1]),
                     "k_cache": np.ascontiguousarray(k.swapaxes(0, 1)[None]),
                     "v_cache": np.ascontiguousarray(v.swapaxes(0, 1)[None]),
                     "cache_seqlens": np.array([T], dtype=np.int32),
                     "cache_layout": "bshd", "input_precision": self.precision}
        chunks = T // self._fields["S"]
        if _decoding.needs_prior(self._fields) and chunks > 0:
            slots = np.arange(chunks) * self._fields["S"] + self._fields["S"] - 1
            arguments["landmark_queries"] = np.ascontiguousarray(q[:, slots].swapaxes(0, 1)[None])
        return arguments

    @property
    def arguments(self):
        return {"q": self.q, "k": self.k, "v": self.v, "prior": self.prior,
                "layout": self.layout, "input_precision": self.precision}

    def __str__(self):
        return self.name

    def __repr__(self):
        return f"HardCase({self.name!r}, T={self.T}, layout={self.layout!r}, precision={self.precision!r})"


class HardCases(list):
    """The cases (a list of HardCase, in the table's order) and .skipped: (name, reason) for
    each case of the table that this spec, head shape or length rule leaves out."""

    def __init__(self, cases, skipped):
        super().__init__(cases)
        self.skipped = list(skipped)


def _count(value, name, allow_none=False):
    if allow_none and value is None:
        return value
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name}: expected an integer, found {type(value).__name__} {value!r}")
    if not -2**63 <= value < 2**63:  # was pybind11's "incompatible function arguments"
        raise ValueError(f"{name}: expected an integer within int64's range, found {value}")
    return int(value)


def hard_cases(spec, *, Hq, Hkv, d, dv=None, precision="fp32", layout="hsd", length_multiple=1,
               max_T=None):
    """The hard cases for a kernel of this spec ({"preset": "nsa", "S": 64, ...}) and head shape
    (Hq query heads, Hkv KV heads, head dims d and dv = d by default), every value exact in
    `precision` ("fp32" or "bf16", hils._core.input_precisions), the arrays in `layout` (the
    layouts of hils.verify; "bshd" and "bhsd" with B = 1). length_multiple: every T a multiple
    of it (a kernel that takes only whole tiles); max_T: leave out longer cases. Returns a
    HardCases list; .skipped names the cases left out and why. ValueError / TypeError name the
    argument for a bad value."""
    from . import _core_module, _spec_fields, _spec_json, _text  # hils/__init__ imports this module

    core = _core_module()
    laid = _layouts.Layout(layout)
    precision = _text(precision, "precision", "a precision name such as \"bf16\"")
    Hq, Hkv, d = _count(Hq, "Hq"), _count(Hkv, "Hkv"), _count(d, "d")
    dv = d if dv is None else _count(dv, "dv")
    length_multiple = _count(length_multiple, "length_multiple")
    max_T = _count(max_T, "max_T", allow_none=True)
    if max_T is not None and max_T < 1:
        raise ValueError(f"max_T: expected a length >= 1 (None: no limit), found {max_T}")
    # InvalidArgument from the C++ side arrives as ValueError naming the field.
    cases, skipped = core.hard_cases(_spec_json(spec), Hq, Hkv, d, dv, precision,
                                     length_multiple, 0 if max_T is None else max_T)
    fields = _spec_fields(spec)
    return HardCases([HardCase(item, laid, precision, fields) for item in cases], skipped)

"""A decode step of someone else's kernel (hils.verify_decode) turned into the oracle's one-query
problems: B sequences of ragged lengths (cache_seqlens), their K/V in a dense or paged cache
(FlashAttention's flash_attn_with_kvcache, vLLM's and FlashInfer's page tables), one new query
per sequence at its last slot.

Sequence b has T = cache_seqlens[b] slots (the new token's K/V included) and its query sits at
slot T-1. Its problem is what hils.verify judges with queries=[T-1]: k and v [Hkv, T, d] gathered
from the cache, q [Hq, T, d] holding the step's query at row T-1, and where the mechanism reads
them, q_retrieval [Hq, T, d] holding the step's q~ at row T-1 and the prior of each complete chunk
c < T // S at its landmark slot (c+1)S - 1 (prior_rule landmark_query: the retrieval query q~ of
that slot, reference/SEMANTICS.md section 3). The query at T-1 reads no other row of q or q~
(SEMANTICS sections 2-5): those rows are zero. query_inputs (n = 1 query at the last slot)
builds q and q_retrieval; it is also what hils.gpu.DecodeCache.verify_arguments uses for its own steps.

Caches (cache_layout, the order of a cache's axes, as hils/layouts.py names layouts):
    "bshd": dense [B, capacity, Hkv, d] (FlashAttention's k_cache), paged [num_pages, page_size,
            Hkv, d] (FlashAttention's and vLLM's paged k_cache, FlashInfer's NHD pages)
    "bhsd": dense [B, Hkv, capacity, d] (hils.gpu.DecodeCache.k), paged [num_pages, Hkv,
            page_size, d] (FlashInfer's HND pages)
With block_table [B, max_pages] (int), slot t of sequence b is row t % page_size of page
block_table[b, t // page_size]; entries past a sequence's ceil(T / page_size) pages are not read.
landmark_queries (the priors) follow cache_layout: [B, n_chunks, Hq, d] for "bshd", [B, Hq,
n_chunks, d] for "bhsd" (DecodeCache.priors), row c the q~ of chunk c's landmark slot.

Only what sequence b reads is gathered, with the cache's own indexing (a torch cache stays on its
device until its T slots are taken), then converted (hils.as_numpy). Nothing here judges: shapes
and values are checked by the per-sequence oracle, whose messages name shapes in the verify
file's order.
"""

import numpy as np

from .layouts import _AXES

CACHE_LAYOUTS = ("bshd", "bhsd")
# The step's outputs: name -> the axes after B, the verify file's axes without Tq (one query per
# sequence).
STEP_OUTPUTS = {name: tuple(axis for axis in _AXES[name] if axis != "Tq")
                for name in ("o", "lse", "selection", "o_window", "lse_window", "fusion_weights")}


def landmark_pattern(rows_first):
    """landmark_queries' shape in the caches' (or pack's) order: rows first ("bshd", "thd") or
    heads first ("bhsd", "htd", DecodeCache.priors)."""
    return "[B, n_chunks, Hq, d]" if rows_first else "[B, Hq, n_chunks, d]"


def query_inputs(T, S, q, q_tilde=None, priors=None):
    """The oracle's inputs for queries at the last n slots T-n .. T-1 of a sequence of T slots
    (numpy arrays; a decode step's one query is n = 1, a chunked prefill's chunk n = Tq):
    q [Hq, n, d] -> q_full [Hq, T, d], zero but rows T-n .. T-1; q_retrieval [Hq, T, d] (None
    when neither q_tilde nor priors is given): q_tilde [Hq, n, d] (q when None) at rows T-n ..
    T-1, and priors[:, c] [Hq, >= (T-n) // S, d] at row (c+1)S - 1 for each chunk c < (T-n) // S
    complete before the first query (the landmark slots of the queried rows hold their own q~:
    prior_rule landmark_query, reference/SEMANTICS.md section 3), zero elsewhere."""
    q = np.asarray(q)
    heads, n, d = q.shape
    first = T - n
    q_full = np.zeros((heads, T, d), dtype=q.dtype)
    q_full[:, first:] = q
    if q_tilde is None and priors is None:
        return q_full, None
    q_retrieval = np.zeros_like(q_full)
    chunks = first // S
    if priors is not None and chunks:
        q_retrieval[:, S - 1:chunks * S:S] = np.asarray(priors)[:, :chunks]
    q_retrieval[:, first:] = q if q_tilde is None else q_tilde
    return q_full, q_retrieval


def needs_prior(fields):
    """The summaries read a prior: taylor keys or the entropy bias (reference/SEMANTICS.md
    section 3; hils::gpu's needs_prior, gpu/src/api.cpp)."""
    return fields["key_rule"] == "taylor" or fields["bias_rule"] == "entropy"


def _require_finite(name, array, where, scope):
    """A NaN or Inf among the values the step reads is refused before anything is computed,
    naming the caller's own index (where(first index) -> text; the oracle would name its
    per-sequence copy, k [Hkv, T, d], instead) and how many there are. None passes."""
    if array is None:
        return
    bad = ~np.isfinite(array)
    if not bad.any():
        return
    first = tuple(int(i) for i in np.argwhere(bad)[0])
    value = array[first]
    what = "nan" if np.isnan(value) else ("inf" if value > 0 else "-inf")
    count = int(bad.sum())
    raise ValueError(f"{name}: expected finite values{scope}, found {what} at {where(first)} "
                     f"({count} non-finite value{'s' if count > 1 else ''} there)")


def check_landmark_queries(fields, landmark_queries, pattern, what, holder, required):
    """landmark_queries against the mechanism (fields: hils._spec_fields'): refused
    (ValueError) where the summaries read no prior; where they do, prior_rule must be
    landmark_query (ValueError: `what` is judged so) and, when `required` (some chunk's landmark
    slot lies outside the queries given), landmark_queries must be given (TypeError naming
    `holder`, the inputs that lack them, and `pattern`, its expected shape). Returns
    needs_prior(fields)."""
    name = fields["name"]
    if not needs_prior(fields):
        if landmark_queries is not None:
            raise ValueError(f"landmark_queries: not read by spec {name!r} (its summaries read "
                             f"no prior: key_rule {fields['key_rule']}, bias_rule "
                             f"{fields['bias_rule']}); leave it out")
        return False
    if fields["prior_rule"] != "landmark_query":
        raise ValueError(f"spec['prior_rule']: {what} is judged with prior_rule landmark_query "
                         f"(each chunk's prior the q~ of its landmark slot), found "
                         f"{fields['prior_rule']!r}")
    if required and landmark_queries is None:
        raise TypeError(f"landmark_queries: spec {name!r} summarizes each chunk with a prior, "
                        f"the q~ of its landmark slot (key_rule {fields['key_rule']}, bias_rule "
                        f"{fields['bias_rule']}, prior_rule landmark_query; reference/SEMANTICS.md "
                        f"section 3), which {holder} do not hold: give them, {pattern}, "
                        f"row c the q~ of slot (c+1)S - 1")
    return True


def landmark_rows(landmark_queries, b, chunks, rows_first, size, heads, where, T):
    """Sequence b's priors [Hq, chunks, d] (numpy) from landmark_queries [B, n_chunks, Hq, d]
    (rows_first) or [B, Hq, n_chunks, d], B = size, n_chunks >= chunks; ValueError naming
    `where` (the layout those follow) and the sequence's T when the shape does not fit."""
    from . import as_numpy
    pattern = landmark_pattern(rows_first)
    shape = list(landmark_queries.shape)
    axis = 1 if rows_first else 2
    found = (shape[2] if rows_first else shape[1]) if len(shape) == 4 else None
    if found is None or shape[0] != size or found != heads or shape[axis] < chunks:
        raise ValueError(f"landmark_queries: expected {pattern} ({where}) with B = {size}, Hq = "
                         f"{heads} and n_chunks >= {chunks} (sequence b={b}: T = {T}), found shape "
                         f"{shape}")
    rows = landmark_queries[b, :chunks] if rows_first else landmark_queries[b, :, :chunks]
    rows = as_numpy(rows, "landmark_queries")
    return np.swapaxes(rows, 0, 1) if rows_first else rows


def _count_array(name, array, shape_text):
    from . import as_numpy
    array = as_numpy(array, name)
    if array.dtype.kind not in "iu":
        raise TypeError(f"{name}: expected integers {shape_text}, found dtype {array.dtype}")
    return array


def _shape(value):
    return list(value.shape)


class GatheredInputs:
    """The oracle's inputs of each of `size` sequences ({"q", "k", "v", "q_retrieval", "prior"}),
    built by build(b) when inputs[b] is read and not kept. A decode step's (or a chunked
    prefill's) q [Hq, T, d] per sequence is mostly zeros: B of them built at once took more
    memory than the oracle's check (run as each sequence's oracle is built, with its share of
    the batch) allows, and ended in numpy's MemoryError before that check could name the
    problem (B = 8, T = 32768, Hq = 32, d = 128 under a 3 GiB ulimit -v)."""

    def __init__(self, size, build):
        self._size, self._build = size, build

    @staticmethod
    def require_fit(shapes, size):
        """The oracle's memory check of one sequence's inputs ({name: shape}), before they are
        built: the Verifier runs the same check (its share of the `size` sequences) once they
        are, but building q alone could fail first (an 8 GiB step beside a 2 GiB cache)."""
        from . import _core_module
        _core_module().require_oracle_inputs_fit(
            {name: np.broadcast_to(np.float32(0), shape) for name, shape in shapes.items()}, size)

    def __len__(self):
        return self._size

    def __getitem__(self, b):
        if not 0 <= b < self._size:
            raise IndexError(f"sequence {b} of {self._size}")
        return self._build(b)


class DecodeStep:
    """One decode step's B sequences, gathered into the oracle's per-sequence inputs (.inputs[b]:
    {"q", "k", "v", "q_retrieval", "prior"}), with .lengths (T of each) and .size (B)."""

    def __init__(self, fields, q, k_cache, v_cache, cache_seqlens, block_table, cache_layout,
                 q_retrieval, landmark_queries):
        from . import as_numpy
        if not isinstance(cache_layout, str) or cache_layout not in CACHE_LAYOUTS:
            raise ValueError(f"cache_layout: expected \"bshd\" (k_cache [B, capacity, Hkv, d] or pages "
                             f"[num_pages, page_size, Hkv, d]: FlashAttention, vLLM, FlashInfer NHD) or "
                             f"\"bhsd\" ([B, Hkv, capacity, d] or [num_pages, Hkv, page_size, d]: "
                             f"hils.gpu.DecodeCache, FlashInfer HND), found {cache_layout!r}")
        self.rows_first = cache_layout == "bshd"
        self.layout = cache_layout
        q = as_numpy(q, "q")
        if q.ndim != 3 or q.shape[0] == 0:
            raise ValueError(f"q: expected the step's queries [B, Hq, d] (one per sequence, B >= 1; "
                             f"FlashAttention's [B, 1, Hq, d]: pass q[:, 0]), found shape {_shape(q)}")
        self.size, self.Hq = q.shape[0], q.shape[1]
        self.lengths = self._lengths(cache_seqlens)
        self.prior = needs_prior(fields)
        self._check_priors(fields, landmark_queries)
        q_tilde = None if q_retrieval is None else as_numpy(q_retrieval, "q_retrieval")
        if q_tilde is not None and q_tilde.shape != q.shape:
            raise ValueError(f"q_retrieval: expected the step's q~ [B, Hq, d] = {_shape(q)} (q's "
                             f"shape), found shape {_shape(q_tilde)}")
        for name, array in (("q", q), ("q_retrieval", q_tilde)):
            _require_finite(name, array, lambda i, n=name: f"{n}[{i[0]}, {i[1]}, {i[2]}]", "")
        caches = {"k_cache": self._cache("k_cache", k_cache), "v_cache": self._cache("v_cache", v_cache)}
        self.pages = self._pages(block_table, caches)
        S = fields["S"]
        for b, T in enumerate(self.lengths):  # every value checked before any oracle is built
            self._check_priors_of(landmark_queries, b, T // S)
            for name, cache in caches.items():  # [Hkv, T, d]: the first bad slot is named
                _require_finite(name, np.swapaxes(self._slots(name, cache, b, T), 0, 1),
                                lambda i, n=name, b=b: self._where(n, b, i[1], i[0], i[2]),
                                f" in the {T} slots sequence b={b} reads (T = cache_seqlens[{b}])")

        self._kv_widths = {name: (cache.shape[2 if self.rows_first else 1], cache.shape[3])
                           for name, cache in caches.items()}  # (Hkv, d) of k, (Hkv, dv) of v

        def gather(b):
            T = self.lengths[b]
            (Hkv, d), (Hkv_v, dv) = self._kv_widths["k_cache"], self._kv_widths["v_cache"]
            shapes = {"q": (self.Hq, T, q.shape[2]), "k": (Hkv, T, d), "v": (Hkv_v, T, dv)}
            if q_tilde is not None or (self.prior and landmark_queries is not None):
                shapes["q_retrieval"] = shapes["q"]
            GatheredInputs.require_fit(shapes, self.size)
            priors = (self._priors(landmark_queries, b, T // S)
                      if self.prior and landmark_queries is not None else None)
            q_full, q_tilde_full = query_inputs(T, S, q[b][:, None],
                                                None if q_tilde is None else q_tilde[b][:, None],
                                                priors)
            return {"q": q_full, "k": self._slots("k_cache", caches["k_cache"], b, T),
                    "v": self._slots("v_cache", caches["v_cache"], b, T),
                    "q_retrieval": q_tilde_full, "prior": None}

        self.inputs = GatheredInputs(self.size, gather)

    # --- the arguments ------------------------------------------------------------------------
    def _lengths(self, cache_seqlens):
        if cache_seqlens is None:
            raise TypeError("cache_seqlens: expected the length T of each sequence [B] (the new "
                            "token's slot included; its query is at slot T-1), found None")
        lengths = _count_array("cache_seqlens", cache_seqlens, f"[B] = [{self.size}]")
        if lengths.shape != (self.size,):
            raise ValueError(f"cache_seqlens: expected shape [B] = [{self.size}] (B from q), found "
                             f"shape {_shape(lengths)}")
        for b, T in enumerate(lengths):
            if T < 1:
                raise ValueError(f"cache_seqlens: expected each T >= 1 (the new token's slot "
                                 f"included), found cache_seqlens[{b}] = {T}")
        return [int(T) for T in lengths]

    def _check_priors(self, fields, landmark_queries):
        pattern = landmark_pattern(self.rows_first)
        # Required only where a chunk is complete before some query (T >= S), as for a chunked
        # prefill's prefix: before, the first S - 1 steps of every sequence needed a [B, 0, Hq, d].
        check_landmark_queries(fields, landmark_queries,
                               f"{pattern} (cache_layout \"{self.layout}\")", "a decode step",
                               "the step's inputs",
                               required=any(T // fields["S"] for T in self.lengths))

    def _priors(self, landmark_queries, b, chunks):
        """Sequence b's priors [Hq, chunks, d] (numpy)."""
        return landmark_rows(landmark_queries, b, chunks, self.rows_first, self.size, self.Hq,
                             f"cache_layout \"{self.layout}\"", self.lengths[b])    # [Hq, chunks, d]

    def _check_priors_of(self, landmark_queries, b, chunks):
        """Sequence b's priors read and checked (shape and values), where the mechanism reads them."""
        if not self.prior or landmark_queries is None:
            return
        rows = self._priors(landmark_queries, b, chunks)
        order = (lambda h, c, col: (b, c, h, col)) if self.rows_first else (lambda h, c, col: (b, h, c, col))
        _require_finite("landmark_queries", rows,
                        lambda i: f"landmark_queries[{', '.join(map(str, order(*i)))}] (chunk {i[1]})",
                        f" in the {chunks} row{'s' if chunks > 1 else ''} sequence b={b} reads (its "
                        f"T // S complete chunks)")

    def _cache(self, name, cache):
        from . import as_numpy
        if not hasattr(cache, "shape") or not hasattr(cache, "ndim"):
            cache = as_numpy(cache, name)
        if cache.ndim != 4:
            raise ValueError(f"{name}: expected rank 4 (cache_layout \"{self.layout}\": "
                             f"{self._pattern(None)} dense or {self._pattern(True)} paged), found "
                             f"shape {_shape(cache)}")
        return cache

    def _pattern(self, paged):
        if paged:
            return "[num_pages, page_size, Hkv, d]" if self.rows_first else "[num_pages, Hkv, page_size, d]"
        return "[B, capacity, Hkv, d]" if self.rows_first else "[B, Hkv, capacity, d]"

    def _pages(self, block_table, caches):
        """The pages of each sequence (block_table's first ceil(T / page_size) entries, checked),
        or None for dense caches (their B and capacity checked)."""
        slot_axis = 1 if self.rows_first else 2
        if block_table is None:
            for name, cache in caches.items():
                if cache.shape[0] != self.size or cache.shape[slot_axis] < max(self.lengths):
                    longest = int(np.argmax(self.lengths))
                    raise ValueError(f"{name}: expected {self._pattern(False)} with B = {self.size} "
                                     f"(from q) and capacity >= {max(self.lengths)} "
                                     f"(cache_seqlens[{longest}]), found shape {_shape(cache)} (a "
                                     f"paged cache needs block_table=)")
            return None
        table = _count_array("block_table", block_table, "[B, max_pages]")
        if table.ndim != 2 or table.shape[0] != self.size:
            raise ValueError(f"block_table: expected [B, max_pages] with B = {self.size} (from q), "
                             f"found shape {_shape(table)}")
        shapes = {name: cache.shape for name, cache in caches.items()}
        self.page_size = shapes["k_cache"][slot_axis]
        num_pages = shapes["k_cache"][0]
        if shapes["v_cache"][0] != num_pages or shapes["v_cache"][slot_axis] != self.page_size:
            raise ValueError(f"v_cache: expected {self._pattern(True)} with num_pages = {num_pages} "
                             f"and page_size = {self.page_size} (k_cache's), found shape "
                             f"{list(shapes['v_cache'])}")
        pages = []
        for b, T in enumerate(self.lengths):
            count = -(-T // self.page_size)
            if count > table.shape[1]:
                raise ValueError(f"block_table: sequence b={b} has T = {T} slots, {count} pages of "
                                 f"{self.page_size}, and block_table has {table.shape[1]} columns")
            for i, page in enumerate(table[b, :count]):
                if not 0 <= page < num_pages:
                    raise ValueError(f"block_table: expected page ids 0..{num_pages - 1} (k_cache has "
                                     f"{num_pages} pages) in the {count} pages of sequence b={b} "
                                     f"(T = {T}), found block_table[{b}, {i}] = {page}")
            pages.append([int(page) for page in table[b, :count]])
        return pages

    # --- gathering ----------------------------------------------------------------------------
    def _slots(self, name, cache, b, T):
        """Sequence b's T slots of a cache (`name`: k_cache or v_cache) -> numpy [Hkv, T, d]."""
        from . import as_numpy
        if self.pages is None:
            part = cache[b, :T] if self.rows_first else cache[b, :, :T]
            part = as_numpy(part, name)
            return np.swapaxes(part, 0, 1) if self.rows_first else part
        taken = as_numpy(cache[self.pages[b]], name)                # [n, P, Hkv, d] or [n, Hkv, P, d]
        if not self.rows_first:
            taken = np.swapaxes(taken, 1, 2)                          # [n, P, Hkv, d]
        rows = taken.reshape((-1,) + taken.shape[2:])[:T]            # [T, Hkv, d]
        return np.swapaxes(rows, 0, 1)

    def _where(self, name, b, h, t, col):
        """Slot t, head h, column col of sequence b -> the caller's index into its cache, and for
        a paged cache the page it sits in: "k_cache[7, 3, 0, 5] (slot 3, head 0, column 5: row 3
        of page block_table[0, 0] = 7)"."""
        if self.pages is None:
            index, page = ((b, t, h, col) if self.rows_first else (b, h, t, col)), ""
        else:
            P = self.page_size
            number, row = self.pages[b][t // P], t % P
            index = (number, row, h, col) if self.rows_first else (number, h, row, col)
            page = f": row {row} of page block_table[{b}, {t // P}] = {number}"
        last = (f"; slot {t} is the new token's: write its K/V before the step (cache_seqlens "
                f"counts it)" if t == self.lengths[b] - 1 else "")
        return (f"{name}[{', '.join(map(str, index))}] (slot {t}, head {h}, column {col}{page}"
                f"{last})")

    def outputs(self, outputs):
        """The step's outputs {name: [B, ...]} -> one {name: [heads, 1, ...]} per sequence. A name
        that is not a step output is refused; shapes past B are left to the oracle."""
        from collections.abc import Mapping
        from . import as_numpy
        if not isinstance(outputs, Mapping):
            raise TypeError(f"outputs: expected a dict of the step's arrays such as {{\"o\": o, "
                            f"\"lse\": lse}}, found {type(outputs).__name__}")
        parts = [{} for _ in range(self.size)]
        for name, array in outputs.items():
            if array is None:
                continue
            if name not in STEP_OUTPUTS:
                raise ValueError(f"outputs[{name!r}]: expected one of {', '.join(STEP_OUTPUTS)} "
                                 f"(a decode step's outputs, one query per sequence)")
            array = as_numpy(array, f"outputs[{name!r}]")
            rank = 1 + len(STEP_OUTPUTS[name])
            if array.ndim != rank or array.shape[0] != self.size:
                axes = ", ".join(("B",) + STEP_OUTPUTS[name])
                raise ValueError(f"outputs[{name!r}]: expected [{axes}] with B = {self.size} (from "
                                 f"q), found shape {_shape(array)}")
            for b in range(self.size):
                parts[b][name] = array[b][:, None]
        return parts

    def query_slots(self, b):
        """The one query slot sequence b computes: T-1 (hils.verify's queries=)."""
        return np.array([self.lengths[b] - 1])

    def judged(self, b):
        """Every sequence of a step has its query (T >= 1, checked)."""
        return True

    def title(self):
        """What the BatchReport's first line calls the batch."""
        if self.pages is None:
            return f"decode step, dense cache \"{self.layout}\""
        return f"decode step, paged cache \"{self.layout}\" ({self.page_size} slots a page)"

    def context(self, b):
        T = self.lengths[b]
        (Hkv, d), (Hkv_v, dv) = self._kv_widths["k_cache"], self._kv_widths["v_cache"]
        paged = "" if self.pages is None else f", {len(self.pages[b])} pages of {self.page_size}"
        return (f" (sequence b={b} of the decode step: T = {T}, query slot {T - 1}{paged}; read "
                f"as k [Hkv, T, d] = {[Hkv, T, d]}, v [Hkv, T, dv] = {[Hkv_v, T, dv]})")

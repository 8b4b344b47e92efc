"""PyTorch's own attention kernels judged by the oracle, as a kernel author's pytest would
(issue 9): SDPA flash and cuDNN (full causal), FlexAttention with a causal mask, with the
chunk-aligned window, and with a naive-BSA block mask built from hils.reference's selection;
and planted faults that must fail (a wrong scale, a window shifted by S, a dropped chunk). Then
the same kernels on a batch in their own layouts (SDPA and FlexAttention [B, H, T, d],
FlashAttention's aten entry point [B, T, H, d] with lse [B, H, T]), each judged in one call with
layout= (a fault in one sequence fails that sequence alone). Then packed sequences (FlexAttention
with a document mask, torch's varlen_attn; cu_seqlens=) and a paged decode step (gather + SDPA,
hils.verify_decode), a fault in one sequence again failing that sequence alone.
bf16 inputs on the GPU; ctest label gpu; skipped without torch or CUDA. Each report is printed
(run pytest with -s to see the headroom of every kernel)."""

import math

import pytest

import hils
from hils.testing import assert_kernel_matches
from conftest import seed_of, window_left

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("no CUDA device", allow_module_level=True)
import torch.nn.functional as F  # noqa: E402
from torch.nn.attention import SDPBackend, sdpa_kernel  # noqa: E402

Hq, Hkv, T, d = 8, 2, 2048, 64
G = Hq // Hkv
S, W, K = 64, 256, 8
SCALE = 1.0 / math.sqrt(d)


@pytest.fixture(scope="module")
def qkv():
    generator = torch.Generator(device="cuda").manual_seed(seed_of("gpu_pytorch_kernels") % 2**63)
    draw = lambda heads: torch.randn(heads, T, d, device="cuda", dtype=torch.bfloat16,  # noqa: E731
                                     generator=generator)
    return 2.0 * draw(Hq), draw(Hkv), draw(Hkv)   # gain 2: peaked enough to make chunks differ


def expanded(q, k, v):
    """[Hq|Hkv, T, d] -> [1, Hq, T, d] each, KV heads repeated for their query heads."""
    return q[None], k.repeat_interleave(G, 0)[None], v.repeat_interleave(G, 0)[None]


def judged(name, spec, q, k, v, outputs, **options):
    """assert_kernel_matches, printing the report and each tensor's headroom."""
    report = assert_kernel_matches(spec, q, k, v, outputs, input_precision="bf16", kernel=name,
                                   **options)
    print(f"\n{name}\n{report}HEADROOM {name}: " +
          " ".join(f"{t}={r.headroom:.3g}" for t, r in report.tensors.items()))
    return report


def failing(name, spec, q, k, v, outputs):
    """hils.verify that must FAIL; prints the report."""
    report = hils.verify(spec, q, k, v, outputs, input_precision="bf16", kernel=name)
    print(f"\n{name} (planted fault)\n{report}")
    assert not report.passed
    return report


# ---- SDPA ----------------------------------------------------------------------------------

def sdpa(q, k, v, backend, scale):
    """Causal SDPA on one backend -> o [Hq, T, d] and, where the backend's aten op gives it,
    lse [Hq, T] (None otherwise)."""
    qe, ke, ve = expanded(q, k, v)
    try:
        with sdpa_kernel([backend]):
            o = F.scaled_dot_product_attention(qe, ke, ve, is_causal=True, scale=scale)[0]
    except RuntimeError as error:
        pytest.skip(f"{backend} unavailable here: {error}")
    lse = None
    try:
        if backend == SDPBackend.FLASH_ATTENTION:
            out = torch.ops.aten._scaled_dot_product_flash_attention(qe, ke, ve, 0.0, True, False,
                                                                     scale=scale)
        else:
            out = torch.ops.aten._scaled_dot_product_cudnn_attention(qe, ke, ve, None, True, 0.0,
                                                                     True, False, scale=scale)
        if torch.equal(out[0][0], o):
            lse = out[1].reshape(Hq, T)
    except (RuntimeError, TypeError) as error:
        print(f"no lse from {backend}: {error}")
    return o, lse


@pytest.mark.parametrize("backend", [SDPBackend.FLASH_ATTENTION, SDPBackend.CUDNN_ATTENTION],
                         ids=["flash", "cudnn"])
def test_sdpa_passes(qkv, backend):
    q, k, v = qkv
    o, lse = sdpa(q, k, v, backend, SCALE)
    outputs = {"o": o} if lse is None else {"o": o, "lse": lse}
    judged(f"SDPA {backend.name}", {"preset": "full"}, q, k, v, outputs)


def test_sdpa_wrong_scale_fails(qkv):
    q, k, v = qkv
    o, lse = sdpa(q, k, v, SDPBackend.FLASH_ATTENTION, 1.0 / d)
    report = failing("SDPA flash, scale 1/d", {"preset": "full"}, q, k, v, {"o": o})
    assert report.tensors["o"].headroom > 1


# ---- FlexAttention -------------------------------------------------------------------------

@pytest.fixture(scope="module")
def flex():
    attention = pytest.importorskip("torch.nn.attention.flex_attention")
    return attention, torch.compile(attention.flex_attention)


def run_flex(flex, q, k, v, mask_mod, scale=SCALE):
    attention, compiled = flex
    block_mask = attention.create_block_mask(mask_mod, B=None, H=Hq, Q_LEN=T, KV_LEN=T, device="cuda")
    o, lse = compiled(*expanded(q, k, v), block_mask=block_mask, scale=scale, return_lse=True)
    return o[0], lse[0]


def causal(b, h, q_idx, kv_idx):
    return kv_idx <= q_idx


def window_mask(window):
    def mask(b, h, q_idx, kv_idx):
        return (kv_idx <= q_idx) & (kv_idx >= window_left(q_idx, window, S))
    return mask


def bsa_mask(selection, window=W):
    """The window plus the chunks of `selection` [Hkv, T, K] (-1 padded), per query head."""
    n_chunks = T // S
    chosen = torch.zeros(Hkv, T, n_chunks + 1, dtype=torch.bool, device="cuda")
    index = torch.as_tensor(selection, device="cuda").long()
    chosen.scatter_(2, torch.where(index < 0, n_chunks, index), True)   # -1 -> the spare column
    chosen = chosen[:, :, :n_chunks]

    def mask(b, h, q_idx, kv_idx):
        chunk = torch.clamp(kv_idx // S, max=n_chunks - 1)
        in_chunk = (kv_idx < n_chunks * S) & chosen[h // G, q_idx, chunk]
        return window_mask(window)(b, h, q_idx, kv_idx) | in_chunk
    return mask


def test_flex_causal_passes(qkv, flex):
    q, k, v = qkv
    o, lse = run_flex(flex, q, k, v, causal)
    judged("FlexAttention causal", {"preset": "full"}, q, k, v, {"o": o, "lse": lse})


def test_flex_window_passes_and_shifted_window_fails(qkv, flex):
    q, k, v = qkv
    spec = {"preset": "swa", "S": S, "W": W}
    o, lse = run_flex(flex, q, k, v, window_mask(W))
    judged("FlexAttention chunk-aligned window", spec, q, k, v,
           {"o": o, "lse": lse, "o_window": o, "lse_window": lse})
    o, lse = run_flex(flex, q, k, v, window_mask(W + S))
    report = failing("FlexAttention window W+S", spec, q, k, v,
                     {"o": o, "lse": lse, "o_window": o, "lse_window": lse})
    assert f"W={W + S} instead of W={W}" in report.tensors["o_window"].diagnosis


def test_flex_naive_bsa_passes_and_dropped_chunk_fails(qkv, flex):
    q, k, v = qkv
    spec = {"preset": "naive_bsa", "S": S, "W": W, "K": K}
    selection = hils.reference(spec, q, k, v)["selection"]     # the ground truth's top-K
    o, lse = run_flex(flex, q, k, v, bsa_mask(selection))
    report = judged("FlexAttention naive BSA", spec, q, k, v,
                    {"o": o, "lse": lse, "selection": selection})
    assert report.selection.rows_differing == 0
    dropped = selection.copy()
    rows = (dropped >= 0).sum(axis=2)                          # attend K-1, report K
    for g in range(Hkv):
        for t in range(T):
            if rows[g, t]:
                dropped[g, t, rows[g, t] - 1] = -1
    o, lse = run_flex(flex, q, k, v, bsa_mask(dropped))
    report = failing("FlexAttention naive BSA, one chunk dropped", spec, q, k, v,
                     {"o": o, "lse": lse, "selection": selection})
    assert report.selection.passed and not report.tensors["o"].passed


# ---- a batch in the kernels' own layouts (hils.verify's layout=) -----------------------------
# The same kernels called as their authors call them: B sequences at once, SDPA and FlexAttention
# in [B, H, T, d] with lse [B, H, T], FlashAttention's aten entry point in [B, T, H, d] with its
# softmax_lse [B, H, T]; each batch judged in one call, and a fault planted in one sequence must
# fail that sequence alone.

B = 2


@pytest.fixture(scope="module")
def batch_bhsd():
    generator = torch.Generator(device="cuda").manual_seed(seed_of("gpu_pytorch_kernels_batch") % 2**63)
    draw = lambda heads: torch.randn(B, heads, T, d, device="cuda", dtype=torch.bfloat16,  # noqa: E731
                                     generator=generator)
    return 2.0 * draw(Hq), draw(Hkv), draw(Hkv)


def expanded_batch(k, v, head_axis):
    """KV heads repeated for their query heads along head_axis (the kernels' inputs; the oracle
    reads the Hkv heads)."""
    return k.repeat_interleave(G, head_axis), v.repeat_interleave(G, head_axis)


def plant_in_last_sequence(o, index):
    """o with one row of the last sequence moved by 0.25: 3.6x the oracle's o tolerance for bf16
    inputs and a bf16 o at this size (0.069, measured with the reference's own o; 0.05 passes)."""
    bad = o.clone()
    bad[index] += 0.25
    return bad


def judged_batch(name, spec, q, k, v, outputs, **options):
    report = hils.verify(spec, q, k, v, outputs, input_precision="bf16", kernel=name, **options)
    print(f"\n{name}\n{report}")
    assert isinstance(report, hils.BatchReport) and len(report) == B
    return report


def test_sdpa_flash_batch_bhsd(batch_bhsd):
    q, k, v = batch_bhsd
    ke, ve = expanded_batch(k, v, 1)
    try:
        o, lse = torch.ops.aten._scaled_dot_product_flash_attention(q, ke, ve, 0.0, True, False,
                                                                    scale=SCALE)[:2]
    except RuntimeError as error:
        pytest.skip(f"SDPA flash unavailable here: {error}")
    assert tuple(lse.shape) == (B, Hq, T)
    report = judged_batch("SDPA flash, batch [B, H, T, d]", {"preset": "full"}, q, k, v,
                          {"o": o, "lse": lse}, layout="bhsd")
    assert report.passed, str(report)
    report = judged_batch("SDPA flash, batch, fault in b=1", {"preset": "full"}, q, k, v,
                          {"o": plant_in_last_sequence(o, (B - 1, 3, 700)), "lse": lse},
                          layout="bhsd")
    assert report.failed == [B - 1] and not report.reports[B - 1].tensors["o"].passed


def test_flash_attention_forward_batch_bshd(batch_bhsd):
    """FlashAttention's convention: q, k, v and o [B, T, H, d], softmax_lse [B, H, T]."""
    q, k, v = (x.transpose(1, 2).contiguous() for x in batch_bhsd)
    ke, ve = expanded_batch(k, v, 2)
    try:
        o, lse = torch.ops.aten._flash_attention_forward(q, ke, ve, None, None, T, T, 0.0, True,
                                                         False, scale=SCALE)[:2]
    except (RuntimeError, TypeError) as error:
        pytest.skip(f"aten._flash_attention_forward unavailable here: {error}")
    assert tuple(o.shape) == (B, T, Hq, d) and tuple(lse.shape) == (B, Hq, T)
    report = judged_batch("aten._flash_attention_forward, batch [B, T, H, d]", {"preset": "full"},
                          q, k, v, {"o": o, "lse": lse}, layout="bshd", lse_layout="bhsd")
    assert report.passed, str(report)
    with pytest.raises(ValueError, match="lse_layout"):     # softmax_lse read in o's order
        hils.verify({"preset": "full"}, q, k, v, {"o": o, "lse": lse}, input_precision="bf16",
                    layout="bshd")
    report = judged_batch("aten._flash_attention_forward, batch, fault in b=1", {"preset": "full"},
                          q, k, v, {"o": plant_in_last_sequence(o, (B - 1, 700, 3)), "lse": lse},
                          layout="bshd", lse_layout="bhsd")
    assert report.failed == [B - 1]


def test_flex_naive_bsa_batch_bhsd_with_topk_order(batch_bhsd, flex):
    """FlexAttention on a batch with the naive-BSA block mask of each sequence's selection, the
    selection given in score order (as torch.topk returns it) and judged as sets."""
    attention, compiled = flex
    q, k, v = batch_bhsd
    spec = {"preset": "naive_bsa", "S": S, "W": W, "K": K}
    reference = hils.reference(spec, q, k, v, layout="bhsd")
    selection = reference["selection"]                        # [B, Hkv, T, K], ascending
    n_chunks = T // S
    chosen = torch.zeros(B, Hkv, T, n_chunks + 1, dtype=torch.bool, device="cuda")
    index = torch.as_tensor(selection, device="cuda").long()
    chosen.scatter_(3, torch.where(index < 0, n_chunks, index), True)
    chosen = chosen[..., :n_chunks]

    def mask(b, h, q_idx, kv_idx):
        chunk = torch.clamp(kv_idx // S, max=n_chunks - 1)
        in_chunk = (kv_idx < n_chunks * S) & chosen[b, h // G, q_idx, chunk]
        return window_mask(W)(b, h, q_idx, kv_idx) | in_chunk

    block_mask = attention.create_block_mask(mask, B=B, H=Hq, Q_LEN=T, KV_LEN=T, device="cuda")
    ke, ve = expanded_batch(k, v, 1)
    o, lse = compiled(q, ke, ve, block_mask=block_mask, scale=SCALE, return_lse=True)
    reversed_rows = selection[..., ::-1].copy()               # -1 padding first, chunks descending
    report = judged_batch("FlexAttention naive BSA, batch, selection in reverse order", spec,
                          q, k, v, {"o": o, "lse": lse, "selection": reversed_rows},
                          layout="bhsd", selection_order="any")
    assert report.passed, str(report)
    assert all(r.selection.rows_differing == 0 for r in report.reports)
    report = hils.verify(spec, q, k, v, {"o": o, "lse": lse, "selection": reversed_rows},
                         input_precision="bf16", layout="bhsd")
    assert not report.passed                                  # not ascending: malformed rows


# ---- packed (varlen) batches and decode steps (cu_seqlens=, hils.verify_decode) -------------
# Sequences of ragged lengths packed along T (FlexAttention with a document mask over [1, H,
# total, d]: layout "bhsd" with cu_seqlens; torch's varlen_attn [total, H, d]: layout "thd"), and a
# decode step over a paged cache (gather + SDPA with a one-token query, each sequence its own
# length) judged by hils.verify_decode; a fault in one sequence must fail that sequence alone.

LENGTHS = (1024, 333, 691)                                    # total 2048 = T


@pytest.fixture(scope="module")
def packed_qkv():
    """[total, heads, d] bf16 (FlashAttention's varlen layout) and cu_seqlens int32."""
    generator = torch.Generator(device="cuda").manual_seed(seed_of("gpu_packed") % 2**63)
    draw = lambda heads: torch.randn(sum(LENGTHS), heads, d, device="cuda",  # noqa: E731
                                     dtype=torch.bfloat16, generator=generator)
    cu = torch.tensor((0,) + LENGTHS, device="cuda").cumsum(0).to(torch.int32)
    return 2.0 * draw(Hq), draw(Hkv), draw(Hkv), cu


def document_mask(cu, window=None):
    """Causal inside each packed sequence (and, with a window, the chunk-aligned window counted
    from the sequence's own first slot); nothing across sequences."""
    total = int(cu[-1])
    doc = torch.searchsorted(cu[1:].long(), torch.arange(total, device="cuda"), right=True)
    start = cu.long()[doc]

    def mask(b, h, q_idx, kv_idx):
        keep = (doc[q_idx] == doc[kv_idx]) & (kv_idx <= q_idx)
        if window is not None:
            keep = keep & (kv_idx - start[kv_idx] >= window_left(q_idx - start[q_idx], window, S))
        return keep
    return mask


def run_flex_packed(flex, q, k, v, mask_mod):
    """FlexAttention over the pack as one batch row: [1, Hq, total, d] -> o, lse [1, Hq, total]."""
    attention, compiled = flex
    total = q.shape[0]
    block_mask = attention.create_block_mask(mask_mod, B=None, H=None, Q_LEN=total, KV_LEN=total,
                                             device="cuda")
    heads_first = lambda x: x.transpose(0, 1)[None].contiguous()  # noqa: E731
    ke, ve = (x.repeat_interleave(G, 1) for x in (k, v))
    return compiled(heads_first(q), heads_first(ke), heads_first(ve), block_mask=block_mask,
                    scale=SCALE, return_lse=True)


def test_flex_document_mask_packed(packed_qkv, flex):
    """FlexAttention document masking judged with layout="bhsd", cu_seqlens= (B = 1); a mask
    without the document boundary (plain causal over the pack) passes the first sequence, the
    same causal prefix, and fails the others."""
    q, k, v, cu = packed_qkv
    heads_first = lambda x: x.transpose(0, 1)[None]  # noqa: E731
    args = ({"preset": "full"}, heads_first(q), heads_first(k), heads_first(v))
    o, lse = run_flex_packed(flex, q, k, v, document_mask(cu))
    report = judged_packed("FlexAttention document mask, packed [1, H, total, d]", *args,
                           {"o": o, "lse": lse}, layout="bhsd", cu_seqlens=cu)
    assert report.passed, str(report)
    swa = {"preset": "swa", "S": S, "W": W}
    o, lse = run_flex_packed(flex, q, k, v, document_mask(cu, W))
    report = judged_packed("FlexAttention document mask + window, packed", swa, *args[1:],
                           {"o": o, "lse": lse}, layout="bhsd", cu_seqlens=cu)
    assert report.passed, str(report)
    o, lse = run_flex_packed(flex, q, k, v, causal)
    report = judged_packed("FlexAttention causal over the whole pack (no document mask)", *args,
                           {"o": o, "lse": lse}, layout="bhsd", cu_seqlens=cu)
    assert report.failed == [1, 2], str(report)


def judged_packed(name, spec, q, k, v, outputs, **options):
    report = hils.verify(spec, q, k, v, outputs, input_precision="bf16", kernel=name, **options)
    print(f"\n{name}\n{report}")
    assert isinstance(report, hils.BatchReport) and report.lengths == list(LENGTHS)
    return report


def test_varlen_attn_packed(packed_qkv):
    """torch.nn.attention.varlen.varlen_attn (FlashAttention's varlen kernel) on [total, H, d]
    with cu_seqlens: layout "thd", its lse in the order its shape says (FlashAttention's varlen
    softmax_lse is [Hq, total_q]: lse_layout "htd")."""
    varlen = pytest.importorskip("torch.nn.attention.varlen")
    import inspect
    q, k, v, cu = packed_qkv
    ke, ve = (x.repeat_interleave(G, 1) for x in (k, v))
    parameters = inspect.signature(varlen.varlen_attn).parameters
    print(f"\nvarlen_attn{inspect.signature(varlen.varlen_attn)}")
    causal_option = ({"is_causal": True} if "is_causal" in parameters else {"window_size": (-1, 0)})
    longest = max(LENGTHS)
    o, lse = varlen.varlen_attn(q, ke, ve, cu, cu, longest, longest,
                                return_aux=varlen.AuxRequest(lse=True), **causal_option)
    total = sum(LENGTHS)
    print(f"varlen_attn: o {tuple(o.shape)}, lse {tuple(lse.shape)}")
    lse_layout = {(Hq, total): "htd", (total, Hq): "thd"}[tuple(lse.shape)]
    report = judged_packed(f"varlen_attn, packed [total, H, d], lse {lse_layout}", {"preset": "full"},
                           q, k, v, {"o": o, "lse": lse}, layout="thd", lse_layout=lse_layout,
                           cu_seqlens=cu)
    assert report.passed, str(report)


DECODE_LENGTHS = (2048, 777, 1500, 65)
PAGE = 16


@pytest.fixture(scope="module")
def paged_cache():
    """A paged bf16 cache [num_pages, PAGE, Hkv, d] (vLLM's and FlashAttention's layout), each
    sequence's pages scattered (a shuffled block_table), and the step's queries [B, Hq, d]."""
    generator = torch.Generator(device="cuda").manual_seed(seed_of("gpu_paged_decode") % 2**63)
    counts = [-(-T // PAGE) for T in DECODE_LENGTHS]
    num_pages = sum(counts) + 8
    order = torch.randperm(num_pages, device="cuda", generator=generator)
    table = torch.zeros(len(DECODE_LENGTHS), max(counts), dtype=torch.int32, device="cuda")
    used = 0
    for b, count in enumerate(counts):
        table[b, :count] = order[used:used + count]
        used += count
    draw = lambda *shape: torch.randn(*shape, device="cuda", dtype=torch.bfloat16,  # noqa: E731
                                      generator=generator)
    k_cache, v_cache = draw(num_pages, PAGE, Hkv, d), draw(num_pages, PAGE, Hkv, d)
    q = 2.0 * draw(len(DECODE_LENGTHS), Hq, d)
    lengths = torch.tensor(DECODE_LENGTHS, dtype=torch.int32, device="cuda")
    return q, k_cache, v_cache, table, lengths


def paged_decode_step(q, k_cache, v_cache, table, lengths):
    """A decode step as a kernel author writes it first: per sequence, gather its pages, then SDPA's
    flash kernel with a one-token query over its T slots -> o [B, Hq, d] fp32, lse [B, Hq]."""
    outs, lses = [], []
    for b, T in enumerate(lengths.tolist()):
        pages = table[b, :-(-T // PAGE)].long()
        k, v = (cache[pages].reshape(-1, Hkv, d)[:T].transpose(0, 1).repeat_interleave(G, 0)[None]
                for cache in (k_cache, v_cache))
        o, lse = torch.ops.aten._scaled_dot_product_flash_attention(q[b][None, :, None], k, v, 0.0,
                                                                    False, False, scale=SCALE)[:2]
        outs.append(o[0, :, 0].float())
        lses.append(lse[0, :, 0])
    return torch.stack(outs), torch.stack(lses)


def test_paged_decode_step(paged_cache):
    """The step judged by hils.verify_decode with the page table; a stale page in sequence 2's
    table (the kernel read another sequence's page) fails sequence 2 alone."""
    q, k_cache, v_cache, table, lengths = paged_cache
    o, lse = paged_decode_step(q, k_cache, v_cache, table, lengths)
    spec = {"preset": "full"}
    report = hils.verify_decode(spec, q, k_cache, v_cache, {"o": o, "lse": lse},
                                cache_seqlens=lengths, block_table=table, input_precision="bf16",
                                kernel="gather + SDPA, paged")
    print(f"\ngather + SDPA decode step, paged cache\n{report}")
    assert report.passed and report.lengths == list(DECODE_LENGTHS), str(report)
    stale = table.clone()
    stale[2, 10] = table[0, 3]
    o, lse = paged_decode_step(q, k_cache, v_cache, stale, lengths)
    report = hils.verify_decode(spec, q, k_cache, v_cache, {"o": o, "lse": lse},
                                cache_seqlens=lengths, block_table=table, input_precision="bf16",
                                kernel="gather + SDPA, stale page in b=2")
    print(f"\ngather + SDPA decode step, stale page in b=2 (planted)\n{report}")
    assert report.failed == [2], str(report)

"""PyTorch's own attention kernels judged by the oracle, as a kernel author's pytest would
(issue 9): SDPA flash and cuDNN (full causal), FlexAttention with a causal mask, with the
chunk-aligned window, and with a naive-BSA block mask built from hils.reference's selection;
and planted faults that must fail (a wrong scale, a window shifted by S, a dropped chunk). Then
the same kernels on a batch in their own layouts (SDPA and FlexAttention [B, H, T, d],
FlashAttention's aten entry point [B, T, H, d] with lse [B, H, T]), each judged in one call with
layout= (a fault in one sequence fails that sequence alone).
bf16 inputs on the GPU; ctest label gpu; skipped without torch or CUDA. Each report is printed
(run pytest with -s to see the headroom of every kernel)."""

import math

import pytest

import hils
from hils.testing import assert_kernel_matches
from conftest import seed_of

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


def window_left(t, window):
    """l(t) = max(0, floor((t - W + 1) / S) S), the chunk-aligned window's first slot (Eq. 1)."""
    return torch.clamp(torch.div(t - window + 1, S, rounding_mode="floor") * S, min=0)


def run_flex(flex, q, k, v, mask_mod, scale=SCALE):
    attention, compiled = flex
    block_mask = attention.create_block_mask(mask_mod, B=None, H=Hq, Q_LEN=T, KV_LEN=T, device="cuda")
    o, lse = compiled(*expanded(q, k, v), block_mask=block_mask, scale=scale, return_lse=True)
    return o[0], lse[0]


def causal(b, h, q_idx, kv_idx):
    return kv_idx <= q_idx


def window_mask(window):
    def mask(b, h, q_idx, kv_idx):
        return (kv_idx <= q_idx) & (kv_idx >= window_left(q_idx, window))
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

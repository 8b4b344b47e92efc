"""PyTorch's own attention backward kernels judged by the oracle's gradient policy
(data/verify_format.md "Gradients"): SDPA flash and cuDNN (full causal) and FlexAttention (causal,
and the chunk-aligned window), in bf16 and in fp16, with upstream gradients do ~ N(0, 1) and, for
fp16, do ~ N(0, 2^-16) (small upstream gradients without loss scaling: most of dS below fp16's
normal range, where the floors' subnormal term counts); FlexAttention's naive BSA (flat fusion,
the reference's selection as its block mask) too. Planted faults must fail: the backward
computed in bf16 judged as the fp16 kernel it claims to be, and a wrong logit scale. Each report's
headroom is printed (pytest -s). ctest label gpu; skipped without torch or CUDA."""

import math

import pytest

import hils
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
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


def inputs(precision):
    """q (gain 2), k, v [H, T, d] and a generator for do, in the kernel's dtype on the GPU."""
    generator = torch.Generator(device="cuda").manual_seed(seed_of(f"gpu backward {precision}") % 2**63)
    draw = lambda heads: torch.randn(heads, T, d, device="cuda", generator=generator)  # noqa: E731
    q, k, v = 2.0 * draw(Hq), draw(Hkv), draw(Hkv)
    return [x.to(DTYPES[precision]) for x in (q, k, v)], generator


def backward(forward, q, k, v, d_o):
    """forward(q, k, v expanded to [1, Hq, T, d]) -> o; then its backward with d_o: o, dq, dk, dv
    [H, T, d] (dk, dv summed over each KV group's query heads by autograd)."""
    q, k, v = (x.detach().clone().requires_grad_(True) for x in (q, k, v))
    o = forward(q[None], k.repeat_interleave(G, 0)[None], v.repeat_interleave(G, 0)[None])[0]
    o.backward(d_o)
    return o.detach(), q.grad, k.grad, v.grad


def sdpa(backend, scale=SCALE):
    def forward(q, k, v):
        with sdpa_kernel([backend]):
            return F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scale)
    return forward


@pytest.fixture(scope="module")
def flex():
    attention = pytest.importorskip("torch.nn.attention.flex_attention")
    compiled = torch.compile(attention.flex_attention)

    def forward_of(mask_mod):
        block_mask = attention.create_block_mask(mask_mod, B=None, H=Hq, Q_LEN=T, KV_LEN=T,
                                                 device="cuda")
        return lambda q, k, v: compiled(q, k, v, block_mask=block_mask, scale=SCALE)
    return forward_of


def causal(b, h, q_idx, kv_idx):
    return kv_idx <= q_idx


def window(b, h, q_idx, kv_idx):
    return (kv_idx <= q_idx) & (kv_idx >= window_left(q_idx, W, S))


def block_sparse(selection):
    """The window plus the chunks of `selection` [Hkv, T, K] (-1 padded) of each query's KV group:
    naive BSA's one softmax (flat fusion)."""
    n_chunks = T // S
    chosen = torch.zeros(Hkv, T, n_chunks + 1, dtype=torch.bool, device="cuda")
    index = torch.as_tensor(selection, device="cuda").long()
    chosen.scatter_(2, torch.where(index < 0, n_chunks, index), True)   # -1 -> the spare column
    chosen = chosen[:, :, :n_chunks]

    def mask(b, h, q_idx, kv_idx):
        chunk = torch.clamp(kv_idx // S, max=n_chunks - 1)
        return window(b, h, q_idx, kv_idx) | ((kv_idx < n_chunks * S) & chosen[h // G, q_idx, chunk])
    return mask


def judge(name, spec, precision, tensors, d_o, declared=None, selection=None):
    """hils.verify of a backward (o and the three gradients) -> the report, printed."""
    q, k, v, o, dq, dk, dv = (x.float().cpu().numpy() for x in tensors)
    outputs = {"o": o} if selection is None else {"o": o, "selection": selection}
    report = hils.verify(spec, q, k, v, outputs, do=d_o.float().cpu().numpy(),
                         grads={"dq": dq, "dk": dk, "dv": dv}, kernel=name,
                         input_precision=declared or precision)
    print(f"\n{name} ({precision}, declared {declared or precision})\n{report}HEADROOM {name}: " +
          " ".join(f"{t}={r.headroom:.3g}" for t, r in report.tensors.items()))
    return report


def run(name, spec, forward, precision, do_scale, declared=None, compute_in=None, selection=None):
    """The backward of `forward` on this precision's inputs (computed in `compute_in`'s dtype when
    given: a kernel that casts its inputs), judged (with the kernel's `selection` when given)."""
    (q, k, v), generator = inputs(precision)
    d_o = (do_scale * torch.randn(Hq, T, d, device="cuda", generator=generator)).to(DTYPES[precision])
    cast = (lambda x: x.to(DTYPES[compute_in])) if compute_in else (lambda x: x)
    try:
        o, dq, dk, dv = backward(forward, cast(q), cast(k), cast(v), cast(d_o))
    except RuntimeError as error:
        pytest.skip(f"{name} unavailable here: {error}")
    return judge(name, spec, precision, (q, k, v, o, dq, dk, dv), d_o, declared, selection)


CASES = [("bf16", 1.0), ("fp16", 1.0), ("fp16", 2.0**-16)]
IDS = ["bf16", "fp16", "fp16-small-do"]


@pytest.mark.parametrize("backend", [SDPBackend.FLASH_ATTENTION, SDPBackend.CUDNN_ATTENTION],
                         ids=["flash", "cudnn"])
@pytest.mark.parametrize("precision,do_scale", CASES, ids=IDS)
def test_sdpa_backward_passes(backend, precision, do_scale):
    report = run(f"SDPA {backend.name} backward", {"preset": "full"}, sdpa(backend), precision,
                 do_scale)
    assert report.passed, str(report)


@pytest.mark.parametrize("precision,do_scale", CASES, ids=IDS)
def test_flex_backward_passes(flex, precision, do_scale):
    report = run("FlexAttention causal backward", {"preset": "full"}, flex(causal), precision, do_scale)
    assert report.passed, str(report)
    report = run("FlexAttention window backward", {"preset": "swa", "S": S, "W": W}, flex(window),
                 precision, do_scale)
    assert report.passed, str(report)


@pytest.mark.parametrize("precision,do_scale", CASES, ids=IDS)
def test_flex_naive_bsa_backward_passes(flex, precision, do_scale):
    """Flat fusion: the window and the K chunks hils.reference selects, one softmax; the oracle
    holds the kernel's selection fixed for the gradients."""
    spec = {"preset": "naive_bsa", "S": S, "W": W, "K": K}
    (q, k, v), _ = inputs(precision)  # the ones run() draws again (the same seed)
    selection = hils.reference(spec, *(x.float().cpu().numpy() for x in (q, k, v)))["selection"]
    report = run("FlexAttention naive BSA backward", spec, flex(block_sparse(selection)),
                 precision, do_scale, selection=selection)
    assert report.passed, str(report)


def test_a_bf16_backward_fails_as_the_fp16_kernel_it_claims_to_be():
    report = run("SDPA flash backward computed in bf16", {"preset": "full"},
                 sdpa(SDPBackend.FLASH_ATTENTION), "fp16", 1.0, compute_in="bf16")
    assert not any(report.tensors[n].passed for n in ("dq", "dk", "dv")), str(report)


@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_a_wrong_scale_in_the_backward_fails(precision):
    report = run("SDPA flash, scale 1/d", {"preset": "full"},
                 sdpa(SDPBackend.FLASH_ATTENTION, 1.0 / d), precision, 1.0)
    assert not report.tensors["dq"].passed and not report.tensors["dk"].passed, str(report)

"""fp16 gradients (data/verify_format.md "Gradients"): an fp16 emulation of FlashAttention's
backward of causal full attention, in numpy, judged by hils.verify. The kernel computes in float32
from fp16 q, k, v, do, rounds P (before dV = P^T dO) and dS = P (dP - D) (before dQ = sigma dS K,
dK = sigma dS^T Q) to fp16, reads D from its fp16 o and stores fp16 gradients. It passes under
input_precision="fp16" and fails declared "fp32"; with small upstream gradients (no loss scaling)
its dq and dk errors exceed what fp16's relative unit alone allows (the floor's subnormal term
covers them); flushing fp16's subnormals to zero fails it. The numbers README.md quotes are these
tests' (run with -s to print them). CPU only."""

import numpy as np
import pytest

import hils
from conftest import seed_of

T, HQ, HKV, D = 1024, 8, 2, 64
SPEC = {"preset": "full"}


def to_fp16(x):
    return np.asarray(x, np.float32).astype(np.float16).astype(np.float32)


@pytest.fixture(scope="module")
def inputs():
    rng = np.random.default_rng(seed_of("fp16 backward/inputs"))
    return tuple(to_fp16(rng.standard_normal(shape)) for shape in
                 ((HQ, T, D), (HKV, T, D), (HKV, T, D)))


def flash_backward(q, k, v, d_o, flush=False):
    """The kernel's o, dq, dk, dv (float32 holding fp16 values)."""
    def half(x):
        r = to_fp16(x)
        return np.where(np.abs(r) < 2.0**-14, 0, r).astype(np.float32) if flush else r
    G, sigma = HQ // HKV, np.float32(1 / np.sqrt(D))
    causal = np.tril(np.ones((T, T), bool))
    o_all, dq, dk, dv = np.zeros((HQ, T, D), np.float32), np.zeros_like(q), np.zeros_like(k), np.zeros_like(v)
    for h in range(HQ):
        g = h // G
        s = np.where(causal, sigma * (q[h] @ k[g].T), -np.inf)
        m = s.max(1, keepdims=True)
        P = np.exp(s - (m + np.log(np.exp(s - m).sum(1, keepdims=True)))).astype(np.float32)
        o = half(P @ v[g])
        dS = half(P * (d_o[h] @ v[g].T - (d_o[h] * o).sum(1, keepdims=True)))
        dv[g] += half(P).T @ d_o[h]
        dq[h] = sigma * (dS @ k[g])
        dk[g] += sigma * (dS.T @ q[h])
        o_all[h] = o
    return o_all, half(dq), half(dk), half(dv)


def judged(inputs, scale, precision, flush=False):
    q, k, v = inputs
    rng = np.random.default_rng(seed_of(f"fp16 backward/do {scale}"))
    d_o = to_fp16(scale * rng.standard_normal((HQ, T, D)))
    o, dq, dk, dv = flash_backward(q, k, v, d_o, flush)
    report = hils.verify(SPEC, q, k, v, {"o": o}, do=d_o, grads={"dq": dq, "dk": dk, "dv": dv},
                         input_precision=precision)
    print(f"\ndo ~ N(0, {scale:g}){' flushed' if flush else ''}, declared {precision}: "
          + ", ".join(f"{n} headroom {report.tensors[n].headroom:.3g}" for n in ("o", "dq", "dk", "dv")))
    return report


def without_subnormal_term(tensor):
    """The tolerance the relative floor alone gives: 2 x the float error + 4 x 2^-11 x magnitude."""
    return tensor.tolerance - (tensor.floor - 4 * 2.0**-11 * tensor.magnitude)


@pytest.mark.parametrize("scale", (1.0, 2.0**-16))
def test_an_fp16_flash_backward_passes_under_fp16_and_fails_declared_fp32(inputs, scale):
    assert judged(inputs, scale, "fp16").passed
    as_fp32 = judged(inputs, scale, "fp32")
    assert not any(as_fp32.tensors[n].passed for n in ("dq", "dk", "dv"))


def test_small_upstream_gradients_need_the_floors_subnormal_term(inputs):
    """With do ~ 2^-16 most dS entries are below fp16's normal range: the kernel's dq and dk
    errors are beyond the relative floor alone (the subnormal term is not slack), within it with
    the term; with do ~ N(0, 1) the term adds under 5% to every floor."""
    small = judged(inputs, 2.0**-16, "fp16")
    for name in ("dq", "dk"):
        t = small.tensors[name]
        print(f"{name}: max_abs {t.max_abs:.3g}, {t.max_abs / without_subnormal_term(t):.3g} x "
              f"the relative floor alone")
        assert t.max_abs > without_subnormal_term(t)
        assert t.passed
    # dk's worst case (G T = 4096 rounded dS, each times sigma max |q|) reaches its largest entry
    # at this do: the report names it; dq's (T keys) does not.
    assert [x.split(" ")[0] for x in small.not_compared] == ["grads/dk"]
    unit = judged(inputs, 1.0, "fp16")
    assert not unit.not_compared
    for name in ("dq", "dk", "dv"):
        t = unit.tensors[name]
        assert t.tolerance < 1.05 * without_subnormal_term(t)


def test_a_backward_that_flushes_fp16_subnormals_fails(inputs):
    report = judged(inputs, 2.0**-12, "fp16", flush=True)
    assert not report.passed
    assert report.tensors["o"].passed  # its flushed o entries (below 2^-14) are within o's floor
    assert not any(report.tensors[n].passed for n in ("dq", "dk", "dv"))

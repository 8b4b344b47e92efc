"""fp16 gradients of a hierarchical fusion (data/verify_format.md "Gradients"): an fp16 emulation of
the lmk and hils backward (fp16_hierarchical.py: P~ and dS of every softmax, d s_hat, dk', db' and
the prior's d ell rounded to fp16 where a kernel would round them) judged by hils.verify. It
passes under input_precision="fp16" with do ~ N(0, 1) and with small do ~ N(0, 2^-16) (no loss
scaling), where its errors exceed what fp16's relative unit alone allows (the floor's absolute
term covers them); it fails declared "fp32", and so do the same kernel flushing fp16's
subnormals to zero and one that leaves the fusion logits' gradient out. The emulation's own
float64 run (nothing rounded) is the reference's gradient to 1e-9 (it is a correct backward
before rounding). The numbers data/verify_format.md quotes are these tests' (-s prints them).
CPU only."""

import numpy as np
import pytest

import hils
from conftest import seed_of
from fp16_hierarchical import hierarchical_backward, to_fp16

T, HQ, HKV, D = 1024, 4, 2, 64
GEOMETRY = {"S": 16, "W": 64, "K": 4}
PRESETS = ("lmk", "hils")
SMALL = 2.0**-16
GRADIENTS = {"lmk": ("dq", "dk", "dv"), "hils": ("dq", "dq_retrieval", "dk", "dv"),
             "hils_own_q": ("dq", "dk", "dv")}


@pytest.fixture(scope="module")
def inputs():
    """fp16 q, k, v, and for hils a q~ of its own (lmk takes q~ = q: dq holds its gradient)."""
    rng = np.random.default_rng(seed_of("fp16 hierarchical backward/inputs"))
    q, k, v = (to_fp16(rng.standard_normal(shape)) for shape in
               ((HQ, T, D), (HKV, T, D), (HKV, T, D)))
    return q, k, v, to_fp16(q + 0.5 * rng.standard_normal(q.shape))


def retrieval_of(preset, inputs):
    return inputs[3] if preset == "hils" else None


def spec_of(preset):
    """"hils_own_q": hils with q~ = q (dq then holds q~'s gradient, the prior's at the landmark
    slots included)."""
    return {"preset": preset.replace("_own_q", ""), **GEOMETRY}


@pytest.fixture(scope="module")
def selections(inputs):
    q, k, v, _ = inputs
    return {p: hils.reference(spec_of(p), q, k, v, q_retrieval=retrieval_of(p, inputs))["selection"]
            for p in PRESETS + ("hils_own_q",)}


def upstream(scale):
    rng = np.random.default_rng(seed_of(f"fp16 hierarchical backward/do {scale}"))
    return to_fp16(scale * rng.standard_normal((HQ, T, D)))


_RUNS = {}


def judged(preset, inputs, selections, scale, precision, **fault):
    q, k, v, _ = inputs
    qr, d_o = retrieval_of(preset, inputs), upstream(scale)
    run = (preset, scale, tuple(sorted(fault.items())))  # the emulation once per run
    if run not in _RUNS:
        _RUNS[run] = hierarchical_backward(spec_of(preset), q, k, v, qr, d_o, selections[preset],
                                           **fault)
    o, grads = _RUNS[run]
    report = hils.verify(spec_of(preset), q, k, v, {"o": o, "selection": selections[preset]},
                         q_retrieval=qr, do=d_o, grads=grads, input_precision=precision)
    print(f"\n{preset} do ~ N(0, {scale:g}) {fault or ''} declared {precision}: " + ", ".join(
        f"{n} headroom {report.tensors[n].headroom:.3g}" for n in ("o",) + GRADIENTS[preset]))
    return report


def relative_only(tensor):
    """The tolerance without the floor's absolute term: 2 x the float error + 4 x 2^-11 x
    magnitude."""
    return tensor.tolerance - (tensor.floor - 4 * 2.0**-11 * tensor.magnitude)


@pytest.mark.parametrize("preset", PRESETS)
def test_the_emulation_unrounded_is_the_reference_gradient(preset, inputs, selections):
    """Nothing rounded, in float64, its gradients are the oracle's truth: the fp16 runs below
    differ from the truth by their rounding alone."""
    q, k, v, _ = inputs
    qr = retrieval_of(preset, inputs)
    wide = [None if x is None else x.astype(np.float64) for x in (q, k, v, qr)]
    d_o = upstream(1.0).astype(np.float64)
    o, grads = hierarchical_backward(spec_of(preset), *wide, d_o, selections[preset], exact=True)
    report = hils.verify(spec_of(preset), q, k, v, {"o": o, "selection": selections[preset]},
                         q_retrieval=qr, do=d_o, grads=grads)
    for name in ("o",) + GRADIENTS[preset]:
        assert report.tensors[name].max_abs <= 1e-9 * report.tensors[name].magnitude, name


@pytest.mark.parametrize("scale", (1.0, SMALL))
@pytest.mark.parametrize("preset", PRESETS + ("hils_own_q",))
def test_an_fp16_hierarchical_backward_passes_under_fp16_and_fails_declared_fp32(
        preset, scale, inputs, selections):
    report = judged(preset, inputs, selections, scale, "fp16")
    assert report.passed, str(report)
    for name in GRADIENTS[preset]:
        assert report.tensors[name].headroom < 0.5, name
    as_fp32 = judged(preset, inputs, selections, scale, "fp32")
    assert not any(as_fp32.tensors[n].passed for n in GRADIENTS[preset])


@pytest.mark.parametrize("preset", PRESETS)
def test_small_upstream_gradients_need_the_floors_absolute_term(preset, inputs, selections):
    """With do ~ 2^-16 most d S and d s_hat are below fp16's normal range: the dq, dk (and dq~)
    errors are beyond the relative floor alone (the absolute term is not slack)."""
    small = judged(preset, inputs, selections, SMALL, "fp16")
    beyond = {}
    for name in GRADIENTS[preset]:
        t = small.tensors[name]
        beyond[name] = t.max_abs / relative_only(t)
        print(f"{name}: max_abs {t.max_abs:.3g}, {beyond[name]:.3g} x the relative floor alone, "
              f"floor {t.floor:.3g} of magnitude {t.magnitude:.3g}")
    assert all(beyond[n] > 1 for n in ("dq", "dk")), beyond
    if preset == "hils":
        assert beyond["dq_retrieval"] > 1, beyond


def test_a_worst_case_beyond_the_gradient_itself_is_named_not_compared(inputs, selections):
    """hils' dq~ and dk sum the Taylor summary's chain of roundings (d s_hat of every query
    that selected a chunk, then dk', d ell, d mu): with do ~ 2^-16 that worst case is larger
    than the gradients themselves, so the report says they are not judged there; with
    do ~ N(0, 1) nothing is named."""
    small = judged("hils", inputs, selections, SMALL, "fp16")
    print("\n".join(small.not_compared))
    named = [n for n in GRADIENTS["hils"] if any(f"grads/{n} " in x for x in small.not_compared)]
    assert named == ["dq_retrieval", "dk"]
    for name in named:
        assert small.tensors[name].floor > small.tensors[name].magnitude
    assert not judged("hils", inputs, selections, 1.0, "fp16").not_compared


@pytest.mark.parametrize("preset", PRESETS)
def test_a_backward_that_flushes_fp16_subnormals_fails(preset, inputs, selections):
    report = judged(preset, inputs, selections, 2.0**-12, "fp16", flush=True)
    assert not report.passed
    assert not all(report.tensors[n].passed for n in ("dq", "dv"))


@pytest.mark.parametrize("preset", PRESETS)
def test_a_backward_without_the_fusion_logits_gradient_fails(preset, inputs, selections):
    """d s_hat left out: q~ and the summaries get no gradient (dk of the landmark keys for lmk;
    dq~ and the Taylor prior's dk for hils)."""
    report = judged(preset, inputs, selections, 1.0, "fp16", drop_dscore=True)
    assert not report.passed
    assert not report.tensors["dk"].passed
    if preset == "hils":
        assert not report.tensors["dq_retrieval"].passed

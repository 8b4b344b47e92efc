"""Every row of the mechanism tables of reference/include/hils/spec.hpp (kPresets and
kKeyRuleNames, read from the header as conftest reads the case table) reaches Python: hils.reference
runs it and hils.verify passes the reference's own outputs and fails them with one element of o
moved by 1e-3. A preset or key rule added to the tables is swept here without a line of Python.
hils.gpu's own copy of the spec tables (python/hils/gpu/spec.py: PRESETS, DEFAULTS, SPEC_KEYS,
pure Python so that hils.gpu needs no hils._core) resolves every preset as the C++ codec does."""

import re

import numpy as np
import pytest

import hils
import hils.gpu
from conftest import ROOT, load_table

PRESETS = load_table("kPresets")
KEY_RULES = load_table("kKeyRuleNames")
GEOMETRY = {"S": 16, "W": 32, "K": 2}


def _inputs(T=96, Hq=4, Hkv=2, d=16):
    rng = np.random.default_rng(7)
    # fp32 values held in float64: the reference and the "kernel" read the same numbers.
    return [rng.standard_normal(shape).astype(np.float32).astype(np.float64)
            for shape in ((Hq, T, d), (Hkv, T, d), (Hkv, T, d))]


def _judged(spec):
    q, k, v = _inputs()
    ref = hils.reference(spec, q, k, v)
    outputs = {"o": ref["o"].astype(np.float32), "lse": ref["lse"].astype(np.float32)}
    if "selection" in ref:
        outputs["selection"] = ref["selection"]
    passed = hils.verify(spec, q, k, v, outputs)
    outputs["o"] = outputs["o"].copy()
    outputs["o"][0, -1, 0] += 1e-3
    return passed, hils.verify(spec, q, k, v, outputs)


def test_the_tables_were_read():
    assert PRESETS[:6] == ["full", "swa", "naive_bsa", "nsa", "lmk", "hils"]
    assert KEY_RULES[:4] == ["exact", "mean", "landmark_key", "taylor"]


@pytest.mark.parametrize("preset", PRESETS)
def test_every_preset_runs_and_is_judged(preset):
    passed, planted = _judged({"preset": preset, **GEOMETRY})
    assert passed.passed, str(passed)
    assert not planted.passed, str(planted)


@pytest.mark.parametrize("key_rule", KEY_RULES)
def test_every_key_rule_runs_and_is_judged(key_rule):
    spec = {"preset": "hils", "key_rule": key_rule, **GEOMETRY}
    if key_rule == "exact":
        spec["bias_rule"] = "none"  # the exact chunk mass has no bias (MechanismSpec::validate)
    passed, planted = _judged(spec)
    assert passed.passed, str(passed)
    assert not planted.passed, str(planted)


def test_hils_gpu_spec_keys_are_the_cpp_fields_in_order():
    header = (ROOT / "reference" / "include" / "hils" / "spec_fields.hpp").read_text()
    fields = re.findall(r'SpecField<[\w:]+>\{"(\w+)"', header)
    assert fields and hils.gpu.SPEC_KEYS == ("preset",) + tuple(fields)
    assert hils.gpu.resolve_spec({}) == hils._spec_fields({}), (
        "python/hils/gpu/spec.py DEFAULTS differ from MechanismSpec's defaults")


@pytest.mark.parametrize("preset", PRESETS)
def test_hils_gpu_resolves_every_preset_as_the_codec_does(preset):
    # hils.gpu.forward and DecodeCache resolve a spec with python/hils/gpu/spec.py's PRESETS, a
    # copy of kPresets (README "Adding a mechanism", a preset's step 3); this runs without CUDA.
    assert preset in hils.gpu.PRESETS, f"{preset}: no entry in PRESETS of python/hils/gpu/spec.py"
    spec = {"preset": preset}
    assert hils.gpu.resolve_spec(spec) == hils._spec_fields(spec), (
        f"{preset}: PRESETS of python/hils/gpu/spec.py differs from kPresets")


def test_hils_gpu_has_no_preset_that_kpresets_lacks():
    assert sorted(hils.gpu.PRESETS) == sorted(PRESETS), (
        "python/hils/gpu/spec.py PRESETS and kPresets name different presets")

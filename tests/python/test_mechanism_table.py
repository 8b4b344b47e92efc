"""Every row of the mechanism tables of reference/include/hils/spec.hpp (kPresets and
kKeyRuleNames, read from the header as conftest reads the case table) reaches Python: hils.reference
runs it and hils.verify passes the reference's own outputs and fails them with one element of o
moved by 1e-3. A preset or key rule added to the tables is swept here without a line of Python."""

import numpy as np
import pytest

import hils
from conftest import load_table

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

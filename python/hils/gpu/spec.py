"""The spec dict of hils.verify ({"preset": "hils", "S": 64, ...}, data/verify_format.md) resolved
to every field's value, in pure Python (no library, no torch): the keys are the fields of
reference/include/hils/spec_fields.hpp plus "preset", the presets the rows of kPresets in
reference/include/hils/spec.hpp (tests/python/test_mechanism_table.py
resolves every preset here and through the C++ codec and compares, in the CPU suite).
Enum names are checked against the library's own tables when the problem is built
(hils.gpu.stages.problem)."""

from collections.abc import Mapping
from numbers import Integral, Real

# MechanismSpec's defaults (reference/include/hils/spec.hpp).
DEFAULTS = {"name": "custom", "fusion": "hierarchical", "key_rule": "taylor", "bias_rule": "entropy",
            "prior_rule": "landmark_query", "group_rule": "max_normalized", "softmax1": False,
            "S": 64, "W": 512, "K": 32, "landmarks": True, "scale": 0.0}
# kPresets of reference/include/hils/spec.hpp: fusion, key_rule, bias_rule, landmarks (prior_rule
# landmark_query, the other fields their defaults).
PRESETS = {
    "full": ("full", "exact", "none", False),
    "swa": ("window", "exact", "none", False),
    "naive_bsa": ("flat", "exact", "none", False),
    "nsa": ("flat", "mean", "none", False),
    "lmk": ("hierarchical", "landmark_key", "none", True),
    "hils": ("hierarchical", "taylor", "entropy", True),
}
SPEC_KEYS = ("preset",) + tuple(DEFAULTS)
_ENUM_KEYS = ("fusion", "key_rule", "bias_rule", "prior_rule", "group_rule")
_INT_KEYS = ("S", "W", "K")
_BOOL_KEYS = ("softmax1", "landmarks")


def _field(spec, key, value):
    """One field's value, type-checked (TypeError naming spec[key] and what it expects)."""
    if key in _ENUM_KEYS or key == "name":
        ok = isinstance(value, str)
        expected = "a name (str)"
    elif key in _INT_KEYS:
        ok = isinstance(value, Integral) and not isinstance(value, bool)
        expected = "an integer"
    elif key in _BOOL_KEYS:
        ok = isinstance(value, bool) or type(value).__name__ == "bool_"  # numpy's bool too
        expected = "true or false (bool)"
    else:  # scale
        ok = isinstance(value, Real) and not isinstance(value, bool)
        expected = "a number"
    if not ok:
        raise TypeError(f"spec[{key!r}]: expected {expected}, found {type(value).__name__} {value!r}")
    if key in _INT_KEYS:
        return int(value)
    return bool(value) if key in _BOOL_KEYS else (float(value) if key == "scale" else value)


def resolve(spec):
    """spec (a dict of hils.verify's form) -> {field: value} for every field of DEFAULTS, the
    preset's values under the given ones. TypeError / ValueError naming the key for a spec that
    is not a dict, an unknown key or preset, or a value of the wrong type."""
    if not isinstance(spec, Mapping):
        raise TypeError(f"spec: expected a dict such as {{\"preset\": \"hils\", \"S\": 64}}, "
                        f"found {type(spec).__name__}")
    unknown = [key for key in spec if key not in SPEC_KEYS]
    if unknown:
        raise ValueError(f"spec: unknown key {unknown[0]!r} (expected keys: {', '.join(SPEC_KEYS)})")
    fields = dict(DEFAULTS)
    if "preset" in spec:
        name = spec["preset"]
        if name not in PRESETS:
            raise ValueError(f"spec['preset']: expected one of {' | '.join(PRESETS)}, got {name!r}")
        fields["name"] = name
        fields["fusion"], fields["key_rule"], fields["bias_rule"], fields["landmarks"] = PRESETS[name]
    for key, value in spec.items():
        if key != "preset":
            fields[key] = _field(spec, key, value)
    return fields


def selects(fields):
    """True for a mechanism that selects chunks (MechanismSpec::selects: flat or hierarchical)."""
    return fields["fusion"] in ("flat", "hierarchical")

"""experiments/python/hf_dump.py's writer (numpy + h5py; no model, no download): a float16 file
(--storage float16) holds float16 datasets that `hils run` reads exactly, and a value beyond
float16's range is refused by name instead of being stored as Inf
(data/activation_format.md)."""

import os
import stat
import subprocess
import sys

import numpy as np
import pytest

from conftest import ROOT, seed_of, tool

h5py = pytest.importorskip("h5py")
sys.path.insert(0, str(ROOT / "experiments" / "python"))
import hf_dump  # noqa: E402

Hq, Hkv, T, d, dv = 4, 2, 64, 16, 8
NAMES = ("q", "k", "v", "q_unrotated", "k_unrotated")


def layers(name, n_layers=2, cast=None):
    """n_layers of Gaussian q, k, v (and un-rotated copies) seeded by `name`, cast through
    `cast` when given (float16: the values a float16 file can hold)."""
    rng = np.random.default_rng(seed_of(name))
    out = []
    for _ in range(n_layers):
        layer = {"q": 3.0 * rng.standard_normal((Hq, T, d)), "k": rng.standard_normal((Hkv, T, d)),
                 "v": rng.standard_normal((Hkv, T, dv))}
        layer.update(q_unrotated=layer["q"].copy(), k_unrotated=layer["k"].copy())
        out.append({n: a.astype(cast).astype(np.float64) if cast else a for n, a in layer.items()})
    return out


def write(path, data, storage):
    hf_dump.write_activation_file(path, data, tokens=np.arange(T), rotated=True,
                                  rope_pairing="half", rope_theta=10000.0,
                                  source={"model": "test"}, storage=storage)


def hils_run(acts, out):
    result = subprocess.run([tool("HILS_CLI"), "run", str(acts), "-o", str(out), "--preset",
                             "full,hils", "-S", "16", "-W", "32", "-K", "2",
                             "--landmarks", "false", "--prior-rule", "shared"],
                            capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    datasets = {}
    with h5py.File(out, "r") as f:
        f.visititems(lambda name, obj: datasets.__setitem__(name, obj[()])
                     if isinstance(obj, h5py.Dataset) else None)
    assert any(name.endswith("/o") for name in datasets)
    return datasets


def test_float16_storage_is_read_back_exactly_by_hils_run(tmp_path):
    name = "float16_storage_is_read_back_exactly_by_hils_run"
    half, single, wide = tmp_path / "half.h5", tmp_path / "single.h5", tmp_path / "wide.h5"
    write(half, layers(name), "float16")
    write(single, layers(name), "float32")
    # The same values, already rounded to float16, in float64: what the reader must see.
    write(wide, layers(name, cast=np.float16), "float64")
    with h5py.File(half, "r") as f:
        for i in range(2):
            for n in NAMES:
                assert f[f"layer{i}/{n}"].dtype == np.float16, f"layer{i}/{n}"
    assert os.path.getsize(half) < 0.6 * os.path.getsize(single)   # half the disk, about
    from_half = hils_run(half, tmp_path / "half_out.h5")
    from_wide = hils_run(wide, tmp_path / "wide_out.h5")
    assert from_half.keys() == from_wide.keys()
    for key, value in from_half.items():
        np.testing.assert_array_equal(value, from_wide[key], err_msg=key)


def test_float16_refuses_a_value_beyond_its_range_by_name(tmp_path):
    data = layers("float16_refuses_a_value_beyond_its_range_by_name")
    data[1]["k"][1, 5, 3] = -70000.0
    with pytest.raises(ValueError) as raised:
        write(tmp_path / "acts.h5", data, "float16")
    assert str(raised.value) == ("layer1/k: expected values within float16's range "
                                 "(|x| <= 65504), found -70000 at [1, 5, 3]; store float32")
    assert list(tmp_path.iterdir()) == []   # neither the file nor a temporary one
    write(tmp_path / "acts.h5", data, "float32")   # float32 holds it
    with h5py.File(tmp_path / "acts.h5", "r") as f:
        assert f["layer1/k"][1, 5, 3] == -70000.0


def test_an_unknown_storage_is_refused_by_name(tmp_path):
    with pytest.raises(ValueError) as raised:
        write(tmp_path / "acts.h5", layers("unknown_storage", n_layers=1), "bfloat16")
    assert str(raised.value) == ("storage: expected one of float16, float32, float64, "
                                 "found 'bfloat16'")
    assert list(tmp_path.iterdir()) == []


def test_the_file_gets_the_mode_of_a_new_file_not_the_temporary_ones(tmp_path):
    """The temporary file (tempfile.mkstemp) is owner-only; the published file is not: others
    read it as they read `hils dump`'s files (0666 less the umask)."""
    mask = os.umask(0o22)
    try:
        write(tmp_path / "acts.h5", layers("file_mode", n_layers=1), "float16")
    finally:
        os.umask(mask)
    assert stat.S_IMODE(os.stat(tmp_path / "acts.h5").st_mode) == 0o644

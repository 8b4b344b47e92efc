"""One oracle: for the same verify file, hils.verify gives the verdict and the text that
`hils verify` prints. The file comes from oracle_make_verify_file (the reference's float run as
the kernel, broken on purpose); the CLI's stdout is its first line (the file and the kernel's
name) followed by exactly str(report); its exit code is 0 exactly when report.passed. For a
malformed spec both give the spec codec's message (exit 2 / ValueError)."""

import json
import shutil
import subprocess

import pytest

import hils
from conftest import ROOT, tool
from hils import layouts

h5py = pytest.importorskip("h5py")

# oracle::kOutputTensors, the outputs hils verify and hils.verify read.
OUTPUT_NAMES = hils._core.output_names

# (case, break, preset, precision) as in tests/oracle/CMakeLists.txt's CLI tests.
FILES = [
    ("gqa_group4", "none", "hils", "fp32"),
    ("peaked_attention", "none", "hils", "bf16"),
    ("ragged_tail_no_landmarks", "none", "nsa", "fp32"),
    ("longer_blocks", "wrong_chunk", "hils", "fp32"),
    ("gqa_group4", "shifted_window", "hils", "fp32"),
    ("peaked_attention", "missing_softmax1", "hils", "fp32"),
    ("gqa_group4", "nan", "hils", "fp32"),
    ("gqa_group4", "all_zero", "hils", "fp32"),
    ("gqa_group4", "grads", "hils", "fp32"),
    ("longer_blocks", "grads", "naive_bsa", "bf16"),
    ("gqa_group4", "grads_zero_chunk", "hils", "fp32"),
    ("gqa_group4", "grads_no_softmax1", "hils", "fp32"),
    ("gqa_group4", "grads_wrong_sigma", "full", "fp32"),
]
PASSING = ("none", "grads")


def make_file(directory, case, kind, preset, precision):
    path = directory / "dump.h5"
    subprocess.run([tool("HILS_MAKE_VERIFY_FILE"), str(path), case, kind, preset, precision],
                   check=True, capture_output=True)
    return path


def verify_file_with_python(path):
    """Reads a verify file (data/verify_format.md) with h5py and judges it with hils.verify."""
    with h5py.File(path, "r") as f:
        inputs = {name: f["inputs/" + name][()] for name in f["inputs"]}
        outputs = {name: f["outputs/" + name][()] for name in OUTPUT_NAMES if "outputs/" + name in f}
        grads = {name: f["grads/" + name][()] for name in f["grads"]} if "grads" in f else None
        spec = json.loads(f.attrs["spec"])
        return hils.verify(spec, inputs["q"], inputs["k"], inputs["v"], outputs,
                           input_precision=f.attrs["input_precision"],
                           score_precision=f.attrs.get("score_precision", "fp32"),
                           q_retrieval=inputs.get("q_retrieval"), prior=inputs.get("prior"),
                           kernel=f.attrs["kernel"], do=inputs.get("do"),
                           dlse=inputs.get("dlse"), grads=grads)


@pytest.mark.parametrize("case,kind,preset,precision", FILES,
                         ids=[f"{c}-{k}-{p}-{x}" for c, k, p, x in FILES])
def test_same_text_and_verdict_as_the_cli(tmp_path, case, kind, preset, precision):
    path = make_file(tmp_path, case, kind, preset, precision)
    cli = subprocess.run([tool("HILS_CLI"), "verify", str(path)], capture_output=True, text=True)
    report = verify_file_with_python(path)
    heading = f"{path} (kernel {report.kernel})\n"
    assert cli.stdout == heading + str(report)
    assert cli.returncode == (0 if report.passed else 1)
    assert report.passed == (kind in PASSING)
    if kind.startswith("grads"):
        assert all(name in report.tensors for name in ("dq", "dk", "dv"))


def test_malformed_spec_same_message_as_the_cli(tmp_path):
    path = make_file(tmp_path, "gqa_group4", "bad_spec", "hils", "fp32")
    cli = subprocess.run([tool("HILS_CLI"), "verify", str(path)], capture_output=True, text=True)
    assert cli.returncode == 2
    with pytest.raises(ValueError) as error:
        verify_file_with_python(path)
    assert str(error.value) == 'spec.K: expected an integer, got string "four"'
    # One codec (experiments/config/spec_codec) reads the spec for both; the CLI names the file.
    assert cli.stderr.strip() == f"hils: bad input: {path}: {error.value}"


def test_gradients_through_the_pytest_helper(tmp_path):
    """assert_kernel_matches passes do/dlse/grads on: a zeroed chunk of dk raises with the
    diagnosis; an unknown gradient name is a ValueError naming it."""
    from hils.testing import assert_kernel_matches
    path = make_file(tmp_path, "gqa_group4", "grads_zero_chunk", "hils", "fp32")
    with h5py.File(path, "r") as f:
        inputs = {name: f["inputs/" + name][()] for name in f["inputs"]}
        grads = {name: f["grads/" + name][()] for name in f["grads"]}
        spec = json.loads(f.attrs["spec"])
    args = (spec, inputs["q"], inputs["k"], inputs["v"], {})
    options = dict(q_retrieval=inputs["q_retrieval"], prior=inputs["prior"], do=inputs["do"],
                   dlse=inputs["dlse"])
    with pytest.raises(AssertionError, match=r"dk is exactly zero on h=1 rows 16-23 \(chunk 2\)"):
        assert_kernel_matches(*args, grads=grads, **options)
    with pytest.raises(ValueError, match="grads: unknown key 'dx'"):
        assert_kernel_matches(*args, grads={"dx": grads["dq"]}, **options)
    # do without any gradient: nothing of the backward ran, and the report says so.
    report = hils.verify(*args, grads={}, **options)
    assert report.not_compared and report.not_compared[0].startswith("inputs/do")
    assert "not compared: inputs/do" in str(report)


def test_every_output_the_oracle_judges_has_its_axes_and_its_rows_in_the_format():
    # An output added to oracle::kOutputTensors (README "Adding a judged output") needs its axes
    # in hils.layouts (hils.verify's layouts read them) and, in data/verify_format.md, its row in
    # the datasets table and in the layouts table and its floor's precision.
    text = (ROOT / "data" / "verify_format.md").read_text()
    layout_table = text.split('| tensor | `"hsd"` (default) |')[1].split("\n\n")[0]
    layout_rows = [row.split("|")[1] for row in layout_table.splitlines()[2:]]
    floor = " ".join(text.split("- **Floor**")[1].split("\n- ")[0].split())
    assert "o" in OUTPUT_NAMES and "selection" in OUTPUT_NAMES
    for name in OUTPUT_NAMES:
        assert name in layouts._AXES, f"{name}: no axes in python/hils/layouts.py _AXES"
        assert f"| `/outputs/{name}` |" in text, f"{name}: no row in verify_format.md's datasets"
        assert any(name in row.replace(" ", "").split(",") for row in layout_rows), (
            f"{name}: no row in verify_format.md's layouts table")
        assert f"`{name}`" in floor or name == "selection", (
            f"{name}: verify_format.md's Floor does not say which precision it uses")


@pytest.fixture(scope="module")
def passing_file(tmp_path_factory):
    """A verify file of a kernel that passes (made once for the tests that set its attributes)."""
    return make_file(tmp_path_factory.mktemp("passing"), "gqa_group4", "none", "hils", "fp32")


@pytest.mark.parametrize("precision", hils._core.score_precisions)
def test_every_score_precision_is_in_the_format_and_judged_alike_by_the_cli(tmp_path, passing_file,
                                                                           precision):
    # A precision added to oracle::precision_row (README "Adding a score precision") is named in
    # data/verify_format.md's score_precision attribute and, when it is a store of k' (no input
    # precision), described in its own entry; the CLI (the verify file's attribute) and hils.verify
    # (the argument) read it and give the same report, which names it.
    text = (ROOT / "data" / "verify_format.md").read_text()
    row = next(line for line in text.splitlines() if line.startswith("| `score_precision` |"))
    assert f'`"{precision}"`' in row, f"{precision}: not named in verify_format.md's score_precision row"
    if precision not in hils._core.input_precisions:
        assert f'(`score_precision = "{precision}"`' in text, (
            f"{precision}: no entry in verify_format.md describing its store")
    path = tmp_path / "dump.h5"
    shutil.copyfile(passing_file, path)
    with h5py.File(path, "a") as f:
        f.attrs["score_precision"] = precision
    cli = subprocess.run([tool("HILS_CLI"), "verify", str(path)], capture_output=True, text=True)
    report = verify_file_with_python(path)
    assert report.score_precision == precision
    assert cli.stdout == f"{path} (kernel {report.kernel})\n" + str(report)
    assert f"selection scores {precision}\n" in cli.stdout
    assert cli.returncode == 0 and report.passed

"""A kernel author's path through `hils verify`: a verify file written by the Python writer that
data/verify_format.md documents (taken from that page, so the page cannot drift from what the
CLI reads) passes, and the mistakes users make in writing one each end in exit 2 and one line
naming the dataset or attribute, what was expected and what was found (never a crash, nor a
kernel verdict for a file the oracle could not read as meant)."""

import json
import pathlib
import re
import subprocess

import numpy as np
import pytest

import hils
from conftest import ROOT, case_inputs, case_spec, tool

h5py = pytest.importorskip("h5py")

CASE = "gqa_group4"  # Hq = 8, Hkv = 2, T = 131, d = dv = 16


def documented_writer():
    """write_verify_file from data/verify_format.md's "Writing one from Python" block."""
    page = (ROOT / "data" / "verify_format.md").read_text()
    block = re.search(r"## Writing one from Python.*?```python\n(.*?)```", page, re.S).group(1)
    definition = block.split("\n# e.g.")[0]  # the example call below it needs a kernel's arrays
    namespace = {}
    exec(definition, namespace)
    return namespace["write_verify_file"]


@pytest.fixture(scope="module")
def dump(tmp_path_factory):
    """A correct dump of the nsa preset (the reference's own outputs as the kernel's) and its
    arrays."""
    q, k, v = case_inputs(CASE)
    spec = case_spec("nsa", CASE)
    ref = hils.reference(spec, q, k, v)
    outputs = {"o": ref["o"], "lse": ref["lse"], "selection": ref["selection"]}
    path = tmp_path_factory.mktemp("dump") / "good.h5"
    documented_writer()(str(path), spec, q, k, v, outputs)
    return path, dict(q=q, k=k, v=v, spec=spec, **outputs)


def hils_verify(*paths):
    return subprocess.run([tool("HILS_CLI"), "verify", *map(str, paths)], capture_output=True,
                          text=True, timeout=120)


def broken_copy(tmp_path, good, edit, name="broken.h5"):
    """good's bytes under another name, then `edit(f)` on the h5py file."""
    path = tmp_path / name
    path.write_bytes(pathlib.Path(good).read_bytes())
    with h5py.File(path, "r+") as f:
        edit(f)
    return path


def replace(name, array):
    def edit(f):
        del f[name]
        f[name] = array
    return edit


def test_an_fp16_kernels_file_in_float16_datasets_is_read_exactly(dump, tmp_path):
    """An fp16 kernel's file as h5py writes float16 arrays (input_precision "fp16"): the CLI reads
    every value as numpy widens it, subnormals, +-65504 and NaN included: its report is
    hils.verify's on the same arrays, character for character."""
    _, a = dump
    q, k, v = (a[n].astype(np.float16) for n in ("q", "k", "v"))
    v[0, 3, :4] = [2.0 ** -24, -(2.0 ** -20), 65504.0, -65504.0]  # subnormals and the largest
    ref = hils.reference(a["spec"], *(x.astype(np.float64) for x in (q, k, v)))
    outputs = {"o": ref["o"].astype(np.float16), "lse": ref["lse"].astype(np.float32),
               "selection": ref["selection"]}
    path = tmp_path / "fp16.h5"
    documented_writer()(str(path), a["spec"], q, k, v, outputs)
    with h5py.File(path, "r+") as f:
        f.attrs["input_precision"] = "fp16"
        for name, x in (("inputs/q", q), ("inputs/k", k), ("inputs/v", v), ("outputs/o", outputs["o"])):
            del f[name]
            f[name] = x
        assert f["inputs/v"].dtype == np.float16
        kernel = f.attrs["kernel"]
    report = hils.verify(a["spec"], q, k, v, outputs, input_precision="fp16", kernel=kernel)
    cli = hils_verify(path)
    assert cli.returncode == 0 and report.passed, cli.stdout + cli.stderr
    assert cli.stdout == f"{path} (kernel {report.kernel})\n" + str(report)
    outputs["o"][1, 7, 2] = np.nan
    with h5py.File(path, "r+") as f:
        f["outputs/o"][1, 7, 2] = np.nan
    cli = hils_verify(path)
    assert cli.returncode == 1
    assert cli.stdout == f"{path} (kernel {report.kernel})\n" + str(
        hils.verify(a["spec"], q, k, v, outputs, input_precision="fp16", kernel=kernel))


def test_the_documented_writer_passes(dump):
    path, _ = dump
    result = hils_verify(path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.splitlines()[-1] == "PASS"


def bad_files(a):
    """(name, edit, the words of the one-line error) of the mistakes users make."""
    q_BTd = a["q"].transpose(1, 0, 2).copy()  # [T, Hq, d]: a kernel's [B, T, H, d] without B
    return [
        # The message names q, whose shape set T and d, not only the k that looks wrong then.
        ("q in [T, Hq, d]", replace("inputs/q", q_BTd),
         ["inputs/k: expected rank 3 shape [*, 8, 16]",
          "T = 8 and d = 16 from inputs/q, shape [131, 8, 16] read as [Hq, T, d]",
          "found rank 3 shape [2, 131, 16]"]),
        ("k of Hq heads, v of Hkv", replace("inputs/k", np.concatenate([a["k"]] * 4)),
         ["inputs/v: expected rank 3 shape [8, 131, *]", "KV heads = 8 from inputs/k"]),
        ("q of no heads", replace("inputs/q", a["q"][:0]),
         ["inputs/q: expected at least one query head, found shape [0, 131, 16]"]),
        ("q in 8-bit integers", replace("inputs/q", a["q"].astype(np.int8)),
         ["inputs/q: expected float16, float32 or float64 data, found 8-bit integers"]),
        ("o with a batch axis", replace("outputs/o", a["o"][None].astype(np.float32)),
         ["outputs/o: expected rank 3 shape [*, *, *] (heads, rows, columns; one sequence per file, "
          "no batch axis: write x[b]), found rank 4 shape [1, 8, 131, 16]"]),
        ("q with a batch axis", replace("inputs/q", a["q"][None]),
         ["inputs/q: expected rank 3", "no batch axis", "found rank 4 shape [1, 8, 131, 16]"]),
        ("lse with a batch axis", replace("outputs/lse", a["lse"][None].astype(np.float32)),
         ["outputs/lse: expected rank 2 shape [*, *] (heads, rows; one sequence per file, no batch "
          "axis: write x[b]), found rank 3 shape [1, 8, 131]"]),
        ("selection as floats", replace("outputs/selection", a["selection"].astype(np.float32)),
         ["outputs/selection: expected integer data, found 32-bit floats"]),
        ("selection below -1", replace("outputs/selection", a["selection"] - 2),
         ["outputs/selection: expected chunk indices from -1 (padding)"]),
        ("queries a numpy bool mask", lambda f: f.__setitem__("queries", np.ones(131, bool)),
         ["queries: expected integer data, found an enum type (h5py stores numpy bool arrays as "
          "one)"]),
        ("a NaN input", lambda f: f["inputs/v"].__setitem__((1, 3, 2), np.nan),
         ["inputs/v: expected finite values, found nan at [1, 3, 2]"]),
        # A whole output array written as /outputs read as "no outputs": a kernel failure (1).
        ("/outputs a dataset", lambda f: (f.__delitem__("outputs"), f.__setitem__("outputs", a["o"])),
         ["/outputs: expected a group holding datasets such as /outputs/o, found a dataset"]),
        ("/inputs a dataset", lambda f: (f.__delitem__("inputs"), f.__setitem__("inputs", a["q"])),
         ["/inputs: expected a group holding datasets such as /inputs/q, found a dataset"]),
        ("format_version an array", lambda f: f.attrs.__setitem__("format_version", np.array([1, 1])),
         ["/ attribute format_version: expected one integer, found an array of 2 64-bit integers"]),
        ("format_version a string", lambda f: f.attrs.__setitem__("format_version", "1"),
         ["/ attribute format_version: expected one integer, found strings"]),
        ("input_precision misspelled", lambda f: f.attrs.__setitem__("input_precision", "bfloat16"),
         ['/ attribute input_precision: expected "fp32", "bf16" or "fp16", got "bfloat16"']),
        ("input_precision missing", lambda f: f.attrs.__delitem__("input_precision"),
         ["/ attribute input_precision: expected the attribute to exist, found no such attribute"]),
        ("spec.K a string", lambda f: f.attrs.__setitem__("spec", json.dumps({**a["spec"], "K": "4"})),
         ['spec.K: expected an integer, got string "4"']),
        ("a results file", lambda f: f.attrs.__setitem__("format", "hils-results"),
         ['/ attribute format: expected "hils-verify" (a kernel\'s dump, data/verify_format.md), '
          'found "hils-results" (a results file of hils run or a study)']),
        ("a huge declared shape", lambda f: f.create_dataset(
            "outputs/o_window", shape=(10**6, 10**6, 64), dtype="f4", chunks=(1, 1, 64)),
         ["outputs/o_window: expected a dataset whose values fit in 80% of this machine's",
          "found shape [1000000, 1000000, 64]"]),
    ]


def test_each_mistake_is_named(dump, tmp_path):
    path, arrays = dump
    for name, edit, words in bad_files(arrays):
        result = hils_verify(broken_copy(tmp_path, path, edit))
        message = result.stderr.strip()
        assert result.returncode == 2, (name, result.returncode, result.stdout, message)
        assert len(message.splitlines()) == 1 and message.startswith("hils: bad input: "), (name, message)
        for word in words:
            assert word in message, (name, word, message)


def test_files_that_are_not_verify_files(dump, tmp_path):
    path, _ = dump
    truncated = tmp_path / "truncated.h5"
    truncated.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    empty, text, folder = tmp_path / "empty.h5", tmp_path / "text.h5", tmp_path / "folder.h5"
    empty.write_bytes(b"")
    text.write_text("o,lse\n1,2\n")
    folder.mkdir()
    for bad, words in [(truncated, "expected a complete HDF5 file"),
                       (empty, "expected an HDF5 file, found a file without the HDF5 signature"),
                       (text, "expected an HDF5 file, found a file without the HDF5 signature"),
                       (folder, "expected a file, found a folder"),
                       (tmp_path / "missing.h5", "expected an existing file, found no such file")]:
        result = hils_verify(bad)
        assert result.returncode == 2 and words in result.stderr, (bad, result.stderr)


def test_python_names_a_batch_axis(dump):
    _, a = dump
    with pytest.raises(ValueError) as raised:
        hils.verify(a["spec"], a["q"], a["k"], a["v"], {"o": a["o"][None]})
    assert str(raised.value) == (
        'outputs["o"]: expected rank 3 shape [*, *, *] (heads, rows, columns; one sequence in '
        'layout "hsd", the default: pass x[b], or the batch with layout="bhsd" or "bshd"), found '
        "rank 4 shape [1, 8, 131, 16]")
    with pytest.raises(ValueError) as raised:  # two axes too many: no guess
        hils.verify(a["spec"], a["q"][None, None], a["k"], a["v"], {"o": a["o"]})
    assert "batch" not in str(raised.value)


def test_python_names_q_for_a_transposed_q(dump):
    _, a = dump
    with pytest.raises(ValueError) as raised:
        hils.verify(a["spec"], a["q"].transpose(1, 0, 2), a["k"], a["v"], {"o": a["o"]})
    assert ("k: expected rank 3 shape [*, 8, 16] (KV heads, T, d; T = 8 and d = 16 from q, shape "
            "[131, 8, 16] read as [Hq, T, d]), found rank 3 shape [2, 131, 16]") in str(raised.value)


def test_a_corrupt_file_the_hdf5_library_crashes_on(dump, tmp_path):
    """The first global heap object (where h5py keeps the string attributes) given a size of
    ~2^34 bytes: libhdf5 1.10's H5Aread copies past its buffer (was: "Segmentation fault", exit
    139). Now exit 2 naming the file, for verify and info; a library that refuses the size
    instead gives the same start of the line."""
    good, _ = dump
    data = bytearray(good.read_bytes())
    heap = data.find(b"GCOL")  # the collection's signature; its first object's size at +24
    assert heap >= 0
    data[heap + 28] = 0x4C
    corrupt = tmp_path / "corrupt.h5"
    corrupt.write_bytes(bytes(data))
    for command in ("verify", "info"):
        result = subprocess.run([tool("HILS_CLI"), command, str(corrupt)], capture_output=True,
                                timeout=120)
        message = result.stderr.decode(errors="replace")
        assert result.returncode == 2, (command, result.returncode, message)
        assert message.startswith(f"hils: bad input: {corrupt}: expected a complete HDF5 file, "
                                  "found one the HDF5 library c"), (command, message)
        assert len(message.splitlines()) == 1, message


def test_bytes_that_are_not_utf8_are_not_echoed(dump, tmp_path):
    """A kernel name (or a spec) with bytes that are not UTF-8 (a damaged or Latin-1 attribute):
    the report shows U+FFFD for them, so a caller reading it as text (subprocess text=True, as
    here) gets no UnicodeDecodeError (was: the raw bytes echoed)."""
    good, a = dump
    named = broken_copy(tmp_path, good, lambda f: f.attrs.__setitem__("kernel", np.bytes_(b"v2 \xff\xfe")),
                        "named.h5")
    result = hils_verify(named)
    assert result.returncode == 0 and result.stdout.splitlines()[0] == f"{named} (kernel v2 \ufffd\ufffd)"
    spec = broken_copy(tmp_path, good, lambda f: f.attrs.__setitem__("spec", np.bytes_(b'{"preset": "\xe5"}')),
                       "spec.h5")
    result = hils_verify(spec)
    assert result.returncode == 2 and "attribute spec: expected a JSON object, found invalid JSON" in result.stderr
    assert "\ufffd" in result.stderr, result.stderr


def test_a_spec_that_gives_a_key_twice_is_refused(dump, tmp_path):
    """A hand-written spec attribute that gives K twice: JSON leaves the meaning open and the
    parser kept the last value without a word (was: the file judged with K = 8, exit 0 or 1);
    now exit 2 naming the key. A key repeated in another object of the text is named too; equal
    keys in different objects are not repeats."""
    good, _ = dump
    for text, key in (('{"preset": "hils", "K": 4, "K": 8}', "K"),
                      ('{"preset": "hils", "S": 8, "extra": {"a": 1, "a": 2}}', "a")):
        repeated = broken_copy(tmp_path, good, lambda f, t=text: f.attrs.__setitem__("spec", t),
                               "repeated.h5")
        result = hils_verify(repeated)
        assert result.returncode == 2, (text, result.stdout, result.stderr)
        assert result.stderr == (f"hils: bad input: {repeated}: attribute spec: expected a JSON "
                                 f"object whose keys differ (which value is meant?), found the "
                                 f"key '{key}' twice\n"), result.stderr
    unique = broken_copy(tmp_path, good, lambda f: f.attrs.__setitem__(
        "spec", '{"preset": "hils", "S": 8, "extra": {"S": 1}}'), "unique.h5")
    result = hils_verify(unique)
    assert "unknown key 'extra'" in result.stderr, result.stderr  # past the repeat check


def test_several_files_as_a_shell_glob_gives_them(dump, tmp_path):
    """`hils verify dumps/*.h5`: every file's report, each bad file named as it comes, and the
    worst exit status (was: 'The following argument was not expected', exit 2, nothing judged)."""
    good, _ = dump
    failing = broken_copy(tmp_path, good, lambda f: f["outputs/o"].__setitem__((0, 3, 1), np.nan),
                          "failing.h5")
    empty = tmp_path / "empty.h5"
    empty.write_bytes(b"")
    result = hils_verify(good, failing, empty, good)
    assert result.returncode == 2, result.stderr
    reports = [line for line in result.stdout.splitlines() if line.endswith(".h5") or
               line.endswith("(kernel my kernel)") or line in ("PASS", "FAIL")]
    assert reports == [f"{good} (kernel my kernel)", "PASS", str(failing) + " (kernel my kernel)",
                       "FAIL", f"{good} (kernel my kernel)", "PASS"], result.stdout
    assert result.stderr.splitlines() == [
        f"hils: check failed: {failing}: the kernel's outputs fail the oracle",
        f"hils: bad input: {empty}: expected an HDF5 file, found a file without the HDF5 signature",
        f"hils: bad input: 1 of 4 files could not be judged (their errors above): {empty}; "
        f"1 of 4 files fail the oracle: {failing}"]
    result = hils_verify(good, failing)
    assert result.returncode == 1 and result.stderr.splitlines()[-1] == (
        f"hils: check failed: 1 of 2 files fail the oracle: {failing}"), result.stderr
    result = hils_verify(good, good)
    assert result.returncode == 0 and result.stdout.splitlines()[-1] == "all 2 files PASS"

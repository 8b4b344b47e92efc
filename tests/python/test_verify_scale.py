"""`hils verify` at a kernel author's sizes (README "The oracle's speed"). A file whose oracle
(the reference in double and float, and what it compares) needs more than 80% of the memory this
process may use is refused before any dataset is read, exit 2, with one line naming inputs/q,
the sizes, the estimate and the knobs (/queries); it ran for the whole reference and then ended
in an "out of memory" line naming no field. On a terminal, one stderr line says which step of
the oracle runs, cleared before the report; scripts (no terminal) and --quiet see nothing.
Ctrl-C ends it at once, as it did, now with a line naming the file (it printed nothing). The
files come from oracle_make_verify_file (a table case resized, its reference's float run as the
kernel)."""

import os
import pty
import resource
import signal
import subprocess
import time

import pytest

from conftest import tool

# T = 2048, the paper's heads (Hq = 16, Hkv = 2, d = 64), hils (K = 32): the oracle's estimate
# is ~0.35 GB, more than 80% of a 300 MB address space; the process itself starts in far less.
CASE = "longer_blocks:T=2048,S=64,W=512,K=32,Hq=16,Hkv=2,d=64,dv=64,landmarks=1"
LIMIT = 300 * 2**20


def make(directory, name, case):
    path = directory / name
    subprocess.run([tool("HILS_MAKE_VERIFY_FILE"), str(path), case, "none", "hils", "bf16"],
                   check=True, capture_output=True)
    return path


@pytest.fixture(scope="module")
def dump(tmp_path_factory):
    return make(tmp_path_factory.mktemp("scale"), "hils_T2048.h5", CASE)


@pytest.fixture(scope="module")
def small(tmp_path_factory):
    return make(tmp_path_factory.mktemp("steps"), "hils_T1024.h5",
                "longer_blocks:T=1024,S=64,W=256,K=4,Hq=4,Hkv=2,d=32,dv=32,landmarks=1")


def on_a_terminal(arguments):
    """hils with stderr on a pseudo-terminal -> (stdout, what the terminal received)."""
    leader, follower = pty.openpty()
    child = subprocess.Popen([tool("HILS_CLI")] + arguments, stdout=subprocess.PIPE,
                             stderr=follower, text=True)
    os.close(follower)
    received = b""
    while True:
        try:
            chunk = os.read(leader, 4096)
        except OSError:  # EIO: every writer of the terminal has closed it
            break
        if not chunk:
            break
        received += chunk
    out = child.stdout.read()
    child.wait(timeout=600)
    os.close(leader)
    return out, received.decode()


def limited(bytes_):
    return lambda: resource.setrlimit(resource.RLIMIT_AS, (bytes_, bytes_))


def test_a_file_too_large_for_the_memory_is_refused_up_front_naming_inputs_q(dump):
    run = subprocess.run([tool("HILS_CLI"), "verify", str(dump)], capture_output=True, text=True,
                         preexec_fn=limited(LIMIT), timeout=600)
    assert run.returncode == 2, run.stderr
    assert run.stdout == ""
    lines = run.stderr.splitlines()
    assert len(lines) == 1, run.stderr
    assert lines[0].startswith(f"hils: bad input: {dump}: inputs/q: expected a problem whose oracle"), lines[0]
    assert "address-space limit (ulimit -v)" in lines[0]
    assert "judge fewer query rows (/queries), a shorter T or fewer heads at once" in lines[0]
    assert "got T = 2048 slots, 16 query heads, 2 KV heads, d = 64, 2048 query rows: about" in lines[0]


def test_the_same_file_passes_without_the_limit_and_a_script_sees_no_steps(dump):
    run = subprocess.run([tool("HILS_CLI"), "verify", str(dump)], capture_output=True, text=True,
                         timeout=600)
    assert run.returncode == 0, run.stdout + run.stderr
    assert run.stdout.splitlines()[-1] == "PASS"
    assert run.stderr == ""


def test_a_terminal_sees_each_step_then_the_line_is_cleared(small):
    out, terminal = on_a_terminal(["verify", str(small)])
    assert out.splitlines()[0] == f"{small} (kernel reference float run (break: none))"
    assert out.splitlines()[-1] == "PASS"
    steps = [part.split(" (")[0] for part in terminal.split("\r") if part.startswith("hils verify")]
    assert steps == [f"hils verify {small}: " + step for step in (
        "reading the file", "the reference in double", "the reference in float",
        "the selection's margins and the fusions of its own selection",
        "comparing the kernel's outputs")], terminal
    assert terminal.endswith("\r\x1b[K"), repr(terminal)


def test_quiet_draws_no_step_line(small):
    out, terminal = on_a_terminal(["verify", "--quiet", str(small)])
    assert out.splitlines()[-1] == "PASS"
    assert terminal == ""


def reading(pid, path, at_most=1.0):
    """Waits until process `pid` has `path` open (Linux /proc; the handler is in place then), or
    `at_most` seconds (a read too quick to be seen: hils started long before)."""
    end = time.monotonic() + at_most
    while time.monotonic() < end:
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
        except FileNotFoundError:
            break
        for fd in fds:
            try:
                if os.readlink(f"/proc/{pid}/fd/{fd}") == str(path):
                    return
            except OSError:
                pass
        time.sleep(0.002)


def test_ctrl_c_ends_it_at_once_with_a_line_naming_the_file(dump):
    # As a terminal's Ctrl-C: SIGINT at its default (a shell script's background job ignores
    # it, and hils keeps an ignored signal ignored) to the process group of hils.
    def own_group():
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.setpgrp()
    child = subprocess.Popen([tool("HILS_CLI"), "verify", str(dump)], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True, preexec_fn=own_group)
    try:
        reading(child.pid, dump)  # the handler is in place; the judging takes seconds more
        sent = time.monotonic()
        os.killpg(child.pid, signal.SIGINT)
        out, err = child.communicate(timeout=600)
        waited = time.monotonic() - sent
    finally:
        child.kill()
    assert child.returncode == -signal.SIGINT, (out, err)
    assert out == ""
    assert err == f"hils: interrupted by SIGINT (Ctrl-C) while judging {dump}; nothing was written\n"
    assert waited < 5.0, waited

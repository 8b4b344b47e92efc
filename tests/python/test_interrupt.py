"""Ctrl-C during a long hils.reference (or hils.verify) call raises KeyboardInterrupt at the
reference's next query block (hils::StopScope), not when the call would have ended: the work
runs without the GIL, so Python alone would only raise it after the call returned. The
interpreter is left as it was: the next call runs, Python's SIGINT handler is back."""

import os
import signal
import subprocess
import sys
import time

CHILD = r"""
import signal, sys, time
import numpy as np
import hils
rng = np.random.default_rng(0)
T = 65536  # full attention, 2 heads, d = 32 on one thread: ~5.5e11 flops, tens of seconds
q = rng.standard_normal((2, T, 32)).astype(np.float32)
k = rng.standard_normal((1, T, 32)).astype(np.float32)
v = rng.standard_normal((1, T, 32)).astype(np.float32)
print("start", flush=True)
try:
    hils.reference({"preset": "full"}, q, k, v)
    print("finished", flush=True)
except KeyboardInterrupt:
    print("KeyboardInterrupt", flush=True)
small = hils.reference({"preset": "full"}, q[:, :64], k[:, :64], v[:, :64])
print("after", small["o"].shape, signal.getsignal(signal.SIGINT) is signal.default_int_handler,
      flush=True)
"""


def test_ctrl_c_stops_a_long_reference_call():
    env = dict(os.environ, OMP_NUM_THREADS="1")
    # A background job of a non-interactive shell (ctest's, say) starts with SIGINT ignored,
    # which Python keeps: the child gets the default, as a terminal's Python does.
    child = subprocess.Popen([sys.executable, "-c", CHILD], stdout=subprocess.PIPE, text=True,
                             env=env, preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        assert child.stdout.readline().strip() == "start"
        time.sleep(0.5)  # inside the reference's loops by now (the inputs are ready)
        sent = time.monotonic()
        child.send_signal(signal.SIGINT)
        out, _ = child.communicate(timeout=300)
        waited = time.monotonic() - sent
    finally:
        child.kill()
    assert child.returncode == 0, out
    assert out.splitlines() == ["KeyboardInterrupt", "after (2, 64, 32) True"], out
    assert waited < 5.0, waited  # the call's end would be tens of seconds away

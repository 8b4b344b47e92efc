"""The GPU scripts' first import: they run on a machine with an NVIDIA GPU, CUDA and PyTorch
(gpu/NOTES.md "Running the GPU checks"). `needs("torch", "h5py")` ends the script with one line
naming the missing Python modules, instead of a traceback from the first import (--help included:
the scripts' options are read after their imports). Importing it also puts this checkout's
python/ first on sys.path, so that `import hils.gpu` (the C API over torch tensors,
python/hils/gpu) is this checkout's, with or without a built or installed hils._core."""
import importlib.util
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "python"))


def needs(*modules):
    missing = [m for m in modules if importlib.util.find_spec(m) is None]
    if missing:
        sys.exit(f"{os.path.basename(sys.argv[0])}: needs the Python module(s) {', '.join(missing)}, "
                 "not found by this interpreter; the GPU scripts run on a machine with an NVIDIA GPU, "
                 "CUDA and PyTorch (gpu/NOTES.md \"Running the GPU checks\")")

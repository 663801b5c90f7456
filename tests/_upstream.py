"""The source of other projects' LN-LSTMs, from their released wheels, for the
tests that check fastln's loaders against each implementation's own code.

A pinned wheel is downloaded once (``pip download --no-deps``) into
FASTLN_UPSTREAM_DIR (default: ``fastln-upstream`` in the temporary folder);
the .py files a test needs are read out of it into that folder and run there
as modules of private names, with stub modules standing in, while they load,
for the package-level imports they make (torchaudio's package imports its
compiled extension; NeMo's imports half of its dependencies). Where the wheel
cannot be had (no pip, no network), the test skips -- or fails under CI,
which downloads the wheels first (``python tests/_upstream.py``).
"""
import contextlib
import glob
import importlib.util
import logging
import os
import subprocess
import sys
import tempfile
import types
import zipfile

import pytest

WHEELS = {"torchaudio": "2.11.0", "nemo-toolkit": "3.0.0"}   # name: pinned version


def folder():
    return os.environ.get("FASTLN_UPSTREAM_DIR") or os.path.join(tempfile.gettempdir(),
                                                                  "fastln-upstream")


def _wheel(name):
    """The path of the pinned wheel of ``name``, downloaded if not there yet."""
    version = WHEELS[name]
    pattern = os.path.join(folder(), f"{name.replace('-', '_')}-{version}-*.whl")
    found = glob.glob(pattern)
    if not found:
        os.makedirs(folder(), exist_ok=True)
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--no-input", "-q",
               "-d", folder(), f"{name}=={version}"]
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
        found = glob.glob(pattern)
        if not found:
            raise OSError(f"cannot download {name}=={version}: {done.stderr.strip()[-500:]}")
    return found[0]


def _source(name, path):
    """The file ``path`` of the pinned wheel of ``name``, extracted into folder()."""
    target = os.path.join(folder(), f"{name}-{WHEELS[name]}", path)
    if not os.path.exists(target):
        with zipfile.ZipFile(_wheel(name)) as whl:
            data = whl.read(path)
        os.makedirs(os.path.dirname(target), exist_ok=True)
        with open(target + ".part", "wb") as f:
            f.write(data)
        os.replace(target + ".part", target)
    return target


@contextlib.contextmanager
def _stubs(modules):
    """sys.modules with ``modules`` (name: attributes) as stand-ins, restored on exit."""
    saved = {name: sys.modules.get(name) for name in modules}
    try:
        for name, attributes in modules.items():
            stub = types.ModuleType(name)
            stub.__path__ = []   # a package, so that its submodules import
            stub.__dict__.update(attributes)
            sys.modules[name] = stub
        yield
    finally:
        for name, module in saved.items():
            if module is None:
                sys.modules.pop(name, None)
            else:
                sys.modules[name] = module


def _run(name, path, label):
    """The module at ``path`` of ``name``'s wheel, run as module ``label``, which
    stays in sys.modules (TorchScript and inspect find the source through it)."""
    if label in sys.modules:
        return sys.modules[label]
    spec = importlib.util.spec_from_file_location(label, _source(name, path))
    module = importlib.util.module_from_spec(spec)
    sys.modules[label] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[label]
        raise
    return module


def _or_skip(load):
    try:
        return load()
    except (OSError, subprocess.SubprocessError) as exc:
        if os.environ.get("CI"):
            raise
        pytest.skip(f"upstream source not available: {exc}")


def torchaudio_rnnt():
    """torchaudio's ``models/rnnt.py`` (with its ``models/emformer.py``)."""
    def load():
        emformer = _run("torchaudio", "torchaudio/models/emformer.py",
                        "upstream_torchaudio_emformer")
        with _stubs({"torchaudio": {}, "torchaudio.models": {"Emformer": emformer.Emformer}}):
            return _run("torchaudio", "torchaudio/models/rnnt.py", "upstream_torchaudio_rnnt")
    return _or_skip(load)


def nemo_rnn():
    """NeMo's ``collections/common/parts/rnn.py``."""
    def load():
        nemo_logging = logging.getLogger("nemo")
        with _stubs({"nemo": {}, "nemo.utils": {"logging": nemo_logging}}):
            return _run("nemo-toolkit", "nemo/collections/common/parts/rnn.py",
                        "upstream_nemo_rnn")
    return _or_skip(load)


if __name__ == "__main__":   # CI: download the wheels before the tests run
    for wheel_name in WHEELS:
        print(_wheel(wheel_name))

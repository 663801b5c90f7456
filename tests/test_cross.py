"""fastln's C core checked without Python by tests/c/check_kernels.c: every
function of src_c/api/fastln.h and fastln_rnn.h against plain double loops,
for odd sizes, on every ISA path, 1 and 3 threads, built for aarch64 with
aarch64-linux-gnu-gcc and run under qemu-aarch64, so a core that only builds
or only computes right on x86 fails here. (Natively, ctest runs the same
program: tests/test_c.py.) Skipped when the cross tools are missing, unless
the environment variable CI is set (then a failure): .ci/run installs
gcc-aarch64-linux-gnu, libc6-dev-arm64-cross, libgomp1-arm64-cross and
qemu-user.

The build compiles every .c file under src_c/ and starts in the background once the
tests are collected (tests/conftest.py), or when the test asks for it.
"""
import glob
import os
import shutil
import subprocess

import pytest

from _util import kill_builds, start_build, wait_build

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DRIVER = os.path.join(ROOT, "tests", "c", "check_kernels.c")
CROSS_CC = "aarch64-linux-gnu-gcc"
QEMU = "qemu-aarch64"
QEMU_LIBS = "/usr/aarch64-linux-gnu"

SRC = os.path.join(ROOT, "src_c")

pytestmark = pytest.mark.skipif(not os.path.isdir(SRC),
                                reason="the C sources are not next to tests/")


def _sources():
    return sorted(glob.glob(os.path.join(SRC, "**", "*.c"), recursive=True)) + [DRIVER]


def _compilers():
    """{build name: compiler path or None}."""
    return {"aarch64": shutil.which(CROSS_CC)}


# the sources name their headers from src_c/, the driver the public ones by name
FLAGS = ["-O2", "-fopenmp", "-std=gnu99", "-Wall", "-Wextra", "-I" + SRC,
         "-I" + os.path.join(SRC, "api")]


_started = {}   # name: (process, exe, log path)


BUILD_OF_TEST = {"test_aarch64_under_qemu": "aarch64"}


def start_builds(outdir, tests=None):
    """Starts the builds whose compiler is present, all at once, into outdir:
    those of the tests named in tests (None: all). tests/conftest.py calls
    this once the tests are collected, so that the compilers run beside the
    other tests; _built() only waits."""
    wanted = set(BUILD_OF_TEST.values()) if tests is None else \
        {BUILD_OF_TEST[t] for t in tests if t in BUILD_OF_TEST}
    for name, cc in _compilers().items():
        if cc is None or name in _started or name not in wanted:
            continue
        _started[name] = start_build([cc, *FLAGS, *_sources()], outdir, name)


def stop_builds():
    """Kills the builds still running (the test run ended early)."""
    kill_builds(_started)


@pytest.fixture(scope="module")
def builds(tmp_path_factory):
    """{name: (process, exe, log)} of the builds, started here if conftest did not."""
    if not _started:
        start_builds(str(tmp_path_factory.mktemp("check_kernels")))
    return _started


def _built(builds, name):
    rc, out, exe = wait_build(builds[name], timeout=600)
    assert rc == 0, out[-4000:]
    return exe


def _check(cmd, env=None):
    run = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=env)
    out = run.stdout + run.stderr
    assert run.returncode == 0, out[-6000:]
    assert " checks, 0 failed" in out, out[-2000:]
    return out


def test_aarch64_under_qemu(builds):
    missing = [t for t in (CROSS_CC, QEMU) if shutil.which(t) is None]
    if not missing and not os.path.isdir(QEMU_LIBS):
        missing = [QEMU_LIBS]
    if missing:
        if os.environ.get("CI"):
            pytest.fail(f"CI: the cross tools are missing: {', '.join(missing)}")
        pytest.skip(f"missing: {', '.join(missing)}")
    exe = _built(builds, "aarch64")
    out = _check([QEMU, "-L", QEMU_LIBS, exe])
    # the aarch64 build has only the generic path
    assert "generic, 3 thread(s): ok" in out and "avx2" not in out

"""fastln's C core without Python, built here from src_c/ with the system C
compiler:

* under AddressSanitizer, UndefinedBehaviorSanitizer and LeakSanitizer:
  tests/c/sanitize.c drives the whole C API (every normalization kernel and
  the LN-RNN engine; every ISA path and dtype; odd sizes, empties, in place,
  the streaming sizes, 1 and 3 threads) and the cache of large outputs
  (src_c/pool.c, from 3 threads at once). Any invalid access, undefined
  behaviour or leak fails the run;
* examples/c/normalize.c, the C API example of the README, builds with
  warnings as errors and checks its own result.
"""
import glob
import os
import shutil
import subprocess

import pytest

from _util import kill_builds, start_build, wait_build

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# every C source of the core (kernels, dispatch, RNN helpers, the cache of large outputs)
C_CORE = sorted(os.path.relpath(p, ROOT) for p in glob.glob(os.path.join(ROOT, "src_c", "*.c")))

pytestmark = pytest.mark.skipif(not os.path.exists(os.path.join(ROOT, "src_c", "rnn.c")),
                                reason="the C sources are not next to tests/")


# UBSan without its pointer-overflow check: that check (pointer arithmetic that
# wraps around the address space) makes up a large share of the build's time,
# and any access such a pointer makes is ASan's to catch. -g1: line tables
# only, which is all the sanitizers' stack traces show (file:line); full -g
# (local variables too) makes the build far slower.
SANITIZE_FLAGS = ["-O1", "-g1", "-Wall", "-Wextra", "-fsanitize=address,undefined",
                  "-fno-sanitize=pointer-overflow", "-fno-omit-frame-pointer",
                  "-fno-sanitize-recover=undefined", "-fopenmp", "-fopenmp-simd"]
EXAMPLE_FLAGS = ["-O2", "-std=c99", "-Wall", "-Wextra", "-Werror"]
# name: (main, flags)
BUILDS = {
    "sanitize": ("tests/c/sanitize.c", SANITIZE_FLAGS),
    "normalize-openmp": ("examples/c/normalize.c", EXAMPLE_FLAGS + ["-fopenmp"]),
    "normalize-serial": ("examples/c/normalize.c", EXAMPLE_FLAGS + ["-Wno-unknown-pragmas"]),
}
_started = {}   # name: (process, exe, log path)


def start_builds(outdir, tests=None):
    """Starts every build of BUILDS in the background, into outdir.

    The C core takes minutes to compile (kernels_avx512.c most of all, and
    several times longer under UBSan), so tests/conftest.py calls this once
    the tests are collected, when any test of this file is selected: the
    compilers then run beside the other tests, and build() only waits."""
    cc = shutil.which("gcc") or shutil.which("cc")
    if cc is None:
        return
    for name, (main, flags) in BUILDS.items():
        if name not in _started:
            _started[name] = start_build([cc, *flags, "-Isrc_c", main, *C_CORE], outdir, name)


def stop_builds():
    """Kills the builds still running (the test run ended early)."""
    kill_builds(_started)


def build(name, tmp_path):
    """Waits for build `name` (started here when start_builds() was not
    called); returns (returncode, compiler output, exe). Skips without a C
    compiler."""
    if shutil.which("gcc") is None and shutil.which("cc") is None:
        pytest.skip("no C compiler")
    if name not in _started:
        start_builds(str(tmp_path))
    return wait_build(_started[name], timeout=900)


def test_c_core_is_clean_under_sanitizers(tmp_path):
    rc, out, exe = build("sanitize", tmp_path)
    if rc != 0 and "sanitize" in out:
        pytest.skip("this compiler cannot build with sanitizers: " + out[-300:])
    assert rc == 0, out[-3000:]
    env = dict(os.environ, ASAN_OPTIONS="detect_leaks=1:abort_on_error=0",
               UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1", OMP_NUM_THREADS="3")
    env.pop("LD_PRELOAD", None)
    run = subprocess.run([exe], capture_output=True, text=True, timeout=600, env=env)
    assert run.returncode == 0, (run.stdout + run.stderr)[-4000:]
    assert "runs, rc 0" in run.stdout


@pytest.mark.parametrize("openmp", [True, False], ids=["openmp", "serial"])
def test_c_example_builds_and_passes(tmp_path, openmp):
    rc, out, exe = build("normalize-openmp" if openmp else "normalize-serial", tmp_path)
    assert rc == 0, out[-3000:]
    run = subprocess.run([exe], capture_output=True, text=True, timeout=60)
    assert run.returncode == 0 and run.stdout.rstrip().endswith("ok"), run.stdout + run.stderr

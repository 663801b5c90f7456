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
import os
import shutil
import subprocess

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
C_CORE = ["src_c/rnn.c", "src_c/dispatch.c", "src_c/kernels_generic.c",
          "src_c/kernels_avx2.c", "src_c/kernels_avx512.c"]

pytestmark = pytest.mark.skipif(not os.path.exists(os.path.join(ROOT, "src_c", "rnn.c")),
                                reason="the C sources are not next to tests/")


def build(main, exe, flags, extra=()):
    """Compiles main (and the sources in extra) with the C core into exe
    (skips without a C compiler)."""
    cc = shutil.which("gcc") or shutil.which("cc")
    if cc is None:
        pytest.skip("no C compiler")
    return subprocess.run([cc, *flags, "-Isrc_c", main, *extra, *C_CORE, "-o", exe, "-lm"],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)


def test_c_core_is_clean_under_sanitizers(tmp_path):
    exe = str(tmp_path / "sanitize")
    b = build("tests/c/sanitize.c", exe,
              ["-O1", "-g", "-fsanitize=address,undefined", "-fno-omit-frame-pointer",
               "-fno-sanitize-recover=undefined", "-fopenmp", "-fopenmp-simd",
               "-Wno-unused-function"], extra=["src_c/pool.c"])
    if b.returncode != 0 and "sanitize" in b.stderr:
        pytest.skip("this compiler cannot build with sanitizers: " + b.stderr[-300:])
    assert b.returncode == 0, b.stderr[-3000:]
    env = dict(os.environ, ASAN_OPTIONS="detect_leaks=1:abort_on_error=0",
               UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1", OMP_NUM_THREADS="3")
    env.pop("LD_PRELOAD", None)
    run = subprocess.run([exe], capture_output=True, text=True, timeout=600, env=env)
    assert run.returncode == 0, (run.stdout + run.stderr)[-4000:]
    assert "runs, rc 0" in run.stdout


@pytest.mark.parametrize("openmp", [True, False], ids=["openmp", "serial"])
def test_c_example_builds_and_passes(tmp_path, openmp):
    exe = str(tmp_path / "normalize")
    b = build("examples/c/normalize.c", exe,
              ["-O2", "-std=c99", "-Wall", "-Werror", "-Wno-unused-function"]
              + (["-fopenmp"] if openmp else ["-Wno-unknown-pragmas"]))
    assert b.returncode == 0, b.stderr[-3000:]
    run = subprocess.run([exe], capture_output=True, text=True, timeout=60)
    assert run.returncode == 0 and run.stdout.rstrip().endswith("ok"), run.stdout + run.stderr

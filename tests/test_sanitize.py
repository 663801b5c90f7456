"""fastln's C core under AddressSanitizer, UndefinedBehaviorSanitizer and
LeakSanitizer: tests/c/sanitize.c drives the whole C API (every normalization
kernel and the LN-RNN engine; every ISA path and dtype; odd sizes, empties,
in place, the streaming sizes, 1 and 3 threads), built here from src_c/ with
-fsanitize=address,undefined. Any invalid access, undefined behaviour or leak
fails the run."""
import os
import shutil
import subprocess

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SOURCES = ["tests/c/sanitize.c", "src_c/rnn.c", "src_c/dispatch.c",
           "src_c/kernels_generic.c", "src_c/kernels_avx2.c", "src_c/kernels_avx512.c"]


@pytest.mark.skipif(not os.path.exists(os.path.join(ROOT, "src_c", "rnn.c")),
                    reason="the C sources are not next to tests/")
def test_c_core_is_clean_under_sanitizers(tmp_path):
    cc = shutil.which("gcc") or shutil.which("cc")
    if cc is None:
        pytest.skip("no C compiler")
    exe = str(tmp_path / "sanitize")
    build = subprocess.run(
        [cc, "-O1", "-g", "-fsanitize=address,undefined", "-fno-omit-frame-pointer",
         "-fno-sanitize-recover=undefined", "-fopenmp", "-fopenmp-simd",
         "-Wno-unused-function", "-Isrc_c", *SOURCES, "-o", exe, "-lm"],
        cwd=ROOT, capture_output=True, text=True, timeout=300)
    if build.returncode != 0 and "sanitize" in build.stderr:
        pytest.skip("this compiler cannot build with sanitizers: " + build.stderr[-300:])
    assert build.returncode == 0, build.stderr[-3000:]
    env = dict(os.environ, ASAN_OPTIONS="detect_leaks=1:abort_on_error=0",
               UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1", OMP_NUM_THREADS="3")
    env.pop("LD_PRELOAD", None)
    run = subprocess.run([exe], capture_output=True, text=True, timeout=600, env=env)
    assert run.returncode == 0, (run.stdout + run.stderr)[-4000:]
    assert "runs, rc 0" in run.stdout

"""fastln's C library (CMakeLists.txt) without Python, built with CMake as a
C or C++ project builds it, in three configurations:

* default: the build, then ctest (tests/c/check_kernels.c checks every
  function against plain double loops; examples/c/normalize.c, the C example
  of docs/guide/c-library.md, builds with warnings as errors and checks its
  own result);
  libfastln.so exports exactly the functions the public headers declare;
  `cmake --install` into a prefix, then the consumer project examples/c
  configured out of the tree with find_package(fastln) and built against
  it (normalize.c on the shared library, consumer.cpp, C++, on the static
  one), and normalize.c compiled with the two pkg-config commands of
  docs/guide/c-library.md and run with the command after each, as written
  there, with both libraries installed in a prefix outside the dynamic
  loader's folders and without LD_LIBRARY_PATH: the first on the shared
  library, which the program finds in the prefix, the second on the static
  one (the program it links needs no libfastln.so and defines the kernels
  itself);
* FASTLN_SANITIZE=ON: ctest runs tests/c/sanitize.c (the whole C API and the
  cache of large outputs, src_c/runtime/pool.c, from 3 threads at once) and the two
  programs above under AddressSanitizer, UndefinedBehaviorSanitizer and
  LeakSanitizer: any invalid access, undefined behaviour or leak fails;
* FASTLN_OPENMP=OFF: the serial library (at -O1, which compiles in a third
  of -O3's time), and normalize.c on it.

cmake comes from the [test] extra (PyPI's cmake). Each configuration is a
chain of commands in a folder of its own, run in the background: the chains
start once the tests are collected (tests/conftest.py calls start_builds),
each compiling one file at a time, and the tests wait for them. Without
cmake, a C++ compiler (the consumer) or pkg-config, the tests that need it
skip, unless the environment variable CI is set (then they fail).
"""
import glob
import os
import re
import shlex
import shutil
import signal
import subprocess
import sysconfig
import tempfile
import threading

import pytest

from _util import declared_functions

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EXAMPLES = os.path.join(ROOT, "examples", "c")
HEADERS = [os.path.join(ROOT, "src_c", "api", name) for name in ("fastln.h", "fastln_rnn.h")]
STRICT = "-Wall -Wextra -Werror"

pytestmark = pytest.mark.skipif(not os.path.exists(os.path.join(ROOT, "CMakeLists.txt")),
                                reason="the C sources are not next to tests/")


def _which(name):
    """name's path: first in this Python's scripts folder (where pip puts
    PyPI's cmake), then on PATH; or None."""
    path = os.pathsep.join([sysconfig.get_path("scripts"), os.environ.get("PATH", "")])
    return shutil.which(name, path=path)


def _tools():
    cmake = _which("cmake")
    ctest = cmake and (shutil.which("ctest", path=os.path.dirname(cmake)) or _which("ctest"))
    return {"cmake": cmake, "ctest": ctest, "cc": shutil.which("gcc") or shutil.which("cc"),
            "c++": shutil.which("g++") or shutil.which("c++"),
            "pkg-config": shutil.which("pkg-config"), "nm": shutil.which("nm"),
            "ldd": shutil.which("ldd")}


def _require(tool):
    """Skips without tool, or fails where the environment variable CI is set."""
    if _tools()[tool] is None:
        message = f"{tool} is not installed"
        if os.environ.get("CI"):
            pytest.fail("CI: " + message)
        pytest.skip(message)


# ---- the chains of commands -----------------------------------------------------------

class Chain(threading.Thread):
    """Runs the steps of one configuration one after another in a thread of
    this process: each step an argv list (or a function of no arguments that
    returns the argv and its environment), run from the repository root.
    self.results: {step: (returncode, output)}; the chain stops at the first
    step that fails."""

    def __init__(self, name, steps):
        super().__init__(name=f"fastln-c-{name}", daemon=True)
        self.steps, self.results = steps, {}
        self._proc, self._stopped = None, False

    def run(self):
        for step, command in self.steps:
            if self._stopped:
                return
            try:
                argv, env = command() if callable(command) else (command, None)
            except (OSError, IndexError, subprocess.CalledProcessError) as e:
                self.results[step] = (1, f"{type(e).__name__}: {e} {getattr(e, 'stderr', '')}")
                return
            with tempfile.TemporaryFile() as log:
                # a session of its own: stop() kills the compilers cmake started too
                self._proc = subprocess.Popen(argv, cwd=ROOT, env=env, stdout=log,
                                              stderr=subprocess.STDOUT, start_new_session=True)
                rc = self._proc.wait()
                log.seek(0)
                self.results[step] = (rc, log.read().decode(errors="replace"))
            if rc != 0:
                return

    def stop(self):
        self._stopped = True
        if self._proc is not None and self._proc.poll() is None:
            os.killpg(self._proc.pid, signal.SIGKILL)
            self._proc.wait()

    def result(self, step, timeout=900):
        """(returncode, output) of step, once the chain has finished."""
        self.join(timeout)
        if self.is_alive():
            self.stop()
            pytest.fail(f"the {self.name} build ran past {timeout} s")
        if step not in self.results:
            failed = [(s, r) for s, r in self.results.items() if r[0] != 0]
            pytest.fail(f"{step} did not run: " + (
                f"{failed[0][0]} failed:\n{failed[0][1][-4000:]}" if failed else "skipped"))
        return self.results[step]

    def passed(self, step):
        rc, out = self.result(step)
        assert rc == 0, f"{step} failed:\n{out[-6000:]}"
        return out


def _configure_and_build(t, build, *options, target=None):
    """The steps that configure the repository's CMake project into build
    and build it (target, or everything), one compiler at a time."""
    return [("configure", [t["cmake"], "-S", ROOT, "-B", build, *options]),
            ("build", [t["cmake"], "--build", build, "-j1",
                       *(["--target", target] if target else [])])]


GUIDE = os.path.join(ROOT, "docs", "guide", "c-library.md")


def _guide_pkg_config_commands():
    """The section "Using it from pkg-config" of the guide, as written there:
    [(compile, run)] for the shared library, then the static one, each
    compile command with the commands that follow it, joined by &&."""
    with open(GUIDE, encoding="utf-8") as f:
        section = f.read().split("## Using it from pkg-config", 1)[1].split("\n## ", 1)[0]
    block = re.search(r"```console\n(.*?)```", section, re.DOTALL).group(1)
    pairs = []
    for line in block.replace("\\\n", " ").splitlines():
        if line.startswith("$ cc "):
            pairs.append((line[2:], []))
        elif line.startswith("$ ") and pairs:
            pairs[-1][1].append(line[2:])
    assert len(pairs) == 2 and "libfastln.a" in pairs[1][0], pairs
    assert all(run for _, run in pairs), f"no command runs the program: {pairs}"
    return [(compile, " && ".join(run)) for compile, run in pairs]


def _guide_env(prefix):
    """The environment of the guide's commands for the fastln installed in
    prefix: its PKG_CONFIG_PATH, and no LD_LIBRARY_PATH (the program must
    find libfastln.so by itself)."""
    env = dict(os.environ, PKG_CONFIG_PATH=os.path.dirname(
        glob.glob(os.path.join(prefix, "**", "fastln.pc"), recursive=True)[0]))
    env.pop("LD_LIBRARY_PATH", None)
    return env


def _pkg_config(t, prefix, folder, static, run=False):
    """A step: the guide's pkg-config command (the second with static) run by
    the shell in folder, on a copy of normalize.c, for the fastln installed in
    prefix; the compiler is t["cc"], with -std=c99 and STRICT. With run, the
    guide's command that runs the program instead."""
    def command():
        os.makedirs(folder, exist_ok=True)
        shutil.copyfile(os.path.join(EXAMPLES, "normalize.c"), os.path.join(folder, "normalize.c"))
        line, run_line = _guide_pkg_config_commands()[1 if static else 0]
        line = f"{shlex.quote(t['cc'])} -std=c99 {STRICT} " + line[len("cc "):]
        return ["sh", "-c", f"cd {shlex.quote(folder)} && {run_line if run else line}"], \
            _guide_env(prefix)
    return command


def _default_steps(t, d):
    build, prefix, consumer = (os.path.join(d, n) for n in ("build", "prefix", "consumer"))
    steps = _configure_and_build(t, build)
    steps += [("ctest", [t["ctest"], "--test-dir", build, "--output-on-failure"]),
              ("install", [t["cmake"], "--install", build, "--prefix", prefix])]
    if t["c++"]:
        steps += [("consumer configure", [t["cmake"], "-S", EXAMPLES, "-B", consumer,
                                          "-DCMAKE_PREFIX_PATH=" + prefix,
                                          "-DCMAKE_C_FLAGS=" + STRICT,
                                          "-DCMAKE_CXX_FLAGS=" + STRICT]),
                  ("consumer build", [t["cmake"], "--build", consumer, "-j1"]),
                  ("consumer normalize", [os.path.join(consumer, "normalize")]),
                  ("consumer consumer", [os.path.join(consumer, "consumer")])]
    if t["pkg-config"]:
        shared, static = os.path.join(d, "pc-shared"), os.path.join(d, "pc-static")
        steps += [("pkg-config build", _pkg_config(t, prefix, shared, static=False)),
                  ("pkg-config run", _pkg_config(t, prefix, shared, static=False, run=True)),
                  # the shared library stays installed beside the archive, as by default
                  ("pkg-config static build", _pkg_config(t, prefix, static, static=True)),
                  ("pkg-config static run", _pkg_config(t, prefix, static, static=True,
                                                        run=True))]
    return steps


def _steps(name, t, d):
    if name == "default":
        return _default_steps(t, d)
    build = os.path.join(d, "build")
    if name == "sanitize":
        return _configure_and_build(t, build, "-DFASTLN_SANITIZE=ON") + [
            ("ctest", [t["ctest"], "--test-dir", build, "--output-on-failure"])]
    # -O1: a third of -O3's compile time; the default configuration builds the real flags
    return _configure_and_build(t, build, "-DFASTLN_OPENMP=OFF", "-DFASTLN_BUILD_STATIC=OFF",
                                "-DCMAKE_C_FLAGS_RELEASE=-O1", target="fastln_normalize") + [
        ("ctest", [t["ctest"], "--test-dir", build, "-R", "^normalize$", "--verbose"])]


# the configuration each test needs
CONFIG_OF_TEST = {
    "test_cmake_build_passes_ctest": "default",
    "test_shared_library_exports_only_the_public_api": "default",
    "test_find_package_consumer_builds_and_runs": "default",
    "test_pkg_config_consumer_builds_and_runs": "default",
    "test_c_core_is_clean_under_sanitizers": "sanitize",
    "test_serial_build_without_openmp": "serial",
}
_started = {}   # configuration: (Chain, folder)


def start_builds(outdir, tests=None):
    """Starts the chains of the configurations that the tests named in tests
    (None: all) need, each in a folder of outdir. tests/conftest.py calls this
    once the tests are collected, so that the compilers run beside the other
    tests; the tests only wait."""
    t = _tools()
    if t["cmake"] is None or t["ctest"] is None or t["cc"] is None:
        return
    wanted = set(CONFIG_OF_TEST.values()) if tests is None else \
        {CONFIG_OF_TEST[re.sub(r"\[.*", "", n)] for n in tests
         if re.sub(r"\[.*", "", n) in CONFIG_OF_TEST}
    for name in sorted(wanted - set(_started)):
        folder = os.path.join(outdir, name)
        os.makedirs(folder, exist_ok=True)
        chain = Chain(name, _steps(name, t, folder))
        chain.start()
        _started[name] = (chain, folder)


def stop_builds():
    """Kills the chains still running (the test run ended early)."""
    for chain, _ in _started.values():
        chain.stop()
        chain.join(30)


@pytest.fixture(scope="module")
def chains(tmp_path_factory):
    """{configuration: (Chain, folder)}, started here where conftest did not."""
    _require("cmake")
    _require("cc")
    if not _started:
        start_builds(str(tmp_path_factory.mktemp("fastln_c")))
    return _started


# ---- the tests ------------------------------------------------------------------------

def test_cmake_build_passes_ctest(chains):
    out = chains["default"][0].passed("ctest")
    assert "100% tests passed" in out and "check_kernels" in out and "normalize" in out, out


def test_shared_library_exports_only_the_public_api(chains):
    chain, folder = chains["default"]
    chain.passed("build")
    _require("nm")
    so = os.path.join(folder, "build", "libfastln.so")
    run = subprocess.run([_tools()["nm"], "-D", "--defined-only", so], capture_output=True,
                         text=True, check=True)
    exported = set(re.findall(r" [TDBRVW] (\w+)$", run.stdout, re.MULTILINE))
    declared = declared_functions(*HEADERS)
    assert len(declared) >= 50 and "fastln_pool_alloc" not in declared
    assert {n for n in exported if n.startswith("fastln")} == declared


def test_find_package_consumer_builds_and_runs(chains):
    _require("c++")
    chain = chains["default"][0]
    out = chain.passed("consumer configure")
    assert "fastln" in out
    chain.passed("consumer build")
    assert chain.passed("consumer normalize").rstrip().endswith("ok")
    out = chain.passed("consumer consumer")
    assert out.rstrip().endswith("-> ok") and "fastln_add_layer_norm_f32" in out, out


def test_pkg_config_consumer_builds_and_runs(chains):
    _require("pkg-config")
    chain, folder = chains["default"]
    chain.passed("pkg-config build")
    assert chain.passed("pkg-config run").rstrip().endswith("ok")
    prefix = os.path.join(folder, "prefix")
    shared = os.path.join(folder, "pc-shared", "normalize")
    with open(shared, "rb") as f:
        assert b"libfastln.so" in f.read()        # needs the shared library
    chain.passed("pkg-config static build")
    assert chain.passed("pkg-config static run").rstrip().endswith("ok")
    # the guide's static command links libfastln.a, with libfastln.so installed beside it
    assert glob.glob(os.path.join(prefix, "**", "libfastln.so"), recursive=True)
    exe = os.path.join(folder, "pc-static", "normalize")
    with open(exe, "rb") as f:
        assert b"libfastln.so" not in f.read()    # no libfastln.so among its needed libraries
    _require("nm")
    run = subprocess.run([_tools()["nm"], "--defined-only", exe], capture_output=True,
                         text=True, check=True)
    assert re.search(r" T fastln_layer_norm_f32$", run.stdout, re.MULTILINE), run.stdout[-2000:]
    # the shared one found libfastln.so in the prefix, not in a libfastln.so the system may hold
    _require("ldd")
    run = subprocess.run([_tools()["ldd"], shared], capture_output=True, text=True,
                         env=_guide_env(prefix), check=True)
    found = re.search(r"libfastln\.so\S* => (\S+)", run.stdout)
    assert found and os.path.realpath(found.group(1)).startswith(
        os.path.realpath(prefix) + os.sep), run.stdout


def test_c_core_is_clean_under_sanitizers(chains):
    chain = chains["sanitize"][0]
    rc, out = chain.result("build")
    if rc != 0 and re.search(r"fsanitize|lib[a-z]*san\b", out):
        pytest.skip("this compiler cannot build with sanitizers: " + out[-300:])
    out = chain.passed("ctest")
    assert "100% tests passed" in out and "sanitize" in out, out


def test_serial_build_without_openmp(chains):
    chain, folder = chains["serial"]
    out = chain.passed("ctest")
    assert re.search(r"100% tests passed.* out of 1\n", out), out
    assert re.search(r"1 thread\(s\): .* -> ok", out), out
    with open(os.path.join(folder, "build", "libfastln.so"), "rb") as f:
        data = f.read()
    assert b"libgomp" not in data and b"libomp" not in data   # no OpenMP runtime needed

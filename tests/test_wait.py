"""How idle OpenMP threads wait (fastln._wait, fastln.get_wait_policy): fastln's
short spin is applied where the environment sets no policy, the user's
variables win, the environment is as before once fastln is imported, a runtime
loaded before fastln is reported, and the runtime info shows the policy.

Each case runs in a fresh process: the runtime reads the environment once, as
it loads. Where the runtime is libgomp with ``omp_display_env`` (GCC 11 and
later), the spin count it actually uses is read from its own report."""
import importlib.util
import json
import os
import platform
import re

import pytest

import fastln
from fastln import __main__ as main_mod
from fastln import _selfcheck, _wait

from _util import run_python

X86 = platform.machine().lower() in _wait.X86
SHORT = f"short spin (GOMP_SPINCOUNT={_wait.SPIN_COUNT}, fastln's default)"
needs_openmp = pytest.mark.skipif(not fastln.has_openmp(), reason="built without OpenMP")

# prints, as JSON: the policy, the variables after import, what a child process
# sees, and the C environment (getenv) after import; then, where fastln runs on
# libgomp with omp_display_env, the runtime's settings on stderr
REPORT = """
import ctypes, json, os, subprocess, sys
{before}
import fastln
names = ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT", "KMP_BLOCKTIME")
libc = ctypes.CDLL(None)
libc.getenv.restype = ctypes.c_char_p
def getenv(n):
    v = libc.getenv(n.encode())
    return None if v is None else v.decode()
child = subprocess.run([sys.executable, "-c", "import os, json; print(json.dumps("
                        "[os.environ.get(n) for n in %r]))" % (names,)],
                       capture_output=True, text=True, check=True).stdout
print(json.dumps({{"policy": fastln.get_wait_policy(),
                   "environ": {{n: os.environ.get(n) for n in names}},
                   "getenv": {{n: getenv(n) for n in names}},
                   "child": json.loads(child), "new": fastln._wait._state["new"]}}))
sys.stdout.flush()
try:
    gomp = ctypes.CDLL("libgomp.so.1", mode=os.RTLD_NOLOAD)
    gomp.omp_display_env(1)
except (OSError, AttributeError):
    pass
"""


def report(env_set=None, before=""):
    """(the child's JSON report, libgomp's settings as {name: value}, empty where
    not shown) of a fresh process that imports fastln with the waiting
    variables removed from the environment, then ``env_set`` added."""
    env = {k: v for k, v in os.environ.items() if k not in _wait.USER_VARS}
    env.update(env_set or {})
    proc = run_python(REPORT.format(before=before), env=env)
    assert proc.returncode == 0, proc.stderr
    shown = dict(re.findall(r"^\s*(OMP_WAIT_POLICY|GOMP_SPINCOUNT) = '([^']*)'", proc.stderr,
                            flags=re.M))
    return json.loads(proc.stdout.strip().splitlines()[-1]), shown


def fastlns_policy(new):
    """The policy get_wait_policy names where the user set nothing, by the
    runtimes that fastln's import loaded."""
    if "libgomp.so.1" in new:
        return SHORT if X86 else "libgomp.so.1's default"
    if new:
        return "short spin (KMP_BLOCKTIME=1, fastln's default)"
    return ("short spin (" + (f"GOMP_SPINCOUNT={_wait.SPIN_COUNT}, " if X86 else "")
            + "KMP_BLOCKTIME=1, set at import; runtime not identified)")


@needs_openmp
def test_short_spin_applied_where_unset_and_environment_restored():
    """No variable set: the runtime gets fastln's spin (libgomp shows it), and
    afterwards neither os.environ, nor C's getenv, nor a child process sees a
    variable that fastln set."""
    got, shown = report()
    gone = dict.fromkeys(_wait.USER_VARS)
    assert got["environ"] == gone and got["getenv"] == gone, got
    assert got["child"] == [None, None, None], got
    assert got["policy"] == fastlns_policy(got["new"])
    if shown:   # the runtime's own word
        assert shown["GOMP_SPINCOUNT"] == (str(_wait.SPIN_COUNT) if X86 else "300000")


@needs_openmp
@pytest.mark.parametrize("env_set, spins", [
    ({"OMP_WAIT_POLICY": "passive"}, "0"),
    ({"OMP_WAIT_POLICY": "ACTIVE"}, "30000000000"),
    ({"GOMP_SPINCOUNT": "300000"}, "300000"),
    ({"GOMP_SPINCOUNT": "0"}, "0"),
    ({"OMP_WAIT_POLICY": "passive", "GOMP_SPINCOUNT": "77"}, "77"),
    ({"KMP_BLOCKTIME": "0"}, None),
])
def test_the_users_setting_wins(env_set, spins):
    """A variable the user set reaches the runtime unchanged, stays in the
    environment as it was, and is what get_wait_policy names. KMP_BLOCKTIME
    is libomp's: under libgomp fastln's spin still applies."""
    got, shown = report(env_set)
    for name in _wait.USER_VARS:
        assert got["environ"][name] == env_set.get(name), got
        assert got["getenv"][name] == env_set.get(name), got
    if spins is None:   # KMP_BLOCKTIME: not libgomp's
        if "libgomp.so.1" in got["new"]:
            assert got["policy"] == fastlns_policy(got["new"])
        if shown:
            assert shown["GOMP_SPINCOUNT"] == (str(_wait.SPIN_COUNT) if X86 else "300000")
        return
    if "libgomp.so.1" in got["new"]:
        mine = [f"{k}={v}" for k, v in env_set.items()]
        assert got["policy"] == f"the environment's ({', '.join(mine)})"
    if shown:
        assert shown["GOMP_SPINCOUNT"] == spins


@needs_openmp
def test_empty_variables_count_as_unset():
    """An empty value is no choice (libgomp ignores it): fastln's spin applies,
    and the empty value is back in the environment afterwards."""
    got, shown = report({"GOMP_SPINCOUNT": ""})
    assert got["environ"]["GOMP_SPINCOUNT"] == "" and got["getenv"]["GOMP_SPINCOUNT"] == ""
    assert got["policy"] == fastlns_policy(got["new"])
    if shown:
        assert shown["GOMP_SPINCOUNT"] == (str(_wait.SPIN_COUNT) if X86 else "300000")


@needs_openmp
def test_a_runtime_loaded_before_fastln_is_reported():
    """libgomp loaded before fastln (as ``import torch`` does) has read the
    environment already: fastln's spin cannot apply, and the policy says so."""
    got, shown = report()
    if "libgomp.so.1" not in got["new"]:
        pytest.skip("fastln does not run on libgomp here")
    got, shown = report(before="ctypes.CDLL('libgomp.so.1')")
    assert got["policy"] == "libgomp.so.1's default (loaded before fastln)"
    assert got["environ"] == dict.fromkeys(_wait.USER_VARS)
    if shown:
        assert shown["GOMP_SPINCOUNT"] == "300000"
    # the user's variables, read by the runtime loaded first, are still theirs
    got, shown = report({"OMP_WAIT_POLICY": "passive"}, before="ctypes.CDLL('libgomp.so.1')")
    assert got["policy"] == "the environment's (OMP_WAIT_POLICY=passive)"


@needs_openmp
def test_torch_imported_first_is_reported(torch):
    """torch's wheels bring a libgomp.so.1 of their own: imported first, it is
    the runtime fastln shares, with its default spin; imported after fastln,
    it shares fastln's runtime and short spin."""
    got, _ = report(before="import torch")
    if "libgomp" not in got["policy"]:   # torch on another runtime: fastln's loads fresh
        assert got["policy"] == fastlns_policy(got["new"])
        pytest.skip("torch brings no libgomp.so.1 here")
    assert got["policy"] == "libgomp.so.1's default (loaded before fastln)"
    proc = run_python("import fastln, torch; print(fastln.get_wait_policy())",
                      env={k: v for k, v in os.environ.items() if k not in _wait.USER_VARS})
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == (SHORT if X86 else "libgomp.so.1's default")


# ---- the rules, on given environments and states -----------------------------------

@pytest.mark.parametrize("environ, machine, expect", [
    ({}, "x86_64", {"GOMP_SPINCOUNT": str(_wait.SPIN_COUNT), "KMP_BLOCKTIME": "1"}),
    ({}, "AMD64", {"GOMP_SPINCOUNT": str(_wait.SPIN_COUNT), "KMP_BLOCKTIME": "1"}),
    ({}, "aarch64", {"KMP_BLOCKTIME": "1"}),
    ({}, "arm64", {"KMP_BLOCKTIME": "1"}),
    ({"OMP_WAIT_POLICY": "passive"}, "x86_64", {}),
    ({"GOMP_SPINCOUNT": "10"}, "x86_64", {"KMP_BLOCKTIME": "1"}),
    ({"KMP_BLOCKTIME": "10"}, "x86_64", {"GOMP_SPINCOUNT": str(_wait.SPIN_COUNT)}),
    ({"OMP_WAIT_POLICY": "", "GOMP_SPINCOUNT": ""}, "x86_64",
     {"GOMP_SPINCOUNT": str(_wait.SPIN_COUNT), "KMP_BLOCKTIME": "1"}),
    ({"OMP_NUM_THREADS": "1"}, "i686", {"GOMP_SPINCOUNT": str(_wait.SPIN_COUNT),
                                        "KMP_BLOCKTIME": "1"}),
])
def test_defaults_for(environ, machine, expect):
    assert _wait.defaults_for(environ, machine) == expect


def _state(**kw):
    base = dict(openmp=True, new=["libgomp.so.1"], before=[], user={},
                settings={"GOMP_SPINCOUNT": "3000", "KMP_BLOCKTIME": "1"})
    return dict(base, **kw)


@pytest.mark.parametrize("state, expect", [
    (_state(), "short spin (GOMP_SPINCOUNT=3000, fastln's default)"),
    (_state(openmp=False), "serial build (no OpenMP threads)"),
    (_state(new=["libomp.so.5"]), "short spin (KMP_BLOCKTIME=1, fastln's default)"),
    (_state(new=[]), "short spin (GOMP_SPINCOUNT=3000, KMP_BLOCKTIME=1, set at import; "
                     "runtime not identified)"),
    (_state(new=[], before=["libgomp.so.1"]), "libgomp.so.1's default (loaded before fastln)"),
    (_state(user={"OMP_WAIT_POLICY": "passive"}, settings={}),
     "the environment's (OMP_WAIT_POLICY=passive)"),
    (_state(user={"KMP_BLOCKTIME": "0"}, settings={"GOMP_SPINCOUNT": "3000"}),
     "short spin (GOMP_SPINCOUNT=3000, fastln's default)"),
    (_state(new=["libomp.so.5"], user={"GOMP_SPINCOUNT": "9"}, settings={"KMP_BLOCKTIME": "1"}),
     "short spin (KMP_BLOCKTIME=1, fastln's default)"),
    (_state(settings={"KMP_BLOCKTIME": "1"}), "libgomp.so.1's default"),
    (_state(new=[], before=["libgomp.so.1"], user={"GOMP_SPINCOUNT": "0"}, settings={}),
     "the environment's (GOMP_SPINCOUNT=0)"),
])
def test_describe(state, expect):
    assert _wait.describe(state) == expect


def test_import_lib_restores_a_given_environment():
    """import_lib (fastln._lib is imported already: this checks the
    bookkeeping) sets fastln's variables only for the import and puts the
    environment back as it was, values and absences alike."""
    environ = {"GOMP_SPINCOUNT": "", "OTHER": "x"}
    seen = {}

    class Recording(dict):
        def update(self, other):
            seen.update(other)
            super().update(other)
    env = Recording(environ)
    saved = dict(_wait._state)
    try:
        assert _wait.import_lib(env) is fastln._lib
        assert dict(env) == environ
        assert seen == _wait.defaults_for(environ)
    finally:
        _wait._state.clear()
        _wait._state.update(saved)


def test_runtime_info_reports_the_policy():
    """get_wait_policy is import_lib's record put in words; machine_info and
    ``python -m fastln``'s header carry it."""
    assert fastln.get_wait_policy() == _wait.describe()
    info = _selfcheck.machine_info(peer_versions={})
    assert info["wait_policy"] == fastln.get_wait_policy()
    info["versions"] = {"python": "3", "numpy": "2", "torch": None, "onnxruntime": None}
    assert f"wait policy: {fastln.get_wait_policy()}" in main_mod.header(info)


# ---- bench/idle.py ----------------------------------------------------------------

def _idle_bench():
    path = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                        "bench", "idle.py")
    spec = importlib.util.spec_from_file_location("fastln_bench_idle_test", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_idle_bench_refuses_bad_options(capsys):
    mod = _idle_bench()
    assert mod.policy_env("spin=250") == {"GOMP_SPINCOUNT": "250"}
    assert mod.policy_env("fastln") == {}
    for argv in (["--policies", "fastln,sometimes"], ["--policies", "spin=x"],
                 ["--policies", "passive,passive"], ["--rounds", "0"], ["--seconds", "0"],
                 ["--busy", "-1"], ["--threads", "two"]):
        with pytest.raises(SystemExit) as info:
            mod.main(argv)
        assert info.value.code == 2, argv
    assert "--policies" in capsys.readouterr().err


@needs_openmp
def test_idle_bench_runs_each_policy_in_its_own_environment(tmp_path, capsys):
    """A tiny run: every figure positive, and each policy's children report the
    waiting policy their environment gives (the variables reach them, and
    fastln's default applies where none is set)."""
    mod = _idle_bench()
    path = tmp_path / "idle.json"
    mod.main(["--policies", "fastln,spin=700", "--rounds", "1", "--seconds", "0.1",
              "--threads", "2", "--json", str(path)])
    out = capsys.readouterr().out
    res = json.loads(path.read_text())
    assert list(res["results"]) == ["fastln", "spin=700"]
    for runs in res["results"].values():
        assert len(runs) == 1 and runs[0]["threads"] == 2
        assert all(runs[0][k] > 0 for k, _, _ in mod.FIGURES), runs
    fastln_child, spin_child = res["results"]["fastln"][0], res["results"]["spin=700"][0]
    if "libgomp.so.1" in _wait._state["new"] + _wait._state["before"]:
        assert spin_child["wait_policy"] == "the environment's (GOMP_SPINCOUNT=700)"
        assert fastln_child["wait_policy"] == fastlns_policy(["libgomp.so.1"])
    assert "| fastln |" in out and "| spin=700 |" in out

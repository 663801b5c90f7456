"""How fastln's idle OpenMP worker threads wait: a short bounded spin by default.

After a parallel region, OpenMP's worker threads wait for the next one. They
spin on the CPU for a while, then sleep in the kernel. GCC's libgomp spins
300000 iterations where neither ``OMP_WAIT_POLICY`` nor ``GOMP_SPINCOUNT`` is
set (milliseconds on x86), LLVM's libomp (clang, macOS) 200 ms (``KMP_BLOCKTIME``). A
process that calls fastln a few dozen times a second would keep its cores busy
spinning between the calls, and take them from other processes.

The runtimes read these variables once, as they start: libgomp when it loads,
libomp when it is first used. :func:`import_lib` imports fastln's extension,
which loads the runtime and asks it for its thread count (starting libomp),
with a short spin in the environment: ``GOMP_SPINCOUNT=SPIN_COUNT`` for
libgomp on x86, ``KMP_BLOCKTIME=BLOCKTIME_MS`` for libomp. It then restores the
environment, so that child processes and other runtimes loaded later see the
user's. The short spin still covers the barriers inside a call and the gap
between calls made back to back; past it, an idle worker sleeps. A library
loaded later that links the same runtime (torch imported after fastln shares
its libgomp) shares its policy too.

The user's choice wins: where ``OMP_WAIT_POLICY`` is set, or the runtime's
own variable (``GOMP_SPINCOUNT``, ``KMP_BLOCKTIME``), fastln sets nothing for
that runtime. Where the runtime was loaded before fastln (``import torch``
first loads libgomp), it has read the environment already: fastln's setting
cannot apply, and :func:`describe` says so.
"""
from __future__ import annotations

import ctypes
import importlib
import os
import platform
from collections.abc import Mapping, MutableMapping
from types import ModuleType
from typing import Optional

# libgomp's spin between parallel regions on x86, in iterations of a load and
# a pause instruction: 3 ns (older cores) to 50 ns (Intel cores since Skylake)
# each, so 0.01-0.15 ms. docs/performance.md has the measurements behind it.
# Elsewhere libgomp's iterations have no pause: its default of 300000 takes a
# fraction of a millisecond already, and fastln leaves it.
SPIN_COUNT = 3000
X86 = ("x86_64", "amd64", "i386", "i686", "x86")
# libomp's spin in milliseconds: its smallest setting above 0 (sleep at once)
# that every libomp version reads
BLOCKTIME_MS = 1
USER_VARS = ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT", "KMP_BLOCKTIME")
# runtime file name -> the variables that set its waiting
RUNTIMES = {"libgomp.so.1": ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT"),
            "libomp.so.5": ("OMP_WAIT_POLICY", "KMP_BLOCKTIME"),
            "libomp.so": ("OMP_WAIT_POLICY", "KMP_BLOCKTIME"),
            "libiomp5.so": ("OMP_WAIT_POLICY", "KMP_BLOCKTIME"),
            "libomp.dylib": ("OMP_WAIT_POLICY", "KMP_BLOCKTIME"),
            "libiomp5.dylib": ("OMP_WAIT_POLICY", "KMP_BLOCKTIME")}

# what import_lib saw: see describe()
_state: dict = {}


def defaults_for(environ: Mapping[str, str], machine: Optional[str] = None) -> dict[str, str]:
    """The variables fastln sets for an environment on a machine (default:
    this one's ``platform.machine()``): ``GOMP_SPINCOUNT=SPIN_COUNT`` on x86
    and ``KMP_BLOCKTIME=BLOCKTIME_MS``, each unless the user set
    ``OMP_WAIT_POLICY`` or that variable (to anything but the empty string,
    which the runtimes treat as unset)."""
    chosen = {v for v in USER_VARS if environ.get(v)}
    machine = (platform.machine() if machine is None else machine).lower()
    settings = {}
    if machine in X86 and not chosen & {"OMP_WAIT_POLICY", "GOMP_SPINCOUNT"}:
        settings["GOMP_SPINCOUNT"] = str(SPIN_COUNT)
    if not chosen & {"OMP_WAIT_POLICY", "KMP_BLOCKTIME"}:
        settings["KMP_BLOCKTIME"] = str(BLOCKTIME_MS)
    return settings


def loaded_runtimes() -> set[str]:
    """The OpenMP runtimes of RUNTIMES loaded in this process now, by file name
    (dlopen with RTLD_NOLOAD finds a library loaded under its name; it loads
    nothing). Empty where the platform has no RTLD_NOLOAD."""
    mode = getattr(os, "RTLD_NOLOAD", None)
    if mode is None:
        return set()
    found = set()
    for name in RUNTIMES:
        try:
            ctypes.CDLL(name, mode=mode)
        except OSError:
            continue
        found.add(name)
    return found


def import_lib(environ: MutableMapping[str, str] = os.environ) -> ModuleType:
    """Imports fastln._lib with fastln's waiting policy (see the module's
    docstring) and returns it; the environment is as before on return."""
    before = loaded_runtimes()
    settings = defaults_for(environ)
    saved = {name: environ.get(name) for name in settings}
    environ.update(settings)
    try:
        lib = importlib.import_module("fastln._lib")
        lib.get_num_threads()   # starts a runtime that reads its settings on first use
    finally:
        for name, value in saved.items():
            if value is None:
                environ.pop(name, None)
            else:
                environ[name] = value
    after = loaded_runtimes()
    _state.update(openmp=bool(lib.has_openmp()), new=sorted(after - before),
                  before=sorted(before & after), settings=settings,
                  user={v: environ[v] for v in USER_VARS if environ.get(v)})
    return lib


def describe(state: Optional[Mapping] = None) -> str:
    """One line on how fastln's idle threads wait (``state``: import_lib's record).

    - ``"serial build (no OpenMP threads)"``;
    - ``"the environment's (OMP_WAIT_POLICY=passive)"``: the user's variables
      for the runtime in use;
    - ``"libgomp.so.1's default (loaded before fastln)"``: the runtime was
      loaded before fastln, without the user's variables;
    - ``"short spin (GOMP_SPINCOUNT=3000, fastln's default)"``: fastln's
      setting, read by the runtime that fastln's import loaded;
    - ``"short spin (KMP_BLOCKTIME=1, set at import; runtime not identified)"``:
      where no runtime of RUNTIMES is found by name (macOS, another runtime);
    - ``"libgomp.so.1's default"``: fastln set nothing for the runtime (libgomp
      off x86, where its default spin is short).
    """
    s = _state if state is None else state
    if not s.get("openmp", False):
        return "serial build (no OpenMP threads)"
    runtimes = s["new"] or s["before"]
    names = set().union(*(RUNTIMES[r] for r in runtimes)) if runtimes else set(USER_VARS)
    user = {k: v for k, v in s["user"].items() if k in names}
    if user:
        return "the environment's (" + ", ".join(f"{k}={v}" for k, v in user.items()) + ")"
    if not s["new"] and s["before"]:
        return f"{', '.join(s['before'])}'s default (loaded before fastln)"
    ours = {k: v for k, v in s["settings"].items() if k in names}
    if not ours:
        return f"{', '.join(runtimes)}'s default"
    where = "fastln's default" if runtimes else "set at import; runtime not identified"
    return "short spin (" + ", ".join(f"{k}={v}" for k, v in ours.items()) + f", {where})"

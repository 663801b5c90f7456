"""Runs Python as if some packages were not installed.

    python tests/_blocker.py PKG[,PKG...] -m MODULE [ARGS...]
    python tests/_blocker.py PKG[,PKG...] -c CODE
    python tests/_blocker.py PKG[,PKG...] SCRIPT [ARGS...]

A finder first on ``sys.meta_path`` raises ImportError (as a missing package
does) for each named top-level package and its submodules, then the module,
code or script runs as ``python`` would run it. ``importlib.util.find_spec``
of a blocked name returns None, so code that probes for a package sees it
missing too. tests/test_optional.py runs fastln this way.
"""
import importlib.abc
import importlib.util
import runpy
import sys


class Blocker(importlib.abc.MetaPathFinder):
    def __init__(self, names):
        self.names = frozenset(names)

    def find_spec(self, fullname, path=None, target=None):
        if fullname.split(".")[0] in self.names:
            raise ModuleNotFoundError(f"No module named {fullname!r} (blocked)", name=fullname)
        return None


def block(names):
    """Makes the top-level packages in names unimportable in this process."""
    names = [n for n in names if n]
    loaded = [m for m in sys.modules if m.split(".")[0] in names]
    assert not loaded, f"already imported: {loaded}"
    sys.meta_path.insert(0, Blocker(names))
    original = importlib.util.find_spec

    def find_spec(name, package=None):
        if name.split(".")[0] in names:
            return None
        return original(name, package)

    importlib.util.find_spec = find_spec


def main(argv):
    if len(argv) < 3:
        sys.exit(__doc__)
    block(argv[1].split(","))
    if argv[2] == "-m":
        sys.argv = [argv[3]] + argv[4:]
        runpy.run_module(argv[3], run_name="__main__", alter_sys=True)
    elif argv[2] == "-c":
        sys.argv = ["-c"] + argv[4:]
        exec(compile(argv[3], "<string>", "exec"), {"__name__": "__main__"})  # noqa: S102
    else:
        sys.argv = argv[2:]
        runpy.run_path(argv[2], run_name="__main__")


if __name__ == "__main__":
    main(sys.argv)

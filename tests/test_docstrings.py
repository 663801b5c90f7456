"""The public API's docstrings: numpydoc sections present, examples run.

1. Every public name -- ``fastln.__all__``, ``fastln.rnn.__all__``, the public
   functions of ``fastln.reference`` and ``fastln.rnn_reference``, and the
   public methods of the public classes (inherited ones and ``__call__``
   included) -- has a docstring. It has a "Parameters" section naming exactly
   its parameters when it takes any besides self/cls (for a class, those of
   its constructor), and a "Returns" (or "Yields") section when its code
   returns a value.
2. The examples in the docstrings of fastln, fastln._lib, fastln._norms and
   fastln._add_norms (the Cython modules), fastln.layers, fastln.rnn,
   fastln._threads, fastln._memory, fastln.reference and fastln.rnn_reference
   run as doctests; each module has some. A docstring whose examples use torch
   is skipped where torch is missing (unless FASTLN_REQUIRE_TORCH=1, as in
   tests/conftest.py).

fastln.dask is covered by tests/test_dask.py.
"""
import ast
import doctest
import importlib
import inspect
import io
import os
import re
import textwrap

import pytest

import fastln
import fastln.reference
import fastln.rnn
import fastln.rnn.functional
import fastln.rnn_reference

DOCTEST_MODULES = ["fastln", "fastln._lib", "fastln._norms", "fastln._add_norms",
                   "fastln.layers", "fastln.rnn", "fastln.rnn.functional", "fastln._threads",
                   "fastln._memory", "fastln.reference", "fastln.rnn_reference"]

# Public names that need no Parameters/Returns section, with the reason. (None
# today: LayerNorm's and RMSNorm's __call__ have their own short docstring, and
# the RNN models' __call__ is forward itself.)
EXEMPT = {}


# ---- what is public ---------------------------------------------------------

def _module_functions(module):
    """The public functions a module defines itself."""
    return [name for name, obj in vars(module).items()
            if not name.startswith("_") and inspect.isfunction(obj)
            and obj.__module__ == module.__name__]


def _public_methods(cls):
    """Public methods of cls, inherited ones included, and __call__."""
    names = []
    for name in dir(cls):
        if name.startswith("_") and name != "__call__":
            continue
        if name == "__call__" and "__call__" not in {k for c in cls.__mro__[:-1]
                                                   for k in vars(c)}:
            continue   # type's own __call__, not the class's
        if not any(name in vars(c) for c in cls.__mro__ if c.__module__ != "builtins"):
            continue   # a builtin base's own method (an exception's with_traceback)
        if callable(getattr(cls, name)):
            names.append(name)
    return names


def _public_objects(modules=None):
    """(qualified name, object) for every public name checked: of fastln,
    fastln.rnn and the reference modules, or of (module, names) pairs."""
    items = []
    if modules is None:
        modules = [(fastln, fastln.__all__), (fastln.rnn, fastln.rnn.__all__),
                   (fastln.rnn.functional, _module_functions(fastln.rnn.functional)),
                   (fastln.reference, _module_functions(fastln.reference)),
                   (fastln.rnn_reference, fastln.rnn_reference.__all__)]
    for module, names in modules:
        for name in names:
            obj = getattr(module, name)
            if not callable(obj):
                continue   # __version__
            items.append((f"{module.__name__}.{name}", obj))
            if inspect.isclass(obj):
                items += [(f"{module.__name__}.{name}.{m}", getattr(obj, m))
                          for m in _public_methods(obj)]
    return items


PUBLIC = _public_objects()


def test_the_walk_sees_everything():
    names = {name for name, _ in PUBLIC}
    for expected in ["fastln.layer_norm", "fastln.threads",
                     "fastln.LayerNorm.from_torch", "fastln.RMSNorm.load_state_dict",
                     "fastln.LayerNorm.__call__", "fastln.rnn.LNLSTM.forward",
                     "fastln.rnn.LNGRU.step", "fastln.rnn.RNN.from_torch",
                     "fastln.rnn.LSTM.__call__", "fastln.reference.add_layer_norm",
                     "fastln.rnn_reference.param_shapes", "fastln.rnn_reference.int8_product"]:
        assert expected in names
    # reference modules: __all__ lists what they define (rnn_reference also
    # the int8 product of its private helper module)
    assert set(_module_functions(fastln.reference)) == set(fastln.reference.__all__)
    assert set(_module_functions(fastln.rnn_reference)) < set(fastln.rnn_reference.__all__)


# ---- numpydoc sections ------------------------------------------------------

_SECTION = re.compile(r"^(\w[\w ]*)\n-{3,}$", re.M)


def _doc(obj):
    """The docstring, dedented (Cython's embedded signature line is harmless)."""
    return inspect.cleandoc(obj.__doc__ or "")


def _sections(doc):
    """{section title: its text} of a numpydoc docstring."""
    found = list(_SECTION.finditer(doc))
    return {m.group(1): doc[m.end():found[i + 1].start() if i + 1 < len(found) else len(doc)]
            for i, m in enumerate(found)}


def _documented_names(text):
    """Parameter names of a Parameters section: its unindented "a, b : type" lines."""
    names = set()
    for line in text.splitlines():
        if line and not line[0].isspace():
            names.update(n.strip().lstrip("*") for n in line.split(" : ")[0].split(","))
    return names


def _parameters(obj):
    """Names of the parameters besides self/cls (of the constructor for a class)."""
    if inspect.isclass(obj) and issubclass(obj, BaseException) and "__init__" not in {
            k for c in obj.__mro__ if c.__module__ != "builtins" for k in vars(c)}:
        return []   # an exception class with the builtin constructor: no signature
    params = list(inspect.signature(obj).parameters.values())
    if params and params[0].name in ("self", "cls"):
        params = params[1:]
    return [p.name for p in params]


def _source(func):
    """func's source, or None where there is none (a compiled function)."""
    func = inspect.unwrap(func)
    try:
        return textwrap.dedent(inspect.getsource(func))
    except (OSError, TypeError):
        pass
    # a Cython function: its def block in the .pyx beside the module
    module = inspect.getmodule(func)
    path = os.path.splitext(getattr(module, "__file__", "") or "")[0].split(".cpython")[0] + ".pyx"
    if not os.path.exists(path):
        return None
    lines = open(path, encoding="utf-8").read().splitlines()
    start = next((i for i, line in enumerate(lines)
                  if line.startswith(f"def {func.__name__}(")), None)
    if start is None:
        return None
    end = next((i for i in range(start + 1, len(lines))
                if lines[i] and not lines[i][0].isspace() and not lines[i].startswith(")")),
               len(lines))
    return "\n".join(lines[start:end])


def _gives_value(func):
    """'yield' for a generator, True where the code returns a value, else False."""
    src = _source(func)
    if src is None:
        return True   # unknown: ask for a Returns section
    try:
        tree = ast.parse(src)
    except SyntaxError:   # Cython
        body = src.split('"""')[-1] if src.count('"""') >= 2 else src
        return bool(re.search(r"^\s+return\b(?!\s*(None)?\s*$)", body, re.M))
    top = tree.body[0]

    def walk(node):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda,
                                  ast.ClassDef)):
                continue   # nested scopes return for themselves
            yield child
            yield from walk(child)
    nodes = list(walk(top))
    if any(isinstance(n, (ast.Yield, ast.YieldFrom)) for n in nodes):
        return "yield"
    return any(isinstance(n, ast.Return) and n.value is not None
               and not (isinstance(n.value, ast.Constant) and n.value.value is None)
               for n in nodes)


@pytest.mark.parametrize("name,obj", PUBLIC, ids=[name for name, _ in PUBLIC])
def test_numpydoc_sections(name, obj):
    if name in EXEMPT:
        pytest.skip(EXEMPT[name])
    _check_sections(name, obj)


def test_numpydoc_sections_of_fastln_torch(torch):
    import fastln.torch

    objects = _public_objects([(fastln.torch, fastln.torch.__all__)])
    assert "fastln.torch.LNLSTM.forward" in {name for name, _ in objects}
    for name, obj in objects:
        if getattr(obj, "__module__", "").startswith("fastln"):   # not torch.nn.Module's own
            _check_sections(name, obj)


def _check_sections(name, obj):
    doc = _doc(obj)
    assert doc.strip(), f"{name} has no docstring"
    sections = _sections(doc)
    params = _parameters(obj)
    if params:
        assert "Parameters" in sections, f"{name} takes {params} but has no Parameters section"
        documented = _documented_names(sections["Parameters"])
        assert set(params) <= documented, \
            f"{name}: parameters {sorted(set(params) - documented)} are not documented"
        assert documented <= set(params), \
            f"{name}: documents {sorted(documented - set(params))}, which it does not take"
    if inspect.isclass(obj):
        return
    gives = _gives_value(obj)
    if gives == "yield":
        assert "Returns" in sections or "Yields" in sections, f"{name}: no Returns/Yields"
    elif gives:
        assert "Returns" in sections, f"{name} returns a value but has no Returns section"


@pytest.mark.parametrize("module_name", DOCTEST_MODULES)
def test_module_docstring(module_name):
    module = importlib.import_module(module_name)
    assert (module.__doc__ or "").strip(), f"{module_name} has no module docstring"


# ---- examples ---------------------------------------------------------------

def _torch_available():
    try:
        import torch  # noqa: F401
    except Exception as exc:  # ImportError, or a broken install
        if os.environ.get("FASTLN_REQUIRE_TORCH") == "1":
            pytest.fail("FASTLN_REQUIRE_TORCH=1 but torch cannot be imported: %r" % (exc,))
        return False
    return True


_USES_TORCH = re.compile(r"\btorch\b")


def _doctests(module):
    """The module's doctests with examples, each docstring once (Cython also
    lists the docstrings of its functions in the module's __test__)."""
    tests, seen = [], set()
    for test in sorted(doctest.DocTestFinder().find(module), key=lambda t: t.name):
        key = tuple(ex.source for ex in test.examples)
        if test.examples and key not in seen:
            seen.add(key)
            tests.append(test)
    return tests


@pytest.fixture
def restore_global_state():
    """Examples set the thread count; put it (and the ISA) back."""
    requested, isa = fastln._lib.get_requested_threads(), fastln.get_isa()
    yield
    fastln._lib.set_num_threads(requested)
    fastln._lib._set_isa(isa)


@pytest.mark.parametrize("module_name", DOCTEST_MODULES)
def test_examples(module_name, restore_global_state):
    module = importlib.import_module(module_name)
    tests = _doctests(module)
    have_torch = _torch_available()
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    report = io.StringIO()
    skipped = []
    for test in tests:
        if not have_torch and any(_USES_TORCH.search(ex.source) for ex in test.examples):
            skipped.append(test.name)
            continue
        runner.run(test, out=report.write)
    results = runner.summarize(verbose=False)
    assert results.failed == 0, f"{results.failed} example(s) failed:\n{report.getvalue()}"
    assert results.attempted > 0, f"no examples ran in {module_name} (skipped: {skipped})"
    if skipped:   # logged as a skip, so that a run with torch runs them
        pytest.skip(f"the examples of {skipped} need torch, which is missing")


def test_examples_of_fastln_torch(torch, restore_global_state):

    test_module_docstring("fastln.torch")
    test_examples("fastln.torch", None)

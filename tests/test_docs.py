"""The documentation site (docs/) stays true to the code.

1. The API reference names every public name and nothing else. Its pages,
   docs/reference/*.rst, list names in ``autosummary`` tables under a
   ``currentmodule`` or ``automodule``; read from those sources (no Sphinx
   needed), they are exactly the ``__all__`` of fastln, fastln.rnn,
   fastln.dask, fastln.reference, fastln.rnn_reference and fastln.serve
   (fastln.layers' classes appear as fastln's, the same objects), and each
   exists; the modules of fastln.serve's protocols, endpoints and metrics
   show their docstrings (automodule), and no other module does. A class
   page lists its public methods (inherited ones and ``__call__`` included)
   through the autosummary templates. The summary an autosummary table shows
   for each entry and each public method -- the first sentence of the
   docstring, cut at the first period followed by white space -- reads
   whole: it does not end in an abbreviation (``eq.``, ``e.g.``, ``cf.``) nor
   with a parenthesis or a literal left open.
2. The C reference pages are generated from the public headers
   (src_c/api/fastln*.h) at build time by docs/_ext/c_reference.py. Each header
   has its page, and the header reader docs/_ext/cheader.py finds every
   function, macro, enumerator, struct (with every member) and type that a
   plain scan of the header finds, and attaches the comments as the
   headers' conventions say.
3. Every ```python block of README.md and docs/**/*.md runs as written, in a
   namespace of its own, from the repository root. A block with an
   ``if __name__ == "__main__":`` guard (a dask cluster) runs as a script in
   a subprocess, as a user would run it. A block that needs a package that
   is not installed is skipped (torch through the ``torch`` fixture, so
   FASTLN_REQUIRE_TORCH=1 fails; the others fail under CI=1, which installs
   them). Code not meant to run is marked ```{code-block} python
   (highlighted, not run), ```pycon, ```console or ```text; the fences
   ```py, ```python3 and ```ipython are refused, so that no Python escapes
   the runner.
4. A ```python block that needs an optional package -- one it imports
   beside the standard library, NumPy and fastln, ``dask`` for
   ``fastln.dask``, or one that a module of the repository it imports
   (``fastln.serve.client``) imports at its top, itself or through the
   modules of the repository it imports there -- follows a note: the
   paragraph right before it starts with "Needs", names each such package in
   backticks, and gives a ``pip install`` command that installs them (the
   package itself, or a fastln extra that holds it).
5. The install guide's table of extras has a row for each extra of
   pyproject.toml, naming every distribution the extra installs and nothing
   else (``test``: "the packages of every extra above but ``torch`` and ``docs``", then the
   rest), and a size in MB for each.
"""
import ast
import glob
import importlib
import importlib.util
import inspect
import os
import re
import subprocess
import sys
import sysconfig

import pytest

import fastln

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DOCS = os.path.join(ROOT, "docs")
REFERENCE = os.path.join(DOCS, "reference")
TEMPLATES = os.path.join(DOCS, "_templates", "autosummary")
PUBLIC_MODULES = ["fastln", "fastln.rnn", "fastln.rnn.functional", "fastln.torch",
                  "fastln.dask", "fastln.reference", "fastln.rnn_reference", "fastln.serve",
                  "fastln.serve.store"]
# modules whose reference is their docstring alone (automodule, no names listed)
DOCSTRING_MODULES = ["fastln.serve.ws.stream", "fastln.serve.ws.mux", "fastln.serve.http",
                     "fastln.serve.metrics", "fastln.serve.checkpoint"]
HEADERS = sorted(glob.glob(os.path.join(ROOT, "src_c", "api", "fastln*.h")))

pytestmark = pytest.mark.skipif(not os.path.isdir(REFERENCE),
                                reason="docs/ is not next to tests/")


def _module(name):
    """The module, its names loaded (fastln.serve loads them on first use); a
    package it needs that is missing skips, or fails under CI."""
    try:
        module = importlib.import_module(name)
        for attr in getattr(module, "__all__", ()):
            getattr(module, attr)
    except ImportError as e:
        if (e.name or "fastln").split(".")[0] == "fastln" or os.environ.get("CI"):
            raise
        pytest.skip(f"{name} needs {e.name}, which is not installed")
    return module


# ---- 1. the API reference -------------------------------------------------------------

def _reference_entries():
    """{full name: page} of every autosummary entry of docs/reference/*.rst, and the
    modules the pages document with automodule."""
    entries, modules = {}, set()
    for path in sorted(glob.glob(os.path.join(REFERENCE, "*.rst"))):
        page = os.path.relpath(path, ROOT)
        current, in_table = None, False
        with open(path, encoding="utf-8") as f:
            for line in f:
                m = re.match(r"\.\. (currentmodule|automodule):: (\S+)", line)
                if m:
                    current, in_table = m.group(2), False
                    if m.group(1) == "automodule":
                        modules.add(current)
                elif line.startswith(".. autosummary::"):
                    in_table = True
                elif in_table and line.strip() and not line[0].isspace():
                    in_table = False
                elif in_table and line.strip() and not line.strip().startswith(":"):
                    name = f"{current}.{line.strip()}"
                    assert name not in entries, f"{name} in {page} and {entries[name]}"
                    entries[name] = page
    return entries, modules


def test_the_reader_sees_the_reference():
    entries, modules = _reference_entries()
    for name in ["fastln.layer_norm", "fastln.LayerNorm", "fastln.rnn.LNLSTM",
                 "fastln.rnn_reference.param_shapes", "fastln.dask.rnn_forward"]:
        assert name in entries
    assert "fastln.rnn" in modules


@pytest.mark.parametrize("module_name", PUBLIC_MODULES)
def test_reference_lists_exactly_the_public_names(module_name):
    module = _module(module_name)
    entries, modules = _reference_entries()
    documented = {name.rpartition(".")[2] for name in entries
                  if name.rpartition(".")[0] == module_name}
    assert documented == set(module.__all__), (
        f"missing: {sorted(set(module.__all__) - documented)}, "
        f"not public: {sorted(documented - set(module.__all__))}")
    assert module_name in modules, f"no page shows {module_name}'s docstring (automodule)"


def test_reference_entries_exist():
    entries, modules = _reference_entries()
    for name, page in entries.items():
        module_name, _, attr = name.rpartition(".")
        assert module_name in PUBLIC_MODULES, f"{name} ({page}): not a public module"
        assert hasattr(_module(module_name), attr), f"{name} ({page}) does not exist"
    assert modules <= set(PUBLIC_MODULES + DOCSTRING_MODULES), modules


@pytest.mark.parametrize("module_name", DOCSTRING_MODULES)
def test_docstring_modules_are_shown(module_name):
    assert _module(module_name).__doc__
    assert module_name in _reference_entries()[1]


def test_layers_classes_are_documented_as_fastlns():
    import fastln.layers

    entries, _ = _reference_entries()
    for name in fastln.layers.__all__:
        assert f"fastln.{name}" in entries
        assert getattr(fastln, name) is getattr(fastln.layers, name)


def test_class_pages_list_the_public_methods():
    with open(os.path.join(TEMPLATES, "class.rst"), encoding="utf-8") as f:
        template = f.read()
    # inherited members up to torch.nn.Module's own (fastln.torch's modules)
    for option in (":members:", ":inherited-members: Module", ":special-members: __call__"):
        assert re.search(r"^\s+" + re.escape(option) + r"\s*$", template, re.M), option


# sphinx.ext.autosummary's extract_summary: the first paragraph is cut at each period that
# white space follows (periods_re) until the part does not end in a well-known abbreviation
_PERIODS = re.compile(r"\.(?:\s+)")
_WELL_KNOWN_ABBREVIATIONS = ("et al.", "e.g.", "i.e.", "vs.")
# words that end in a period without ending a sentence: a summary cut after one is cut short
_ABBREVIATIONS = {"eq.", "eqs.", "e.g.", "i.e.", "cf.", "vs.", "fig.", "figs.", "al.", "sec.",
                  "ch.", "no.", "approx.", "resp.", "ref.", "refs.", "p.", "pp.", "vol.", "ed.",
                  "eds.", "incl.", "max.", "min.", "std."}


def _summary(obj):
    """The summary autosummary shows for obj: the first sentence of its docstring's
    first paragraph (after the signature line Cython embeds, which autodoc reads as
    the signature)."""
    lines = inspect.cleandoc(obj.__doc__ or "").splitlines()
    name = getattr(obj, "__name__", "")
    if lines and name and re.match(re.escape(name) + r"\(.*\)( ->.*)?$", lines[0]):
        lines = lines[1:]
    stanza = []
    for line in lines:
        if not line.strip():
            if stanza:
                break
            continue
        stanza.append(line)
    sentences = _PERIODS.split(" ".join(stanza))
    if len(sentences) == 1:
        return sentences[0].strip()
    for i in range(len(sentences)):
        summary = ". ".join(sentences[:i + 1]).rstrip(".") + "."
        if not summary.endswith(_WELL_KNOWN_ABBREVIATIONS):
            break
    return summary


def _summarized():
    """(name, object) of every autosummary entry that has a docstring of its own, and
    of the public methods of the classes among them."""
    entries, _ = _reference_entries()
    items = []
    for name in sorted(entries):
        module_name, _, attr = name.rpartition(".")
        obj = getattr(_module(module_name), attr)
        if not callable(obj):
            continue   # __version__: its summary is the #: comment
        items.append((name, obj))
        if inspect.isclass(obj):
            items += [(f"{name}.{m}", getattr(obj, m)) for m in dir(obj)
                      if (not m.startswith("_") or m == "__call__")
                      and any(m in vars(c) for c in obj.__mro__   # as the class template:
                              if c.__module__ != "builtins"            # not torch.nn.Module's
                              and not c.__module__.startswith("torch."))
                      and callable(getattr(obj, m))]
    return items


def test_summary_reader_cuts_as_autosummary():
    def doc(text):
        return type("T", (), {"__doc__": text})
    assert _summary(doc("RNN (Ba et al. 2016, eq. 4).\n\nMore.")) == "RNN (Ba et al. 2016, eq."
    assert _summary(doc("Norm, e.g. this one. More.")) == "Norm, e.g. this one."
    assert _summary(doc("One line\nand the next.\n\nOther.")) == "One line and the next."
    assert _summary(fastln.rms_norm).startswith("RMS normalization over ``axis``")


def test_summaries_read_whole():
    short = []
    for name, obj in _summarized():
        summary = _summary(obj)
        last = summary.split()[-1].lstrip("(").lower() if summary.split() else ""
        if (not summary or last in _ABBREVIATIONS or summary.count("(") != summary.count(")")
                or summary.count("``") % 2 or summary.count("[") != summary.count("]")):
            short.append(f"{name}: {summary!r}")
    assert not short, "summaries cut short:\n" + "\n".join(short)


# ---- 2. the C reference ---------------------------------------------------------------

def _cheader():
    spec = importlib.util.spec_from_file_location(
        "cheader", os.path.join(DOCS, "_ext", "cheader.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _scan(text):
    """{name: kind} of a header's declarations, found by plain patterns, and
    {struct: member names}."""
    code = re.sub(r"/\*.*?\*/", " ", text, flags=re.S)
    guard = re.search(r"#ifndef (\w+)", code).group(1)
    names = {n: "macro" for n in re.findall(r"^#define\s+(\w+)\s+\S", code, re.M)}
    names.pop(guard, None)
    names.update({n: "function" for n in re.findall(r"\b(fastln_\w+)\s*\(", code)})
    names.update({n: "type" for n in re.findall(r"\(\s*\*\s*(fastln_\w+)\s*\)\s*\(", code)})
    for body in re.findall(r"\benum\s*\{(.*?)\}", code, re.S):
        names.update({n: "enumerator" for n in re.findall(r"(\w+)\s*=", body)})
    members = {}
    for body, name in re.findall(r"typedef struct\s*\{(.*?)\}\s*(\w+)\s*;", code, re.S):
        names[name] = "struct"
        body = re.sub(r"\)\s*\([^()]*\)", ")", body)        # int (*f)(void *) -> int (*f)
        members[name] = re.findall(r"(\w+)\s*\)?\s*(?:\[\w+\])?\s*[;,]", body)
    return names, members


def _member_name(declaration):
    """The name a member declaration declares: ``(*f)(...)``, ``w[4]``, ``*p``."""
    m = re.search(r"\(\s*\*\s*(\w+)\s*\)", declaration) or re.search(r"(\w+)\s*(?:\[\w+\])?$",
                                                                   declaration)
    return m.group(1)


@pytest.mark.parametrize("header", HEADERS, ids=os.path.basename)
def test_c_reader_finds_every_declaration(header):
    with open(header, encoding="utf-8") as f:
        text = f.read()
    parsed = _cheader().parse(text)
    names, members = _scan(text)
    assert {d.name: d.kind for d in parsed.decls()} == names
    assert len(parsed.decls()) == len(names)            # each once
    for decl in parsed.decls():
        if decl.kind == "struct":
            assert [_member_name(m) for m, _ in decl.members] == members[decl.name]
    assert parsed.text, "the header's leading comment"


@pytest.mark.parametrize("header", HEADERS, ids=os.path.basename)
def test_every_public_header_has_a_reference_page(header):
    pages = []
    for path in glob.glob(os.path.join(REFERENCE, "*.*")):
        with open(path, encoding="utf-8") as f:
            for target in re.findall(r"^(?:\.\. c-header::|```\{c-header\}) (\S+)", f.read(),
                                     re.M):
                if os.path.normpath(os.path.join(REFERENCE, target)) == header:
                    pages.append(path)
    assert len(pages) == 1, pages


def test_c_reader_follows_the_comment_conventions():
    header = _cheader().parse("""/*
 * The header.
 *
 * Legend
 *   x  input
 */
#ifndef T_H
#define T_H
#define T_OK 0
#define T_ERR 1   /* went wrong */

/* ---- Norms: y = f(x) ---- */
/* A pair. */
int t_f32(float *y, const float *x);
int t_f64(double *y, const double *x);

int t_alone(void);

enum { T_A = 0, T_B = 1 };
/* Args. */
typedef struct {
    int a, *b;        /* two */
    int (*cb)(void *ctx);  /* a callback */
    double w[4];
} t_args;
/* A BLAS. */
typedef void (*t_fn)(char *, int *);
void t_set(t_fn f);
#endif
""")
    assert header.text == "The header.\n\nLegend\n  x  input"
    first, norms = header.sections
    assert first.title == "" and [d.name for d in first.groups[0].decls] == ["T_OK", "T_ERR"]
    assert [d.value for d in first.groups[0].decls] == ["0", "1"]
    assert first.groups[0].decls[1].comment == "went wrong"
    assert (norms.title, norms.text) == ("Norms", "y = f(x)")
    groups = [(g.comment, [d.name for d in g.decls]) for g in norms.groups]
    assert groups == [("A pair.", ["t_f32", "t_f64"]), ("", ["t_alone"]),
                      ("", ["T_A", "T_B"]), ("Args.", ["t_args"]),
                      ("A BLAS.", ["t_fn", "t_set"])]
    args = norms.groups[3].decls[0]
    assert args.members == [("int a", "two"), ("int *b", "two"),
                            ("int (*cb)(void *ctx)", "a callback"), ("double w[4]", "")]
    assert norms.groups[4].decls[0].signature == "void (*t_fn)(char *, int *)"
    assert norms.groups[0].decls[0].signature == "int t_f32(float *y, const float *x)"


# ---- 3. the code blocks ---------------------------------------------------------------

def _pages():
    pages = [os.path.join(ROOT, "README.md")]
    pages += sorted(glob.glob(os.path.join(DOCS, "**", "*.md"), recursive=True))
    return [p for p in pages if os.path.exists(p)
            and not os.path.relpath(p, DOCS).startswith("_build")]


def _fences(path):
    """(line number, info string, code) of every fenced block of a Markdown page."""
    with open(path, encoding="utf-8") as f:
        lines = f.read().split("\n")
    blocks, i = [], 0
    while i < len(lines):
        m = re.match(r"(\s*)(`{3,}|~{3,})\s*([^`\s]*)(.*)$", lines[i])
        if not m:
            i += 1
            continue
        indent, fence, info = m.group(1), m.group(2), m.group(3)
        start, i = i + 1, i + 1
        while i < len(lines) and not re.match(r"\s*" + fence + r"\s*$", lines[i]):
            i += 1
        code = "\n".join(line[len(indent):] for line in lines[start:i]) + "\n"
        blocks.append((start, info, code))
        i += 1
    return blocks


def _python_blocks():
    return [pytest.param(path, code, id=f"{os.path.relpath(path, ROOT)}:{line}")
            for path in _pages() for line, info, code in _fences(path) if info == "python"]


def _imports(block):
    """The top-level packages a block imports."""
    names = set()
    for line in block.splitlines():
        m = re.match(r"\s*import\s+(.+)", line)
        if m:
            names.update(part.split()[0].split(".")[0] for part in m.group(1).split(","))
        m = re.match(r"\s*from\s+(\S+)\s+import\b", line)
        if m:
            names.add(m.group(1).split(".")[0])
            if m.group(1) == "dask.distributed":   # a module of dask that needs distributed
                names.add("distributed")
    return names


_FIRST_PARTY = {"fastln", "examples", "bench"}
_REQUIRED = {"numpy"}


def _stdlib(name):
    """Whether the top-level module name is the standard library's."""
    if hasattr(sys, "stdlib_module_names"):    # Python 3.10+
        return name in sys.stdlib_module_names
    spec = importlib.util.find_spec(name)
    return spec is not None and (spec.origin in ("built-in", "frozen") or str(
        spec.origin).startswith(sysconfig.get_paths()["stdlib"]))


def _modules(code, top_only=False, package=None):
    """The dotted modules code imports (``from a import b`` gives a and a.b), in
    any statement, or only in the statements at its top with top_only (a
    ``with`` block there included: fastln.serve imports its extra's packages
    under ``with needs_extra(...)``); a relative import is read as one of
    package's, when package is given."""
    tree = ast.parse(code)
    nodes = list(ast.walk(tree))
    if top_only:
        nodes = [n for top in tree.body
                 for n in (top.body if isinstance(top, ast.With) else [top])]
    names = set()
    for node in nodes:
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and (node.level == 0 or package):
            base = package.rsplit(".", node.level - 1)[0] if node.level else ""
            module = ".".join(filter(None, (base, node.module)))
            names.add(module)
            names.update(f"{module}.{a.name}" for a in node.names)
    return names


def _source(name):
    """(path, package) of the first-party module name: its file and the
    package its relative imports start from; None for another module."""
    path = os.path.join(ROOT, *name.split("."))
    if name.split(".")[0] not in _FIRST_PARTY:
        return None
    if os.path.isfile(path + ".py"):
        return path + ".py", name.rpartition(".")[0]
    if os.path.isfile(os.path.join(path, "__init__.py")):
        return os.path.join(path, "__init__.py"), name
    return None


def _needs(block):
    """The optional packages a block needs (see 4. above)."""
    modules = _modules(block)
    todo, read = list(modules), set()
    while todo:   # the first-party modules imported, and those they import at their top
        name = todo.pop()
        found = _source(name)
        if found is None or found[0] in read:
            continue
        read.add(found[0])
        with open(found[0], encoding="utf-8") as f:
            more = _modules(f.read(), top_only=True, package=found[1])
        todo += more - modules
        modules |= more
    if "fastln.dask" in modules:
        modules.add("dask")
    if "dask.distributed" in modules:
        modules.add("distributed")
    return {m.split(".")[0] for m in modules
            if m.split(".")[0] not in _FIRST_PARTY | _REQUIRED and not _stdlib(m.split(".")[0])}


def _require(block, request):
    for name in sorted(_needs(block)):
        if name == "torch":
            if importlib.util.find_spec("torch") is None:
                # a skip, or a failure under FASTLN_REQUIRE_TORCH=1
                request.getfixturevalue("torch")
        elif importlib.util.find_spec(name) is None:
            if os.environ.get("CI"):
                pytest.fail(f"the block needs {name}, which CI installs")
            pytest.skip(f"the block needs {name}, which is not installed")


def test_pages_have_python_blocks():
    assert len(_python_blocks()) >= 5


def test_needs_reader():
    assert _needs("import numpy as np\nimport torch\nimport os") == {"torch"}
    assert _needs("import fastln.dask\nfrom dask.distributed import Client") == {
        "dask", "distributed"}
    assert _needs("from fastln import dask") == {"dask"}
    assert _needs("import json\nfrom fastln.serve.client import move_stream") == {"picows"}
    assert _needs("import numpy as np\nfrom fastln.rnn import LSTM") == set()


# the distribution of each package whose import name differs from it
_DISTRIBUTION = {"sklearn": "scikit-learn"}


def _extras():
    """{extra: the distributions it installs} from pyproject.toml's optional-dependencies."""
    tomllib = pytest.importorskip("tomllib")   # Python 3.11+
    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
        extras = tomllib.load(f)["project"]["optional-dependencies"]
    return {name: {_normalized(re.match(r"[A-Za-z0-9_.-]+", r).group(0)) for r in reqs}
            for name, reqs in extras.items()}


def _normalized(distribution):
    return re.sub(r"[-_.]+", "-", distribution).lower()


def _note_before(path, line):
    """The paragraph right before the block whose code starts at line (its
    fence is the line before), joined into one line."""
    with open(path, encoding="utf-8") as f:
        lines = f.read().split("\n")
    i = line - 2                      # the last line before the fence
    while i >= 0 and not lines[i].strip():
        i -= 1
    paragraph = []
    while i >= 0 and lines[i].strip():
        paragraph.insert(0, lines[i].strip())
        i -= 1
    return " ".join(paragraph)


def _optional_blocks():
    return [pytest.param(path, line, code, id=f"{os.path.relpath(path, ROOT)}:{line}")
            for path in _pages() for line, info, code in _fences(path)
            if info == "python" and _needs(code)]


def test_blocks_that_need_optional_packages_exist():
    assert len(_optional_blocks()) >= 8


@pytest.mark.parametrize("path, line, block", _optional_blocks())
def test_block_with_optional_packages_follows_a_needs_note(path, line, block):
    where = f"{os.path.relpath(path, ROOT)}:{line}"
    note = _note_before(path, line)
    needs = sorted(_needs(block))
    assert note.startswith("Needs "), (
        f"{where} needs {needs}: write a paragraph right before it such as "
        f"'Needs `{needs[0]}`: `pip install ...`.', not {note[:80]!r}")
    for name in needs:
        assert f"`{name}`" in note, f"{where}: the note does not name `{name}`: {note!r}"
    commands = re.findall(r"`pip install ([^`]+)`", note)
    assert commands, f"{where}: the note gives no `pip install ...` command: {note!r}"
    extras = _extras()
    installed = set()
    for word in " ".join(commands).replace('"', " ").replace("'", " ").split():
        m = re.fullmatch(r"(?:fastln|\.)\[([\w,-]+)\]", word)
        if m:
            for extra in m.group(1).split(","):
                assert extra in extras, f"{where}: no extra {extra!r} in pyproject.toml"
                installed |= extras[extra]
        elif not word.startswith("-"):
            installed.add(_normalized(word))
    for name in needs:
        assert _normalized(_DISTRIBUTION.get(name, name)) in installed, (
            f"{where}: the note's command does not install {name}: {note!r}")


# ---- 5. the install guide's extras ---------------------------------------------------

def test_install_guide_names_what_each_extra_installs_and_its_size():
    extras = _extras()
    with open(os.path.join(DOCS, "guide", "install.md"), encoding="utf-8") as f:
        rows = re.findall(r"^\| `(\w+)` \| ([^|]+) \| ([^|]+) \| [^|]+ \|$", f.read(), re.M)
    assert {extra for extra, _, _ in rows} == set(extras), rows
    for extra, installs, size in rows:
        assert re.fullmatch(r"\d+ MB", size.strip()), (extra, size)
        named = {_normalized(n) for n in re.split(r",\s*(?:and\s+)?", installs.strip())}
        want = set(extras[extra])
        if extra == "test":
            prefix = _normalized("the packages of every extra above but `torch` and `docs`")
            assert prefix in named, installs
            named.discard(prefix)
            named |= set().union(*(v for k, v in extras.items()
                                   if k not in ("test", "docs", "torch")))
        assert named == want, (extra, sorted(named - want), sorted(want - named))


@pytest.mark.parametrize("page", _pages(), ids=lambda p: os.path.relpath(p, ROOT))
def test_python_is_fenced_as_python(page):
    for line, info, _ in _fences(page):
        assert info.lower() not in ("py", "python3", "ipython", "ipython3"), (
            f"{os.path.relpath(page, ROOT)}:{line}: ```{info} is not run by the tests: "
            "write ```python, or ```{code-block} python for code that must not run")


@pytest.mark.parametrize("path, block", _python_blocks())
def test_python_block_runs(path, block, request, tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(ROOT)        # for the repository's modules (bench, examples)
    _require(block, request)
    if re.search(r"^if __name__ == .__main__.:", block, re.MULTILINE):
        script = tmp_path / "block.py"
        script.write_text(block, encoding="utf-8")
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(
            [ROOT] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]))
        run = subprocess.run([sys.executable, str(script)], cwd=ROOT, env=env,
                             capture_output=True, text=True, timeout=600, check=False)
        assert run.returncode == 0, (run.stdout + run.stderr)[-3000:]
        return
    monkeypatch.chdir(ROOT)
    limit = fastln.cache_info().limit
    try:
        with fastln.threads(None):      # a block's thread count ends with it
            exec(compile(block, path, "exec"), {"__name__": "__doc_block__"})  # noqa: S102
    finally:
        fastln.set_cache_limit(limit)

"""The source tree keeps the shape docs/design.md describes.

1. No two modules of the package import each other, directly or around a
   longer circle: the imports of every .py, .pyx and .pxd file under
   fastln/ (those inside functions and those for type checkers too, and cimports)
   form a graph without cycles. A package's __init__ counts as the package: ``from fastln import
   x`` is an import of fastln/__init__.py unless x is a module of its own.
2. No source file under fastln/ or src_c/ is longer than 700 lines, except a
   module that holds only documentation (its body is a docstring and string
   assignments). Cython's generated C files are not sources.
3. A private name (one with a leading underscore) is private to its folder
   and the folders inside it: no module takes one from a module of another
   folder, except from the modules that exist to share such names (SHARING
   below).
4. pyproject.toml names every folder of the package, so that an installed
   copy has them all.
"""
import ast
import os
import re

from _util import REPO_ROOT

PACKAGE = os.path.join(REPO_ROOT, "fastln")
MAX_LINES = 700

# the modules whose underscore names other folders may import: shared
# checks, dtypes and array helpers that carry a leading underscore so that
# users do not take them for API
SHARING = {"fastln._validate", "fastln._dtypes", "fastln._ndarray", "fastln._optional",
           "fastln._lib"}


def _module_files():
    """{dotted module name: path} of every .py, .pyx and .pxd under fastln/."""
    found = {}
    for folder, dirs, files in os.walk(PACKAGE):
        dirs[:] = [d for d in dirs if d not in ("__pycache__", "include")]
        for name in files:
            stem, ext = os.path.splitext(name)
            if ext not in (".py", ".pyx", ".pxd"):
                continue
            rel = os.path.relpath(os.path.join(folder, stem), REPO_ROOT).split(os.sep)
            if rel[-1] == "__init__":
                rel = rel[:-1]
            found.setdefault(".".join(rel), []).append(os.path.join(folder, name))
    return found


_FROM = re.compile(r"^\s*from\s+([\w.]+)\s+c?import\s+(\([^)]*\)|[^\n#]*)", re.M)
_IMPORT = re.compile(r"^\s*c?import\s+([\w.]+)", re.M)


def _imports(path, modules):
    """(module imported, name taken from it or None) for each import in path."""
    with open(path, encoding="utf-8") as f:
        text = f.read()
    here = os.path.relpath(path, REPO_ROOT)[:-len(os.path.splitext(path)[1])].split(os.sep)
    package = here[:-1]
    out = []
    if path.endswith(".py"):
        tree = ast.parse(text)
        aliases = {}   # a name bound to a module of the package: the module
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                out += [(a.name, None) for a in node.names]
                aliases.update({a.asname: a.name for a in node.names if a.asname})
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    base = ".".join(package[:len(package) - node.level + 1] + ([base] if base
                                                                                 else []))
                out += [(base, a.name) for a in node.names]
                aliases.update({a.asname or a.name: f"{base}.{a.name}" for a in node.names
                                if f"{base}.{a.name}" in modules})
        # a private name read through a module: module._name
        out += [(aliases[n.value.id], n.attr) for n in ast.walk(tree)
                if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name)
                and n.value.id in aliases and n.attr.startswith("_")]
    else:
        for m in _FROM.finditer(text):
            for item in re.split(r"[,()]", m.group(2)):   # "name" or "name as alias"
                name = item.split(" as ")[0].strip()
                if name.isidentifier():
                    out.append((m.group(1), name))
        out += [(m.group(1), None) for m in _IMPORT.finditer(text)]
    edges = []
    for mod, name in out:
        if name and f"{mod}.{name}" in modules:
            edges.append((f"{mod}.{name}", None))
        elif mod in modules:
            edges.append((mod, name))
    return edges


def _graph():
    modules = _module_files()
    graph = {}
    for mod, paths in modules.items():
        for path in paths:
            graph.setdefault(mod, []).extend(_imports(path, modules))
    return graph


def _cycles(graph):
    """The strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on, out = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w, _ in graph.get(v, ()):
            if w == v:
                continue
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_the_import_graph_finds_a_planted_circle():
    """The checker itself: a two-module circle and a longer one are found."""
    graph = {"a": [("b", None)], "b": [("a", "x")], "c": [("d", None)], "d": [("e", None)],
             "e": [("c", None)], "f": [("a", None)]}
    assert sorted(_cycles(graph)) == [["a", "b"], ["c", "d", "e"]]


def test_no_import_cycles_in_the_package():
    graph = _graph()
    assert len(graph) > 30, "the package's modules were not found"
    assert _cycles(graph) == []


def _documentation_only(path):
    if not path.endswith(".py"):
        return False
    with open(path, encoding="utf-8") as f:
        body = ast.parse(f.read()).body

    def is_text(node):
        if isinstance(node, ast.Expr):
            node = node.value
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            node = node.value
        else:
            return False
        return isinstance(node, ast.Constant) and isinstance(node.value, str)

    return all(is_text(n) or isinstance(n, (ast.Import, ast.ImportFrom)) and
               getattr(n, "module", None) == "__future__" for n in body)


def _sources():
    for root in (PACKAGE, os.path.join(REPO_ROOT, "src_c")):
        for folder, dirs, files in os.walk(root):
            dirs[:] = [d for d in dirs if d not in ("__pycache__", "include")]
            for name in files:
                path = os.path.join(folder, name)
                ext = os.path.splitext(name)[1]
                if ext in (".py", ".pyx", ".pxd", ".pyi", ".h") or (
                        ext == ".c" and root.endswith("src_c")):
                    yield path


def test_no_source_file_is_over_700_lines():
    long = {}
    for path in _sources():
        with open(path, encoding="utf-8") as f:
            n = sum(1 for _ in f)
        if n > MAX_LINES and not _documentation_only(path):
            long[os.path.relpath(path, REPO_ROOT)] = n
    assert long == {}


def _folder(mod):
    parts = mod.split(".")
    return ".".join(parts[:-1])


def test_private_names_cross_folders_only_through_sharing_modules():
    graph = _graph()
    reaches = []
    for mod, edges in graph.items():
        for target, name in edges:
            inside = (_folder(mod) + ".").startswith(_folder(target) + ".")
            if (name and name.startswith("_") and not name.startswith("__")
                    and target not in SHARING and not inside
                    and not target.startswith(mod + ".")):
                reaches.append(f"{mod} -> {target}.{name}")
    assert reaches == []


def test_documentation_only_recognises_a_docstring_module(tmp_path):
    probe = tmp_path / "doc.py"
    probe.write_text('"""Doc."""\nfrom __future__ import annotations\nA = """x"""\n')
    assert _documentation_only(str(probe))
    probe.write_text('"""Doc."""\nA = 1\n')
    assert not _documentation_only(str(probe))


def test_every_package_folder_installs():
    """pyproject.toml lists each folder of the package (an installed copy
    holds only the packages listed there)."""
    import tomllib

    with open(os.path.join(REPO_ROOT, "pyproject.toml"), "rb") as f:
        listed = set(tomllib.load(f)["tool"]["setuptools"]["packages"])
    folders = {os.path.relpath(folder, REPO_ROOT).replace(os.sep, ".")
               for folder, dirs, files in os.walk(PACKAGE) if "__init__.py" in files}
    assert listed == folders

"""Reads the declarations of a public C header of fastln, with their comments.

Pure Python (no Sphinx), so tests can check what it finds. The headers
follow a few rules that this reader relies on: a comment above a group of
declarations (no blank line between them) describes the group; a comment of
the form ``/* ---- Title ---- */`` or ``/* ---- Title: text ---- */`` starts a
section; the first comment of the file describes the whole header; a
``#define NAME value`` may carry a comment on its own line; struct members
carry their comments at the end of their line.
"""
import re
from dataclasses import dataclass, field

_IDENT = r"[A-Za-z_]\w*"
_SPACE = re.compile(r"\s+")
_BLANK_LINE = re.compile(r"[ \t]*\n[ \t]*\n")
_CPLUSPLUS_BRACE = re.compile(r'extern\s+"C"\s*\{|\}')


@dataclass
class Decl:
    """One declaration: kind is "function", "macro", "struct", "type" or "enumerator"."""

    kind: str
    name: str
    signature: str                                 # as Sphinx's C domain reads it
    members: list = field(default_factory=list)    # a struct's [(declaration, comment)]
    value: str = ""                                # a macro's value
    comment: str = ""                              # a macro's own comment on its line


@dataclass
class Group:
    """Declarations documented together: the comment above them applies to all."""

    comment: str
    decls: list


@dataclass
class Section:
    """A titled part of a header: its own text, then its groups."""

    title: str
    text: str
    groups: list = field(default_factory=list)


@dataclass
class Header:
    """A header: its leading comment, then its sections (the first may be untitled)."""

    text: str
    sections: list

    def decls(self):
        """Every declaration, in the order of the file."""
        return [d for s in self.sections for g in s.groups for d in g.decls]


def _comment_text(raw):
    """The text of a /* ... */ comment, without the markers, stars and common indent."""
    body = raw[2:-2]
    lines = body.split("\n")
    lines = [re.sub(r"^\s*\* ?", "", line) if i else line for i, line in enumerate(lines)]
    lines = [line.rstrip() for line in lines]
    while lines and not lines[0].strip():
        lines.pop(0)
    while lines and not lines[-1].strip():
        lines.pop()
    if not lines:
        return ""
    lines[0] = lines[0].lstrip()
    rest = [line for line in lines[1:] if line.strip()]
    indent = min((len(line) - len(line.lstrip()) for line in rest), default=0)
    return "\n".join([lines[0]] + [line[indent:] for line in lines[1:]])


def _squash(code):
    """Declaration code on one line, without comments."""
    code = re.sub(r"/\*.*?\*/", " ", code, flags=re.S)
    return re.sub(r"\s+", " ", code).strip()


def _split_top(text, sep):
    """text split at sep outside parentheses and brackets."""
    parts, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        depth += ch in "([{"
        depth -= ch in ")]}"
        if ch == sep and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    parts.append(text[start:])
    return parts


def _members(body):
    """A struct body's members as [(declaration, comment)], one per declarator."""
    members = []
    # a member ends at ";", and its comment starts on the same line
    for m in re.finditer(r"([^;]*?);([ \t]*/\*.*?\*/)?", body, re.S):
        code = _squash(m.group(1))
        if not code:
            continue
        comment = _squash(_comment_text(m.group(2).strip())) if m.group(2) else ""
        first, *more = _split_top(code, ",")
        base = re.match(r"((?:(?:const|struct|unsigned|signed|long|short)\s+)*" + _IDENT
                        + r")\s*(.*)", first.strip())
        members.append((f"{base.group(1)} {base.group(2)}".strip(), comment))
        members += [(f"{base.group(1)} {d.strip()}", comment) for d in more]
    return members


def _statement(code):
    """The Decls of one top-level statement (an enum declares several)."""
    text = _squash(code)
    m = re.match(r"typedef struct\s*(?:" + _IDENT + r")?\s*\{(.*)\}\s*(" + _IDENT + r")\s*;$",
                 code.strip(), re.S)
    if m:
        return [Decl("struct", m.group(2), m.group(2), _members(m.group(1)))]
    m = re.match(r"enum\s*(?:" + _IDENT + r")?\s*\{(.*)\}\s*;$", text)
    if m:
        return [Decl("enumerator", e.split("=")[0].strip(), e.strip())
                for e in m.group(1).split(",") if e.strip()]
    if text.startswith("typedef "):
        sig = text[len("typedef "):-1]
        m = re.search(r"\(\s*\*\s*(" + _IDENT + r")\s*\)", sig) or re.search(
            "(" + _IDENT + r")\s*$", sig)             # (*name)(...), or a plain alias
        return [Decl("type", m.group(1), sig)]
    m = re.match(r"(.*?)\b(" + _IDENT + r")\s*\((.*)\)\s*;$", text)
    if m:
        return [Decl("function", m.group(2), text[:-1])]
    raise ValueError(f"a declaration this reader does not know: {text!r}")


def _scan_statement(source, pos):
    """The end of the statement that starts at pos: its ";" outside braces and comments."""
    depth = 0
    while pos < len(source):
        if source.startswith("/*", pos):
            pos = source.index("*/", pos) + 2
            continue
        ch = source[pos]
        depth += ch == "{"
        depth -= ch == "}"
        pos += 1
        if ch == ";" and depth == 0:
            return pos
    raise ValueError("a declaration without its ';'")


def parse(source):
    """The Header of the C source text of a header."""
    header = Header("", [Section("", "")])
    pending = None          # the comment waiting for its declarations
    group = None            # the group the next declaration joins (no blank line between)

    def add(decl):
        nonlocal pending, group
        if group is None:
            group = Group(pending or "", [])
            header.sections[-1].groups.append(group)
            pending = None
        group.decls.append(decl)

    pos = 0
    while pos < len(source):
        space = _SPACE.match(source, pos)
        if _BLANK_LINE.match(source, pos):
            group = None                      # a blank line ends a group
        if space:
            pos = space.end()
            continue
        if source.startswith("/*", pos):
            end = source.index("*/", pos) + 2
            comment = _comment_text(source[pos:end])
            title = re.fullmatch(r"-{3,}\s*(.*?)\s*-{3,}", comment, re.S)
            if not source[:pos].strip():
                header.text = comment         # the file's own comment
            elif title:
                name, _, rest = title.group(1).partition(":")
                header.sections.append(Section(_squash(name), rest.strip()))
                pending, group = None, None
            else:
                pending, group = comment, None
            pos = end
            continue
        if source[pos] == "#":
            end = source.find("\n", pos)
            end = len(source) if end < 0 else end
            d = re.match(r"#\s*define\s+(" + _IDENT + r")\s+(.*?)\s*(/\*.*\*/)?\s*$",
                         source[pos:end])
            if d:                             # a macro with a value (not an include guard)
                add(Decl("macro", d.group(1), d.group(1), value=d.group(2),
                         comment=_comment_text(d.group(3)) if d.group(3) else ""))
            pos = end
            continue
        m = _CPLUSPLUS_BRACE.match(source, pos)
        if m:                                 # the C++ guard's braces
            pos = m.end()
            continue
        end = _scan_statement(source, pos)
        for decl in _statement(source[pos:end]):
            add(decl)
        pos = end
    header.sections = [s for s in header.sections if s.groups]
    return header

"""The ``c-header`` directive: a reference page generated from a C header.

``.. c-header:: ../../src_c/api/fastln.h`` reads the header at build time
(cheader.py) and writes its leading comment, then a section per
``/* ---- Title ---- */`` part, each declaration group as Sphinx C-domain
objects (``c:function``, ``c:macro``, ``c:struct`` with its ``c:member``\\ s,
``c:type``, ``c:enumerator``) followed by the comment above it. The comments
are shown as written (plain text, and indented lines as preformatted text),
never parsed as markup. The page is rebuilt when the header changes.
"""
import re

import cheader
from docutils import nodes
from sphinx import addnodes
from sphinx.util.docutils import SphinxDirective

_DIRECTIVE = {"function": "c:function", "macro": "c:macro", "type": "c:type",
              "enumerator": "c:enumerator"}


def _paragraph(text):
    """A paragraph of plain text whose C names (fastln_*, FASTLN_*) link to their entries."""
    para = nodes.paragraph(text)
    for i, part in enumerate(re.split(r"\b((?:fastln|FASTLN)_\w+)", text)):
        if i % 2 == 0:
            para += nodes.Text(part)
        else:
            para += addnodes.pending_xref("", nodes.literal(part, part), refdomain="c",
                                          reftype="identifier", reftarget=part)
    return para


def _text_nodes(text):
    """Docutils nodes for a comment: paragraphs, and indented runs as literal blocks."""
    result, prose, block = [], [], []

    def flush():
        if prose:
            result.append(_paragraph(" ".join(line.strip() for line in prose)))
            prose.clear()
        if block:
            lines = list(block)
            while lines and not lines[-1].strip():
                lines.pop()
            indent = min(len(line) - len(line.lstrip()) for line in lines if line.strip())
            code = "\n".join(line[indent:] for line in lines)
            result.append(nodes.literal_block(code, code, language="text"))
            block.clear()

    for line in text.split("\n"):
        if not line.strip():
            if block:
                block.append(line)
            else:
                flush()
        elif line[0].isspace():
            if prose and not block:
                flush()                       # the prose above an indented run ends there
            block.append(line)
        else:
            if block:
                flush()
            prose.append(line)
    flush()
    return result


def _indent(lines):
    return ["   " + line if line else "" for line in lines]


class CHeader(SphinxDirective):
    """Documents every declaration of the C header named by the argument."""

    required_arguments = 1

    def run(self):
        rel, path = self.env.relfn2path(self.arguments[0], self.env.docname)
        self.env.note_dependency(rel)
        with open(path, encoding="utf-8") as f:
            header = cheader.parse(f.read())
        result = _text_nodes(header.text)
        for section in header.sections:
            parent = result
            if section.title:
                node = nodes.section(ids=[nodes.make_id(section.title)],
                                     names=[nodes.fully_normalize_name(section.title)])
                node += nodes.title(section.title, section.title)
                node += _text_nodes(section.text)
                self.state.document.note_implicit_target(node, node)
                result.append(node)
                parent = node
            for group in section.groups:
                for item in self._group(group):
                    parent.append(item)
        return result

    def _group(self, group):
        """The nodes of one group: its runs of declarations of one kind, each as C-domain
        objects; the group's comment goes with the first."""
        runs = []
        for decl in group.decls:
            if runs and runs[-1][-1].kind == decl.kind != "struct":
                runs[-1].append(decl)
            else:
                runs.append([decl])
        found = []
        for i, run in enumerate(runs):
            found += self._run(run, group.comment if i == 0 else "")
        return found

    def _run(self, decls, comment):
        """The C-domain objects of declarations of one kind, and the comment."""
        kind = decls[0].kind
        if kind == "struct":
            (decl,) = decls
            lines = [f".. c:struct:: {decl.name}", ""]
            lines += _indent([f".. c:member:: {member}" for member, _ in decl.members])
            notes = [comment] + [note for _, note in decl.members]
        else:
            lines = [f".. {_DIRECTIVE[kind]}:: {decls[0].signature}"]
            lines += _indent([d.signature for d in decls[1:]])
            notes = [comment]
        found = self.parse_text_to_nodes("\n".join(lines) + "\n")
        descs = [n for item in found for n in item.findall(addnodes.desc)]
        assert len(descs) == len(notes), (lines, len(descs))
        for desc, note in zip(descs, notes):
            content = next(desc.findall(addnodes.desc_content))
            content.insert(0, _text_nodes(note))     # before a struct's members
            if kind == "macro" and desc is descs[0]:
                content += self._macro_values(decls)
        return found

    @staticmethod
    def _macro_values(decls):
        """A list of the macros' values and their own comments."""
        items = nodes.bullet_list()
        for d in decls:
            para = nodes.paragraph()
            define = f"#define {d.name} {d.value}"
            para += nodes.literal(define, define)
            if d.comment:
                para += _paragraph(": " + re.sub(r"\s+", " ", d.comment)).children
            items += nodes.list_item("", para)
        return [items]


def setup(app):
    app.add_directive("c-header", CHeader)
    return {"version": "1", "parallel_read_safe": True, "parallel_write_safe": True,
            "env_version": 1}


"""Renders flatmem's docstrings as they are written: plain text for help().

The docstrings of flatmem, flatmem.torch and flatmem_jax are prose paragraphs
flush left, with code examples and aligned argument tables indented (or laid
out in columns). Read as reStructuredText, those tables and examples are
malformed definition lists and block quotes. This hook turns each blank-line
separated block of a docstring into one of two things:

- a block with an indented line or columns (a run of 3+ spaces inside a line)
  becomes a literal block, shown exactly as written;
- any other block stays a paragraph, with ``*``, ``|`` and a word's trailing
  ``_`` escaped (products, absolute values and C names such as
  ``flatmem_cyclic_schedule_*``, not emphasis, substitutions or links);
  ``double backquotes`` still mark code.
"""
import re

_COLUMNS = re.compile(r"\S {3,}\S")
_MARKUP = re.compile(r"(``.*?``)|([*|]|(?<=\w)_(?!\w))")


def _escape(line):
    return _MARKUP.sub(lambda m: m.group(1) or "\\" + m.group(2), line)


def _blocks(lines):
    block = []
    for line in lines:
        if line.strip():
            block.append(line)
        elif block:
            yield block
            block = []
    if block:
        yield block


def _render(lines):
    out = []
    for block in _blocks(lines):
        if any(line.startswith(" ") or _COLUMNS.search(line) for line in block):
            out += ["::", ""] + ["    " + line for line in block]
        else:
            out += [_escape(line) for line in block]
        out.append("")
    return out


def _process(app, what, name, obj, options, lines):
    if name.split(".")[0] in ("flatmem", "flatmem_jax"):
        lines[:] = _render(lines)


def setup(app):
    app.connect("autodoc-process-docstring", _process)
    return {"parallel_read_safe": True, "parallel_write_safe": True}

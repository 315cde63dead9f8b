"""header_model.py -- include/flatmem/*.h read as a C compiler reads them (standard library only).

The one C header reader of the bindings' generators and checkers (scripts/gen_julia.py, scripts/gen_header_tables.py,
bindings/julia/check_ccalls.py): conditionals evaluated as without FLATMEM_EXPERIMENTAL and
__cplusplus, comments dropped, includes named with a folder (<dlpack/dlpack.h>) read too.
load_header() gives a CHeader: functions, enums, integer constants, structs (fields with their
C types), opaque handle typedefs and function-pointer typedefs.
"""

import ast
import os
import re
from dataclasses import dataclass, field

@dataclass
class CType:
    base: str  # "int", "size_t", "DLTensor", "flatmem_contrastive_t", "char", ...
    depth: int = 0  # number of '*'
    const: bool = False  # const pointee (informational)
    funcptr: bool = False
    array: int = 0  # a struct field `T name[N]`: N (0 = not an array)
    array_expr: str = ""  # N as the header spells it (FLATMEM_COMM_UNIQUE_ID_BYTES)

    def __str__(self):
        if self.funcptr:
            return "function pointer"
        text = ("const " if self.const else "") + self.base + (" " + "*" * self.depth if self.depth else "")
        return text + (f"[{self.array_expr}]" if self.array else "")


@dataclass
class CFunction:
    name: str
    ret: CType
    params: list  # [(name or "", CType)]
    where: str


@dataclass
class CHeader:
    functions: dict = field(default_factory=dict)  # name -> CFunction
    enums: dict = field(default_factory=dict)  # enum type name -> {constant: value}
    constants: dict = field(default_factory=dict)  # enum constant or int macro -> value
    constant_origin: dict = field(default_factory=dict)  # constant -> header file
    structs: dict = field(default_factory=dict)  # typedef name -> [(field, CType)]
    opaque: dict = field(default_factory=dict)  # typedef name -> struct tag
    funcptrs: dict = field(default_factory=dict)  # function-pointer typedef name -> its declaration
    macros: dict = field(default_factory=dict)  # object-like macro -> its body (one line)
    files: list = field(default_factory=list)


C_QUALIFIERS = {"const", "volatile", "restrict", "struct", "enum", "union", "extern", "static", "inline"}
C_BUILTIN_WORDS = {"unsigned", "signed", "short", "long", "int", "char", "float", "double", "void", "_Bool"}


def strip_c_comments(text):
    """Comments become spaces (newlines kept, so line numbers hold); string and char literals are kept."""
    out, i, n = [], 0, len(text)
    while i < n:
        ch = text[i]
        if text.startswith("/*", i):
            j = text.find("*/", i + 2)
            j = n if j < 0 else j + 2
            out.append("".join(c if c == "\n" else " " for c in text[i:j]))
            i = j
        elif text.startswith("//", i):
            j = text.find("\n", i)
            j = n if j < 0 else j
            out.append(" " * (j - i))
            i = j
        elif ch in "\"'":
            j = i + 1
            while j < n and text[j] != ch:
                j += 2 if text[j] == "\\" else 1
            out.append(text[i : j + 1])
            i = j + 1
        else:
            out.append(ch)
            i += 1
    return "".join(out)


def c_int_value(expr, names):
    """The value of a C integer constant expression, or None."""
    expr = re.sub(r"\b(0[xX][0-9a-fA-F]+|\d+)[uUlL]*\b", r"\1", expr.strip())
    expr = expr.replace("/", "//").replace("!", " not ").replace("&&", " and ").replace("||", " or ")
    expr = expr.replace(" not =", "!=")
    return safe_int_eval(expr, names)


def safe_int_eval(expr, names, calls=()):
    """Evaluate +, -, *, //, <<, >>, |, &, ~, comparisons, and/or/not over ints and known names.
    `calls` names one-argument functions that return their argument (Julia's Cint(0))."""
    try:
        tree = ast.parse(expr.strip(), mode="eval")
    except SyntaxError:
        return None

    def ev(node):
        if isinstance(node, ast.Expression):
            return ev(node.body)
        if isinstance(node, ast.Constant) and isinstance(node.value, int) and not isinstance(node.value, bool):
            return node.value
        if isinstance(node, ast.Name):
            if node.id in names and names[node.id] is not None:
                return names[node.id]
            raise ValueError(node.id)
        if isinstance(node, ast.UnaryOp):
            v = ev(node.operand)
            return {ast.USub: lambda: -v, ast.UAdd: lambda: v, ast.Invert: lambda: ~v, ast.Not: lambda: int(not v)}[
                type(node.op)
            ]()
        if isinstance(node, ast.BinOp):
            a, b = ev(node.left), ev(node.right)
            ops = {
                ast.Add: lambda: a + b,
                ast.Sub: lambda: a - b,
                ast.Mult: lambda: a * b,
                ast.FloorDiv: lambda: a // b,
                ast.LShift: lambda: a << b,
                ast.RShift: lambda: a >> b,
                ast.BitOr: lambda: a | b,
                ast.BitAnd: lambda: a & b,
            }
            if type(node.op) not in ops:
                raise ValueError("operator")
            return ops[type(node.op)]()
        if isinstance(node, ast.BoolOp):
            values = [ev(v) for v in node.values]
            return int(all(values)) if isinstance(node.op, ast.And) else int(any(values))
        if isinstance(node, ast.Compare) and len(node.ops) == 1:
            a, b = ev(node.left), ev(node.comparators[0])
            ops = {ast.Eq: a == b, ast.NotEq: a != b, ast.Lt: a < b, ast.LtE: a <= b, ast.Gt: a > b, ast.GtE: a >= b}
            return int(ops[type(node.ops[0])])
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id in calls
            and len(node.args) == 1
            and not node.keywords
        ):
            return ev(node.args[0])
        raise ValueError(ast.dump(node))

    try:
        return ev(tree)
    except (ValueError, KeyError, ZeroDivisionError, TypeError):
        return None


def preprocess(text, path, defined, macros, includes):
    """Runs the conditionals (#if/#ifdef/#ifndef/#elif/#else/#endif), records #define
    and #include, and returns the active non-directive code with line numbers kept."""
    lines = strip_c_comments(text).split("\n")
    out = [""] * len(lines)
    stack = []  # [(this branch active, some branch taken, parent active)]
    active = True
    i = 0
    while i < len(lines):
        start = i
        line = lines[i]
        while line.endswith("\\") and i + 1 < len(lines):
            i += 1
            line = line[:-1] + " " + lines[i]
        i += 1
        m = re.match(r"\s*#\s*(\w+)\s*(.*)$", line)
        if not m:
            if active:
                out[start] = line
            continue
        directive, rest = m.group(1), m.group(2).strip()
        if directive in ("ifdef", "ifndef"):
            name = rest.split()[0] if rest else ""
            cond = (name in defined) == (directive == "ifdef")
            stack.append((active and cond, cond, active))
            active = active and cond
        elif directive == "if":
            cond = bool(eval_pp_condition(rest, defined, macros))
            stack.append((active and cond, cond, active))
            active = active and cond
        elif directive == "elif":
            _, taken, parent = stack.pop()
            cond = (not taken) and bool(eval_pp_condition(rest, defined, macros))
            stack.append((parent and cond, taken or cond, parent))
            active = parent and cond
        elif directive == "else":
            _, taken, parent = stack.pop()
            stack.append((parent and not taken, True, parent))
            active = parent and not taken
        elif directive == "endif":
            _, _, active = stack.pop()
        elif not active:
            continue
        elif directive == "define":
            dm = re.match(r"(\w+)(\([^)]*\))?\s*(.*)$", rest)
            if dm:
                defined.add(dm.group(1))
                if not dm.group(2):
                    macros[dm.group(1)] = dm.group(3).strip()
        elif directive == "undef":
            defined.discard(rest.split()[0])
            macros.pop(rest.split()[0], None)
        elif directive == "include":
            im = re.match(r"[<\"]([^>\"]+)[>\"]", rest)
            if im:
                includes.append((im.group(1), f"{path}:{start + 1}"))
    if stack:
        raise SystemExit(f"header_model: {path}: unbalanced #if/#endif")
    return "\n".join(out)


def eval_pp_condition(expr, defined, macros):
    expr = re.sub(r"\bdefined\s*\(\s*(\w+)\s*\)", lambda m: "1" if m.group(1) in defined else "0", expr)
    expr = re.sub(r"\bdefined\s+(\w+)", lambda m: "1" if m.group(1) in defined else "0", expr)
    names = {}
    for ident in re.findall(r"\b[A-Za-z_]\w*\b", expr):
        value = c_int_value(macros.get(ident, ""), {}) if ident in macros else None
        names[ident] = value if value is not None else 0  # C: unknown identifiers are 0
    value = c_int_value(expr, names)
    return 0 if value is None else value


def split_top(text, sep=","):
    """Split on `sep` outside (), [], {}; returns [(piece, offset)]."""
    parts, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        if ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth -= 1
        elif ch == sep and depth == 0:
            parts.append((text[start:i], start))
            start = i + 1
    parts.append((text[start:], start))
    return parts


def c_statements(code):
    """Top-level declarations: split at ';' outside braces; a brace block that closes
    a non-typedef statement (a function body) ends it too. Yields (text, offset)."""
    depth, start = 0, 0
    for i, ch in enumerate(code):
        if ch == "{":
            depth += 1
        elif ch == "}":
            depth -= 1
            if depth == 0 and not re.match(r"\s*(typedef|struct|enum|union)\b", code[start:i]):
                yield code[start : i + 1], start
                start = i + 1
        elif ch == ";" and depth == 0:
            yield code[start:i], start
            start = i + 1


def parse_c_declarator(decl, where, constants=None):
    """`const DLTensor *q` -> ("q", CType("DLTensor", 1, const)). Unnamed parameters allowed.
    With `constants` (struct fields), a trailing `[N]` is an array of N elements (N an
    integer constant expression over the header's macros); otherwise (parameters) `[]`
    is a pointer, as C adjusts it."""
    decl = decl.strip()
    if constants is not None:
        am = re.match(r"^(.*?\w)\s*\[([^\[\]]+)\]\s*$", decl)
        if am:
            n = c_int_value(am.group(2), constants)
            if n is None or n <= 0:
                raise SystemExit(f"header_model: {where}: cannot evaluate the array extent in {decl!r}")
            name, ctype = parse_c_declarator(am.group(1), where)
            ctype.array, ctype.array_expr = n, am.group(2).strip()
            return name, ctype
    if "(" in decl:  # a function pointer: `void (*deleter)(struct X *)`
        m = re.search(r"\(\s*\*\s*(\w+)\s*\)", decl)
        return (m.group(1) if m else ""), CType("", funcptr=True)
    tokens = re.findall(r"[A-Za-z_]\w*|\*|\[|\]|:", decl)
    if ":" in tokens:
        raise SystemExit(f"header_model: {where}: bit fields are not supported: {decl!r}")
    words = [t for t in tokens if re.match(r"\w", t)]
    name = ""
    type_words = [w for w in words if w not in C_QUALIFIERS]
    if (
        tokens
        and re.match(r"\w", tokens[-1])
        and tokens[-1] not in C_BUILTIN_WORDS | C_QUALIFIERS
        and len(type_words) >= 2
    ):
        name = tokens[-1]
        type_words = type_words[:-1]
    elif tokens and tokens[-1] == "]":
        idx = len(tokens) - 1 - tokens[::-1].index("[")
        if idx > 0 and re.match(r"\w", tokens[idx - 1]) and len(type_words) >= 2:
            name = tokens[idx - 1]
            type_words = [w for w in type_words if w != name]
    stars = tokens.count("*") + tokens.count("[")
    first_star = tokens.index("*") if "*" in tokens else len(tokens)
    const = "const" in tokens[:first_star] and stars > 0
    if not type_words:
        raise SystemExit(f"header_model: {where}: cannot read the C declaration {decl!r}")
    return name, CType(" ".join(type_words), stars, const)


def parse_header(path, include_dirs, defined=None, header=None, text=None, seen=None, macros=None):
    """Parse `path` (and, recursively, its includes named with a folder: dlpack/dlpack.h,
    flatmem/x.h; plain system headers such as stdint.h are not read). Macros are shared
    with the includes, as a compiler sees them (FLATMEM_API of flatmem.h in reversible.h)."""
    header = header if header is not None else CHeader()
    defined = defined if defined is not None else set()
    seen = seen if seen is not None else set()
    macros = macros if macros is not None else {}
    includes = []
    if text is None:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    seen.add(os.path.realpath(path))
    header.files.append(path)
    code = preprocess(text, path, defined, macros, includes)
    for inc, where in includes:
        if "/" not in inc:
            continue
        for d in include_dirs:
            candidate = os.path.join(d, inc)
            if os.path.isfile(candidate):
                if os.path.realpath(candidate) not in seen:
                    parse_header(candidate, include_dirs, defined, header, None, seen, macros)
                break
        else:
            raise SystemExit(f"header_model: {where}: cannot find <{inc}> in {include_dirs}")
    # Object-like macros that expand to nothing (FLATMEM_API, DLPACK_DLL, ...) are erased.
    for name, body in macros.items():
        if body == "":
            code = re.sub(rf"\b{re.escape(name)}\b", " ", code)
    # Integer macros.
    for name, body in macros.items():
        if name in header.constants:
            continue  # an include's macro, recorded with its own file
        value = c_int_value(body, header.constants)
        if value is not None:
            header.constants[name] = value
            header.constant_origin[name] = path

    def line_of(offset):
        return f"{os.path.basename(path)}:{code.count(chr(10), 0, offset) + 1}"

    for stmt, offset in c_statements(code):
        lead = len(stmt) - len(stmt.lstrip())
        where = line_of(offset + lead)
        s = " ".join(stmt.split())
        if not s or s.startswith("extern \"C\""):
            continue
        m = re.match(r"(typedef\s+)?(struct|enum|union)\s*(\w+)?\s*\{(.*)\}\s*(\w+)?\s*$", s)
        if m:
            kind, tag, body, alias = m.group(2), m.group(3), m.group(4), m.group(5)
            name = alias or tag
            if kind == "enum":
                values, nxt = {}, 0
                for item, _ in split_top(body):
                    item = item.strip()
                    if not item:
                        continue
                    em = re.match(r"(\w+)\s*(?:=\s*(.+))?$", item)
                    if not em:
                        raise SystemExit(f"header_model: {where}: cannot read the enumerator {item!r}")
                    value = nxt if em.group(2) is None else c_int_value(em.group(2), {**header.constants, **values})
                    if value is None:
                        raise SystemExit(f"header_model: {where}: cannot evaluate {item!r}")
                    values[em.group(1)] = value
                    header.constants[em.group(1)] = value
                    header.constant_origin[em.group(1)] = path
                    nxt = value + 1
                header.enums[name] = values
            elif kind == "struct":
                fields = []
                for decl, _ in split_top(body, ";"):
                    if not decl.strip():
                        continue
                    pieces = split_top(decl) if "(" not in decl else [(decl, 0)]
                    fname, ftype = parse_c_declarator(pieces[0][0], where, header.constants)
                    fields.append((fname, ftype))
                    base_words = re.sub(r"[*\s]*\w+\s*$", "", pieces[0][0]).strip()
                    for extra, _ in pieces[1:]:  # `int a, *b;`
                        fields.append(parse_c_declarator(base_words + " " + extra, where, header.constants))
                header.structs[name] = fields
            continue
        m = re.match(r"typedef\s+(struct|union)\s+(\w+)\s+(\w+)$", s)
        if m:
            header.opaque[m.group(3)] = m.group(2)
            continue
        m = re.match(r"typedef\s+[^(]+\(\s*\*\s*(\w+)\s*\)\s*\(.*\)$", s)
        if m:  # typedef RET (*NAME)(PARAMS): a C function pointer (the reversible callbacks)
            header.funcptrs[m.group(1)] = s
            continue
        if s.startswith("typedef"):
            continue  # scalar typedefs: none in the ABI today
        m = re.match(r"(.+?)\b([A-Za-z_]\w*)\s*\((.*)\)$", s)
        if m and "=" not in s:
            ret_text, name, params_text = m.groups()
            _, ret = parse_c_declarator(ret_text + " __ret", where)
            params = []
            if params_text.strip() not in ("", "void"):
                for p, _ in split_top(params_text):
                    params.append(parse_c_declarator(p, where))
            header.functions[name] = CFunction(name, ret, params, where)
    return header


def load_header(path, include_dirs, text=None, extra=None):
    """`path` (the umbrella flatmem.h, `text` standing for its contents) with what it
    includes, then every other *.h beside it (include/flatmem/*.h), so that a public
    header flatmem.h does not include still has its functions checked for wrappers.
    `extra` ({file name: text}, the self-test's) are read as more such headers."""
    header, seen, defined, macros = CHeader(), set(), set(), {}
    parse_header(path, include_dirs, defined, header, text, seen, macros)
    folder = os.path.dirname(os.path.abspath(path))
    for name in sorted(os.listdir(folder)):
        full = os.path.join(folder, name)
        if name.endswith(".h") and os.path.realpath(full) not in seen:
            parse_header(full, include_dirs, defined, header, None, seen, macros)
    for name, extra_text in (extra or {}).items():
        parse_header(os.path.join(folder, name), include_dirs, defined, header, extra_text, seen, macros)
    header.macros = macros
    return header



def generated_file_main(tool, doc, render, default_out=None):
    """The command line of a generator (scripts/gen_*.py): `[--check] OUT` writes render()'s text
    to OUT, or with --check fails (exit 1, with a diff) when OUT differs from it."""
    import argparse
    import difflib
    import sys
    from pathlib import Path

    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    parser.add_argument("--check", action="store_true")
    parser.add_argument("out", nargs="?" if default_out else None, default=default_out)
    args = parser.parse_args()
    text, out = render(), Path(args.out)
    if not args.check:
        out.write_text(text)
        print(f"{tool}: wrote {out}")
        return 0
    have = out.read_text() if out.exists() else ""
    if have == text:
        print(f"{tool}: OK: {out} matches include/flatmem/*.h")
        return 0
    sys.stdout.writelines(difflib.unified_diff(have.splitlines(True), text.splitlines(True), str(out),
                                               "from the headers"))
    print(f"{tool}: FAIL: {out} differs from the headers; regenerate: python3 scripts/{tool.replace('-', '_')}.py "
          f"{args.out}")
    return 1

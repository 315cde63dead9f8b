#!/usr/bin/python3
"""check_ccalls.py -- check the Julia binding's ccalls against the C header.

No Julia runtime exists on the project's machines, so Flatmem.jl cannot be
run in CI. This checker (standard library only) reads the C header and the
Julia sources and fails unless:

  1. every `ccall((:name, libflatmem), Ret, (Args...,), values...)` names a
     function of the header, with as many argument types as C parameters, as
     many values as argument types, and each Julia type compatible with the C
     type under SCALARS of scripts/gen_julia.py (pointees of handles and
     structs included);
  2. every public function of include/flatmem/*.h (flatmem.h, what it
     includes, and any other header beside it) is ccall'd somewhere, or on the
     allow-list: a Julia comment `# flatmem-check: not wrapped: NAME: reason`
     (an entry without a reason, for a function that is wrapped or that the
     headers lack, is an error too);
  3. generated.jl (the constants, handle types and struct mirrors that
     scripts/gen_julia.py writes from the headers) is what the headers give
     now; each mirror's field names, offsets, size and alignment, computed
     from its Julia field types by the C rules (Julia's isbits layout), equal
     the C struct's as the C compiler measures them (offsetof/sizeof of a
     program that includes the header: the proof, without Julia, that the
     generator's type table lays out as C); every positional call
     `Mirror(args...)` passes one value per field (a field appended to a
     mirror but not to its constructions would fail only when Julia runs);
  4. no `const` named like a header constant (FLATMEM_*, kDL*) is defined
     outside generated.jl;
  5. `__init__` exists and compares with FLATMEM_VERSION;
  6. every ccall passing a raw `Ptr` (other than a handle, a null literal or
     a `Ptr`-typed parameter of the enclosing function: an address the caller
     owns, such as a CUDA stream) sits inside `GC.@preserve v1 v2 ... begin
     ... end` whose variables cover the names the value is computed from;
  7. every ccall of a function that may wait (BLOCKING_FUNCTIONS: collectives,
     request waits, cyclic next, the contrastive passes) is `@gc_safe ccall(...)`,
     and `macro gc_safe` runs gc_safe_enter(), the call, gc_safe_leave(...);
  8. the only ccalls without a library are the Julia runtime's
     JULIA_RUNTIME_CALLS (jl_gc_safe_enter/leave), with their exact types;
  9. every size_t parameter right after a pointer to a mirrored struct (ABI 1:
     an init function's struct_size, an output's size, an array's element
     size) is passed `Csize_t(sizeof(Mirror))` of that struct's Julia mirror,
     so that the library writes exactly the mirror's bytes; a ccall that
     passes another size on purpose (a test of the size rules) says so in a
     comment on its lines or the line above:
     `# flatmem-check: size: reason`.

The header is read by scripts/header_model.py, as a C compiler without
FLATMEM_EXPERIMENTAL and without __cplusplus would read it; the C -> Julia type
table and the mirrors' names are scripts/gen_julia.py's.

`--self-test` applies deliberate mistakes (a wrong argument count, a wrong
type, an unknown name, and more) to the real sources and asserts that each
one is reported, so that the checker cannot silently pass.

Usage: check_ccalls.py [--header H] [--include-dir D ...] [--self-test] [-v] [JULIA_DIR_OR_FILE]
Exit status: 0 when everything matches (or every self-test mistake is found).
"""

import argparse
import hashlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections import Counter
from dataclasses import dataclass, field

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "scripts"))
from gen_julia import ENUM_SPELLINGS, SCALARS, julia_name, mirrored_structs, render  # noqa: E402
from header_model import CType, load_header, safe_int_eval, split_top  # noqa: E402

# ============================================================================
# The tables (the C type -> Julia type tables and names are scripts/gen_julia.py's)
# ============================================================================

JULIA_LIBRARY = "libflatmem"  # the const every ccall must name as its library

# `const char *` (strings in and out).
C_STRING_SPELLINGS = {"Cstring", "Ptr{UInt8}", "Ptr{Cchar}"}

# Julia consts with these prefixes are the header's: generated.jl alone defines them.
CONSTANT_PREFIXES = ("FLATMEM_", "kDL")
GENERATED = "generated.jl"  # scripts/gen_julia.py's output, among the Julia sources

# Functions of the Julia runtime itself that the binding may ccall by bare symbol
# (`ccall(:name, Ret, (Args...,), ...)`), with their exact signatures: a blocking flatmem
# call is bracketed by them so that a thread waiting in C does not hold up the garbage
# collection of the others (julia/src/gc.c: int8_t jl_gc_safe_enter(void),
# void jl_gc_safe_leave(int8_t)). Any other bare-symbol ccall is refused.
JULIA_RUNTIME_CALLS = {
    "jl_gc_safe_enter": ("Int8", ()),
    "jl_gc_safe_leave": ("Cvoid", ("Int8",)),
}

# flatmem functions that may wait (for peers, a deadline, a long computation): their ccall
# must be the argument of the binding's `@gc_safe` macro (`@gc_safe ccall(...)`), whose
# definition must call gc_safe_enter() and gc_safe_leave(...), so that a Julia thread
# waiting in C never holds up a garbage collection (which, with an in-process group whose
# ranks are Julia threads, could wait for the very peer this thread waits for).
BLOCKING_FUNCTIONS = {
    "flatmem_comm_create", "flatmem_comm_create_from_env", "flatmem_comm_destroy", "flatmem_comm_abort",
    "flatmem_comm_wait", "flatmem_comm_ring_shift", "flatmem_comm_all_reduce", "flatmem_comm_barrier",
    "flatmem_comm_init_device", "flatmem_comm_group_end", "flatmem_comm_synchronize",
    "flatmem_cyclic_create", "flatmem_cyclic_next", "flatmem_cyclic_destroy",
    "flatmem_cyclic_parameters",  # the ZeRO relay: waits for the full stage
    "flatmem_cyclic_parameters_stream",  # its device twin waits on the host too
    # stage-parallel: create is collective, next waits for the last sends, send for a staging
    # buffer, receive for the neighbour, destroy may poison the communicator
    "flatmem_cyclic_stages_create", "flatmem_cyclic_stages_next", "flatmem_cyclic_stages_send",
    "flatmem_cyclic_stages_receive", "flatmem_cyclic_stages_destroy",
    # their device twins: send may wait for a staging buffer, receive (on the host) for the arrival
    "flatmem_cyclic_stages_send_stream", "flatmem_cyclic_stages_receive_stream",
    "flatmem_contrastive_forward", "flatmem_contrastive_backward",
    # collective on a ring handle (options.comm), like the softmax forward / backward
    "flatmem_contrastive_sigmoid_forward", "flatmem_contrastive_sigmoid_value_and_grad",
    "flatmem_contrastive_sigmoid_backward",
}  # fmt: skip

NOT_WRAPPED_RE = re.compile(r"#\s*flatmem-check:\s*not wrapped:\s*(.*)$")
SIZE_NOTE_RE = re.compile(r"#\s*flatmem-check:\s*size:\s*(.*)$")
NULL_LITERALS = re.compile(r"^(C_NULL|Ptr\{[\w{}]+\}\(\s*(C_NULL|0)\s*\)|Ptr\{[\w{}]+\}\(\))$")

# ============================================================================
# Errors
# ============================================================================


@dataclass
class Issue:
    kind: str  # e.g. "arg-type"; the self-test matches on it
    where: str  # "file:line" or a name
    message: str

    def __str__(self):
        return f"ERROR [{self.kind}] {self.where}: {self.message}"


# ============================================================================
# C type -> accepted Julia spellings
# ============================================================================


def julia_spellings(header, ctype, context):
    """Accepted Julia spellings of a C type. context: "arg" (the outermost pointer may be
    Ptr or Ref), "ret" (Ptr only), "field" (Ptr only). Returns (set, problem)."""
    if ctype.funcptr:
        return {"Ptr{Cvoid}"}, None
    if ctype.array:  # a C array field is stored inline: NTuple{N, T}, N as a number or the header's macro
        inner, problem = julia_spellings(header, CType(ctype.base, ctype.depth, ctype.const), "field")
        extents = {str(ctype.array)} | ({ctype.array_expr} if re.fullmatch(r"[A-Za-z_]\w*", ctype.array_expr) else set())
        return {f"NTuple{{{n},{t}}}" for n in extents for t in inner}, problem
    if ctype.depth == 0:
        return base_spellings(header, ctype.base)
    if ctype.depth == 1 and ctype.base == "char":
        return set(C_STRING_SPELLINGS), None
    if ctype.depth == 1 and ctype.base == "void":
        return {"Ptr{Cvoid}", "Ptr{Nothing}"}, None
    inner, problem = julia_spellings(header, CType(ctype.base, ctype.depth - 1), "inner")
    if problem:
        return set(), problem
    inner -= C_STRING_SPELLINGS - {"Ptr{UInt8}", "Ptr{Cchar}"}  # no Cstring below a pointer
    wrappers = ["Ptr"]
    opaque_pointee = ctype.depth == 1 and ctype.base in header.opaque
    if context == "arg" and not opaque_pointee:
        wrappers.append("Ref")  # Ref{T}: Julia-owned memory, rooted by ccall itself
    return {f"{w}{{{s}}}" for w in wrappers for s in inner}, None


def base_spellings(header, base):
    if base in SCALARS:
        return set(SCALARS[base]), None
    if base in header.funcptrs:  # a function pointer: an address (a @cfunction's, or C's)
        return {"Ptr{Cvoid}"}, None
    if base in header.enums:
        return set(ENUM_SPELLINGS), None
    if base in header.opaque or base in mirrored_structs(header):
        return {julia_name(base)}, None
    return set(), f"C type {base} is not in the checker's type table"


def normalize_julia_type(text):
    t = re.sub(r"\s+", "", text)
    t = re.sub(r"\b(Base|Core)\.", "", t)
    return t


# ============================================================================
# Julia sources
# ============================================================================


def blank_julia(src):
    """Comments and string/char literal contents become spaces (delimiters, newlines and
    interpolated $(code) are kept), so that what is left is code. Handles #= =# (nested),
    \"\"\" strings, prefixed strings (raw\"\", r\"\"), `cmd` and 'c' literals."""
    out = list(src)
    n = len(src)

    def blank(a, b):
        for j in range(a, b):
            if out[j] != "\n":
                out[j] = " "

    def skip_string(i, delim):
        """i: just after the opening delimiter. Returns the index just after the closing one."""
        start = i
        while i < n:
            if src.startswith(delim, i):
                blank(start, i)
                return i + len(delim)
            if src[i] == "\\":
                i += 2
                continue
            if src.startswith("$(", i):  # interpolated code stays visible (and checked)
                blank(start, i + 1)
                i = start = skip_code(i + 2, stop_at_paren=True)
                continue
            i += 1
        blank(start, n)
        return n

    def skip_code(i, stop_at_paren=False):
        depth = 0
        while i < n:
            ch = src[i]
            if src.startswith("#=", i):
                j, level = i + 2, 1
                while j < n and level:
                    if src.startswith("#=", j):
                        level, j = level + 1, j + 2
                    elif src.startswith("=#", j):
                        level, j = level - 1, j + 2
                    else:
                        j += 1
                blank(i, j)
                i = j
            elif ch == "#":
                j = src.find("\n", i)
                j = n if j < 0 else j
                blank(i, j)
                i = j
            elif src.startswith('"""', i):
                i = skip_string(i + 3, '"""')
            elif ch == '"':
                i = skip_string(i + 1, '"')
            elif ch == "`":
                i = skip_string(i + 1, "`")
            elif ch == "'":
                prev = src[i - 1] if i > 0 else " "
                if re.match(r"[\w)\]}'.!]", prev):  # transpose (adjoint) operator
                    i += 1
                    continue
                j = i + 1
                if j < n and src[j] == "\\":
                    j += 2
                    while j < n and src[j] != "'":
                        j += 1
                else:
                    j += 1
                    while j < n and src[j] != "'" and src[j] != "\n":
                        j += 1
                blank(i + 1, j)
                i = j + 1
            else:
                if stop_at_paren:
                    if ch == "(":
                        depth += 1
                    elif ch == ")":
                        if depth == 0:
                            return i + 1
                        depth -= 1
                i += 1
        return n

    skip_code(0)
    return "".join(out)


BLOCK_OPENERS = {
    "function", "macro", "module", "baremodule", "struct", "begin", "let", "if", "for",
    "while", "try", "do", "quote", "abstract", "primitive",
}  # fmt: skip
BRACKET_SENSITIVE = {"begin", "if", "for"}  # inside [] or () these are index/generator words


def julia_tokens(code):
    """(kind, text, offset) for words and brackets. kind: "bracket", "word" (identifiers and
    keywords), "name" (after a dot: x.end is a field) or "symbol" (:end, but not a[2:end])."""
    toks = []
    for m in re.finditer(r"[A-Za-z_][A-Za-z0-9_!]*|[()\[\]{}]", code):
        text, pos = m.group(0), m.start()
        prev = code[pos - 1] if pos > 0 else " "
        before = code[pos - 2] if pos > 1 else " "
        if text in "()[]{}":
            kind = "bracket"
        elif prev == ".":
            kind = "name"
        elif prev == ":" and not re.match(r"[\w)\]}:]", before):
            kind = "symbol"
        else:
            kind = "word"
        toks.append((kind, text, pos))
    return toks


def block_ends(code):
    """{offset of an opener keyword: offset of its `end`} for the whole source."""
    ends, stack = {}, []
    for kind, text, pos in julia_tokens(code):
        if kind == "bracket":
            if text in "([{":
                stack.append((text, pos))
            elif stack and stack[-1][0] in "([{":
                stack.pop()
            continue
        if kind != "word":
            continue
        top = stack[-1][0] if stack else None
        if text in BLOCK_OPENERS:
            if text in BRACKET_SENSITIVE and top in ("(", "[", "{"):
                continue
            stack.append((text, pos))
        elif text == "end":
            if top in ("(", "[", "{"):
                continue  # a[end]
            if stack:
                _, opened = stack.pop()
                ends[opened] = pos
    return ends


def line_at(text, offset):
    return text.count("\n", 0, offset) + 1


@dataclass
class JuliaCcall:
    name: str
    library: str
    ret: str
    types: list  # normalized Julia type strings
    values: list  # value expressions (blanked code)
    where: str
    offset: int
    file: str
    form_problem: str = ""
    runtime: bool = False  # a bare-symbol ccall of the Julia runtime (JULIA_RUNTIME_CALLS)
    size_note: str = None  # the reason of a `# flatmem-check: size:` comment on it (None: none)


@dataclass
class JuliaStruct:
    name: str
    mutable: bool
    fields: list  # [(name, type, line_start_offset, line_end_offset)]
    where: str
    file: str


@dataclass
class JuliaConst:
    name: str
    expr: str
    where: str
    file: str


@dataclass
class JuliaConstruction:
    """A call `Mirror(args...)` of a struct mirror's default constructor."""

    name: str
    args: int  # positional arguments
    checkable: bool  # False with a splat or keyword arguments
    where: str


@dataclass
class FunctionRegion:
    """A `function name(params) ... end` block: where, and the names of its Ptr{...} parameters."""

    start: int
    end: int
    body_start: int
    pointer_params: set
    file: str


@dataclass
class PreserveRegion:
    start: int
    end: int
    names: set
    file: str


@dataclass
class JuliaSources:
    files: dict  # path -> source text
    codes: dict = field(default_factory=dict)  # path -> blank_julia(source): code only
    ccalls: list = field(default_factory=list)
    structs: dict = field(default_factory=dict)
    consts: dict = field(default_factory=dict)
    preserves: list = field(default_factory=list)
    not_wrapped: dict = field(default_factory=dict)  # name -> reason
    problems: list = field(default_factory=list)  # Issues found while reading
    init_bodies: list = field(default_factory=list)
    functions: list = field(default_factory=list)  # [FunctionRegion] of `function ... end` blocks
    macro_bodies: list = field(default_factory=list)  # [(body text, where)] of `macro gc_safe(...) ... end`
    constructions: list = field(default_factory=list)  # [JuliaConstruction]


def size_note(src, start, end):
    """The reason of a `# flatmem-check: size: reason` comment on the lines of the ccall at
    src[start:end] or on a comment line right above it; None without one."""
    lines = src.split("\n")
    first, last = line_at(src, start), line_at(src, end)
    candidates = lines[first - 1 : last]
    if first >= 2 and lines[first - 2].lstrip().startswith("#"):
        candidates.insert(0, lines[first - 2])
    for line in candidates:
        m = SIZE_NOTE_RE.search(line)
        if m:
            return m.group(1).strip()
    return None


def parse_julia(files):
    """files: {path: text}."""
    js = JuliaSources(files)
    for path, src in files.items():
        base = os.path.basename(path)
        code = js.codes[path] = blank_julia(src)
        ends = block_ends(code)

        def where(offset):
            return f"{base}:{line_at(code, offset)}"

        # Not-wrapped list (comments: read from the raw source).
        for lineno, line in enumerate(src.split("\n"), 1):
            m = NOT_WRAPPED_RE.search(line)
            if m:
                nm = re.match(r"(\w+)\s*:\s*(\S.*)$", m.group(1).strip())
                if not nm:
                    js.problems.append(
                        Issue("not-wrapped-list", f"{base}:{lineno}", "expected '# flatmem-check: not wrapped: NAME: reason'")
                    )
                else:
                    js.not_wrapped[nm.group(1)] = (nm.group(2).strip(), f"{base}:{lineno}")

        # @ccall is not read by this checker: refuse it rather than skip it.
        for m in re.finditer(r"@ccall\b", code):
            js.problems.append(Issue("ccall-form", where(m.start()), "@ccall is not checked; write ccall((:name, lib), Ret, (Args...,), ...)"))

        # GC.@preserve v1 v2 ... begin ... end
        for m in re.finditer(r"\bGC\s*\.\s*@preserve\b((?:[ \t]+\w+)*)[ \t]+begin\b", code):
            begin_at = m.end() - len("begin")
            if begin_at in ends:
                js.preserves.append(PreserveRegion(begin_at, ends[begin_at], set(m.group(1).split()), path))

        # ccalls
        for m in re.finditer(r"(?<![\w@.])ccall\s*\(", code):
            open_at = m.end() - 1
            close_at = matching_paren(code, open_at)
            if close_at < 0:
                js.problems.append(Issue("ccall-form", where(m.start()), "unbalanced parentheses"))
                continue
            args = [
                (a.strip(), open_at + 1 + off + len(a) - len(a.lstrip()))
                for a, off in split_top(code[open_at + 1 : close_at])
            ]
            call = JuliaCcall("", "", "", [], [], where(m.start()), m.start(), path)
            call.size_note = size_note(src, m.start(), close_at)
            js.ccalls.append(call)
            if len(args) < 3:
                call.form_problem = "expected ccall((:name, lib), RetType, (ArgTypes...,), values...)"
                continue
            bare = re.match(r"^:(\w+)$", args[0][0])
            target = re.match(r'^\(\s*:(\w+)\s*,\s*([\w.]+|"[^"\n]*")\s*\)$', args[0][0])
            if bare and bare.group(1) in JULIA_RUNTIME_CALLS:
                call.name, call.runtime = bare.group(1), True
            elif not target:
                raw = src[args[0][1] : args[0][1] + len(args[0][0])]
                call.form_problem = f"the first argument must be (:flatmem_name, {JULIA_LIBRARY}), not {raw!r}"
                continue
            else:
                call.name = target.group(1)
                call.library = src[args[0][1] + target.start(2) : args[0][1] + target.end(2)]  # raw text (strings are blanked)
            if args[1][0] in ("cdecl", "stdcall", "fastcall", "thiscall", "llvmcall"):
                call.form_problem = "calling conventions are not supported by the checker"
                continue
            call.ret = normalize_julia_type(args[1][0])
            tup = args[2][0]
            if not (tup.startswith("(") and matching_paren(tup, 0) == len(tup) - 1):
                call.form_problem = f"the argument types must be a literal tuple, not {tup!r}"
                continue
            inner = tup[1:-1]
            pieces = [p for p, _ in split_top(inner)] if inner.strip() else []
            if len(pieces) == 1:
                call.form_problem = f"{tup} is not a tuple: a 1-tuple needs a trailing comma"
                continue
            if pieces and not pieces[-1].strip():
                pieces = pieces[:-1]
            call.types = [normalize_julia_type(p) for p in pieces]
            call.values = [a for a, _ in args[3:]]

        # structs: name, mutable or not, and `name::Type` fields
        toks = julia_tokens(code)
        for idx, (kind, text, pos) in enumerate(toks):
            hm = re.match(r"struct\s+(\w+)", code[pos:])
            if kind != "word" or not hm or pos not in ends:
                continue
            mutable = idx > 0 and toks[idx - 1][1] == "mutable" and toks[idx - 1][0] == "word"
            fields, offset = [], pos + hm.end()
            for line in code[offset : ends[pos]].split("\n"):
                fm = re.match(r"^\s*(\w+)\s*::\s*(.+?)\s*$", line)
                if fm:
                    fields.append((fm.group(1), normalize_julia_type(fm.group(2)), offset, offset + len(line)))
                offset += len(line) + 1
            js.structs[hm.group(1)] = JuliaStruct(hm.group(1), mutable, fields, where(pos), path)

        # consts (top-level style: `const NAME = expr` on one line)
        for m in re.finditer(r"^[ \t]*const[ \t]+(\w+)[ \t]*=[ \t]*(.+?)[ \t]*$", code, re.M):
            js.consts[m.group(1)] = JuliaConst(m.group(1), m.group(2), where(m.start()), path)

        # function ... end blocks, with their Ptr-typed parameters (a foreign address the
        # caller owns, such as a cudaStream_t: nothing for the GC to keep)
        for m in re.finditer(r"\bfunction\s+[\w.!]+(?:\{[^}]*\})?\s*\(", code):
            if m.start() not in ends:
                continue
            close_at = matching_paren(code, m.end() - 1)
            params = code[m.end() : close_at] if close_at > 0 else ""
            ptrs = set(re.findall(r"\b(\w+)\s*::\s*Ptr\{", params))
            js.functions.append(FunctionRegion(m.start(), ends[m.start()], max(close_at, m.end()), ptrs, path))

        # macro gc_safe(call) ... end (interpolations are code: kept by blank_julia)
        for m in re.finditer(r"\bmacro\s+gc_safe\s*\(", code):
            if m.start() in ends:
                js.macro_bodies.append((src[m.end() : ends[m.start()]], where(m.start())))

        # function __init__()
        for m in re.finditer(r"\bfunction\s+__init__\s*\(\s*\)", code):
            if m.start() in ends:
                js.init_bodies.append((code[m.end() : ends[m.start()]], where(m.start())))

    # calls of the generated mirrors' default constructors (not Ref{Mirror}(), Type{Mirror}, x.Mirror(...))
    mirrors = "|".join(sorted(n for n, st in js.structs.items() if os.path.basename(st.file) == GENERATED and st.fields))
    for path, code in js.codes.items():
        for m in re.finditer(rf"(?<![\w.{{:])({mirrors or '$^'})\s*\(", code):
            close_at = matching_paren(code, m.end() - 1)
            inner = code[m.end() : close_at] if close_at > 0 else ""
            args = [a.strip() for a, _ in split_top(inner)] if inner.strip() else []
            checkable = close_at > 0 and not any(";" in a or a.endswith("...") for a in args)
            where = f"{os.path.basename(path)}:{line_at(code, m.start())}"
            js.constructions.append(JuliaConstruction(m.group(1), len(args), checkable, where))
    return js


def matching_paren(text, open_at):
    depth = 0
    for i in range(open_at, len(text)):
        if text[i] in "([{":
            depth += 1
        elif text[i] in ")]}":
            depth -= 1
            if depth == 0:
                return i
    return -1



# ============================================================================
# Struct layouts: offsets and sizes (x86-64 / LP64 C rules, which Julia's isbits
# structs follow: each field at the next multiple of its alignment, the size
# rounded up to the largest alignment)
# ============================================================================

JULIA_SCALAR_SIZES = {
    "Cint": 4, "Int32": 4, "Cuint": 4, "UInt32": 4, "Int8": 1, "UInt8": 1, "Cchar": 1, "Cuchar": 1,
    "Int16": 2, "UInt16": 2, "Int64": 8, "UInt64": 8, "Csize_t": 8, "UInt": 8, "Int": 8,
    "Cfloat": 4, "Float32": 4, "Cdouble": 8, "Float64": 8, "Cstring": 8,
}  # fmt: skip
POINTER_SIZE = 8


@dataclass
class Layout:
    size: int
    align: int
    offsets: list  # [(field name, offset)]


def place(members):
    """members: [(name, size, align)] -> Layout, by the C rules."""
    offset, align, offsets = 0, 1, []
    for name, size, a in members:
        offset = (offset + a - 1) // a * a
        offsets.append((name, offset))
        offset += size
        align = max(align, a)
    return Layout((offset + align - 1) // align * align, align, offsets)


def julia_type_layout(js, jtype, consts, memo):
    """(size, align) of a Julia field type as the checker reads it, or None."""
    if jtype in JULIA_SCALAR_SIZES:
        return JULIA_SCALAR_SIZES[jtype], JULIA_SCALAR_SIZES[jtype]
    if jtype.startswith("Ptr{"):
        return POINTER_SIZE, POINTER_SIZE
    m = re.fullmatch(r"NTuple\{(\w+),(.+)\}", jtype)
    if m:
        n = int(m.group(1)) if m.group(1).isdigit() else consts.get(m.group(1))
        inner = julia_type_layout(js, m.group(2), consts, memo)
        return None if n is None or inner is None else (n * inner[0], inner[1])
    if jtype in js.structs and not js.structs[jtype].mutable:
        lay = julia_layout(js, jtype, consts, memo)
        return None if lay is None else (lay.size, lay.align)
    return None


def julia_layout(js, jname, consts, memo=None):
    memo = memo if memo is not None else {}
    if jname not in memo:
        memo[jname] = None  # a recursive struct has no layout
        members = []
        for fname, jtype, _, _ in js.structs[jname].fields:
            sa = julia_type_layout(js, jtype, consts, memo)
            if sa is None:
                return None
            members.append((fname, sa[0], sa[1]))
        memo[jname] = place(members)
    return memo[jname]


_COMPILED = {}  # (header text digest, structs) -> {C struct: Layout} or an error string


def compiled_layouts(header_path, header_text, include_dirs, header):
    """The C compiler's own sizeof/offsetof/alignment of the mirrored structs, from a program that
    includes the header (`header_text` standing for `header_path`): {C name: Layout}, or why not."""
    structs = {c: [f for f, _ in header.structs[c]] for c in mirrored_structs(header)}
    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if not cc:
        return "no C compiler (cc) found"
    key = (hashlib.sha256(header_text.encode()).hexdigest(), tuple(sorted((k, tuple(v)) for k, v in structs.items())))
    if key in _COMPILED:
        return _COMPILED[key]
    lines = ["#include <stddef.h>", "#include <stdio.h>", f'#include "{os.path.basename(header_path)}"', "int main(void) {"]
    for name, fields in structs.items():
        lines.append(f'  printf("S {name} %zu %zu\\n", sizeof({name}), offsetof(struct {{ char c; {name} t; }}, t));')
        for f in fields:
            lines.append(f'  printf("F {name} {f} %zu\\n", offsetof({name}, {f}));')
    lines += ["  return 0;", "}"]
    with tempfile.TemporaryDirectory(prefix="check_ccalls.") as tmp:
        # The header under test sits where its own folder would be, so that its includes
        # (<flatmem/comm.h> back to <flatmem/flatmem.h>) resolve as for the real one.
        hdir = os.path.join(tmp, os.path.basename(os.path.dirname(os.path.abspath(header_path))))
        os.makedirs(hdir)
        with open(os.path.join(hdir, os.path.basename(header_path)), "w", encoding="utf-8") as f:
            f.write(header_text)
        src, exe = os.path.join(hdir, "layout.c"), os.path.join(tmp, "layout")
        with open(src, "w", encoding="utf-8") as f:
            f.write("\n".join(lines) + "\n")
        cmd = [cc, "-std=c99", "-o", exe, src, f"-I{tmp}"] + [f"-I{d}" for d in include_dirs]
        try:
            built = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
            if built.returncode != 0:
                result = f"{' '.join(cmd)} failed: {built.stderr.strip()[:2000]}"
            else:
                ran = subprocess.run([exe], capture_output=True, text=True, timeout=30, check=True)
                layouts = {}
                for line in ran.stdout.splitlines():
                    parts = line.split()
                    if parts[0] == "S":
                        layouts[parts[1]] = Layout(int(parts[2]), int(parts[3]), [])
                    else:
                        layouts[parts[1]].offsets.append((parts[2], int(parts[3])))
                result = layouts
        except (OSError, subprocess.SubprocessError) as e:
            result = f"the layout program failed: {e}"
    _COMPILED[key] = result
    return result


def describe(layout):
    return f"size {layout.size}, align {layout.align}, offsets " + ", ".join(f"{n}@{o}" for n, o in layout.offsets)


def check_layouts(header, js, rep, compiled):
    """Each generated mirror's field names, offsets, size and alignment, computed from its Julia
    field types by the C rules (as Julia lays out an isbits struct), against the C struct's as
    the C compiler measures them: the proof that the generator's type table gives C's layout."""
    if not isinstance(compiled, dict):
        rep.fail("struct-layout", header.files[0], f"the C compiler could not measure the mirrored structs: {compiled}")
        return
    consts = {}
    for name, jc in js.consts.items():
        value = safe_int_eval(jc.expr, consts, calls={"Cint", "Int32", "Int64", "UInt8", "Int", "Csize_t"})
        if value is not None:
            consts[name] = value
    memo = {}
    for cname in mirrored_structs(header):
        jname, want = julia_name(cname), compiled[cname]
        if jname not in js.structs or js.structs[jname].mutable:
            rep.fail("struct-layout", jname, f"no immutable Julia struct {jname} mirrors C {cname} (regenerate {GENERATED})")
            continue
        got = julia_layout(js, jname, consts, memo)
        if got is None:
            rep.fail("struct-layout", jname, f"cannot compute the layout of Julia {jname} (a field type the layout table lacks)")
        elif (got.size, got.align, got.offsets) != (want.size, want.align, want.offsets):
            rep.fail("struct-layout", js.structs[jname].where, f"Julia {jname} lays out as {describe(got)}; the C compiler lays out {cname} as {describe(want)}")
        else:
            rep.ok(f"layout of {jname} = C {cname}: {describe(want)}")


# ============================================================================
# The check
# ============================================================================


@dataclass
class Report:
    issues: list = field(default_factory=list)
    passed: int = 0  # individual checks that passed
    ccalls_ok: int = 0
    lines: list = field(default_factory=list)  # verbose lines

    def fail(self, kind, where, message):
        self.issues.append(Issue(kind, where, message))

    def ok(self, text):
        self.passed += 1
        self.lines.append("ok  " + text)


def check(header, js, compiled):
    """compiled: the C compiler's layouts of the mirrored structs ({name: Layout}), or why there
    are none (a string: no compiler, or the header did not compile)."""
    rep = Report()
    rep.issues.extend(js.problems)

    if not header.functions or "flatmem_status" not in header.enums:
        rep.fail("header", header.files[0] if header.files else "?", "no functions or no flatmem_status enum parsed")
    if not js.ccalls:
        rep.fail("ccall-form", "julia", "no ccall found in the Julia sources")

    # 1. ccalls
    wrapped = set()
    for call in js.ccalls:
        if call.form_problem:
            rep.fail("ccall-form", call.where, call.form_problem)
            continue
        before = len(rep.issues)
        if call.runtime:
            want_ret, want_types = JULIA_RUNTIME_CALLS[call.name]
            if (call.ret, tuple(call.types)) != (want_ret, want_types) or len(call.values) != len(want_types):
                rep.fail(
                    "runtime-call",
                    call.where,
                    f"{call.name}: ccall as {call.ret}, ({', '.join(call.types)}) with {len(call.values)} values; "
                    f"the Julia runtime's is {want_ret}, ({', '.join(want_types)})",
                )
            else:
                rep.ok(f"runtime ccall {call.name} ({call.where})")
                rep.ccalls_ok += 1
            continue
        if call.library != JULIA_LIBRARY:
            rep.fail("library", call.where, f"{call.name}: library is {call.library!r}; every ccall must use the const {JULIA_LIBRARY}")
        fn = header.functions.get(call.name)
        if fn is None:
            rep.fail("unknown-function", call.where, f"{call.name} is not declared in {os.path.basename(header.files[0])}")
            continue
        wrapped.add(call.name)
        if len(call.values) != len(call.types):
            rep.fail("value-count", call.where, f"{call.name}: {len(call.types)} argument types but {len(call.values)} values")
        if len(call.types) != len(fn.params):
            rep.fail(
                "arg-count",
                call.where,
                f"{call.name}: {len(call.types)} argument types; the C prototype ({fn.where}) has {len(fn.params)}: "
                + ", ".join(str(t) for _, t in fn.params),
            )
        else:
            for i, (jt, (pname, ct)) in enumerate(zip(call.types, fn.params)):
                accepted, problem = julia_spellings(header, ct, "arg")
                if problem:
                    rep.fail("arg-type", call.where, f"{call.name} argument {i + 1} ({pname}): {problem}")
                elif jt not in accepted:
                    rep.fail(
                        "arg-type",
                        call.where,
                        f"{call.name} argument {i + 1} ({pname}): Julia {jt} for C `{ct}`; expected one of {sorted(accepted)}",
                    )
        accepted, problem = julia_spellings(header, fn.ret, "ret")
        if problem:
            rep.fail("return-type", call.where, f"{call.name}: {problem}")
        elif call.ret not in accepted:
            rep.fail("return-type", call.where, f"{call.name}: returns Julia {call.ret} for C `{fn.ret}`; expected one of {sorted(accepted)}")
        check_preserve(header, js, call, rep)
        check_gc_safe(js, call, rep)
        check_size_args(header, fn, call, rep)
        if len(rep.issues) == before:
            rep.ccalls_ok += 1
            rep.ok(f"ccall {call.name} ({call.where}) matches {fn.where}")

    # 2. coverage
    for name, (reason, where) in js.not_wrapped.items():
        if name not in header.functions:
            rep.fail("not-wrapped-list", where, f"{name} is listed as not wrapped but is not in the header")
        elif name in wrapped:
            rep.fail("not-wrapped-list", where, f"{name} is listed as not wrapped but is ccall'd")
    for name, fn in header.functions.items():
        if name in wrapped:
            rep.ok(f"{name} is wrapped")
        elif name in js.not_wrapped:
            rep.ok(f"{name} is not wrapped: {js.not_wrapped[name][0]}")
        else:
            rep.fail(
                "not-wrapped",
                fn.where,
                f"{name} has no ccall; wrap it or add '# flatmem-check: not wrapped: {name}: <reason>'",
            )

    # 3. generated.jl: what the headers give, laid out as C; built with one value per field
    generated = [path for path in js.files if os.path.basename(path) == GENERATED]
    if not generated:
        rep.fail("generated", "julia", f"no {GENERATED} among the Julia sources (python3 scripts/gen_julia.py)")
    elif js.files[generated[0]] != render(header):
        rep.fail("generated", generated[0], "differs from what the headers give (python3 scripts/gen_julia.py)")
    else:
        rep.ok(f"{GENERATED} is what the headers give")
    check_layouts(header, js, rep, compiled)
    # A mirror built positionally gets one value per field: a field appended to the
    # mirror without its value at every construction fails only when Julia runs it.
    for c in js.constructions:
        fields = [f for f, _, _, _ in js.structs[c.name].fields]
        if not c.checkable:
            continue
        if c.args != len(fields):
            rep.fail("struct-construct", c.where, f"{c.name}(...) with {c.args} arguments; the struct has {len(fields)} fields: {', '.join(fields)}")
        else:
            rep.ok(f"{c.name}(...) at {c.where} gives its {c.args} fields")
    check_gc_safe_macro(js, rep)

    # 4. the header's constants come from generated.jl only (no hand-written copy to go stale)
    for name, jc in js.consts.items():
        if name.startswith(CONSTANT_PREFIXES) and os.path.basename(jc.file) != GENERATED:
            rep.fail("hand-constant", jc.where, f"const {name} is the header's: {GENERATED} defines it")

    # 5. __init__ checks the version
    if not js.init_bodies:
        rep.fail("init", "julia", "no `function __init__()`: the module must check flatmem_version() at load")
    elif not any(re.search(r"\bFLATMEM_VERSION\b", body) for body, _ in js.init_bodies):
        rep.fail("init", js.init_bodies[0][1], "__init__ does not compare with FLATMEM_VERSION")
    else:
        rep.ok("__init__ checks the library version against FLATMEM_VERSION")
    return rep


def value_names(expr):
    """Variables a value expression reads: identifiers not called, not keywords, not fields."""
    while re.search(r"\{[^{}]*\}", expr):  # type parameters: Ptr{DLTensor}(x) reads x only
        expr = re.sub(r"\{[^{}]*\}", "", expr)
    names = set()
    for m in re.finditer(r"(?<![.:\w])([A-Za-z_]\w*)\b(?!\s*[({])", expr):
        names.add(m.group(1))
    return names - {"nothing", "true", "false", "C_NULL"}


def enclosing_function(js, call):
    inside = [f for f in js.functions if f.file == call.file and f.start < call.offset < f.end]
    return max(inside, key=lambda f: f.start) if inside else None


def check_gc_safe(js, call, rep):
    """A blocking ccall (BLOCKING_FUNCTIONS) must be the argument of @gc_safe:
    `@gc_safe ccall(...)` or `@gc_safe(ccall(...))`."""
    if call.name not in BLOCKING_FUNCTIONS:
        return
    before = js.codes[call.file][max(0, call.offset - 40) : call.offset]
    if re.search(r"@gc_safe(\s+|\s*\(\s*)$", before):
        rep.ok(f"{call.name} ({call.where}) runs GC-safe")
    else:
        rep.fail(
            "gc-safe",
            call.where,
            f"{call.name} may wait for peers or a deadline: write `@gc_safe ccall(...)` (arguments computed first)",
        )


def check_size_args(header, fn, call, rep):
    """A size_t right after a pointer to a mirrored struct is the size of that struct (ABI 1: an
    init function's struct_size, an output's size, an array's element size): the library writes
    exactly that many bytes, so the value is `Csize_t(sizeof(Mirror))` (or `sizeof(Mirror)`) of
    that struct's own mirror, unless a `# flatmem-check: size: reason` comment says otherwise."""
    mirrored = mirrored_structs(header)
    sizes = [
        (i, pname, julia_name(prev.base))
        for i, ((pname, ct), (_, prev)) in enumerate(zip(fn.params[1:], fn.params), 1)
        if ct.base == "size_t" and not ct.depth and prev.depth == 1 and not prev.funcptr and prev.base in mirrored
    ]
    if call.size_note is not None:
        if not call.size_note:
            rep.fail("size-arg", call.where, "expected '# flatmem-check: size: <reason>'")
        elif not sizes:
            rep.fail("size-arg", call.where, f"{call.name} has no struct size argument; drop the '# flatmem-check: size:' comment")
        else:
            rep.ok(f"{call.name} ({call.where}) passes another size on purpose: {call.size_note}")
        return
    if len(call.values) != len(fn.params):
        return  # reported as a value or argument count
    for i, pname, mirror in sizes:
        value = re.sub(r"\s+", "", call.values[i])
        if re.fullmatch(rf"sizeof\({mirror}\)|Csize_t\(sizeof\({mirror}\)\)", value):
            rep.ok(f"{call.name} ({call.where}) passes {pname} = sizeof({mirror})")
        else:
            rep.fail(
                "size-arg",
                call.where,
                f"{call.name} argument {i + 1} ({pname}) is {call.values[i].strip()}; pass Csize_t(sizeof({mirror})), "
                f"the size of the mirror the library writes or reads (or say why not: '# flatmem-check: size: <reason>')",
            )


def check_gc_safe_macro(js, rep):
    """The @gc_safe macro exists and marks the thread GC-safe around its ccall."""
    bodies = [(b, w) for b, w in js.macro_bodies if b is not None]
    if not bodies:
        rep.fail("gc-safe", "julia", "no `macro gc_safe(call)`: blocking ccalls must run GC-safe")
        return
    body, where = bodies[0]
    enter = re.search(r"\bgc_safe_enter\s*\(\s*\)", body)
    call = re.search(r"\$\(\s*esc\(\s*call\s*\)\s*\)", body)
    leave = re.search(r"\bgc_safe_leave\s*\(", body)
    if enter and call and leave and enter.start() < call.start() < leave.start():
        rep.ok(f"macro gc_safe ({where}) brackets its ccall with gc_safe_enter / gc_safe_leave")
    else:
        rep.fail("gc-safe", where, "macro gc_safe must run gc_safe_enter(), then $(esc(call)), then gc_safe_leave(state)")


def check_preserve(header, js, call, rep):
    handle_types = {f"Ptr{{{julia_name(h)}}}" for h in header.opaque}
    regions = [r for r in js.preserves if r.file == call.file and r.start < call.offset < r.end]
    covered = set().union(*(r.names for r in regions)) if regions else set()
    fn = enclosing_function(js, call)
    foreign = fn.pointer_params if fn else set()  # Ptr-typed parameters: addresses the caller owns
    for i, (jt, value) in enumerate(zip(call.types, call.values)):
        if not jt.startswith("Ptr{") or jt in handle_types or NULL_LITERALS.match(re.sub(r"\s+", "", value)):
            continue
        if value.strip() in foreign:
            continue
        if not regions:
            rep.fail(
                "gc-preserve",
                call.where,
                f"{call.name} argument {i + 1} passes a raw {jt} ({value.strip()}) outside GC.@preserve ... begin ... end",
            )
            continue
        missing = sorted(value_names(value) - covered)
        if missing:
            rep.fail(
                "gc-preserve",
                call.where,
                f"{call.name} argument {i + 1} ({value.strip()}) reads {', '.join(missing)}, not in the enclosing GC.@preserve",
            )


# ============================================================================
# Self-test: deliberate mistakes that must be reported
# ============================================================================


def self_test_cases(header, js):
    """[(description, expected kind, mutate)] where mutate(header_text, files) -> (header_text, files)."""
    last = list(js.files)[-1]

    def append(snippet):
        def mutate(htext, files):
            files = dict(files)
            files[last] = files[last] + "\n" + snippet + "\n"
            return htext, files

        return mutate

    def replace_in_julia(pattern, repl, what):
        def mutate(htext, files):
            files = dict(files)
            for path, src in files.items():
                new, count = re.subn(pattern, repl, src)
                if count:
                    files[path] = new
                    return htext, files
            raise LookupError(f"cannot apply: {what} (pattern {pattern!r} not found)")

        return mutate

    def edit_struct(jname, how):
        def mutate(htext, files):
            s = js.structs.get(jname)
            if s is None or len(s.fields) < 2:
                raise LookupError(f"cannot apply: struct {jname} with >= 2 fields not found")
            src = files[s.file]
            f0, f1, flast = s.fields[0], s.fields[1], s.fields[-1]
            line0 = src[f0[2] : f0[3]]
            if how == "swap":  # the first two fields (adjacent lines)
                new = src[: f0[2]] + src[f1[2] : f1[3]] + "\n" + src[f0[2] : f0[3]] + src[f1[3] :]
            elif how == "retype":
                new = src[: f0[2]] + re.sub(r"::.*$", "::Float64", line0) + src[f0[3] :]
            elif how == "drop-last":
                new = src[: flast[2]] + src[flast[3] + 1 :]
            else:
                raise ValueError(how)
            return htext, {**files, s.file: new}

        return mutate

    def header_append(decl):
        def mutate(htext, files):
            idx = htext.rfind("#endif")
            if idx < 0:
                raise LookupError("cannot apply: no #endif in the header")
            return htext[:idx] + decl + "\n" + htext[idx:], files

        return mutate

    def header_enum_value():
        name = next((c for c in header.enums.get("flatmem_status", {}) if c != "FLATMEM_STATUS_SUCCESS"), None)

        def mutate(htext, files):
            if name is None:
                raise LookupError("cannot apply: no flatmem_status enumerator")
            new, count = re.subn(rf"\b{name}\s*=\s*[^,}}\n]+", f"{name} = 99", htext)
            if not count:
                raise LookupError(f"cannot apply: {name} = ... not found in the header")
            return new, files

        return mutate

    def header_replace(old, new):
        def mutate(htext, files):
            if old not in htext:
                raise LookupError(f"cannot apply: {old!r} not found in the header")
            return htext.replace(old, new, 1), files

        return mutate

    def sibling_header(name, text):
        def mutate(htext, files):
            return htext, files, {name: text}

        return mutate

    h, p = "Ptr{ContrastiveHandle}", "Ptr{DLTensor}"
    cm, rq, cy = "Ptr{CommHandle}", "Ptr{CommRequestHandle}", "Ptr{CyclicHandle}"
    return [
        ("wrong argument count", "arg-count", append(f"ccall((:flatmem_contrastive_destroy, libflatmem), Cint, ({h}, Cint), c, 0)")),
        ("wrong argument type (a status passed as Csize_t)", "arg-type",
         append("ccall((:flatmem_status_string, libflatmem), Cstring, (Csize_t,), s)")),
        ("unknown function name", "unknown-function", append("ccall((:flatmem_contrastive_forwards, libflatmem), Cint, ())")),
        # More of the same family.
        ("wrong return type", "return-type", append("ccall((:flatmem_version, libflatmem), Csize_t, ())")),
        ("handle pointee erased to Ptr{Cvoid}", "arg-type", append("ccall((:flatmem_contrastive_destroy, libflatmem), Cint, (Ptr{Cvoid},), c)")),
        ("options passed as the wrong struct", "arg-type",
         append("ccall((:flatmem_contrastive_options_init, libflatmem), Cint, (Ref{DLTensor}, Csize_t), o, Csize_t(sizeof(ContrastiveOptions)))")),
        ("size_t* out-parameter as Ref{Cint}", "arg-type",
         append(f"GC.@preserve t begin ccall((:flatmem_contrastive_forward_workspace_size, libflatmem), Cint, ({h}, {p}, {p}, Ref{{Cint}}), c, tensor_ptr(t), tensor_ptr(t), b) end")),
        ("more values than argument types", "value-count", append(f"ccall((:flatmem_contrastive_destroy, libflatmem), Cint, ({h},), c, 0)")),
        ("1-tuple of types without its comma", "ccall-form", append(f"ccall((:flatmem_contrastive_destroy, libflatmem), Cint, ({h}), c)")),
        ("library other than the libflatmem const", "library", append('ccall((:flatmem_version, "libflatmem"), Cint, ())')),
        ("@ccall (unchecked form)", "ccall-form", append("@ccall libflatmem.flatmem_version()::Cint")),
        ("raw tensor pointer outside GC.@preserve", "gc-preserve",
         append(f"f(t) = ccall((:flatmem_contrastive_forward_workspace_size, libflatmem), Cint, ({h}, {p}, {p}, Ref{{Csize_t}}), c, tensor_ptr(t), tensor_ptr(t), b)")),
        ("GC.@preserve that misses a variable", "gc-preserve",
         append(f"GC.@preserve a begin ccall((:flatmem_contrastive_forward_workspace_size, libflatmem), Cint, ({h}, {p}, {p}, Ref{{Csize_t}}), c, tensor_ptr(a), tensor_ptr(z), b) end")),
        ("a wrapped function dropped", "not-wrapped",
         replace_in_julia(r":flatmem_version_string\b", ":flatmem_version", "rename the flatmem_version_string ccall")),
        ("not-wrapped entry for a wrapped function", "not-wrapped-list",
         append("# flatmem-check: not wrapped: flatmem_contrastive_forward: stale entry")),
        ("not-wrapped entry without a reason", "not-wrapped-list", append("# flatmem-check: not wrapped: flatmem_version")),
        ("struct mirror fields swapped", "struct-layout", edit_struct("ContrastiveOptions", "swap")),
        ("generated mirror field retyped by hand (the same size)", "generated", edit_struct("DLTensor", "retype")),
        ("struct mirror field dropped", "struct-layout", edit_struct("DLTensor", "drop-last")),
        ("struct mirror made mutable", "struct-layout",
         replace_in_julia(r"(?m)^(\s*)struct DLDataType\b", r"\1mutable struct DLDataType", "make DLDataType mutable")),
        ("__init__ removed", "init", replace_in_julia(r"\bfunction __init__\(\)", "function init_disabled()", "rename __init__")),
        ("generated constant edited by hand", "generated",
         replace_in_julia(r"FLATMEM_STATUS_NON_FINITE = Cint\(5\)", "FLATMEM_STATUS_NON_FINITE = Cint(6)", "edit a generated const")),
        ("generated.jl missing", "generated", lambda htext, files: (htext, {path: text for path, text in files.items() if not path.endswith(GENERATED)})),
        ("hand-written copy of a header constant", "hand-constant", append("const FLATMEM_STATUS_SUCCESS = Cint(0)")),
        ("header struct gains a field (generated.jl not regenerated)", "struct-layout",
         header_replace("size_t logit_cache_bytes;", "size_t logit_cache_bytes;\n  int64_t selftest_extra;")),
        ("header grows a function", "not-wrapped", header_append("FLATMEM_API flatmem_status flatmem_selftest_new_function(int x);")),
        # Reversible segments and built-in blocks.
        ("block handle passed as a segment handle", "arg-type",
         append("ccall((:flatmem_block_destroy, libflatmem), Cint, (Ptr{ReversibleHandle},), b)")),
        ("enum out-parameter as Ref{UInt64}", "arg-type",
         append("ccall((:flatmem_reversible_last_mode, libflatmem), Cint, (Ptr{ReversibleHandle}, Ref{UInt64}), s, m)")),
        ("uint64 seed passed as Int32", "arg-type",
         append("ccall((:flatmem_reversible_block_seed, libflatmem), UInt64, (Int32, Int32, Int32), s, k, p)")),
        ("nested struct mirror fields swapped", "struct-layout", edit_struct("ReversibleBlock", "swap")),
        ("block options without the appended math field", "struct-layout", edit_struct("BlockOptions", "drop-last")),
        # Cyclic schedule queries and the mirrors of cyclic.h.
        ("schedule passed by value, not by pointer", "arg-type",
         append("ccall((:flatmem_cyclic_schedule_length, libflatmem), Cint, (CyclicSchedule, Ref{Int64}), s, n)")),
        ("int64 time_step passed as Int32", "arg-type",
         append("ccall((:flatmem_cyclic_schedule_action, libflatmem), Cint, (Ref{CyclicSchedule}, Int32, Int32, Ref{CyclicAction}, Csize_t), "
                "s, r, t, a, Csize_t(sizeof(CyclicAction)))")),
        ("int32 delay out-parameter as Ref{Int64}", "arg-type",
         append("ccall((:flatmem_cyclic_schedule_delay, libflatmem), Cint, (Ref{CyclicSchedule}, Int32, Int32, Ref{Int64}), s, r, j, d)")),
        ("cyclic handle passed as a communicator", "arg-type",
         append("ccall((:flatmem_cyclic_get_schedule, libflatmem), Cint, (Ptr{CommHandle}, Ref{CyclicSchedule}, Csize_t), h, s, Csize_t(sizeof(CyclicSchedule)))")),
        # The CPU instruction set and the contrastive options' appended logit_cache_bytes.
        ("instruction set passed as Csize_t", "arg-type", append("ccall((:flatmem_cpu_isa_set, libflatmem), Cint, (Csize_t,), i)")),
        ("instruction set out-parameter as Ref{UInt8}", "arg-type",
         append("ccall((:flatmem_cpu_isa_get, libflatmem), Cint, (Ref{UInt8}, Ref{Cint}), i, b)")),
        ("contrastive options built without the logit_cache_bytes value", "struct-construct",
         replace_in_julia(r",\s*Csize_t\(logit_cache_bytes\)\)", ")", "drop the last ContrastiveOptions(...) argument")),
        ("block options built with an extra value", "struct-construct",
         replace_in_julia(r"\bBlockOptions\(defaults\.struct_size,", "BlockOptions(defaults.struct_size, 0,", "add a BlockOptions(...) argument")),
        # Communicators (comm.jl).
        ("unique id passed by value, not by pointer", "arg-type",
         append(f"ccall((:flatmem_comm_create, libflatmem), Cint, (Ref{{{cm}}}, Int32, Int32, CommUniqueId, Ref{{CommOptions}}), o, r, n, i, p)")),
        ("uint32 tag passed as Int32", "arg-type",
         append(f"GC.@preserve t begin ccall((:flatmem_comm_isend, libflatmem), Cint, ({cm}, {p}, Int32, Int32, Ref{{{rq}}}, Ptr{{Cvoid}}), c, tensor_ptr(t), r, g, q, C_NULL) end")),
        ("request handle passed as a communicator", "arg-type",
         append(f"ccall((:flatmem_comm_test, libflatmem), Cint, ({cm}, {cm}, Ref{{Int32}}), c, r, d)")),
        ("create_local's array of handles as a single handle", "arg-type",
         append(f"GC.@preserve h begin ccall((:flatmem_comm_create_local, libflatmem), Cint, ({cm}, Int32, Ref{{CommOptions}}), pointer(h), n, o) end")),
        ("unique id bytes as a 64-element tuple", "struct-layout",
         replace_in_julia(r"NTuple\{FLATMEM_COMM_UNIQUE_ID_BYTES,\s*UInt8\}", "NTuple{64,UInt8}", "shorten CommUniqueId.internal")),
        ("unique id bytes as a pointer", "struct-layout",
         replace_in_julia(r"internal::NTuple\{FLATMEM_COMM_UNIQUE_ID_BYTES,\s*UInt8\}", "internal::Ptr{UInt8}", "CommUniqueId.internal as a pointer")),
        ("comm options fields swapped", "struct-layout", edit_struct("CommOptions", "swap")),
        ("comm options built without connect_timeout_ms", "struct-construct",
         replace_in_julia(r",\s*Int64\(connect_timeout_ms\)\)", ")", "drop the last CommOptions(...) argument")),
        ("a comm function dropped", "not-wrapped", replace_in_julia(r":flatmem_comm_barrier\b", ":flatmem_comm_health", "rename the barrier ccall")),
        ("a stream parameter without a Ptr type passed as a raw pointer", "gc-preserve",
         append(f"function selftest_sync(c, stream)\n    state = gc_safe_enter()\n    ccall((:flatmem_comm_synchronize, libflatmem), Cint, ({cm}, Ptr{{Cvoid}}, Int64), c, stream, 0)\n    gc_safe_leave(state)\nend")),
        # Blocking calls run GC-safe; the Julia runtime's own functions.
        ("cyclic next without @gc_safe", "gc-safe",
         replace_in_julia(r"@gc_safe (ccall\(\(:flatmem_cyclic_next,)", r"\1", "drop @gc_safe in cyclic_next!")),
        ("comm abort without @gc_safe", "gc-safe",
         replace_in_julia(r"@gc_safe\((ccall\(\(:flatmem_comm_abort,[^\n]*\))\)", r"(\1)", "drop @gc_safe( ) around the abort ccall")),
        ("sigmoid value_and_grad without @gc_safe", "gc-safe",
         replace_in_julia(r"@gc_safe (ccall\(\(:flatmem_contrastive_sigmoid_value_and_grad,)", r"\1",
                          "drop @gc_safe in the sigmoid value_and_grad call")),
        ("sigmoid backward one tensor argument short", "arg-count",
         replace_in_julia(r"(:flatmem_contrastive_sigmoid_backward, libflatmem\), Cint,\s*\(Ptr\{ContrastiveHandle\}, )Ptr\{DLTensor\}, ",
                          r"\1", "drop one tensor type from the sigmoid backward call")),
        ("sigmoid wrapper dropped", "not-wrapped",
         replace_in_julia(r":flatmem_contrastive_sigmoid_forward\b", ":flatmem_contrastive_forward",
                          "rename the sigmoid forward ccall")),
        ("blocking call without @gc_safe", "gc-safe", append(f"ccall((:flatmem_comm_barrier, libflatmem), Cint, ({cm}, Int64), c, 0)")),
        ("the @gc_safe macro without gc_safe_leave", "gc-safe",
         replace_in_julia(r"(local result = \$\(esc\(call\)\)\n)(\s*)gc_safe_leave\(state\)", r"\1\2nothing", "drop gc_safe_leave in macro gc_safe")),
        ("runtime call with a wrong signature", "runtime-call", append("ccall(:jl_gc_safe_leave, Cvoid, (Int32,), s)")),
        ("bare-symbol ccall of a flatmem function (no library)", "ccall-form", append("ccall(:flatmem_version, Cint, ())")),
        # Cyclic runtime (cyclic.jl).
        ("stage passed as Int64 to cyclic reduce", "arg-type",
         append(f"GC.@preserve t begin ccall((:flatmem_cyclic_reduce, libflatmem), Cint, ({cy}, Int64, {p}), h, j, tensor_ptr(t)) end")),
        ("cyclic next's action as a schedule", "arg-type",
         append(f"ccall((:flatmem_cyclic_next, libflatmem), Cint, ({cy}, Ref{{CyclicSchedule}}, Csize_t), h, a, Csize_t(sizeof(CyclicAction)))")),
        ("cyclic stats' written count as Ref{Int32}", "arg-type",
         append(f"GC.@preserve v begin ccall((:flatmem_cyclic_stats, libflatmem), Cint, ({cy}, Int64, Int64, Ptr{{CyclicTimeStepStats}}, Csize_t, Ref{{Int32}}), "
                f"h, f, n, pointer(v), Csize_t(sizeof(CyclicTimeStepStats)), w) end")),
        ("cyclic create with the communicator as a cyclic handle", "arg-type",
         append(f"ccall((:flatmem_cyclic_create, libflatmem), Cint, (Ref{{{cy}}}, {cy}, Ref{{CyclicOptions}}), o, c, p)")),
        ("cyclic time step stats fields swapped (offsets move)", "struct-layout", edit_struct("CyclicTimeStepStats", "swap")),
        ("stage-parallel options built without history", "struct-construct",
         replace_in_julia(r",\s*Int64\(history\),(\s*CYCLIC_MEMORY\[memory\], Int32\(0\)\))", r",\1",
                          "drop history from the CyclicStagesOptions(...) arguments")),
        ("cyclic runtime function dropped", "not-wrapped", replace_in_julia(r":flatmem_cyclic_summary_get\b", ":flatmem_cyclic_get_schedule", "rename the summary ccall")),
        ("relay parameters without @gc_safe", "gc-safe",
         replace_in_julia(r"@gc_safe (ccall\(\(:flatmem_cyclic_parameters,)", r"\1", "drop @gc_safe in cyclic_parameters!")),
        ("relay parameters_stream without @gc_safe", "gc-safe",
         replace_in_julia(r"@gc_safe (ccall\(\(:flatmem_cyclic_parameters_stream,)", r"\1",
                          "drop @gc_safe in the parameters_stream call")),
        ("relay set_shard_stream's stream as Int64", "arg-type",
         replace_in_julia(r"(:flatmem_cyclic_set_shard_stream, libflatmem\), Cint, \(Ptr\{CyclicHandle\}, Int32, Ptr\{DLTensor\}, )Ptr\{Cvoid\}",
                          r"\1Int64", "retype the stream of the set_shard_stream call")),
        ("relay set_shard_stream dropped", "not-wrapped",
         replace_in_julia(r":flatmem_cyclic_set_shard_stream\b", ":flatmem_cyclic_set_shard", "rename the set_shard_stream ccall")),
        ("cyclic options built without memory", "struct-construct",
         replace_in_julia(r",\s*CYCLIC_MEMORY\[memory\], Int32\(0\)\)", ")",
                          "drop the last two CyclicOptions(...) arguments")),
        ("cyclic reduce_stream's stream as Int64", "arg-type",
         replace_in_julia(r"(:flatmem_cyclic_reduce_stream, libflatmem\), Cint, \(Ptr\{CyclicHandle\}, Int32, Ptr\{DLTensor\}, )Ptr\{Cvoid\}",
                          r"\1Int64", "retype the stream of the reduce_stream call")),
        ("cyclic reduce_stream without its stream", "arg-count",
         append(f"GC.@preserve t begin ccall((:flatmem_cyclic_reduce_stream, libflatmem), Cint, ({cy}, Int32, {p}), h, j, tensor_ptr(t)) end")),
        ("stage-parallel receive without @gc_safe", "gc-safe",
         replace_in_julia(r"@gc_safe (ccall\(\(:flatmem_cyclic_stages_receive,)", r"\1", "drop @gc_safe in cyclic_stages_receive!")),
        ("stage-parallel runtime function dropped", "not-wrapped",
         replace_in_julia(r":flatmem_cyclic_stages_average\b", ":flatmem_cyclic_stages_accumulate", "rename the average ccall")),
        ("stage-parallel send_stream's stream as Int64", "arg-type",
         replace_in_julia(r"(:flatmem_cyclic_stages_send_stream, libflatmem\), Cint,\s*\(Ptr\{CyclicStagesHandle\}, Ptr\{DLTensor\}, )Ptr\{Cvoid\}",
                          r"\1Int64", "retype the stream of the send_stream call")),
        ("stage-parallel receive_stream without @gc_safe", "gc-safe",
         replace_in_julia(r"@gc_safe (ccall\(\(:flatmem_cyclic_stages_receive_stream,)", r"\1",
                          "drop @gc_safe in the receive_stream call")),
        ("stage-parallel average_stream without its stream", "arg-count",
         append(f"GC.@preserve t begin ccall((:flatmem_cyclic_stages_average_stream, libflatmem), Cint, "
                f"(Ptr{{CyclicStagesHandle}}, {p}), h, tensor_ptr(t)) end")),
        ("stage-parallel average_stream dropped", "not-wrapped",
         replace_in_julia(r":flatmem_cyclic_stages_average_stream\b", ":flatmem_cyclic_stages_average", "rename the average_stream ccall")),
        # ABI 1: every struct the library writes comes with the size of its mirror.
        ("cyclic next's action size as the schedule's", "size-arg",
         replace_in_julia(r"(\bh, action, Csize_t\(sizeof\()CyclicAction\)", r"\1CyclicSchedule)", "size the cyclic_next! action as a schedule")),
        ("relay stats' element size before the array (ABI 0's order)", "arg-type",
         replace_in_julia(r"Ptr\{CyclicRelayTimeStep\}, Csize_t, (Ref\{Int64\}\),\s*h, Int64\(first\), Int64\(n\)), (pointer\(stats\)), (Csize_t\(sizeof\(CyclicRelayTimeStep\)\))",
                          r"Csize_t, Ptr{CyclicRelayTimeStep}, \1, \3, \2", "swap the relay stats' array and element size")),
        ("options init's struct_size as a number", "size-arg",
         append("ccall((:flatmem_block_options_init, libflatmem), Cint, (Ref{BlockOptions}, Csize_t), o, Csize_t(32))")),
        ("size note without a reason", "size-arg",
         append("# flatmem-check: size:\nccall((:flatmem_cyclic_summary_get, libflatmem), Cint, (Ptr{CyclicHandle}, Ref{CyclicSummary}, Csize_t), h, s, n)")),
        # Coverage of every public header, not only those flatmem.h includes.
        ("a public header flatmem.h does not include", "not-wrapped",
         sibling_header("selftest_extra.h", "#include <flatmem/flatmem.h>\nflatmem_status flatmem_selftest_extra(int32_t x);\n")),
    ]  # fmt: skip


def run_self_test(header_path, header_text, include_dirs, files, verbose):
    header = load_header(header_path, include_dirs, text=header_text)
    js = parse_julia(files)
    base = check(header, js, compiled_layouts(header_path, header_text, include_dirs, header))
    base_keys = Counter((i.kind, i.message) for i in base.issues)
    detected, missed = 0, 0
    for description, expected, mutate in self_test_cases(header, js):
        try:
            htext, mfiles, *extra = mutate(header_text, files)
        except LookupError as e:
            print(f"self-test: MISSED  {description}: {e}")
            missed += 1
            continue
        mheader = load_header(header_path, include_dirs, text=htext, extra=extra[0] if extra else None)
        rep = check(mheader, parse_julia(mfiles), compiled_layouts(header_path, htext, include_dirs, mheader))
        # New issues: those beyond the base run's (a multiset difference, so that a second
        # occurrence of a message the base sources already have still counts).
        seen = Counter()
        new = []
        for i in rep.issues:
            seen[(i.kind, i.message)] += 1
            if seen[(i.kind, i.message)] > base_keys[(i.kind, i.message)]:
                new.append(i)
        kinds = sorted({i.kind for i in new})
        if expected in kinds:
            detected += 1
            first = next(i for i in new if i.kind == expected)
            print(f"self-test: detected [{expected}] {description}")
            if verbose:
                print(f"           {first}")
        else:
            missed += 1
            print(f"self-test: MISSED  {description}: expected [{expected}], got {kinds or 'nothing new'}")
    return detected, missed


# ============================================================================
# Main
# ============================================================================


def julia_files(target):
    if os.path.isfile(target):
        return [target]
    found = []
    for root, dirs, names in os.walk(target):
        dirs.sort()
        found += [os.path.join(root, n) for n in sorted(names) if n.endswith(".jl")]
    return found


def main(argv):
    here = os.path.dirname(os.path.abspath(__file__))
    root = os.path.dirname(os.path.dirname(here))
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("julia", nargs="?", default=here, help="Julia file or folder (default: this folder)")
    ap.add_argument("--header", default=os.path.join(root, "include", "flatmem", "flatmem.h"))
    ap.add_argument("--include-dir", action="append", default=None, help="where <dlpack/dlpack.h> is (default: the header's include/ and /usr/include)")
    ap.add_argument("--self-test", action="store_true", help="check that deliberate mistakes are reported")
    ap.add_argument("-v", "--verbose", action="store_true")
    args = ap.parse_args(argv)

    include_dirs = args.include_dir or [os.path.dirname(os.path.dirname(os.path.abspath(args.header))), "/usr/include"]
    paths = julia_files(args.julia)
    if not paths:
        print(f"check_ccalls: no .jl files under {args.julia}")
        return 1
    files = {}
    for path in paths:
        with open(path, encoding="utf-8") as f:
            files[path] = f.read()
    with open(args.header, encoding="utf-8") as f:
        header_text = f.read()

    if args.self_test:
        detected, missed = run_self_test(args.header, header_text, include_dirs, files, args.verbose)
        print(f"check_ccalls: self-test detected={detected} missed={missed}")
        return 0 if missed == 0 and detected > 0 else 1

    header = load_header(args.header, include_dirs, text=header_text)
    js = parse_julia(files)
    rep = check(header, js, compiled_layouts(args.header, header_text, include_dirs, header))
    if args.verbose:
        for line in rep.lines:
            print(line)
    for issue in rep.issues:
        print(issue)
    for name, (reason, where) in sorted(js.not_wrapped.items()):
        print(f"check_ccalls: allow-list ({where}): {name} is not wrapped: {reason}")
    rel = ", ".join(os.path.relpath(p) for p in paths)
    print(
        f"check_ccalls: {os.path.relpath(args.header)} ({len(header.functions)} functions, "
        f"{len(header.enums)} enums, {len(header.structs)} structs incl. dlpack.h) vs {rel}: "
        f"{rep.ccalls_ok} of {len(js.ccalls)} ccalls match"
    )
    print(f"check_ccalls: checks passed={rep.passed} failed={len(rep.issues)} ccalls={rep.ccalls_ok}")
    return 0 if not rep.issues else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

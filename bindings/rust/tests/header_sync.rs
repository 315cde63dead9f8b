//! Keeps the hand-written `sys` module in sync with the installed header.
//!
//! The header is the one build.rs found with pkg-config
//! (`$FLATMEM_INCLUDE_DIR/flatmem/flatmem.h`, overridable at run time with
//! the same variable), with the `flatmem/reversible.h`, `flatmem/comm.h` and
//! `flatmem/cyclic.h` it includes (`FLATMEM_EXPERIMENTAL` is not defined:
//! what it guards is not mirrored). The C compiler (`$CC`, default `cc`) preprocesses it
//! (so FLATMEM_API, the include guard and the `extern "C"` wrapper are gone
//! and `<dlpack/dlpack.h>` is in), then this test parses the declarations
//! and src/sys.rs + src/dlpack.rs, and checks:
//!
//! - every `flatmem_*` function of the header is declared in Rust and vice
//!   versa, with the same return type and the same parameters (count, names,
//!   types, with `const T *` = `*const T`);
//! - every `flatmem_*` enum, struct and opaque handle type is declared, each
//!   enumerator is a Rust constant of the enum's alias type with the value
//!   the compiler gives it, and the alias has the compiler's size and
//!   signedness for the enum;
//! - every struct (flatmem's options and the DLPack structs the crate
//!   declares) has the same fields in the same order with the same types,
//!   and the same offsets, field sizes, size and alignment as the compiler
//!   lays out (array fields, `T name[N]`, are `[T; N]` in Rust, N a literal
//!   or a constant of sys.rs);
//! - every `flatmem_*` function-pointer typedef (the reversible callbacks)
//!   is a `pub type X = Option<unsafe extern "C" fn(..) -> R>;` with the same
//!   parameters (names and types) and return type; function-pointer fields
//!   (`parallel_for`) are compared the same way, nested ones included;
//! - every integer `FLATMEM_*` / `DLPACK_VERSION` macro has a Rust constant
//!   of the same value;
//! - every `FLATMEM_*_INIT` initialiser macro (`{ ... }`) is covered: a
//!   `*_OPTIONS_INIT` has its `*_options_init()` function, which the
//!   `*_init_matches_macro` tests compare with the macro's expansion; any
//!   other (`FLATMEM_CYCLIC_SCHEDULE_INIT`, which has no function) is a
//!   `pub const` of its struct type in sys.rs, compared field by field with
//!   the expansion, and a struct-typed const in sys.rs must be such a macro.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::Command;

use flatmem::sys;

// ---------------------------------------------------------------------------
// Tokens
// ---------------------------------------------------------------------------

fn is_ident(t: &str) -> bool {
    t.chars().next().map_or(false, |c| c.is_ascii_alphabetic() || c == '_')
        && t.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
}

/// Identifiers, numbers (with suffixes), string literals, `::`, `->` and
/// single punctuation characters. Comments are removed first.
fn tokenize(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let chars: Vec<char> = strip_comments(text).chars().collect();
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        if c.is_whitespace() {
            i += 1;
        } else if c.is_ascii_alphanumeric() || c == '_' {
            let start = i;
            while i < chars.len() && (chars[i].is_ascii_alphanumeric() || chars[i] == '_') {
                i += 1;
            }
            out.push(chars[start..i].iter().collect());
        } else if c == '"' {
            let start = i;
            i += 1;
            while i < chars.len() && chars[i] != '"' {
                i += if chars[i] == '\\' { 2 } else { 1 };
            }
            i += 1;
            out.push(chars[start..i.min(chars.len())].iter().collect());
        } else if (c == ':' || c == '-') && i + 1 < chars.len() && (chars[i + 1] == ':' || chars[i + 1] == '>') {
            out.push(chars[i..i + 2].iter().collect());
            i += 2;
        } else {
            out.push(c.to_string());
            i += 1;
        }
    }
    out
}

fn strip_comments(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while !rest.is_empty() {
        if rest.starts_with("//") {
            rest = rest.find('\n').map_or("", |n| &rest[n..]);
        } else if rest.starts_with("/*") {
            rest = rest[2..].find("*/").map_or("", |n| &rest[n + 4..]);
            out.push(' ');
        } else if rest.starts_with('"') {
            let end = rest[1..].find('"').map_or(rest.len(), |n| n + 2);
            out.push_str(&rest[..end]);
            rest = &rest[end..];
        } else {
            let c = rest.chars().next().unwrap();
            out.push(c);
            rest = &rest[c.len_utf8()..];
        }
    }
    out
}

/// Splits at `sep` tokens outside (), [], {} and <>.
fn split_top(tokens: &[String], sep: &str) -> Vec<Vec<String>> {
    let mut parts = vec![Vec::new()];
    let mut depth = 0i32;
    for t in tokens {
        match t.as_str() {
            "(" | "[" | "{" | "<" => depth += 1,
            ")" | "]" | "}" | ">" => depth -= 1,
            _ => {}
        }
        if depth == 0 && t == sep {
            parts.push(Vec::new());
        } else {
            parts.last_mut().unwrap().push(t.clone());
        }
    }
    if parts.last().map_or(false, |p| p.is_empty()) {
        parts.pop();
    }
    parts
}

/// The tokens between the bracket at `open` and its match, and the index
/// after the closing bracket.
fn bracketed(tokens: &[String], open: usize) -> (Vec<String>, usize) {
    let (o, c) = match tokens[open].as_str() {
        "(" => ("(", ")"),
        "{" => ("{", "}"),
        other => panic!("not a bracket: {}", other),
    };
    let mut depth = 0;
    for (n, t) in tokens.iter().enumerate().skip(open) {
        if t == o {
            depth += 1;
        } else if t == c {
            depth -= 1;
            if depth == 0 {
                return (tokens[open + 1..n].to_vec(), n + 1);
            }
        }
    }
    panic!("unbalanced {}", o)
}

fn parse_int(text: &str) -> Option<i64> {
    let t = text.replace('_', "");
    let t = t.trim_end_matches(['u', 'U', 'l', 'L']);
    let (neg, t) = match t.strip_prefix('-') {
        Some(rest) => (true, rest.trim()),
        None => (false, t),
    };
    let v = if let Some(hex) = t.strip_prefix("0x").or_else(|| t.strip_prefix("0X")) {
        i64::from_str_radix(hex, 16).ok()?
    } else {
        t.parse::<i64>().ok()?
    };
    Some(if neg { -v } else { v })
}

// ---------------------------------------------------------------------------
// Declarations, in a form both languages map to
// ---------------------------------------------------------------------------

/// A parameter or field: name and canonical type (Rust spelling, e.g.
/// `*const DLTensor`, `*mut *mut flatmem_contrastive_t`, `usize`, `c_int`).
#[derive(Debug, Clone, PartialEq, Eq)]
struct Decl {
    name: String,
    ty: String,
}

impl std::fmt::Display for Decl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.name, self.ty)
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct Function {
    ret: String,
    params: Vec<Decl>,
}

#[derive(Debug, Default)]
struct Api {
    functions: BTreeMap<String, Function>,
    /// enum alias -> its enumerators (names, and values where literal)
    enums: BTreeMap<String, Vec<(String, Option<i64>)>>,
    structs: BTreeMap<String, Vec<Decl>>,
    opaque: BTreeSet<String>,
    /// C only: function-pointer typedefs, name -> canonical `fn(..) -> R`.
    fn_types: BTreeMap<String, String>,
    /// C only: object-like macros of the headers (`cc -dM`), name -> text.
    macros: BTreeMap<String, String>,
    /// Rust only: `pub type A = T;`
    aliases: BTreeMap<String, String>,
    /// Rust only: `pub const N: T = V;` (type, literal value if any)
    consts: BTreeMap<String, (String, Option<i64>)>,
}

/// C type tokens (no name) in the canonical Rust spelling.
fn c_type(tokens: &[String]) -> Result<String, String> {
    let first_star = tokens.iter().position(|t| t == "*").unwrap_or(tokens.len());
    let base_tokens: Vec<&str> =
        tokens[..first_star].iter().map(String::as_str).filter(|t| *t != "const" && *t != "struct").collect();
    let mut pointee_const = tokens[..first_star].iter().any(|t| t == "const");
    let base = match base_tokens.join(" ").as_str() {
        "void" => "c_void".to_string(),
        "char" => "c_char".to_string(),
        "signed char" => "c_schar".to_string(),
        "unsigned char" => "c_uchar".to_string(),
        "short" => "c_short".to_string(),
        "unsigned short" => "c_ushort".to_string(),
        "int" | "signed" | "signed int" => "c_int".to_string(),
        "unsigned" | "unsigned int" => "c_uint".to_string(),
        "long" => "c_long".to_string(),
        "unsigned long" => "c_ulong".to_string(),
        "long long" => "c_longlong".to_string(),
        "unsigned long long" => "c_ulonglong".to_string(),
        "float" => "f32".to_string(),
        "double" => "f64".to_string(),
        "_Bool" | "bool" => "bool".to_string(),
        "size_t" => "usize".to_string(),
        "ptrdiff_t" | "intptr_t" => "isize".to_string(),
        "uintptr_t" => "usize".to_string(),
        "int8_t" => "i8".to_string(),
        "int16_t" => "i16".to_string(),
        "int32_t" => "i32".to_string(),
        "int64_t" => "i64".to_string(),
        "uint8_t" => "u8".to_string(),
        "uint16_t" => "u16".to_string(),
        "uint32_t" => "u32".to_string(),
        "uint64_t" => "u64".to_string(),
        other if is_ident(other) => other.to_string(),
        other => return Err(format!("unsupported C type `{}` (in `{}`)", other, tokens.join(" "))),
    };
    let mut ty = base;
    for t in &tokens[first_star..] {
        match t.as_str() {
            "*" => {
                ty = format!("*{} {}", if pointee_const { "const" } else { "mut" }, ty);
                pointee_const = false;
            }
            "const" => pointee_const = true, // the pointer itself is const: the next level's pointee
            other => return Err(format!("unsupported C declarator `{}` (in `{}`)", other, tokens.join(" "))),
        }
    }
    Ok(ty)
}

const C_TYPE_WORDS: [&str; 10] =
    ["void", "char", "short", "int", "long", "float", "double", "signed", "unsigned", "const"];

/// A function-pointer declarator `RET ( * NAME ) ( PARAMS )` as a Decl of
/// canonical type `fn(p: T, ..) -> R` (parameters named, `()` for void);
/// None when `tokens` is not one.
fn c_fn_pointer(tokens: &[String], what: &str) -> Option<Result<Decl, String>> {
    let open = tokens.iter().position(|t| t == "(")?;
    if tokens.get(open + 1).map(String::as_str) != Some("*") {
        return None;
    }
    let name = tokens.get(open + 2).filter(|t| is_ident(t))?.clone();
    if tokens.get(open + 3).map(String::as_str) != Some(")") || tokens.get(open + 4).map(String::as_str) != Some("(") {
        return Some(Err(format!("{}: unsupported function-pointer declarator `{}`", what, tokens.join(" "))));
    }
    let (params, after) = bracketed(tokens, open + 4);
    if after != tokens.len() {
        return Some(Err(format!("{}: tokens after the parameter list in `{}`", what, tokens.join(" "))));
    }
    let ret = match c_type(&tokens[..open]) {
        Ok(t) if t == "c_void" => "()".to_string(),
        Ok(t) => t,
        Err(e) => return Some(Err(format!("{}: {}", what, e))),
    };
    let mut decls = Vec::new();
    if !(params.len() == 1 && params[0] == "void") {
        for (n, p) in split_top(&params, ",").iter().enumerate() {
            match c_decl(p, &format!("{} parameter {}", name, n + 1)) {
                Ok(d) => decls.push(d),
                Err(e) => return Some(Err(e)),
            }
        }
    }
    Some(Ok(Decl { name, ty: fn_type(&decls, &ret) }))
}

/// The canonical spelling of a function-pointer type, shared by both sides.
fn fn_type(params: &[Decl], ret: &str) -> String {
    format!("fn({}) -> {}", join(params), ret)
}

/// A C parameter or field declaration `type name` (the name required).
fn c_decl(tokens: &[String], what: &str) -> Result<Decl, String> {
    if let Some(fp) = c_fn_pointer(tokens, what) {
        return fp;
    }
    if tokens.last().map(String::as_str) == Some("]") {
        // An array: T NAME [ N ] -> `[T; N]` (N is a literal once preprocessed).
        let open = tokens.iter().rposition(|t| t == "[").unwrap_or(0);
        let length = tokens[open + 1..tokens.len() - 1].concat();
        return match parse_int(&length) {
            Some(n) if open >= 2 => {
                let element = c_decl(&tokens[..open], what)?;
                Ok(Decl { name: element.name, ty: format!("[{}; {}]", element.ty, n) })
            }
            _ => Err(format!("{}: array `{}`: cannot read its length", what, tokens.join(" "))),
        };
    }
    let last = tokens.last().ok_or_else(|| format!("{}: empty declaration", what))?;
    if tokens.len() < 2 || !is_ident(last) || C_TYPE_WORDS.contains(&last.as_str()) {
        return Err(format!("{}: `{}` has no name (or a declarator this check does not know)", what, tokens.join(" ")));
    }
    Ok(Decl { name: last.clone(), ty: c_type(&tokens[..tokens.len() - 1]).map_err(|e| format!("{}: {}", what, e))? })
}

/// Parses preprocessed C: functions, typedef'd enums and structs, opaque
/// struct typedefs. A flatmem or DLPack declaration that does not parse is
/// an error (kept in `errors` or as a field whose type is the message).
fn parse_c(text: &str, errors: &mut Vec<String>) -> Api {
    let tokens = tokenize(text);
    let mut api = Api::default();
    for stmt in split_top(&tokens, ";") {
        if stmt.is_empty() {
            continue;
        }
        if stmt[0] == "typedef" && stmt.len() > 2 && (stmt[1] == "enum" || stmt[1] == "struct") {
            let open = match stmt.iter().position(|t| t == "{") {
                Some(open) => open,
                None => {
                    // typedef struct tag alias;
                    if stmt[1] == "struct" && stmt.len() == 4 {
                        api.opaque.insert(stmt[3].clone());
                    }
                    continue;
                }
            };
            let (body, after) = bracketed(&stmt, open);
            let alias = match stmt[after..].iter().rev().find(|t| is_ident(t)) {
                Some(a) => a.clone(),
                None => continue,
            };
            if stmt[1] == "enum" {
                let items = split_top(&body, ",")
                    .into_iter()
                    .filter(|i| !i.is_empty())
                    .map(|item| {
                        let value =
                            item.iter().position(|t| t == "=").and_then(|eq| parse_int(&item[eq + 1..].concat()));
                        (item[0].clone(), value)
                    })
                    .collect();
                api.enums.insert(alias, items);
            } else {
                let mut fields = Vec::new();
                for field in split_top(&body, ";") {
                    match c_decl(&field, &format!("struct {}", alias)) {
                        Ok(d) => fields.push(d),
                        Err(e) => {
                            if alias.starts_with("flatmem_") || alias.starts_with("DL") {
                                fields.push(Decl { name: "?".into(), ty: e });
                            }
                        }
                    }
                }
                api.structs.insert(alias, fields);
            }
            continue;
        }
        if stmt[0] == "typedef" {
            // typedef RET (*NAME)(PARAMS);
            match c_fn_pointer(&stmt[1..], "typedef") {
                Some(Ok(d)) => {
                    api.fn_types.insert(d.name, d.ty);
                }
                Some(Err(e)) => errors.push(format!("C: {}", e)),
                None => {}
            }
            continue;
        }
        // A function declaration: RET NAME ( PARAMS )
        let open = match stmt.iter().position(|t| t == "(") {
            Some(open) => open,
            None => continue,
        };
        if open == 0 || !is_ident(&stmt[open - 1]) {
            continue;
        }
        let name = stmt[open - 1].clone();
        if !name.starts_with("flatmem_") {
            continue;
        }
        let (params, after) = bracketed(&stmt, open);
        if after != stmt.len() {
            errors.push(format!("C: {}: unexpected tokens after the parameter list", name));
            continue;
        }
        let ret = match c_type(&stmt[..open - 1]) {
            Ok(t) if t == "c_void" => "()".to_string(),
            Ok(t) => t,
            Err(e) => {
                errors.push(format!("C: {}: return type: {}", name, e));
                continue;
            }
        };
        let mut decls = Vec::new();
        if !(params.len() == 1 && params[0] == "void") {
            for (n, p) in split_top(&params, ",").iter().enumerate() {
                match c_decl(p, &format!("{} parameter {}", name, n + 1)) {
                    Ok(d) => decls.push(d),
                    Err(e) => errors.push(format!("C: {}", e)),
                }
            }
        }
        api.functions.insert(name, Function { ret, params: decls });
    }
    api
}

/// A Rust type in the canonical spelling (paths reduced to their last
/// segment, `*const T` / `*mut T`).
fn rust_type(tokens: &[String]) -> Result<String, String> {
    match tokens.first().map(String::as_str) {
        None => Err("empty type".into()),
        Some("*") => {
            let kind = tokens.get(1).map(String::as_str);
            if kind != Some("const") && kind != Some("mut") {
                return Err(format!("bad pointer `{}`", tokens.join(" ")));
            }
            Ok(format!("*{} {}", kind.unwrap(), rust_type(&tokens[2..])?))
        }
        Some("(") if tokens.len() == 2 && tokens[1] == ")" => Ok("()".into()),
        Some("[") if tokens.last().map(String::as_str) == Some("]") => {
            // `[T; N]`: N as written (a literal or a constant; rust_api resolves constants)
            let inner = &tokens[1..tokens.len() - 1];
            match split_top(inner, ";").as_slice() {
                [element, length] if !length.is_empty() => {
                    Ok(format!("[{}; {}]", rust_type(element)?, length.concat()))
                }
                _ => Err(format!("bad array `{}`", tokens.join(" "))),
            }
        }
        Some(_) if tokens.iter().any(|t| t == "fn") => rust_fn_pointer(tokens),
        Some(_) => {
            let path: Vec<&str> = tokens.iter().map(String::as_str).filter(|t| *t != "::").collect();
            match path.last() {
                Some(last) if path.iter().all(|t| is_ident(t)) => Ok(last.to_string()),
                _ => Err(format!("unsupported Rust type `{}`", tokens.join(" "))),
            }
        }
    }
}

/// `Option<unsafe extern "C" fn(p: T, ..) -> R>` (a C function pointer,
/// NULL = None) in the canonical `fn(p: T, ..) -> R`. Any other spelling of a
/// function pointer is refused: it cannot hold the NULL C may pass.
fn rust_fn_pointer(tokens: &[String]) -> Result<String, String> {
    let t: Vec<&str> = tokens.iter().map(String::as_str).collect();
    let n = t.len();
    if n < 8 || t[..6] != ["Option", "<", "unsafe", "extern", "\"C\"", "fn"] || t[6] != "(" || t[n - 1] != ">" {
        return Err(format!(
            "function pointer `{}`: write Option<unsafe extern \"C\" fn(name: T, ..) -> R>",
            tokens.join(" ")
        ));
    }
    // rustfmt leaves a trailing comma after the fn type when it breaks lines
    let inner = if t[n - 2] == "," { &tokens[..n - 2] } else { &tokens[..n - 1] };
    let (params, after) = bracketed(inner, 6);
    let ret = if after == inner.len() {
        "()".to_string()
    } else if inner[after] == "->" {
        rust_type(&inner[after + 1..])?
    } else {
        return Err(format!("function pointer `{}`: unexpected `{}`", tokens.join(" "), inner[after]));
    };
    let mut decls = Vec::new();
    for (k, p) in split_top(&params, ",").iter().enumerate() {
        decls.push(rust_decl(p, &format!("function pointer parameter {}", k + 1))?);
    }
    Ok(fn_type(&decls, &ret))
}

fn rust_decl(tokens: &[String], what: &str) -> Result<Decl, String> {
    let tokens: Vec<String> = tokens.iter().filter(|t| *t != "pub").cloned().collect();
    match tokens.iter().position(|t| t == ":") {
        Some(1) => {
            Ok(Decl { name: tokens[0].clone(), ty: rust_type(&tokens[2..]).map_err(|e| format!("{}: {}", what, e))? })
        }
        _ => Err(format!("{}: cannot read `{}`", what, tokens.join(" "))),
    }
}

/// Parses the items of src/sys.rs and src/dlpack.rs this crate writes:
/// `pub type`, `pub const`, `#[repr(C)] pub struct`, `extern "C" { pub fn }`.
fn parse_rust(text: &str, api: &mut Api, errors: &mut Vec<String>) {
    let tokens = tokenize(text);
    let mut i = 0;
    let mut repr_c = false;
    while i < tokens.len() {
        let t = tokens[i].as_str();
        let at = |k: usize| tokens.get(i + k).map(String::as_str);
        if t == "#" && at(1) == Some("!") {
            i = bracketed_square(&tokens, i + 2); // #![...]
        } else if t == "#" {
            let end = bracketed_square(&tokens, i + 1);
            repr_c |= tokens[i..end].join("").contains("repr(C)");
            i = end;
        } else if t == "pub" && at(1) == Some("type") {
            let end = i + tokens[i..].iter().position(|t| t == ";").unwrap();
            match rust_type(&tokens[i + 4..end]) {
                Ok(ty) => {
                    api.aliases.insert(tokens[i + 2].clone(), ty);
                }
                Err(e) => errors.push(format!("Rust: type {}: {}", tokens[i + 2], e)),
            }
            i = end + 1;
        } else if t == "pub" && at(1) == Some("const") {
            let end = i + tokens[i..].iter().position(|t| t == ";").unwrap();
            let eq = i + tokens[i..end].iter().position(|t| t == "=").unwrap();
            let name = tokens[i + 2].clone();
            match rust_type(&tokens[i + 4..eq]) {
                Ok(ty) => {
                    let value = parse_int(&tokens[eq + 1..end].concat());
                    api.consts.insert(name, (ty, value));
                }
                Err(e) => errors.push(format!("Rust: const {}: {}", name, e)),
            }
            i = end + 1;
        } else if t == "pub" && at(1) == Some("struct") {
            let name = tokens[i + 2].clone();
            if !repr_c {
                errors.push(format!("Rust: struct {} is not #[repr(C)]", name));
            }
            let open = i + tokens[i..].iter().position(|t| t == "{").unwrap();
            let (body, after) = bracketed(&tokens, open);
            if name.ends_with("_t") && body.first().map_or(false, |t| t.starts_with('_')) {
                api.opaque.insert(name); // opaque handle: private zero-sized fields
            } else {
                let mut fields = Vec::new();
                for f in split_top(&body, ",") {
                    match rust_decl(&f, &format!("struct {}", name)) {
                        Ok(d) => fields.push(d),
                        Err(e) => errors.push(format!("Rust: {}", e)),
                    }
                }
                api.structs.insert(name, fields);
            }
            repr_c = false;
            i = after;
        } else if t == "extern" && at(1) == Some("\"C\"") && at(2) == Some("{") {
            let (body, after) = bracketed(&tokens, i + 2);
            for item in split_top(&body, ";") {
                let fn_at = match item.iter().position(|t| t == "fn") {
                    Some(at) => at,
                    None => continue,
                };
                let name = item[fn_at + 1].clone();
                let (params, after_params) = bracketed(&item, fn_at + 2);
                let ret = if item.get(after_params).map(String::as_str) == Some("->") {
                    rust_type(&item[after_params + 1..])
                } else {
                    Ok("()".to_string())
                };
                let mut decls = Vec::new();
                for (n, p) in split_top(&params, ",").iter().enumerate() {
                    match rust_decl(p, &format!("{} parameter {}", name, n + 1)) {
                        Ok(d) => decls.push(d),
                        Err(e) => errors.push(format!("Rust: {}", e)),
                    }
                }
                match ret {
                    Ok(ret) => {
                        api.functions.insert(name, Function { ret, params: decls });
                    }
                    Err(e) => errors.push(format!("Rust: {}: return type: {}", name, e)),
                }
            }
            i = after;
        } else {
            i += 1;
        }
    }
}

fn bracketed_square(tokens: &[String], open: usize) -> usize {
    assert_eq!(tokens[open], "[");
    let mut depth = 0;
    for (n, t) in tokens.iter().enumerate().skip(open) {
        match t.as_str() {
            "[" => depth += 1,
            "]" => {
                depth -= 1;
                if depth == 0 {
                    return n + 1;
                }
            }
            _ => {}
        }
    }
    panic!("unbalanced [")
}

// ---------------------------------------------------------------------------
// The C side: preprocessing and a layout program
// ---------------------------------------------------------------------------

fn include_dir() -> PathBuf {
    let dir = std::env::var_os("FLATMEM_INCLUDE_DIR")
        .map_or_else(|| PathBuf::from(env!("FLATMEM_INCLUDE_DIR")), PathBuf::from);
    assert!(dir.join("flatmem/flatmem.h").is_file(), "no flatmem/flatmem.h under {}", dir.display());
    dir
}

fn cc() -> String {
    std::env::var("CC").unwrap_or_else(|_| "cc".to_string())
}

fn run(cmd: &mut Command) -> String {
    let out = cmd.output().unwrap_or_else(|e| panic!("cannot run {:?}: {} (a C compiler is needed: set CC)", cmd, e));
    assert!(out.status.success(), "{:?} failed: {}", cmd, String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout).unwrap()
}

fn preprocess(extra: &[&str]) -> String {
    let header = include_dir().join("flatmem/flatmem.h");
    run(Command::new(cc()).args(["-E", "-P", "-std=c11"]).args(extra).arg("-I").arg(include_dir()).arg(&header))
}

fn tmp_dir() -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("flatmem-header-sync");
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// Compiles and runs `main_body` with the header included; returns stdout.
fn c_program(main_body: &str) -> String {
    static COUNT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let n = COUNT.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    let dir = tmp_dir();
    let stem = format!("program-{}-{}", std::process::id(), n); // tests run in parallel
    let src = dir.join(format!("{}.c", stem));
    let exe = dir.join(stem);
    let code = format!(
        "#include <stdio.h>\n#include <stddef.h>\n#include <flatmem/flatmem.h>\nint main(void) {{\n{}  return 0;\n}}\n",
        main_body
    );
    std::fs::write(&src, code).unwrap();
    run(Command::new(cc())
        .args(["-std=c11", "-Wall", "-Werror", "-o"])
        .arg(&exe)
        .arg(&src)
        .arg("-I")
        .arg(include_dir()));
    run(&mut Command::new(&exe))
}

// ---------------------------------------------------------------------------
// The Rust side's layouts
// ---------------------------------------------------------------------------

fn size_of_pointee<T>(_: *const T) -> usize {
    std::mem::size_of::<T>()
}

/// (size, align, [(field, offset, size)]) of a Rust struct, for the fields
/// listed (the list itself is compared with the struct's declaration).
macro_rules! rust_layout {
    ($t:ty { $($f:ident),* $(,)? }) => {{
        let u = std::mem::MaybeUninit::<$t>::uninit();
        let base = u.as_ptr() as usize;
        #[allow(unused_mut)]
        let mut fields: Vec<(String, usize, usize)> = Vec::new();
        $(
            // SAFETY: addr_of! on a field of uninitialised memory creates no reference.
            let p = unsafe { std::ptr::addr_of!((*u.as_ptr()).$f) };
            fields.push((stringify!($f).to_string(), p as usize - base, size_of_pointee(p)));
        )*
        (stringify!($t).rsplit("::").next().unwrap().trim().to_string(),
         (std::mem::size_of::<$t>(), std::mem::align_of::<$t>(), fields))
    }};
}

type Layout = (usize, usize, Vec<(String, usize, usize)>);

/// Every struct `sys` declares. A struct added to sys.rs without a line
/// here fails `header_and_sys_agree` with a request to add it.
fn rust_layouts() -> BTreeMap<String, Layout> {
    [
        rust_layout!(sys::flatmem_contrastive_options {
            struct_size,
            loss,
            num_threads,
            tile_rows,
            tile_cols,
            nonfinite,
            fp32_precision,
            comm,
            logit_cache_bytes
        }),
        rust_layout!(sys::flatmem_reversible_options { struct_size, mode, num_threads }),
        rust_layout!(sys::flatmem_reversible_context {
            struct_size,
            block,
            part,
            phase,
            num_threads,
            seed,
            offset,
            stream,
            parallel_for,
            internal
        }),
        rust_layout!(sys::flatmem_reversible_function { forward, vjp, residual_size, user }),
        rust_layout!(sys::flatmem_reversible_block { f, g }),
        rust_layout!(sys::flatmem_block_options { struct_size, kind, width, heads, hidden, layer_norm_eps, math }),
        rust_layout!(sys::flatmem_comm_unique_id { internal }),
        rust_layout!(sys::flatmem_comm_options { struct_size, timeout_ms, connect_timeout_ms }),
        rust_layout!(sys::flatmem_cyclic_schedule { struct_size, world_size, stages, steps, rule }),
        rust_layout!(sys::flatmem_cyclic_action {
            time_step,
            kind,
            stage,
            step,
            update_stage,
            update_step,
            activations_held,
            phase
        }),
        rust_layout!(sys::flatmem_cyclic_options {
            struct_size,
            stages,
            steps,
            rule,
            activation_bytes,
            timeout_ms,
            nonfinite,
            history
        }),
        rust_layout!(sys::flatmem_cyclic_time_step_stats {
            time_step,
            kind,
            stage,
            step,
            activations_held,
            activation_bytes,
            bytes_sent,
            seconds,
            wait_seconds,
            bytes_scheduled
        }),
        rust_layout!(sys::flatmem_cyclic_summary {
            time_steps,
            bytes_sent,
            messages_sent,
            max_bytes_sent_per_time_step,
            peak_activation_bytes,
            wait_seconds,
            seconds
        }),
        rust_layout!(sys::DLDevice { device_type, device_id }),
        rust_layout!(sys::DLDataType { code, bits, lanes }),
        rust_layout!(sys::DLTensor { data, device, ndim, dtype, shape, strides, byte_offset }),
    ]
    .into_iter()
    .collect()
}

/// Size and signedness of the Rust primitive types aliases may name.
fn rust_prim(ty: &str) -> Option<(usize, bool)> {
    use std::mem::size_of;
    use std::os::raw::*;
    Some(match ty {
        "c_int" => (size_of::<c_int>(), true),
        "c_uint" => (size_of::<c_uint>(), false),
        "c_char" => (1, c_char::MIN != 0),
        "i8" => (1, true),
        "u8" => (1, false),
        "i16" => (2, true),
        "u16" => (2, false),
        "i32" => (4, true),
        "u32" => (4, false),
        "i64" => (8, true),
        "u64" => (8, false),
        "c_long" => (size_of::<c_long>(), true),
        "c_ulong" => (size_of::<c_ulong>(), false),
        _ => return None,
    })
}

/// Rust constants whose value is an expression, evaluated by the compiler.
fn rust_const_value(name: &str, literal: Option<i64>) -> Option<i64> {
    literal.or(match name {
        "FLATMEM_VERSION" => Some(sys::FLATMEM_VERSION as i64),
        _ => None,
    })
}

// ---------------------------------------------------------------------------
// The check
// ---------------------------------------------------------------------------

fn sys_sources() -> String {
    [include_str!("../src/sys.rs"), include_str!("../src/dlpack.rs")].join("\n")
}

/// The header as C sees it: declarations and macros.
fn c_api() -> Api {
    let mut errors = Vec::new();
    let mut api = parse_c(&preprocess(&[]), &mut errors);
    assert!(errors.is_empty(), "cannot read the header:\n  {}", errors.join("\n  "));
    for line in preprocess(&["-dM"]).lines() {
        let mut words = line.split_whitespace();
        if words.next() != Some("#define") {
            continue;
        }
        let name = match words.next() {
            Some(n) if !n.contains('(') => n.to_string(),
            _ => continue, // function-like macro
        };
        api.macros.insert(name, words.collect::<Vec<_>>().join(" "));
    }
    api
}

fn rust_api(source: &str) -> Api {
    let mut errors = Vec::new();
    let mut api = Api::default();
    parse_rust(source, &mut api, &mut errors);
    // Array lengths written as constants (`[c_uchar; FLATMEM_COMM_UNIQUE_ID_BYTES]`) by value.
    let consts = api.consts.clone();
    for field in api.structs.values_mut().flatten() {
        field.ty = resolve_lengths(&field.ty, &consts);
    }
    assert!(errors.is_empty(), "cannot read sys.rs / dlpack.rs:\n  {}", errors.join("\n  "));
    api
}

/// `[T; NAME]` -> `[T; value of the Rust const NAME]` (left as it is when
/// NAME has no literal value: the comparison then reports the difference).
fn resolve_lengths(ty: &str, consts: &BTreeMap<String, (String, Option<i64>)>) -> String {
    let mut out = String::new();
    let mut rest = ty;
    while let Some(at) = rest.find("; ") {
        out.push_str(&rest[..at + 2]);
        rest = &rest[at + 2..];
        let end = rest.find(']').unwrap_or(rest.len());
        match consts.get(&rest[..end]) {
            Some((_, Some(value))) => out.push_str(&value.to_string()),
            _ => out.push_str(&rest[..end]),
        }
        rest = &rest[end..];
    }
    out.push_str(rest);
    out
}

/// Macros the crate mirrors as constants: integer macros of flatmem, and
/// DLPACK_VERSION. Not: empty ones (FLATMEM_API, include guards) and the
/// `{ ... }` initialisers (see initialiser_macro).
fn mirrored_macro(name: &str, value: &str) -> bool {
    (name.starts_with("FLATMEM_") || name == "DLPACK_VERSION") && !value.is_empty() && !initialiser_macro(name, value)
}

/// `FLATMEM_*_INIT { ... }`: a struct initialiser. The `*_OPTIONS_INIT` ones
/// are compared with their `*_options_init()` (the `*_init_matches_macro`
/// tests); the others are struct-typed constants of sys.rs.
fn initialiser_macro(name: &str, value: &str) -> bool {
    name.starts_with("FLATMEM_") && name.ends_with("_INIT") && value.starts_with('{')
}

/// `FLATMEM_X_OPTIONS_INIT` -> `flatmem_x_options_init` (None for another name).
fn options_init_function(macro_name: &str) -> Option<String> {
    macro_name.strip_suffix("_OPTIONS_INIT").map(|stem| format!("{}_options_init", stem.to_lowercase()))
}

/// The base type name of a canonical type (`*const *mut T` -> `T`,
/// `[T; N]` -> `T`).
fn base_type(ty: &str) -> &str {
    match ty.strip_prefix('[') {
        Some(array) => base_type(array.split(';').next().unwrap()),
        None => ty.rsplit(' ').next().unwrap(),
    }
}

/// The C type names the Rust side must declare: flatmem's own, and every
/// struct / enum reachable from a function or a needed struct.
fn needed_types(c: &Api) -> BTreeSet<String> {
    let is_type = |n: &str| c.structs.contains_key(n) || c.enums.contains_key(n) || c.opaque.contains(n);
    let mut needed: BTreeSet<String> = BTreeSet::new();
    let mut todo: Vec<String> = c
        .enums
        .keys()
        .chain(c.structs.keys())
        .chain(c.opaque.iter())
        .filter(|n| n.starts_with("flatmem_"))
        .cloned()
        .collect();
    for f in c.functions.values() {
        todo.extend(f.params.iter().map(|p| base_type(&p.ty).to_string()));
        todo.push(base_type(&f.ret).to_string());
    }
    while let Some(name) = todo.pop() {
        if is_type(&name) && needed.insert(name.clone()) {
            if let Some(fields) = c.structs.get(&name) {
                todo.extend(fields.iter().map(|f| base_type(&f.ty).to_string()));
            }
        }
    }
    needed
}

/// What can be compared by reading both sides: names, types, field order,
/// literal values. Returns the differences.
fn compare_text(c: &Api, rust: &Api) -> Vec<String> {
    let mut errors = Vec::new();

    // functions
    for (name, cf) in &c.functions {
        match rust.functions.get(name) {
            None => errors.push(format!("{}: in the header, not declared in sys.rs", name)),
            Some(rf) => {
                if rf.ret != cf.ret {
                    errors.push(format!("{}: returns `{}` in C, `{}` in Rust", name, cf.ret, rf.ret));
                }
                if rf.params.len() != cf.params.len() {
                    errors.push(format!(
                        "{}: {} parameters in C ({}), {} in Rust ({})",
                        name,
                        cf.params.len(),
                        join(&cf.params),
                        rf.params.len(),
                        join(&rf.params)
                    ));
                    continue;
                }
                for (n, (cp, rp)) in cf.params.iter().zip(&rf.params).enumerate() {
                    if cp != rp {
                        errors.push(format!("{}: parameter {} is `{}` in C, `{}` in Rust", name, n + 1, cp, rp));
                    }
                }
            }
        }
    }
    for name in rust.functions.keys().filter(|n| !c.functions.contains_key(*n)) {
        errors.push(format!("{}: declared in sys.rs, not in the header", name));
    }

    // types
    for name in needed_types(c) {
        if c.opaque.contains(&name) {
            if !rust.opaque.contains(&name) {
                errors.push(format!(
                    "type {}: an opaque handle in C; declare `#[repr(C)] pub struct {} {{ _data: [u8; 0], .. }}`",
                    name, name
                ));
            }
        } else if c.structs.contains_key(&name) {
            if !rust.structs.contains_key(&name) {
                errors.push(format!("struct {}: in the header, not declared in Rust", name));
            }
        } else if !rust.aliases.contains_key(&name) {
            errors.push(format!("enum {}: in the header, no `pub type {} = ...` in Rust", name, name));
        }
    }
    for (name, rfields) in &rust.structs {
        match c.structs.get(name) {
            None => errors.push(format!("struct {}: declared in Rust, not in the headers", name)),
            Some(cfields) if cfields != rfields => errors.push(format!(
                "struct {}: fields are ({}) in C, ({}) in Rust",
                name,
                join(cfields),
                join(rfields)
            )),
            Some(_) => {}
        }
    }
    for name in &rust.opaque {
        if !c.opaque.contains(name) {
            errors.push(format!("opaque type {}: declared in Rust, not in the header", name));
        }
    }

    // function-pointer typedefs
    for (name, cty) in c.fn_types.iter().filter(|(n, _)| n.starts_with("flatmem_")) {
        match rust.aliases.get(name) {
            None => errors.push(format!(
                "type {}: a function-pointer typedef in C; declare `pub type {} = Option<unsafe extern \"C\" fn(..)>;`",
                name, name
            )),
            Some(rty) if rty != cty => {
                errors.push(format!("type {}: `{}` in C, `{}` in Rust", name, cty, rty));
            }
            Some(_) => {}
        }
    }
    for (name, rty) in &rust.aliases {
        if rty.starts_with("fn(") && !c.fn_types.contains_key(name) {
            errors.push(format!("type {}: a function pointer in Rust, no such typedef in the header", name));
        }
    }

    // enumerators and macros
    let mut c_consts: BTreeMap<&str, (Option<&str>, Option<i64>)> = BTreeMap::new();
    for (alias, items) in &c.enums {
        for (item, value) in items {
            c_consts.insert(item, (Some(alias), *value));
        }
        if rust.aliases.contains_key(alias) {
            for (item, _) in items.iter().filter(|(i, _)| !rust.consts.contains_key(i)) {
                errors.push(format!("{}: enumerator of {} not declared in Rust", item, alias));
            }
        }
    }
    for (name, value) in &c.macros {
        if mirrored_macro(name, value) {
            c_consts.insert(name, (None, parse_int(value)));
            if !rust.consts.contains_key(name) {
                errors.push(format!("macro {} ({}): no Rust const in sys.rs", name, value));
            }
        } else if initialiser_macro(name, value) {
            match options_init_function(name) {
                Some(function) => {
                    if !c.functions.contains_key(&function) {
                        errors.push(format!(
                            "macro {}: an options initialiser without {}(); mirror it as a struct const",
                            name, function
                        ));
                    }
                }
                None => match rust.consts.get(name) {
                    Some((ty, _)) if rust.structs.contains_key(ty) => {}
                    _ => errors.push(format!(
                        "macro {} ({}): an initialiser; declare `pub const {}: <struct> = <struct> {{ .. }};` in sys.rs",
                        name, value, name
                    )),
                },
            }
        }
    }
    for (name, (ty, value)) in &rust.consts {
        if rust.structs.contains_key(ty) {
            // A struct initialiser: its fields are compared by schedule_init_matches_macro.
            if !c.macros.get(name).map_or(false, |v| initialiser_macro(name, v)) {
                errors.push(format!(
                    "const {}: a struct const, but the headers have no initialiser macro {}",
                    name, name
                ));
            }
            continue;
        }
        match c_consts.get(name.as_str()) {
            None => errors.push(format!("const {}: neither an enumerator nor a macro of the headers", name)),
            Some((alias, cv)) => {
                if let Some(alias) = alias {
                    if ty != alias {
                        errors.push(format!("{}: has type `{}` in Rust, expected the alias `{}`", name, ty, alias));
                    }
                }
                if let (Some(cv), Some(rv)) = (cv, value) {
                    if cv != rv {
                        errors.push(format!("{}: {} in C, {} in Rust", name, cv, rv));
                    }
                }
            }
        }
    }
    errors
}

/// What needs the compiler: every constant's value, enum sizes and
/// signedness, struct layouts.
fn compare_compiled(c: &Api, rust: &Api) -> Vec<String> {
    let mut errors = Vec::new();
    let mut body = String::new();
    for name in rust.consts.iter().filter(|(_, (ty, _))| !rust.structs.contains_key(ty)).map(|(n, _)| n) {
        let is_macro = c.macros.contains_key(name);
        if is_macro {
            body.push_str("#ifdef ");
            body.push_str(name);
            body.push('\n');
        }
        writeln!(body, "  printf(\"value {n} %lld\\n\", (long long)({n}));", n = name).unwrap();
        if is_macro {
            body.push_str("#endif\n");
        }
    }
    for alias in rust.aliases.keys().filter(|a| c.enums.contains_key(a.as_str())) {
        writeln!(body, "  printf(\"enum {a} %zu %d\\n\", sizeof({a}), (int)(({a})-1 < 0));", a = alias).unwrap();
    }
    for (name, fields) in rust.structs.iter().filter(|(n, _)| c.structs.contains_key(n.as_str())) {
        writeln!(body, "  printf(\"struct {n} %zu %zu\\n\", sizeof({n}), _Alignof({n}));", n = name).unwrap();
        for f in fields {
            writeln!(
                body,
                "  printf(\"field {n} {f} %zu %zu\\n\", offsetof({n}, {f}), sizeof((({n} *)0)->{f}));",
                n = name,
                f = f.name
            )
            .unwrap();
        }
    }
    let mut c_values: BTreeMap<String, i64> = BTreeMap::new();
    let mut c_layouts: BTreeMap<String, Layout> = BTreeMap::new();
    for line in c_program(&body).lines() {
        let w: Vec<&str> = line.split_whitespace().collect();
        match w[0] {
            "value" => {
                c_values.insert(w[1].to_string(), w[2].parse().unwrap());
            }
            "enum" => {
                let (size, signed): (usize, bool) = (w[2].parse().unwrap(), w[3] == "1");
                let rust_ty = &rust.aliases[w[1]];
                match rust_prim(rust_ty) {
                    Some((rs, rsigned)) if rs == size && rsigned == signed => {}
                    got => errors.push(format!(
                        "type {}: the C compiler makes it {} bytes, {}; Rust's `{}` is (bytes, signed) {:?}",
                        w[1],
                        size,
                        if signed { "signed" } else { "unsigned" },
                        rust_ty,
                        got
                    )),
                }
            }
            "struct" => {
                c_layouts.insert(w[1].to_string(), (w[2].parse().unwrap(), w[3].parse().unwrap(), Vec::new()));
            }
            "field" => c_layouts.get_mut(w[1]).unwrap().2.push((
                w[2].to_string(),
                w[3].parse().unwrap(),
                w[4].parse().unwrap(),
            )),
            _ => panic!("unexpected line from the layout program: {}", line),
        }
    }
    for (name, (_, literal)) in rust.consts.iter().filter(|(_, (ty, _))| !rust.structs.contains_key(ty)) {
        let cv = match c_values.get(name) {
            Some(&v) => v,
            None => {
                errors.push(format!("const {}: not defined by the headers", name));
                continue;
            }
        };
        match rust_const_value(name, *literal) {
            Some(rv) if rv == cv => {}
            Some(rv) => errors.push(format!("{}: {} in C, {} in Rust", name, cv, rv)),
            None => errors.push(format!("{}: cannot evaluate its Rust value; add it to rust_const_value", name)),
        }
    }
    let layouts = rust_layouts();
    for (name, rfields) in &rust.structs {
        let cl = match c_layouts.get(name) {
            Some(l) => l,
            None => continue,
        };
        match layouts.get(name) {
            None => errors.push(format!("struct {}: add it to rust_layouts() in tests/header_sync.rs", name)),
            Some(rl) => {
                let listed: Vec<&str> = rl.2.iter().map(|f| f.0.as_str()).collect();
                let declared: Vec<&str> = rfields.iter().map(|f| f.name.as_str()).collect();
                if listed != declared {
                    errors.push(format!(
                        "struct {}: rust_layouts() lists {:?}, sys declares {:?}",
                        name, listed, declared
                    ));
                } else if rl != cl {
                    errors.push(format!(
                        "struct {}: layout (size, align, [(field, offset, size)]) is {:?} in C, {:?} in Rust",
                        name, cl, rl
                    ));
                }
            }
        }
    }
    errors
}

fn join(d: &[Decl]) -> String {
    d.iter().map(|d| d.to_string()).collect::<Vec<_>>().join(", ")
}

#[test]
fn header_and_sys_agree() {
    let (c, rust) = (c_api(), rust_api(&sys_sources()));
    let mut errors = compare_text(&c, &rust);
    errors.extend(compare_compiled(&c, &rust));
    assert!(
        errors.is_empty(),
        "src/sys.rs is out of sync with {}:\n  {}",
        include_dir().join("flatmem/flatmem.h").display(),
        errors.join("\n  ")
    );
}

#[test]
fn the_check_reads_both_sides() {
    // Guard against parsers that silently read nothing.
    let (c, rust) = (c_api(), rust_api(&sys_sources()));
    for api in [&c, &rust] {
        assert!(api.functions.len() >= 11, "{:?}", api.functions.keys());
        let create = &api.functions["flatmem_contrastive_create"];
        assert_eq!(create.ret, "flatmem_status");
        assert_eq!(
            join(&create.params),
            "out: *mut *mut flatmem_contrastive_t, options: *const flatmem_contrastive_options"
        );
        assert_eq!(api.functions["flatmem_version_string"].ret, "*const c_char");
        assert_eq!(api.functions["flatmem_version"].params, vec![]);
        assert_eq!(api.structs["DLTensor"].len(), 7);
        assert_eq!(api.structs["flatmem_contrastive_options"].len(), 9);
        assert_eq!(
            api.structs["flatmem_contrastive_options"].last().map(|d| d.to_string()).unwrap(),
            "logit_cache_bytes: usize"
        );
        assert_eq!(
            join(&api.functions["flatmem_cpu_isa_get"].params),
            "in_use: *mut flatmem_cpu_isa, best: *mut flatmem_cpu_isa"
        );
        assert_eq!(api.functions["flatmem_cpu_isa_name"].ret, "*const c_char");
        assert!(api.opaque.contains("flatmem_contrastive_t"));
        // comm.h (included by flatmem.h): functions, opaque types, the array field
        assert_eq!(
            join(&api.functions["flatmem_comm_create_local"].params),
            "comms: *mut *mut flatmem_comm_t, world_size: i32, options: *const flatmem_comm_options"
        );
        assert!(api.opaque.contains("flatmem_comm_t") && api.opaque.contains("flatmem_comm_request_t"));
        assert_eq!(join(&api.structs["flatmem_comm_unique_id"]), "internal: [c_uchar; 128]");
        assert!(!api.functions.contains_key("flatmem_contrastive_ring_stats_get"), "experimental");
        // cyclic.h: the schedule queries, the handle, a pointer field, f64 fields
        assert_eq!(
            join(&api.functions["flatmem_cyclic_schedule_action"].params),
            "schedule: *const flatmem_cyclic_schedule, rank: i32, time_step: i64, action: *mut flatmem_cyclic_action"
        );
        assert!(api.opaque.contains("flatmem_cyclic_t"));
        assert!(api.structs["flatmem_cyclic_options"].iter().any(|d| d.to_string() == "activation_bytes: *const i64"));
        assert_eq!(api.structs["flatmem_cyclic_summary"].last().map(|d| d.to_string()).unwrap(), "seconds: f64");
        assert_eq!(api.structs["flatmem_cyclic_action"].len(), 8);
    }
    assert!(c.enums["flatmem_cyclic_action_kind"].iter().any(|(n, v)| n == "FLATMEM_CYCLIC_DONE" && *v == Some(3)));
    // the initialisers: one with a function, one without (a struct const of sys.rs)
    let schedule_init = &c.macros["FLATMEM_CYCLIC_SCHEDULE_INIT"];
    assert!(initialiser_macro("FLATMEM_CYCLIC_SCHEDULE_INIT", schedule_init), "{}", schedule_init);
    assert!(!mirrored_macro("FLATMEM_CYCLIC_SCHEDULE_INIT", schedule_init));
    assert!(initialiser_macro("FLATMEM_CYCLIC_OPTIONS_INIT", &c.macros["FLATMEM_CYCLIC_OPTIONS_INIT"]));
    assert_eq!(options_init_function("FLATMEM_CYCLIC_OPTIONS_INIT").as_deref(), Some("flatmem_cyclic_options_init"));
    assert_eq!(options_init_function("FLATMEM_CYCLIC_SCHEDULE_INIT"), None);
    assert_eq!(rust.consts["FLATMEM_CYCLIC_SCHEDULE_INIT"].0, "flatmem_cyclic_schedule");
    assert!(c.enums["flatmem_status"].iter().any(|(n, v)| n == "FLATMEM_STATUS_COMM_POISONED" && *v == Some(9)));
    assert_eq!(c.macros["FLATMEM_COMM_UNIQUE_ID_BYTES"], "128");
    assert!(c.enums["flatmem_status"].iter().any(|(n, v)| n == "FLATMEM_STATUS_NON_FINITE" && *v == Some(5)));
    assert_eq!(c.macros["FLATMEM_VERSION_MINOR"], "1");
    assert_eq!(rust.consts["FLATMEM_STATUS_NON_FINITE"], ("flatmem_status".to_string(), Some(5)));
    assert!(needed_types(&c).contains("DLDataType"), "{:?}", needed_types(&c));
    // function pointers are read on both sides, nested ones included
    let fwd = "fn(user: *mut c_void, context: *const flatmem_reversible_context, x: *const DLTensor, \
               y: *mut DLTensor, residuals: *mut c_void) -> flatmem_status";
    assert_eq!(c.fn_types["flatmem_reversible_forward_fn"], fwd);
    assert_eq!(rust.aliases["flatmem_reversible_forward_fn"], fwd);
    for api in [&c, &rust] {
        let context = &api.structs["flatmem_reversible_context"];
        let pf = context.iter().find(|d| d.name == "parallel_for").expect("parallel_for");
        assert!(pf.ty.contains("body: fn(arg: *mut c_void, item: i64, thread: i32) -> ()"), "{}", pf.ty);
        assert!(api.opaque.contains("flatmem_reversible_t") && api.opaque.contains("flatmem_block_t"));
    }
}

#[test]
fn the_check_catches_differences() {
    // Edit a copy of sys.rs / dlpack.rs the ways a stale binding would
    // differ; each edit must be reported.
    let cases: &[(&str, &str, &str)] = &[
        ("        k: *const DLTensor,\n        bytes", "        k: *mut DLTensor,\n        bytes", "parameter 3"),
        (
            "        q: *const DLTensor,\n        k: *const DLTensor,\n        labels",
            "        k: *const DLTensor,\n        q: *const DLTensor,\n        labels",
            "flatmem_contrastive_forward: parameter 2",
        ),
        (
            "        stream: *mut c_void,\n    ) -> flatmem_status;\n\n    // Reversible segments",
            "    ) -> flatmem_status;\n\n    // Reversible segments",
            "flatmem_contrastive_backward: 14 parameters in C",
        ),
        ("pub fn flatmem_version() -> c_int;", "pub fn flatmem_version() -> i64;", "returns"),
        ("    pub fn flatmem_last_error() -> *const c_char;", "", "flatmem_last_error: in the header"),
        (
            "    pub tile_rows: i32,\n    pub tile_cols: i32,",
            "    pub tile_cols: i32,\n    pub tile_rows: i32,",
            "struct flatmem_contrastive_options: fields",
        ),
        ("    pub lanes: u16,", "    pub lanes: u32,", "struct DLDataType"),
        ("FLATMEM_STATUS_NON_FINITE: flatmem_status = 5", "FLATMEM_STATUS_NON_FINITE: flatmem_status = 7", "5 in C, 7"),
        ("pub const FLATMEM_VERSION_MINOR: c_int = 1;", "pub const FLATMEM_VERSION_MINOR: c_int = 2;", "1 in C, 2"),
        ("pub const FLATMEM_NONFINITE_PROPAGATE: flatmem_nonfinite_policy = 1;\n", "", "FLATMEM_NONFINITE_PROPAGATE"),
        // function pointers: a typedef's parameter, a nested one, a missing typedef, a bare fn
        (
            "        y: *mut DLTensor,\n        residuals: *mut c_void,",
            "        y: *mut DLTensor,\n        residuals: *const c_void,",
            "type flatmem_reversible_forward_fn: `fn(",
        ),
        ("item: i64, thread: i32", "item: i64, thread: u32", "struct flatmem_reversible_context: fields"),
        (
            "pub type flatmem_reversible_vjp_fn",
            "pub type renamed_vjp_fn",
            "type flatmem_reversible_vjp_fn: a function-pointer",
        ),
        (
            "pub residual_size: flatmem_reversible_residual_size_fn,",
            "pub residual_size: flatmem_reversible_forward_fn,",
            "struct flatmem_reversible_function: fields",
        ),
        (
            "    pub fn flatmem_reversible_callback_error(message: *const c_char);\n",
            "",
            "flatmem_reversible_callback_error",
        ),
        (
            "pub const FLATMEM_BLOCK_NUM_PARAMETERS: c_int = 6;",
            "pub const FLATMEM_BLOCK_NUM_PARAMETERS: c_int = 5;",
            "6 in C, 5",
        ),
        // the block options' appended math field and its enum
        ("    pub math: flatmem_block_math,\n", "", "struct flatmem_block_options: fields"),
        ("pub const FLATMEM_BLOCK_MATH_TF32: flatmem_block_math = 1;\n", "", "FLATMEM_BLOCK_MATH_TF32"),
        (
            "pub const FLATMEM_BLOCK_MATH_TF32: flatmem_block_math = 1;",
            "pub const FLATMEM_BLOCK_MATH_TF32: flatmem_block_math = 2;",
            "1 in C, 2",
        ),
        // comm.h: a new status, the options' comm field, an array length, a function
        ("pub const FLATMEM_STATUS_TIMEOUT: flatmem_status = 7;\n", "", "FLATMEM_STATUS_TIMEOUT"),
        ("    pub comm: *mut flatmem_comm_t,\n", "", "struct flatmem_contrastive_options: fields"),
        // the options' appended logit_cache_bytes: dropped, or moved before comm
        ("    pub logit_cache_bytes: usize,\n", "", "struct flatmem_contrastive_options: fields"),
        (
            "    pub comm: *mut flatmem_comm_t,\n    /// Appended after `comm`: bytes of logit tiles the forward may keep for\n    /// the backward (0 = none; CPU only; must be 0 with a communicator).\n    pub logit_cache_bytes: usize,",
            "    pub logit_cache_bytes: usize,\n    pub comm: *mut flatmem_comm_t,",
            "struct flatmem_contrastive_options: fields",
        ),
        // the CPU instruction set: an enumerator, a parameter, a function
        ("pub const FLATMEM_CPU_ISA_AVX2: flatmem_cpu_isa = 2;", "pub const FLATMEM_CPU_ISA_AVX2: flatmem_cpu_isa = 3;", "2 in C, 3"),
        ("pub const FLATMEM_CPU_ISA_AVX512: flatmem_cpu_isa = 3;\n", "", "FLATMEM_CPU_ISA_AVX512"),
        (
            "pub fn flatmem_cpu_isa_set(isa: flatmem_cpu_isa)",
            "pub fn flatmem_cpu_isa_set(isa: *const flatmem_cpu_isa)",
            "flatmem_cpu_isa_set: parameter 1",
        ),
        (
            "    pub fn flatmem_cpu_isa_name(isa: flatmem_cpu_isa) -> *const c_char;\n",
            "",
            "flatmem_cpu_isa_name: in the header",
        ),
        (
            "pub internal: [c_uchar; FLATMEM_COMM_UNIQUE_ID_BYTES],",
            "pub internal: [c_uchar; 64],",
            "struct flatmem_comm_unique_id: fields",
        ),
        (
            "    pub fn flatmem_comm_health(comm: *const flatmem_comm_t) -> flatmem_status;\n",
            "",
            "flatmem_comm_health: in the header",
        ),
        // cyclic.h: an enumerator, field order, a parameter, a function, a
        // field type, the struct initialiser const
        ("pub const FLATMEM_CYCLIC_NEWEST: flatmem_cyclic_rule = 1;\n", "", "FLATMEM_CYCLIC_NEWEST"),
        (
            "    pub update_stage: i32,\n    pub update_step: i64,",
            "    pub update_step: i64,\n    pub update_stage: i32,",
            "struct flatmem_cyclic_action: fields",
        ),
        ("        stage: i32,\n        delay: *mut i32,", "        stage: i32,\n        delay: *mut i64,", "flatmem_cyclic_schedule_delay: parameter 4"),
        (
            "    pub fn flatmem_cyclic_reduce(handle: *mut flatmem_cyclic_t, stage: i32, gradient: *mut DLTensor) -> flatmem_status;\n",
            "",
            "flatmem_cyclic_reduce: in the header",
        ),
        (
            "    pub seconds: f64,\n    pub wait_seconds: f64,",
            "    pub seconds: f32,\n    pub wait_seconds: f64,",
            "struct flatmem_cyclic_time_step_stats: fields",
        ),
        (
            "pub const FLATMEM_CYCLIC_SCHEDULE_INIT: flatmem_cyclic_schedule",
            "pub const FLATMEM_CYCLIC_SCHEDULE_DEFAULTS: flatmem_cyclic_schedule",
            "macro FLATMEM_CYCLIC_SCHEDULE_INIT",
        ),
        (
            "pub const FLATMEM_CYCLIC_SCHEDULE_INIT: flatmem_cyclic_schedule",
            "pub const FLATMEM_CYCLIC_SCHEDULE_DEFAULTS: flatmem_cyclic_schedule",
            "const FLATMEM_CYCLIC_SCHEDULE_DEFAULTS: a struct const",
        ),
    ];
    let c = c_api();
    let source = sys_sources();
    for &(from, to, expect) in cases {
        assert!(source.contains(from), "test case no longer applies: {:?}", from);
        let errors = compare_text(&c, &rust_api(&source.replacen(from, to, 1)));
        assert!(
            errors.iter().any(|e| e.contains(expect)),
            "edit {:?} -> {:?} not reported as {:?}: {:?}",
            from,
            to,
            expect,
            errors
        );
    }
}

#[test]
fn options_init_matches_macro() {
    // FLATMEM_CONTRASTIVE_OPTIONS_INIT as the compiler expands it, against
    // the function the crate calls.
    let out = c_program(
        "  flatmem_contrastive_options o = FLATMEM_CONTRASTIVE_OPTIONS_INIT;\n  printf(\"%zu %d %d %d %d %d %lld %d %zu\\n\", \
         o.struct_size, (int)o.loss, (int)o.num_threads, (int)o.tile_rows, (int)o.tile_cols, (int)o.nonfinite, \
         (long long)o.fp32_precision, o.comm == NULL, o.logit_cache_bytes);\n",
    );
    let mut raw = sys::flatmem_contrastive_options {
        struct_size: 0,
        loss: 9,
        num_threads: 9,
        tile_rows: 9,
        tile_cols: 9,
        nonfinite: 9,
        fp32_precision: 9,
        comm: std::ptr::NonNull::dangling().as_ptr(),
        logit_cache_bytes: 9,
    };
    // SAFETY: a valid options struct.
    assert_eq!(unsafe { sys::flatmem_contrastive_options_init(&mut raw) }, sys::FLATMEM_STATUS_SUCCESS);
    let rust = format!(
        "{} {} {} {} {} {} {} {} {}",
        raw.struct_size,
        raw.loss,
        raw.num_threads,
        raw.tile_rows,
        raw.tile_cols,
        raw.nonfinite,
        raw.fp32_precision,
        raw.comm.is_null() as i32,
        raw.logit_cache_bytes
    );
    assert_eq!(out.trim(), rust);
    // The crate's own options start from the same defaults, without a
    // communicator; the builder sets the logit cache budget and nothing else.
    let built = flatmem::Options::new().to_raw().unwrap();
    assert!(built.comm.is_null());
    assert_eq!(built.logit_cache_bytes, raw.logit_cache_bytes);
    let cached = flatmem::Options::new().logit_cache_bytes(4096).to_raw().unwrap();
    assert_eq!(cached, sys::flatmem_contrastive_options { logit_cache_bytes: 4096, ..built });
}

#[test]
fn comm_options_init_matches_macro() {
    let out = c_program(
        "  flatmem_comm_options o = FLATMEM_COMM_OPTIONS_INIT;\n  printf(\"%zu %lld %lld\\n\", o.struct_size, \
         (long long)o.timeout_ms, (long long)o.connect_timeout_ms);\n",
    );
    let mut raw = sys::flatmem_comm_options { struct_size: 0, timeout_ms: 9, connect_timeout_ms: 9 };
    // SAFETY: a valid options struct of this declaration.
    assert_eq!(unsafe { sys::flatmem_comm_options_init(&mut raw) }, sys::FLATMEM_STATUS_SUCCESS);
    assert_eq!(out.trim(), format!("{} {} {}", raw.struct_size, raw.timeout_ms, raw.connect_timeout_ms));
}

#[test]
fn cyclic_options_init_matches_macro() {
    let out = c_program(
        "  flatmem_cyclic_options o = FLATMEM_CYCLIC_OPTIONS_INIT;\n  printf(\"%zu %d %lld %d %d %lld %d %lld\\n\", \
         o.struct_size, (int)o.stages, (long long)o.steps, (int)o.rule, o.activation_bytes == NULL, \
         (long long)o.timeout_ms, (int)o.nonfinite, (long long)o.history);\n",
    );
    let mut raw = sys::flatmem_cyclic_options {
        struct_size: 0,
        stages: 9,
        steps: 9,
        rule: 9,
        activation_bytes: std::ptr::NonNull::dangling().as_ptr(),
        timeout_ms: 9,
        nonfinite: 9,
        history: 9,
    };
    // SAFETY: a valid options struct of this declaration.
    assert_eq!(unsafe { sys::flatmem_cyclic_options_init(&mut raw) }, sys::FLATMEM_STATUS_SUCCESS);
    let rust = format!(
        "{} {} {} {} {} {} {} {}",
        raw.struct_size,
        raw.stages,
        raw.steps,
        raw.rule,
        raw.activation_bytes.is_null() as i32,
        raw.timeout_ms,
        raw.nonfinite,
        raw.history
    );
    assert_eq!(out.trim(), rust);
}

#[test]
fn schedule_init_matches_macro() {
    // FLATMEM_CYCLIC_SCHEDULE_INIT has no *_init function: sys mirrors it as
    // a const, compared here with the compiler's expansion field by field.
    let out = c_program(
        "  flatmem_cyclic_schedule s = FLATMEM_CYCLIC_SCHEDULE_INIT;\n  printf(\"%zu %d %d %lld %d\\n\", \
         s.struct_size, (int)s.world_size, (int)s.stages, (long long)s.steps, (int)s.rule);\n",
    );
    let s = sys::FLATMEM_CYCLIC_SCHEDULE_INIT;
    assert_eq!(out.trim(), format!("{} {} {} {} {}", s.struct_size, s.world_size, s.stages, s.steps, s.rule));
    // The crate's Schedule starts from it.
    let raw = flatmem::cyclic::Schedule::new(4, 2, 3, flatmem::cyclic::Rule::Newest).unwrap().to_raw();
    assert_eq!(
        raw,
        sys::flatmem_cyclic_schedule { world_size: 4, stages: 2, steps: 3, rule: sys::FLATMEM_CYCLIC_NEWEST, ..s }
    );
}

#[test]
fn reversible_options_init_matches_macros() {
    let out = c_program(
        "  flatmem_reversible_options r = FLATMEM_REVERSIBLE_OPTIONS_INIT;\n  flatmem_block_options b = \
         FLATMEM_BLOCK_OPTIONS_INIT;\n  printf(\"%zu %d %d | %zu %d %d %d %d %a %d\\n\", r.struct_size, (int)r.mode, \
         (int)r.num_threads, b.struct_size, (int)b.kind, (int)b.width, (int)b.heads, (int)b.hidden, \
         (double)b.layer_norm_eps, (int)b.math);\n",
    );
    let mut r = sys::flatmem_reversible_options { struct_size: 0, mode: 9, num_threads: 9 };
    let mut b = sys::flatmem_block_options {
        struct_size: 0,
        kind: 9,
        width: 9,
        heads: 9,
        hidden: 9,
        layer_norm_eps: 9.0,
        math: 9,
    };
    // SAFETY: valid options structs of these declarations.
    unsafe {
        assert_eq!(sys::flatmem_reversible_options_init(&mut r), sys::FLATMEM_STATUS_SUCCESS);
        assert_eq!(sys::flatmem_block_options_init(&mut b), sys::FLATMEM_STATUS_SUCCESS);
    }
    // %a of 0.0 is "0x0p+0"; the library's default eps is exactly the macro's 0.0f.
    assert_eq!(b.layer_norm_eps, 0.0);
    let rust = format!(
        "{} {} {} | {} {} {} {} {} 0x0p+0 {}",
        r.struct_size, r.mode, r.num_threads, b.struct_size, b.kind, b.width, b.heads, b.hidden, b.math
    );
    assert_eq!(out.trim(), rust);
    assert_eq!(b.math, sys::FLATMEM_BLOCK_MATH_FP32);
    // The crate's BlockOptions start from the same defaults.
    let built = flatmem::BlockOptions::mlp(4).to_raw().unwrap();
    assert_eq!(built.math, sys::FLATMEM_BLOCK_MATH_FP32);
    assert_eq!(built.struct_size, b.struct_size);
    let tf32 = flatmem::BlockOptions::mlp(4).math(flatmem::BlockMath::Tf32).to_raw().unwrap();
    assert_eq!(tf32, sys::flatmem_block_options { math: sys::FLATMEM_BLOCK_MATH_TF32, ..built });
}

#[test]
fn linked_library_is_the_header_version() {
    assert_eq!(flatmem::HEADER_VERSION.packed(), sys::FLATMEM_VERSION);
    assert_eq!(flatmem::version(), flatmem::HEADER_VERSION);
    assert_eq!(flatmem::check_version().unwrap(), flatmem::HEADER_VERSION);
    assert_eq!(flatmem::version_string(), flatmem::HEADER_VERSION.to_string());
    assert_eq!(env!("FLATMEM_PC_VERSION"), flatmem::HEADER_VERSION.to_string(), "flatmem.pc's Version");
}

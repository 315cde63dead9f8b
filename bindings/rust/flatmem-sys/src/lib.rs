//! Raw declarations of flatmem's C ABI: `include/flatmem/flatmem.h` and the
//! `flatmem/reversible.h`, `flatmem/comm.h` and `flatmem/cyclic.h` it
//! includes, with the DLPack structs of `<dlpack/dlpack.h>` they take.
//!
//! `src/bindings.rs` is bindgen's output for the installed header, checked
//! in; `scripts/check-bindgen.sh PREFIX` regenerates it and fails on any
//! byte of difference (`--write` replaces it), see README.md for the exact
//! command. Everything keeps its C name. Enums are integer aliases with one
//! constant per enumerator (`flatmem_status`, `FLATMEM_STATUS_SUCCESS`), not
//! Rust enums: the C side may hand back any value. What the header keeps
//! behind `FLATMEM_EXPERIMENTAL` is not declared. Initialiser macros
//! (`FLATMEM_*_INIT`) are not either: call the `*_options_init` functions.
//! Every function that fills a struct takes its size after the pointer (an
//! array, the element size): pass `size_of` of the declaration here.
//!
//! The build script finds the library with `pkg-config flatmem` and links it
//! (see build.rs); the safe API is the `flatmem` crate.
#![allow(non_camel_case_types, non_upper_case_globals, non_snake_case)]
// bindgen's layout tests dereference a MaybeUninit pointer; its docs come
// from the header's comments verbatim.
#![allow(unknown_lints, clippy::all, rustdoc::all)]
// PartialEq on the structs with callback fields compares function pointers.
#![allow(unpredictable_function_pointer_comparisons)]

include!("bindings.rs");

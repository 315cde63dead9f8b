//! The size rule of flatmem.h's conventions, through the raw `sys`
//! functions with the mirror of a newer header (one field appended): the
//! library reads a longer options struct while its extra bytes are 0 and
//! refuses it (UNSUPPORTED) when one is set; it fills a longer output with
//! its fields and zeros past them, a shorter one with the prefix; a size of 0
//! or above FLATMEM_MAX_STRUCT_SIZE is INVALID_ARGUMENT and writes nothing.

use std::ffi::CStr;
use std::mem::size_of;

use flatmem::cyclic::{Rule, Schedule};
use flatmem::sys;

/// `T` as a header one field newer than the library's declares it.
#[repr(C)]
#[derive(Debug, Default, Clone, Copy, PartialEq)]
struct Newer<T> {
    known: T,
    unknown: u64,
}

impl<T> Newer<T> {
    fn as_mut_ptr(&mut self) -> *mut T {
        (self as *mut Newer<T>).cast()
    }
}

fn last_error() -> String {
    // SAFETY: the library's per-thread NUL-terminated message.
    unsafe { CStr::from_ptr(sys::flatmem_last_error()) }.to_string_lossy().into_owned()
}

#[test]
fn newer_options_are_read_with_their_unknown_field_zero_and_refused_with_it_set() {
    let known = size_of::<sys::flatmem_contrastive_options>();
    let size = size_of::<Newer<sys::flatmem_contrastive_options>>();
    let mut exact = sys::flatmem_contrastive_options::default();
    let mut newer = Newer { known: exact, unknown: u64::MAX };
    // SAFETY: writable structs of `known` and `size` bytes.
    unsafe {
        assert_eq!(sys::flatmem_contrastive_options_init(&mut exact, known), sys::FLATMEM_STATUS_SUCCESS);
        assert_eq!(sys::flatmem_contrastive_options_init(newer.as_mut_ptr(), size), sys::FLATMEM_STATUS_SUCCESS);
    }
    // The defaults, struct_size = the caller's size, zeros past the library's fields.
    assert_eq!(newer, Newer { known: sys::flatmem_contrastive_options { struct_size: size, ..exact }, unknown: 0 });

    let mut handle: *mut sys::flatmem_contrastive_t = std::ptr::null_mut();
    // SAFETY: valid options of struct_size bytes; the handle is destroyed.
    unsafe {
        assert_eq!(sys::flatmem_contrastive_create(&mut handle, newer.as_mut_ptr()), sys::FLATMEM_STATUS_SUCCESS);
        assert_eq!(sys::flatmem_contrastive_destroy(handle), sys::FLATMEM_STATUS_SUCCESS);
    }
    newer.unknown = 1;
    handle = std::ptr::null_mut();
    // SAFETY: as above; a refused create sets no handle.
    let status = unsafe { sys::flatmem_contrastive_create(&mut handle, newer.as_mut_ptr()) };
    assert_eq!(status, sys::FLATMEM_STATUS_UNSUPPORTED, "{}", last_error());
    assert!(handle.is_null());
    let expected =
        format!("options: byte {} of the caller's {}-byte struct is set, past the {} bytes", known, size, known);
    assert!(last_error().contains(&expected), "{:?} lacks {:?}", last_error(), expected);
}

#[test]
fn outputs_get_the_callers_size() {
    // Rank 0 of 2, one stage, one step: the forward of stage 0, step 0 at time step 0.
    let schedule = Schedule::new(2, 1, 1, Rule::Delay1).unwrap().to_raw();
    let action = |buffer: &mut Newer<sys::flatmem_cyclic_action>, size: usize| {
        // SAFETY: a valid schedule and a writable buffer of at least `size` bytes.
        unsafe { sys::flatmem_cyclic_schedule_action(&schedule, 0, 0, buffer.as_mut_ptr(), size) }
    };
    let full = size_of::<Newer<sys::flatmem_cyclic_action>>();
    let mut exact = Newer::default();
    assert_eq!(action(&mut exact, size_of::<sys::flatmem_cyclic_action>()), sys::FLATMEM_STATUS_SUCCESS);
    assert_eq!(
        (exact.known.time_step, exact.known.kind, exact.known.stage, exact.known.step),
        (0, sys::FLATMEM_CYCLIC_FORWARD, 0, 0)
    );

    let junk = sys::flatmem_cyclic_action {
        time_step: -7,
        kind: 99,
        stage: 99,
        step: -7,
        update_stage: 99,
        reserved0: 99,
        update_step: -7,
        activations_held: 99,
        phase: 99,
    };
    let garbage = Newer { known: junk, unknown: u64::MAX };
    let mut longer = garbage;
    assert_eq!(action(&mut longer, full), sys::FLATMEM_STATUS_SUCCESS);
    assert_eq!(longer, Newer { unknown: 0, ..exact });

    let mut prefix = garbage;
    assert_eq!(action(&mut prefix, size_of::<i64>()), sys::FLATMEM_STATUS_SUCCESS);
    assert_eq!(prefix, Newer { known: sys::flatmem_cyclic_action { time_step: 0, ..junk }, ..garbage });

    for size in [0, sys::FLATMEM_MAX_STRUCT_SIZE as usize + 1] {
        let mut refused = garbage;
        assert_eq!(action(&mut refused, size), sys::FLATMEM_STATUS_INVALID_ARGUMENT);
        assert!(last_error().contains(&format!("action_size: {};", size)), "{}", last_error());
        assert_eq!(refused, garbage);
    }
}

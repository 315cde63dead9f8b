//! What the device (CUDA / NCCL) tests need to know about this libflatmem
//! without a GPU: whether it was built with the NCCL transport.

use flatmem::{CommOptions, Communicator, Status};

/// The library's words for a build without NCCL.
pub const WITHOUT_NCCL: &str = "built without NCCL";

/// Whether this libflatmem has the NCCL transport, as the library says it
/// (init_device's `Unsupported` message on a one-rank group).
pub fn nccl_built() -> bool {
    let comm = Communicator::create_local(1, &CommOptions::new()).unwrap().remove(0);
    match comm.init_device(0, None) {
        Err(e) if e.status() == Status::Unsupported => !e.message().contains(WITHOUT_NCCL),
        _ => true,
    }
}

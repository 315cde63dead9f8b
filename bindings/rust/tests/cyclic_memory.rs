//! `CyclicOptions::memory` and `Cyclic::reduce_stream`: the option's C
//! values, the library's refusals (a CUDA runtime without the device
//! transport or relayed over N > 2L ranks, a device gradient on a host runtime, a
//! reduce_stream outside a backward) and that a refused device gradient
//! leaves the runtime usable (the host average then comes back, checked
//! against the mean computed here). No CUDA runs on the CI machines: the
//! check that needs a device runtime returns early, saying why, when
//! `init_device` fails.

mod common;

use common::device::{nccl_built, WITHOUT_NCCL};
use common::ranks;
use flatmem::cyclic::{ActionKind, Cyclic, CyclicOptions, DeviceGradient, Memory, Rule};
use flatmem::{sys, Status};

/// next() until the first backward; returns its step.
fn to_backward(cyclic: &mut Cyclic<'_, f64>) -> u64 {
    loop {
        let a = cyclic.next().unwrap().action;
        assert_ne!(a.kind, ActionKind::Done);
        if a.kind == ActionKind::Backward {
            return a.step.unwrap();
        }
    }
}

#[test]
fn memory_maps_to_the_c_enum() {
    assert_eq!(Memory::default(), Memory::Host);
    assert_eq!((Memory::Host.raw(), Memory::Cuda.raw()), (0, 1)); // cyclic.h
    assert_eq!(Memory::Host.raw(), sys::FLATMEM_CYCLIC_MEMORY_HOST);
    assert_eq!(Memory::Cuda.raw(), sys::FLATMEM_CYCLIC_MEMORY_CUDA);
    let options = CyclicOptions::new(1, 1, Rule::Sync);
    assert_eq!(options.clone().memory(Memory::Host), options);
    assert_ne!(options.clone().memory(Memory::Cuda), options);
}

#[test]
fn cuda_memory_needs_the_device_transport() {
    let built = nccl_built();
    ranks::on_threads(2, move |comm| {
        let e = Cyclic::<f64>::new(&comm, &CyclicOptions::new(1, 1, Rule::Sync).memory(Memory::Cuda)).unwrap_err();
        if built {
            assert_eq!(e.status(), Status::InvalidArgument, "{}", e);
            assert!(e.message().contains("options.memory: CUDA"), "{}", e);
            assert!(e.message().contains("rank 0 has no device transport"), "{}", e);
        } else {
            assert_eq!(e.status(), Status::Unsupported, "{}", e);
            assert!(e.message().contains("options.memory: CUDA") && e.message().contains(WITHOUT_NCCL), "{}", e);
        }
        comm.barrier(None).unwrap(); // still healthy
    });
}

/// CUDA memory with the relay: N = 3 ranks over L = 1 stage (N > 2L) is
/// `Unsupported` on every rank before any rank is contacted, naming the
/// shape; N = 1 passes that check and stops at the missing device transport.
/// A build without NCCL refuses both as `Unsupported`, saying so.
#[test]
fn cuda_memory_with_the_relay_needs_n_at_most_2l() {
    let built = nccl_built();
    let options = CyclicOptions::new(1, 1, Rule::Delay1).relayed(vec![4]).memory(Memory::Cuda);
    let shape = options.clone();
    ranks::on_threads(3, move |comm| {
        let e = Cyclic::<f64>::new(&comm, &shape).unwrap_err();
        assert_eq!(e.status(), Status::Unsupported, "{}", e);
        assert!(e.message().contains("options.memory: CUDA"), "{}", e);
        assert!(e.message().contains(if built { "N <= 2L" } else { WITHOUT_NCCL }), "{}", e);
    });
    ranks::on_threads(1, move |comm| {
        let e = Cyclic::<f64>::new(&comm, &options).unwrap_err();
        assert!(e.message().contains("options.memory: CUDA"), "{}", e);
        if built {
            assert_eq!(e.status(), Status::InvalidArgument, "{}", e);
            assert!(e.message().contains("no device transport"), "{}", e);
        } else {
            assert_eq!(e.status(), Status::Unsupported, "{}", e);
            assert!(e.message().contains(WITHOUT_NCCL), "{}", e);
        }
    });
}

#[test]
fn a_device_gradient_on_a_host_runtime_is_refused_naming_the_option() {
    ranks::on_threads(2, |comm| {
        let rank = comm.rank() as f64;
        let mut cyclic = Cyclic::<f64>::new(&comm, &CyclicOptions::new(1, 1, Rule::Delay1)).unwrap();
        // Labelled kDLCUDA; host memory that the library never reads (it refuses the kind first).
        let mut host = vec![1.0f64; 3];
        let fake = DeviceGradient { data: host.as_mut_ptr(), len: host.len(), cuda_device: 0 };
        // SAFETY: refused before anything reads the buffer (see above); null is the default stream.
        let e = unsafe { cyclic.reduce_stream(0, fake, std::ptr::null_mut()) }.unwrap_err();
        assert_eq!(e.status(), Status::InvalidArgument);
        assert!(e.message().contains("backward"), "{}", e);
        assert_eq!(to_backward(&mut cyclic), 0);
        // SAFETY: as above; the stream is ignored for a refused kind.
        let e = unsafe { cyclic.reduce_stream(0, fake, 0x5000 as *mut _) }.unwrap_err();
        assert_eq!(e.status(), Status::InvalidArgument, "{}", e);
        assert!(e.message().contains("options.memory = HOST takes kDLCPU gradients"), "{}", e);
        assert!(e.message().contains("FLATMEM_CYCLIC_MEMORY_CUDA"), "{}", e);
        // The runtime goes on: this rank's host gradient is averaged with the other's.
        let gradient = vec![1.0 + rank, -0.5 * rank, 0.25];
        cyclic.reduce(0, gradient).unwrap();
        let averaged = loop {
            let t = cyclic.next().unwrap();
            assert_ne!(t.action.kind, ActionKind::Done);
            if let Some(average) = t.averaged {
                break average;
            }
        };
        assert_eq!(averaged, vec![(1.0 + 2.0) * 0.5, (0.0 - 0.5) * 0.5, (0.25 + 0.25) * 0.5]);
        assert_eq!(host, vec![1.0; 3]);
    });
}

#[test]
fn a_host_gradient_on_a_cuda_runtime_is_refused_naming_the_option() {
    ranks::on_threads(1, |comm| {
        if let Err(e) = comm.init_device(0, None) {
            eprintln!("skipped: no device transport here: {}", e);
            return;
        }
        let mut cyclic = Cyclic::<f64>::new(&comm, &CyclicOptions::new(1, 1, Rule::Sync).memory(Memory::Cuda)).unwrap();
        to_backward(&mut cyclic);
        let e = cyclic.reduce(0, vec![1.0; 3]).unwrap_err();
        assert_eq!(e.status(), Status::InvalidArgument, "{}", e);
        assert!(e.message().contains("options.memory = CUDA takes kDLCUDA"), "{}", e);
    });
}

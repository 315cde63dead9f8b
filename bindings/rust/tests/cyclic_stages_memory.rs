//! `StagesOptions::memory` and the `CyclicStages::*_stream` calls: the
//! option's C value, the library's refusals (a CUDA runtime without the
//! device transport, ranks that disagree, a device buffer on a host runtime
//! in each of send / receive / accumulate / average) and that a refused
//! device buffer changes nothing (the host run then completes and its
//! average is the mean computed here). No CUDA runs on the CI machines:
//! nothing here needs a device.

mod common;

use common::device::{nccl_built, WITHOUT_NCCL};
use common::ranks;
use flatmem::cyclic::{ActionKind, Memory, Rule};
use flatmem::cyclic_stages::{CyclicStages, StagesOptions};
use flatmem::{DeviceBuffer, Error, Status};

fn options(memory: Memory) -> StagesOptions {
    StagesOptions::new(2, 2, 1, Rule::Delay1, vec![24]).memory(memory)
}

#[test]
fn memory_is_a_field_of_the_options() {
    let host = StagesOptions::new(1, 1, 1, Rule::Sync, vec![]);
    assert_eq!(host.clone().memory(Memory::Host), host);
    assert_ne!(host.clone().memory(Memory::Cuda), host);
}

#[test]
fn cuda_memory_needs_the_device_transport() {
    let built = nccl_built();
    ranks::on_threads(2, move |comm| {
        let e = CyclicStages::<f64>::new(&comm, &options(Memory::Cuda)).unwrap_err();
        assert!(e.message().contains("options.memory: CUDA"), "{}", e);
        if built {
            assert_eq!(e.status(), Status::InvalidArgument, "{}", e);
            assert!(e.message().contains("rank 0 has no device transport"), "{}", e);
            assert!(e.message().contains("flatmem_comm_init_device"), "{}", e);
        } else {
            assert_eq!(e.status(), Status::Unsupported, "{}", e);
            assert!(e.message().contains(WITHOUT_NCCL), "{}", e);
        }
        comm.barrier(None).unwrap(); // still healthy
    });
}

#[test]
fn ranks_that_differ_in_memory_are_named() {
    if !nccl_built() {
        eprintln!("skipped: this flatmem has no NCCL: Memory::Cuda is refused before the ranks compare options");
        return;
    }
    ranks::on_threads(2, |comm| {
        let memory = if comm.rank() == 1 { Memory::Cuda } else { Memory::Host };
        let e = CyclicStages::<f64>::new(&comm, &options(memory)).unwrap_err();
        assert_eq!(e.status(), Status::InvalidArgument, "{}", e);
        assert!(e.message().contains("options.memory: rank 1 passes CUDA, rank 0 HOST"), "{}", e);
    });
}

/// The refusal of a device buffer named `name` on a host runtime.
fn assert_refused(result: Result<(), Error>, name: &str) {
    let e = result.unwrap_err();
    assert_eq!(e.status(), Status::InvalidArgument, "{}", e);
    assert!(e.message().contains(&format!("{}: device type 2", name)), "{}", e);
    assert!(e.message().contains("options.memory = HOST takes kDLCPU tensors"), "{}", e);
    assert!(e.message().contains("FLATMEM_CYCLIC_MEMORY_CUDA"), "{}", e);
}

#[test]
fn device_buffers_on_a_host_runtime_are_refused_naming_the_option() {
    // Two stages, two micro-batches, one step: each call is first tried with
    // a buffer labelled kDLCUDA (host memory the library never touches: it
    // refuses the kind first), on the default stream and on a made-up one,
    // then done on the host; the average is the mean of the gradients 1 and 2.
    ranks::on_threads(2, |comm| {
        let mut h = CyclicStages::<f64>::new(&comm, &options(Memory::Host)).unwrap();
        let mut host = vec![7.0f64; 3];
        let fake = DeviceBuffer { data: host.as_mut_ptr(), len: host.len(), cuda_device: 0 };
        let (mut calls, mut averages) = (Vec::new(), Vec::new());
        loop {
            let a = h.next().unwrap();
            if a.kind == ActionKind::Done {
                break;
            }
            for stream in [std::ptr::null_mut(), 0x5000 as *mut _] {
                // SAFETY: every call is refused before the buffer is read or written (see above).
                unsafe {
                    if a.update_step.is_some() {
                        assert_refused(h.average_stream(fake, stream), "out");
                    }
                    if a.receives {
                        assert_refused(h.receive_stream(fake, stream), "into");
                    }
                    if a.accumulates {
                        assert_refused(h.accumulate_stream(fake, stream), "gradient");
                    }
                    if a.sends {
                        assert_refused(h.send_stream(fake, stream), "tensor");
                    }
                }
            }
            if a.update_step.is_some() {
                averages.push(h.average().unwrap());
                calls.push("average");
            }
            if a.receives {
                h.receive(&mut [0.0f64; 3]).unwrap();
                calls.push("receive");
            }
            if a.accumulates {
                h.accumulate(&[1.0 + a.micro_batch.unwrap() as f64; 3]).unwrap();
                calls.push("accumulate");
            }
            if a.sends {
                h.send(&[0.0f64; 3]).unwrap();
                calls.push("send");
            }
        }
        calls.sort_unstable();
        calls.dedup();
        assert_eq!(calls, ["accumulate", "average", "receive", "send"]);
        assert_eq!(averages, vec![vec![(1.0 + 2.0) * 0.5; 3]]);
        assert_eq!(host, vec![7.0; 3]);
    });
}

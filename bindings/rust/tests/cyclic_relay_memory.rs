//! The ZeRO relay's device calls without a device: `Cyclic::set_shard_stream`
//! and `Cyclic::parameters_stream` of a buffer labelled kDLCUDA on a host
//! relayed runtime are refused naming `options.memory` (with the default and
//! a made-up stream), register and write nothing, and the runtime goes on:
//! the full stage the relay then delivers is the ranks' host shards, and each
//! shard after the run is version 1 by the average computed here. The
//! create-time shape rule (N <= 2L) is in `tests/cyclic_memory.rs`. No CUDA
//! runs on the CI machines.

mod common;

use std::os::raw::c_void;

use common::ranks;
use flatmem::cyclic::{ActionKind, Cyclic, CyclicOptions, Rule};
use flatmem::{DeviceBuffer, Error, Status};

const STREAMS: [usize; 2] = [0, 0x5000]; // null = the legacy default stream, then a made-up one
const LR: f64 = 0.25;

fn assert_refused(e: &Error, name: &str) {
    assert_eq!(e.status(), Status::InvalidArgument, "{}", e);
    assert!(e.message().contains(&format!("{}: device type 2", name)), "{}", e);
    assert!(e.message().contains("options.memory = HOST takes kDLCPU tensors"), "{}", e);
}

#[test]
fn device_shard_and_full_on_a_host_relayed_runtime_are_refused_naming_the_option() {
    ranks::on_threads(2, |comm| {
        let r = comm.rank();
        let initial = [0.5f64, -1.0, 2.0, 4.0, -8.0];
        let options = CyclicOptions::new(1, 1, Rule::Delay1).relayed(vec![initial.len() as i64]);
        let mut cyclic = Cyclic::<f64>::new(&comm, &options).unwrap();
        let range = cyclic.shard_range(0, r).unwrap();
        // Labelled kDLCUDA; host memory that the library never reads (it refuses the kind first).
        let mut host = vec![7.0f64; initial.len()];
        let data = host.as_mut_ptr();
        let fake_shard = DeviceBuffer { data, len: range.len(), cuda_device: 0 };
        let fake_full = DeviceBuffer { data, len: initial.len(), cuda_device: 0 };
        for stream in STREAMS {
            // SAFETY: refused before anything reads the buffer (see above).
            let e = unsafe { cyclic.set_shard_stream(0, fake_shard, stream as *mut c_void) }.unwrap_err();
            assert_refused(&e, "shard");
        }
        assert!(cyclic.shard(0).is_none());
        cyclic.set_shard(0, initial[range.clone()].to_vec()).unwrap();
        let (mut served, mut gradient) = (0, 0.0);
        loop {
            let t = cyclic.next().unwrap();
            if let (Some(u), Some(average)) = (t.action.update, &t.averaged) {
                let shard = cyclic.shard_mut(u.stage).unwrap();
                for (w, g) in shard.iter_mut().zip(&average[range.clone()]) {
                    *w -= LR * g;
                }
            }
            match t.action.kind {
                ActionKind::Done => break,
                ActionKind::Forward | ActionKind::Backward => {}
                _ => continue,
            }
            for stream in STREAMS {
                // SAFETY: as above.
                let e = unsafe { cyclic.parameters_stream(fake_full, stream as *mut c_void) }.unwrap_err();
                assert_refused(&e, "full");
            }
            let mut full = vec![0.0; initial.len()];
            cyclic.parameters(&mut full).unwrap(); // the refusals served nothing
            assert_eq!(full, initial, "version 0, gathered from both ranks' shards");
            served += 1;
            if t.action.kind == ActionKind::Backward {
                gradient = 1.0 + r as f64; // ranks 0 and 1: the average is 1.5
                cyclic.reduce(0, vec![gradient; initial.len()]).unwrap();
            }
        }
        assert_eq!((served, gradient), (2, 1.0 + r as f64));
        let want: Vec<f64> = initial[range].iter().map(|w| w - LR * 1.5).collect();
        assert_eq!(cyclic.shard(0).unwrap(), &want[..]);
        drop(cyclic);
        assert_eq!(host, vec![7.0; initial.len()]);
    });
}

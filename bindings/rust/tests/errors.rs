//! Refused input: every bad argument is an `Err` with the right status and a
//! message naming the argument, and nothing the caller owns is written.

use flatmem::{
    Contrastive, Features, FeaturesMut, GradientsMut, Loss, NonFinite, Options, SigmoidGradientsMut, SigmoidLoss,
    Status,
};

fn clip() -> Contrastive {
    Options::new().threads(2).build().unwrap()
}

fn infonce() -> Contrastive {
    Options::new().loss(Loss::InfoNce).threads(2).build().unwrap()
}

/// Asserts the status and that the message contains every `needle`.
fn expect_err<T: std::fmt::Debug>(result: flatmem::Result<T>, status: Status, needles: &[&str]) -> flatmem::Error {
    let err = result.expect_err("expected an error");
    assert_eq!(err.status(), status, "status of: {}", err);
    for needle in needles {
        assert!(err.message().contains(needle), "message {:?} does not mention {:?}", err.message(), needle);
    }
    // Display: "<status name>: <message>"
    assert_eq!(err.to_string(), format!("{}: {}", status.name(), err.message()));
    err
}

fn ones(n: usize) -> Vec<f32> {
    (0..n).map(|i| 1.0 / (1.0 + i as f32)).collect()
}

#[test]
fn feature_dim_mismatch() {
    let (q, k) = (ones(3 * 4), ones(3 * 5));
    let mut h = clip();
    let err = expect_err(
        h.forward(Features::f32(&q, 3, 4), Features::f32(&k, 3, 5), None, 1.0),
        Status::InvalidArgument,
        &["k"],
    );
    assert!(err.message().contains('4') && err.message().contains('5'), "{}", err);
    // the backward refuses it as well
    let row_lse = vec![0.0f32; 3];
    let col_lse = vec![0.0f32; 3];
    let saved = flatmem::Saved { row_lse: &row_lse, col_lse: Some(&col_lse) };
    expect_err(
        h.backward(Features::f32(&q, 3, 4), Features::f32(&k, 3, 5), None, 1.0, saved, 1.0),
        Status::InvalidArgument,
        &["k"],
    );
}

#[test]
fn symmetric_needs_square() {
    let (q, k) = (ones(3 * 2), ones(4 * 2));
    expect_err(
        clip().forward(Features::f32(&q, 3, 2), Features::f32(&k, 4, 2), None, 1.0),
        Status::InvalidArgument,
        &["k"],
    );
}

#[test]
fn labels_out_of_range_and_wrong_length() {
    let (q, k) = (ones(3 * 2), ones(4 * 2));
    let (qf, kf) = (Features::f32(&q, 3, 2), Features::f32(&k, 4, 2));
    let mut h = infonce();
    for bad in [4i64, -1, i64::MAX] {
        let labels = [0, bad, 1];
        let err = expect_err(h.forward(qf, kf, Some(&labels), 1.0), Status::InvalidArgument, &["labels"]);
        assert!(err.message().contains(&bad.to_string()), "value not named: {}", err);
    }
    expect_err(h.forward(qf, kf, Some(&[0, 1]), 1.0), Status::InvalidArgument, &["labels"]);
    // labels are InfoNCE only
    let (k3, labels) = (ones(3 * 2), [0i64, 1, 2]);
    expect_err(clip().forward(qf, Features::f32(&k3, 3, 2), Some(&labels), 1.0), Status::InvalidArgument, &["labels"]);
    // default labels y_i = i need c >= b
    let k2 = ones(2 * 2);
    expect_err(h.forward(qf, Features::f32(&k2, 2, 2), None, 1.0), Status::InvalidArgument, &[]);
}

#[test]
fn nan_and_inf_are_non_finite() {
    let mut q = ones(3 * 4);
    let k = ones(3 * 4);
    q[2 * 4 + 1] = f32::NAN;
    let mut h = clip();
    let mut row_lse = vec![-7.0f32; 3];
    let mut col_lse = vec![-7.0f32; 3];
    let err = expect_err(
        h.forward_into(Features::f32(&q, 3, 4), Features::f32(&k, 3, 4), None, 1.0, &mut row_lse, Some(&mut col_lse)),
        Status::NonFinite,
        &["q"],
    );
    assert!(err.message().contains('2') && err.message().contains('1'), "row 2, column 1 not named: {}", err);
    assert_eq!((row_lse, col_lse), (vec![-7.0; 3], vec![-7.0; 3]), "outputs written on error");

    let mut k_inf = k.clone();
    k_inf[0] = f32::INFINITY;
    expect_err(
        h.forward(Features::f32(&ones(12), 3, 4), Features::f32(&k_inf, 3, 4), None, 1.0),
        Status::NonFinite,
        &["k"],
    );

    // PROPAGATE: no scan, the NaN reaches the loss.
    let mut p = Options::new().nonfinite(NonFinite::Propagate).build().unwrap();
    let out = p.forward(Features::f32(&q, 3, 4), Features::f32(&k, 3, 4), None, 1.0).unwrap();
    assert!(out.loss.is_nan());
}

#[test]
fn bad_logit_scale() {
    let (q, k) = (ones(4), ones(4));
    let mut h = clip();
    for s in [0.0f32, -1.0, f32::NAN, f32::INFINITY] {
        expect_err(
            h.forward(Features::f32(&q, 2, 2), Features::f32(&k, 2, 2), None, s),
            Status::InvalidArgument,
            &["logit_scale"],
        );
    }
}

#[test]
fn slice_shorter_or_longer_than_shape() {
    // Checked by the crate before calling the library (no out-of-bounds read).
    let (q, k) = (ones(5), ones(6));
    let mut h = clip();
    let err = expect_err(
        h.forward(Features::f32(&q, 2, 3), Features::f32(&k, 2, 3), None, 1.0),
        Status::InvalidArgument,
        &["q", "5", "6"],
    );
    assert!(err.message().starts_with("q:"), "{}", err);
    let q6 = ones(7);
    expect_err(
        h.forward(Features::f32(&k, 2, 3), Features::f32(&q6, 2, 3), None, 1.0),
        Status::InvalidArgument,
        &["k"],
    );
    // and for an output
    let mut dq = vec![0.0f32; 5];
    let out = GradientsMut { dq: Some(FeaturesMut::f32(&mut dq, 2, 3)), ..GradientsMut::default() };
    let (row_lse, col_lse) = (vec![0.0f32; 2], vec![0.0f32; 2]);
    let saved = flatmem::Saved { row_lse: &row_lse, col_lse: Some(&col_lse) };
    expect_err(
        h.backward_into(Features::f32(&k, 2, 3), Features::f32(&k, 2, 3), None, 1.0, saved, 1.0, out),
        Status::InvalidArgument,
        &["dq"],
    );
    // rows * dim overflowing usize
    expect_err(
        h.forward(Features::f32(&q, usize::MAX, 2), Features::f32(&k, 2, 3), None, 1.0),
        Status::InvalidArgument,
        &["q", "overflow"],
    );
}

#[test]
fn zero_extents_are_refused() {
    let mut h = clip();
    let empty: [f32; 0] = [];
    expect_err(
        h.forward(Features::f32(&empty, 0, 3), Features::f32(&empty, 0, 3), None, 1.0),
        Status::InvalidArgument,
        &["q"],
    );
    // d = 0 with a huge row count: refused, not a huge allocation
    let k = [1.0f32; 4];
    for rows in [1usize << 40, usize::MAX] {
        let err = h.forward(Features::f32(&empty, rows, 0), Features::f32(&k, 2, 2), None, 1.0).unwrap_err();
        assert_eq!(err.status(), Status::InvalidArgument);
        let err = h
            .backward(
                Features::f32(&empty, rows, 0),
                Features::f32(&k, 2, 2),
                None,
                1.0,
                &flatmem::ForwardOutput { loss: 0.0, row_lse: vec![], col_lse: None },
                1.0,
            )
            .unwrap_err();
        assert_eq!(err.status(), Status::InvalidArgument);
    }
}

#[test]
fn mixed_dtypes_are_refused() {
    let q = ones(4);
    let k = [0x3f80u16; 4]; // bf16 ones
    expect_err(
        clip().forward(Features::f32(&q, 2, 2), Features::bf16(&k, 2, 2), None, 1.0),
        Status::InvalidArgument,
        &["k"],
    );
}

#[test]
fn saved_state_and_outputs_are_checked() {
    let (q, k) = (ones(6), ones(6));
    let (qf, kf) = (Features::f32(&q, 3, 2), Features::f32(&k, 3, 2));
    let mut h = clip();
    let out = h.forward(qf, kf, None, 2.0).unwrap();

    // row_lse of the wrong length
    let short = flatmem::Saved { row_lse: &out.row_lse[..2], col_lse: out.col_lse.as_deref() };
    expect_err(h.backward(qf, kf, None, 2.0, short, 1.0), Status::InvalidArgument, &["row_lse"]);
    // symmetric backward without col_lse
    let no_col = flatmem::Saved { row_lse: &out.row_lse, col_lse: None };
    expect_err(h.backward(qf, kf, None, 2.0, no_col, 1.0), Status::InvalidArgument, &["col_lse"]);
    // non-finite saved state under the default policy
    let nan_lse = vec![f32::NAN; 3];
    let bad = flatmem::Saved { row_lse: &nan_lse, col_lse: out.col_lse.as_deref() };
    let err = h.backward(qf, kf, None, 2.0, bad, 1.0).unwrap_err();
    assert!(err.message().contains("row_lse"), "{}", err);
    // no output requested at all
    expect_err(
        h.backward_into(qf, kf, None, 2.0, &out, 1.0, GradientsMut::default()),
        Status::InvalidArgument,
        &["dq"],
    );
    // InfoNCE: col_lse must not be given to the forward
    let mut i = infonce();
    let (mut row, mut col) = (vec![0.0f32; 3], vec![0.0f32; 3]);
    expect_err(i.forward_into(qf, kf, None, 2.0, &mut row, Some(&mut col)), Status::InvalidArgument, &["col_lse"]);
    // and the symmetric forward needs it
    expect_err(h.forward_into(qf, kf, None, 2.0, &mut row, None), Status::InvalidArgument, &["col_lse"]);
}

#[test]
fn bad_options() {
    for (options, needle) in [
        (Options::new().threads(100_000), "num_threads"),
        (Options::new().tiles(5000, 0), "tile_rows"),
        (Options::new().tiles(0, 5000), "tile_cols"),
        (Options::new().threads(usize::MAX), "num_threads"),
    ] {
        expect_err(options.build(), Status::InvalidArgument, &[needle]);
    }
}

#[test]
fn error_text_is_per_call() {
    // A failing call's message is copied into the Error: a later successful
    // call does not change it, and a later failure gets its own text.
    let mut h = clip();
    let (q, k, k5) = (ones(4), ones(4), ones(6));
    let first = h.forward(Features::f32(&q, 2, 2), Features::f32(&k5, 2, 3), None, 1.0).unwrap_err();
    let text = first.message().to_string();
    h.forward(Features::f32(&q, 2, 2), Features::f32(&k, 2, 2), None, 1.0).unwrap();
    assert_eq!(first.message(), text);
    let second = h.forward(Features::f32(&q, 2, 2), Features::f32(&k, 2, 2), None, -1.0).unwrap_err();
    assert_ne!(second.message(), text);
    assert!(!text.is_empty());
}

#[test]
fn every_status_round_trips_with_the_library_name() {
    use flatmem::sys;
    let known = [
        (Status::InvalidArgument, sys::FLATMEM_STATUS_INVALID_ARGUMENT, "FLATMEM_STATUS_INVALID_ARGUMENT"),
        (Status::Unsupported, sys::FLATMEM_STATUS_UNSUPPORTED, "FLATMEM_STATUS_UNSUPPORTED"),
        (Status::OutOfMemory, sys::FLATMEM_STATUS_OUT_OF_MEMORY, "FLATMEM_STATUS_OUT_OF_MEMORY"),
        (Status::WorkspaceTooSmall, sys::FLATMEM_STATUS_WORKSPACE_TOO_SMALL, "FLATMEM_STATUS_WORKSPACE_TOO_SMALL"),
        (Status::NonFinite, sys::FLATMEM_STATUS_NON_FINITE, "FLATMEM_STATUS_NON_FINITE"),
        (Status::Internal, sys::FLATMEM_STATUS_INTERNAL, "FLATMEM_STATUS_INTERNAL"),
        (Status::Timeout, sys::FLATMEM_STATUS_TIMEOUT, "FLATMEM_STATUS_TIMEOUT"),
        (Status::PeerFailure, sys::FLATMEM_STATUS_PEER_FAILURE, "FLATMEM_STATUS_PEER_FAILURE"),
        (Status::CommPoisoned, sys::FLATMEM_STATUS_COMM_POISONED, "FLATMEM_STATUS_COMM_POISONED"),
    ];
    for (status, raw, name) in known {
        assert_eq!(Status::from_raw(raw), status);
        assert_eq!(status.raw(), raw);
        assert_eq!(status.name(), name);
    }
    let unknown = Status::from_raw(sys::FLATMEM_STATUS_COMM_POISONED + 1);
    assert_eq!(unknown, Status::Unknown(10));
    assert_eq!(unknown.name(), "FLATMEM_STATUS_UNKNOWN");
}

fn sigmoid() -> SigmoidLoss {
    SigmoidLoss::new(&Options::new().threads(2)).unwrap()
}

/// The sigmoid loss's three calls on the same arguments, each refused with
/// `status` naming every `needle`, and nothing written (outputs prefilled
/// with a sentinel).
fn sigmoid_refused(
    q: Features<'_>,
    k: Features<'_>,
    labels: Option<&[i64]>,
    (s, t): (f32, f32),
    status: Status,
    needles: &[&str],
) {
    let mut h = sigmoid();
    expect_err(h.forward(q, k, labels, s, t), status, needles);
    let (mut dq, mut dk, mut ds, mut dt) =
        (vec![-7.0f32; q.rows() * q.dim()], vec![-7.0f32; k.rows() * k.dim()], -7.0f32, -7.0f32);
    for backward in [false, true] {
        let out = SigmoidGradientsMut {
            dq: Some(FeaturesMut::f32(&mut dq, q.rows(), q.dim())),
            dk: Some(FeaturesMut::f32(&mut dk, k.rows(), k.dim())),
            dlogit_scale: Some(&mut ds),
            dlogit_bias: Some(&mut dt),
        };
        if backward {
            expect_err(h.backward_into(q, k, labels, s, t, 1.0, out), status, needles);
        } else {
            expect_err(h.value_and_grad_into(q, k, labels, s, t, out), status, needles);
        }
    }
    expect_err(h.value_and_grad(q, k, labels, s, t), status, needles);
    expect_err(h.backward(q, k, labels, s, t, 1.0), status, needles);
    assert!(dq.iter().chain(&dk).chain([&ds, &dt]).all(|&v| v == -7.0), "outputs written on error");
}

#[test]
fn sigmoid_bad_scale_and_bias() {
    let (q, k) = (ones(4), ones(4));
    let (qf, kf) = (Features::f32(&q, 2, 2), Features::f32(&k, 2, 2));
    for s in [0.0f32, -1.0, f32::NAN, f32::INFINITY] {
        sigmoid_refused(qf, kf, None, (s, -10.0), Status::InvalidArgument, &["logit_scale"]);
    }
    for t in [f32::NAN, f32::INFINITY, f32::NEG_INFINITY] {
        sigmoid_refused(qf, kf, None, (10.0, t), Status::InvalidArgument, &["logit_bias"]);
    }
}

#[test]
fn sigmoid_bad_labels_and_shapes() {
    let (q, k) = (ones(3 * 2), ones(4 * 2));
    let (qf, kf) = (Features::f32(&q, 3, 2), Features::f32(&k, 4, 2));
    for bad in [4i64, -1, i64::MAX] {
        let labels = [0, 1, bad];
        sigmoid_refused(
            qf,
            kf,
            Some(&labels),
            (10.0, -10.0),
            Status::InvalidArgument,
            &["labels[2]", &bad.to_string()],
        );
    }
    sigmoid_refused(qf, kf, Some(&[0, 1]), (10.0, -10.0), Status::InvalidArgument, &["labels"]);
    // y_i = i needs c >= b (with labels c < b is fine)
    let k2 = ones(2 * 2);
    let k2f = Features::f32(&k2, 2, 2);
    sigmoid_refused(qf, k2f, None, (10.0, -10.0), Status::InvalidArgument, &["c >= b"]);
    sigmoid().forward(qf, k2f, Some(&[1, 0, 1]), 10.0, -10.0).unwrap();
    // feature dims differ; dtypes differ; a slice shorter than its shape
    let k3 = ones(4 * 3);
    sigmoid_refused(qf, Features::f32(&k3, 4, 3), None, (10.0, -10.0), Status::InvalidArgument, &["k:"]);
    let kb = [0x3f80u16; 8]; // bf16 ones
    sigmoid_refused(qf, Features::bf16(&kb, 4, 2), None, (10.0, -10.0), Status::InvalidArgument, &["dtype"]);
    sigmoid_refused(qf, Features::f32(&k[..7], 4, 2), None, (10.0, -10.0), Status::InvalidArgument, &["k:"]);
}

#[test]
fn sigmoid_non_finite_features_and_dloss() {
    let (mut q, k) = (ones(3 * 4), ones(3 * 4));
    q[2 * 4 + 1] = f32::NAN;
    sigmoid_refused(Features::f32(&q, 3, 4), Features::f32(&k, 3, 4), None, (10.0, -10.0), Status::NonFinite, &["q"]);
    let q = ones(3 * 4);
    let mut ds = -7.0f32;
    let out = SigmoidGradientsMut { dlogit_scale: Some(&mut ds), ..Default::default() };
    let (qf, kf) = (Features::f32(&q, 3, 4), Features::f32(&k, 3, 4));
    expect_err(sigmoid().backward_into(qf, kf, None, 10.0, -10.0, f32::NAN, out), Status::NonFinite, &["dloss"]);
    assert_eq!(ds, -7.0, "dlogit_scale written on error");
}

#[test]
fn sigmoid_outputs_are_checked() {
    let (q, k) = (ones(3 * 2), ones(3 * 2));
    let (qf, kf) = (Features::f32(&q, 3, 2), Features::f32(&k, 3, 2));
    let mut h = sigmoid();
    // no gradient requested from the backward
    expect_err(
        h.backward_into(qf, kf, None, 10.0, -10.0, 1.0, SigmoidGradientsMut::default()),
        Status::InvalidArgument,
        &["all NULL"],
    );
    // a dq of another shape (checked by the library), a dk slice too short
    // (checked by the crate), a dk of a third dtype
    let mut dq = vec![0.0f32; 4 * 2];
    let out = SigmoidGradientsMut { dq: Some(FeaturesMut::f32(&mut dq, 4, 2)), ..Default::default() };
    expect_err(h.value_and_grad_into(qf, kf, None, 10.0, -10.0, out), Status::InvalidArgument, &["dq"]);
    let mut dk = vec![0.0f32; 5];
    let out = SigmoidGradientsMut { dk: Some(FeaturesMut::f32(&mut dk, 3, 2)), ..Default::default() };
    expect_err(h.backward_into(qf, kf, None, 10.0, -10.0, 1.0, out), Status::InvalidArgument, &["dk"]);
    let mut dk16 = vec![0u16; 3 * 2];
    let out = SigmoidGradientsMut { dk: Some(FeaturesMut::f16(&mut dk16, 3, 2)), ..Default::default() };
    expect_err(h.value_and_grad_into(qf, kf, None, 10.0, -10.0, out), Status::InvalidArgument, &["dk"]);
}

#[test]
fn sigmoid_and_softmax_handles_do_not_mix() {
    let (q, k) = (ones(3 * 2), ones(3 * 2));
    let (qf, kf) = (Features::f32(&q, 3, 2), Features::f32(&k, 3, 2));
    // a Contrastive built with Loss::Sigmoid refuses the softmax calls,
    // pointing at the sigmoid functions
    let mut h = Options::new().loss(Loss::Sigmoid).build().unwrap();
    assert_eq!(h.loss_kind(), Loss::Sigmoid);
    expect_err(h.forward(qf, kf, None, 10.0), Status::InvalidArgument, &["flatmem_contrastive_sigmoid_forward"]);
    // SigmoidLoss sets its kind whatever the options named
    let mut s = SigmoidLoss::new(&Options::new().loss(Loss::InfoNce)).unwrap();
    s.forward(qf, kf, None, 10.0, -10.0).unwrap();
    // the logit cache is refused at create
    expect_err(
        SigmoidLoss::new(&Options::new().logit_cache_bytes(1 << 20)),
        Status::Unsupported,
        &["logit_cache_bytes"],
    );
}

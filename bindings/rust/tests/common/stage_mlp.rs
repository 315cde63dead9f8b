//! An L-stage MLP trained three ways, for the stage-parallel tests:
//! stage-parallel through `CyclicStages` ([`train_stage`]: K parameter
//! slots, activations kept per micro-batch, boundary tensors through the
//! runtime), data-parallel on N ranks through `Cyclic` ([`train_data_parallel`],
//! rank m on micro-batch m's rows), and a single-process simulation of the
//! schedule's math without flatmem ([`simulate`]: micro-batch m of step s
//! uses version max(0, s - delay(m, j)) at stage j; the step's average is
//! ((g_0 + g_1) + ...) * fl(1/N); version v + 1 = version v - lr * average).
//! The three run the same functions on the same values for every
//! (micro-batch, step, stage), so they agree bit for bit wherever the sums
//! are formed in the same order.
//!
//! Stage j: z = x W_j + b_j, y = tanh(z) (the last stage: y = z), its
//! parameters flat [W_j (in x out, row-major), b_j]; the loss of a
//! micro-batch is 1/2 mean((y - target)^2).

use flatmem::cyclic::{ActionKind, Cyclic, CyclicOptions, Rule};
use flatmem::cyclic_stages::{CyclicStages, StagesOptions};
use flatmem::{Communicator, Element};
use std::collections::HashMap;
use std::ops::{Add, Mul, Sub};

use super::Rng;

/// f32 or f64.
pub trait Real:
    Element + Default + PartialEq + std::fmt::Debug + Add<Output = Self> + Sub<Output = Self> + Mul<Output = Self>
{
    fn of(x: f64) -> Self;
    fn tanh(self) -> Self;
    fn bits(self) -> u64;
}

impl Real for f32 {
    fn of(x: f64) -> f32 {
        x as f32
    }
    fn tanh(self) -> f32 {
        f32::tanh(self)
    }
    fn bits(self) -> u64 {
        self.to_bits() as u64
    }
}

impl Real for f64 {
    fn of(x: f64) -> f64 {
        x
    }
    fn tanh(self) -> f64 {
        f64::tanh(self)
    }
    fn bits(self) -> u64 {
        self.to_bits()
    }
}

#[derive(Debug, Clone)]
pub struct Mlp {
    pub widths: Vec<usize>,
    pub rows: usize,
    pub seed: u64,
}

impl Mlp {
    pub fn stages(&self) -> usize {
        self.widths.len() - 1
    }

    pub fn count(&self, j: usize) -> usize {
        self.widths[j] * self.widths[j + 1] + self.widths[j + 1]
    }

    pub fn initial<T: Real>(&self, j: usize) -> Vec<T> {
        let mut rng = Rng::new(self.seed * 7919 + j as u64);
        let scale = 1.0 / (self.widths[j] as f64).sqrt();
        (0..self.count(j)).map(|_| T::of(rng.normal() * scale)).collect()
    }

    /// (inputs rows x widths[0], targets rows x widths[L]) of a micro-batch.
    pub fn batch<T: Real>(&self, step: u64, micro_batch: usize) -> (Vec<T>, Vec<T>) {
        let mut rng = Rng::new(self.seed * 104_729 + step * 1009 + micro_batch as u64 + 1);
        let x = (0..self.rows * self.widths[0]).map(|_| T::of(rng.normal())).collect();
        let t = (0..self.rows * self.widths[self.stages()]).map(|_| T::of(rng.normal())).collect();
        (x, t)
    }

    pub fn boundary_bytes<T: Real>(&self) -> Vec<i64> {
        (1..self.stages()).map(|j| (self.rows * self.widths[j] * std::mem::size_of::<T>()) as i64).collect()
    }

    pub fn forward<T: Real>(&self, j: usize, w: &[T], x: &[T]) -> Vec<T> {
        let (n_in, n_out) = (self.widths[j], self.widths[j + 1]);
        let mut y = vec![T::default(); self.rows * n_out];
        for r in 0..self.rows {
            for o in 0..n_out {
                let mut z = w[n_in * n_out + o];
                for i in 0..n_in {
                    z = z + x[r * n_in + i] * w[i * n_out + o];
                }
                y[r * n_out + o] = if j + 1 == self.stages() { z } else { z.tanh() };
            }
        }
        y
    }

    /// dloss/dy of 1/2 mean((y - t)^2).
    pub fn loss_gradient<T: Real>(&self, y: &[T], t: &[T]) -> Vec<T> {
        let scale = T::of(1.0 / y.len() as f64);
        y.iter().zip(t).map(|(&a, &b)| (a - b) * scale).collect()
    }

    /// (flat parameter gradient, dloss/dx).
    pub fn backward<T: Real>(&self, j: usize, w: &[T], x: &[T], y: &[T], dy: &[T]) -> (Vec<T>, Vec<T>) {
        let (n_in, n_out) = (self.widths[j], self.widths[j + 1]);
        let dz: Vec<T> = if j + 1 == self.stages() {
            dy.to_vec()
        } else {
            dy.iter().zip(y).map(|(&d, &v)| d * (T::of(1.0) - v * v)).collect()
        };
        let mut grad = vec![T::default(); self.count(j)];
        let mut dx = vec![T::default(); self.rows * n_in];
        for r in 0..self.rows {
            for o in 0..n_out {
                let d = dz[r * n_out + o];
                for i in 0..n_in {
                    grad[i * n_out + o] = grad[i * n_out + o] + x[r * n_in + i] * d;
                    dx[r * n_in + i] = dx[r * n_in + i] + d * w[i * n_out + o];
                }
                grad[n_in * n_out + o] = grad[n_in * n_out + o] + d;
            }
        }
        (grad, dx)
    }
}

/// The caller's optimizer, the same operation in every trainer.
pub fn sgd<T: Real>(w: &[T], average: &[T], lr: f64) -> Vec<T> {
    w.iter().zip(average).map(|(&v, &g)| v - T::of(lr) * g).collect()
}

/// The delay of micro-batch m at stage j from the header's closed forms
/// (not the library's): Sync 0, Delay1 1, Newest 0 iff offset(N-1) -
/// offset(m) <= 2j with offset(m) = floor(m 2L / N).
pub fn delay(rule: Rule, n: usize, l: usize, m: usize, j: usize) -> u64 {
    let offset = |r: usize| r * 2 * l / n;
    match rule {
        Rule::Sync => 0,
        Rule::Delay1 => 1,
        Rule::Newest => (offset(n - 1) - offset(m) > 2 * j) as u64,
    }
}

/// Every stage's trained parameters, in one process.
pub fn simulate<T: Real>(mlp: &Mlp, n: usize, steps: u64, rule: Rule, lr: f64) -> Vec<Vec<T>> {
    let l = mlp.stages();
    let mut versions: Vec<Vec<Vec<T>>> = (0..l).map(|j| vec![mlp.initial(j)]).collect();
    for s in 0..steps {
        let mut sums: Vec<Option<Vec<T>>> = vec![None; l];
        for m in 0..n {
            let w: Vec<&Vec<T>> =
                (0..l).map(|j| &versions[j][s.saturating_sub(delay(rule, n, l, m, j)) as usize]).collect();
            let (mut x, target) = mlp.batch::<T>(s, m);
            let mut kept = Vec::new();
            for j in 0..l {
                let y = mlp.forward(j, w[j], &x);
                kept.push((x, y.clone()));
                x = y;
            }
            let mut dy = mlp.loss_gradient(&x, &target);
            for j in (0..l).rev() {
                let (grad, dx) = mlp.backward(j, w[j], &kept[j].0, &kept[j].1, &dy);
                dy = dx;
                sums[j] = Some(match sums[j].take() {
                    None => grad,
                    Some(acc) => acc.iter().zip(&grad).map(|(&a, &b)| a + b).collect(),
                });
            }
        }
        let scale = T::of(1.0 / n as f64);
        for j in 0..l {
            let average: Vec<T> = sums[j].take().unwrap().iter().map(|&g| g * scale).collect();
            let next = sgd(&versions[j][s as usize], &average, lr);
            versions[j].push(next);
        }
    }
    versions.into_iter().map(|mut v| v.pop().unwrap()).collect()
}

/// Stage h.stage()'s side of the training, to Done: version S.
pub fn train_stage<T: Real>(h: &mut CyclicStages<'_, T>, mlp: &Mlp, lr: f64) -> flatmem::Result<Vec<T>> {
    let j = h.stage();
    let (steps, k) = (h.schedule().steps(), h.schedule().versions_kept(j)?);
    let mut slots: Vec<(i64, Vec<T>)> = (0..k).map(|v| (if v == 0 { 0 } else { -1 }, mlp.initial(j))).collect();
    let use_version = |slots: &Vec<(i64, Vec<T>)>, v: u64| -> Vec<T> {
        let (held, w) = &slots[v as usize % k];
        assert_eq!(
            *held,
            v as i64,
            "stage {}: slot {} holds version {}, the action uses {}",
            j,
            v as usize % k,
            held,
            v
        );
        w.clone()
    };
    let mut held: HashMap<(u64, usize), (Vec<T>, Vec<T>)> = HashMap::new();
    let (n_in, n_out) = (mlp.widths[j], mlp.widths[j + 1]);
    loop {
        let a = h.next()?;
        if a.kind == ActionKind::Done {
            break;
        }
        if let Some(v) = a.update_step {
            let next = sgd(&use_version(&slots, v), &h.average()?, lr);
            slots[(v as usize + 1) % k] = (v as i64 + 1, next);
        }
        let (step, m) = match (a.step, a.micro_batch) {
            (Some(s), Some(m)) => (s, m),
            _ => continue,
        };
        let w = use_version(&slots, a.version.unwrap());
        if a.kind == ActionKind::Forward {
            let x = if a.receives {
                let mut x = vec![T::default(); mlp.rows * n_in];
                h.receive(&mut x)?;
                x
            } else {
                mlp.batch::<T>(step, m).0
            };
            let y = mlp.forward(j, &w, &x);
            if a.sends {
                h.send(&y)?;
            }
            held.insert((step, m), (x, y));
        } else {
            let (x, y) = held.remove(&(step, m)).expect("a backward after its forward");
            let dy = if a.receives {
                let mut dy = vec![T::default(); mlp.rows * n_out];
                h.receive(&mut dy)?;
                dy
            } else {
                mlp.loss_gradient(&y, &mlp.batch::<T>(step, m).1)
            };
            let (grad, dx) = mlp.backward(j, &w, &x, &y, &dy);
            h.accumulate(&grad)?;
            if a.sends {
                h.send(&dx)?;
            }
        }
    }
    assert!(held.is_empty(), "stage {}: {} micro-batches still held at Done", j, held.len());
    Ok(use_version(&slots, steps))
}

/// Creates this stage rank's runtime over `comm` and trains.
pub fn train_stages<T: Real>(comm: &Communicator, mlp: &Mlp, n: usize, steps: u64, rule: Rule, lr: f64) -> Vec<T> {
    let options = StagesOptions::new(mlp.stages(), n, steps, rule, mlp.boundary_bytes::<T>());
    let mut h = CyclicStages::<T>::new(comm, &options).unwrap();
    train_stage(&mut h, mlp, lr).unwrap()
}

/// Rank r of N trains the whole model on micro-batch r's rows through
/// `Cyclic`; returns every stage's trained parameters.
pub fn train_data_parallel<T: Real>(comm: &Communicator, mlp: &Mlp, steps: u64, rule: Rule, lr: f64) -> Vec<Vec<T>> {
    let (l, r) = (mlp.stages(), comm.rank());
    let mut w: Vec<Vec<T>> = (0..l).map(|j| mlp.initial(j)).collect();
    let mut kept: Vec<(Vec<T>, Vec<T>)> = vec![(Vec::new(), Vec::new()); l];
    let mut dys: Vec<Vec<T>> = vec![Vec::new(); l];
    let mut cyclic = Cyclic::<T>::new(comm, &CyclicOptions::new(l, steps, rule)).unwrap();
    loop {
        let t = cyclic.next().unwrap();
        if let (Some(u), Some(average)) = (t.action.update, &t.averaged) {
            w[u.stage] = sgd(&w[u.stage], average, lr);
        }
        let (j, step) = match (t.action.kind, t.action.stage, t.action.step) {
            (ActionKind::Done, _, _) => break,
            (_, Some(j), Some(s)) => (j, s),
            _ => continue,
        };
        if t.action.kind == ActionKind::Forward {
            let x = if j == 0 { mlp.batch::<T>(step, r).0 } else { kept[j - 1].1.clone() };
            let y = mlp.forward(j, &w[j], &x);
            kept[j] = (x, y);
        } else {
            let (x, y) = &kept[j];
            let dy = if j + 1 == l { mlp.loss_gradient(y, &mlp.batch::<T>(step, r).1) } else { dys[j].clone() };
            let (grad, dx) = mlp.backward(j, &w[j], x, y, &dy);
            if j > 0 {
                dys[j - 1] = dx;
            }
            cyclic.reduce(j, grad).unwrap();
        }
    }
    w
}

/// Bit-for-bit equality of two parameter sets, with a message naming the
/// first difference.
pub fn assert_bitwise<T: Real>(what: &str, got: &[Vec<T>], want: &[Vec<T>]) {
    assert_eq!(got.len(), want.len(), "{}: stages", what);
    for (j, (g, w)) in got.iter().zip(want).enumerate() {
        assert_eq!(g.len(), w.len(), "{}: stage {} parameters", what, j);
        if let Some(i) = (0..g.len()).find(|&i| g[i].bits() != w[i].bits()) {
            panic!("{}: stage {} parameter {}: {:?} != {:?}", what, j, i, g[i], w[i]);
        }
    }
}

/// The ZeRO relay mode (`Delay1`): rank r of N keeps shard r of every stage,
/// gets the full stage from the relay before each forward and backward, and
/// updates its shard with the average's shard range. Returns this rank's
/// shards (version S) and the relay summary.
pub fn train_relayed<T: Real>(
    comm: &Communicator,
    mlp: &Mlp,
    steps: u64,
    lr: f64,
) -> (Vec<Vec<T>>, flatmem::sys::flatmem_cyclic_relay_summary) {
    let (l, r) = (mlp.stages(), comm.rank());
    let counts = (0..l).map(|j| mlp.count(j) as i64).collect();
    let mut cyclic = Cyclic::<T>::new(comm, &CyclicOptions::new(l, steps, Rule::Delay1).relayed(counts)).unwrap();
    for j in 0..l {
        let range = cyclic.shard_range(j, r).unwrap();
        cyclic.set_shard(j, mlp.initial::<T>(j)[range].to_vec()).unwrap();
    }
    let mut full: Vec<Vec<T>> = (0..l).map(|j| vec![T::default(); mlp.count(j)]).collect();
    let mut kept: Vec<(Vec<T>, Vec<T>)> = vec![(Vec::new(), Vec::new()); l];
    let mut dys: Vec<Vec<T>> = vec![Vec::new(); l];
    loop {
        let t = cyclic.next().unwrap();
        if let (Some(u), Some(average)) = (t.action.update, &t.averaged) {
            let range = cyclic.shard_range(u.stage, r).unwrap();
            let shard = cyclic.shard_mut(u.stage).unwrap();
            let next = sgd(shard, &average[range], lr); // this rank's range of the average
            shard.copy_from_slice(&next);
        }
        let (j, step) = match (t.action.kind, t.action.stage, t.action.step) {
            (ActionKind::Done, _, _) => break,
            (_, Some(j), Some(s)) => (j, s),
            _ => continue,
        };
        cyclic.parameters(&mut full[j]).unwrap();
        let w = &full[j];
        if t.action.kind == ActionKind::Forward {
            let x = if j == 0 { mlp.batch::<T>(step, r).0 } else { kept[j - 1].1.clone() };
            let y = mlp.forward(j, w, &x);
            kept[j] = (x, y);
        } else {
            let (x, y) = &kept[j];
            let dy = if j + 1 == l { mlp.loss_gradient(y, &mlp.batch::<T>(step, r).1) } else { dys[j].clone() };
            let (grad, dx) = mlp.backward(j, w, x, y, &dy);
            if j > 0 {
                dys[j - 1] = dx;
            }
            cyclic.reduce(j, grad).unwrap();
        }
    }
    let shards = (0..l).map(|j| cyclic.shard(j).unwrap().to_vec()).collect();
    (shards, cyclic.relay_summary().unwrap())
}

#include "net/net_ops.hpp"

#include <cmath>
#include <cstring>
#include <sstream>

#include "support/cyclic_train.hpp"
#include "support/random.hpp"

namespace net {

void check(flatmem_status status, const char *call) {
  if (status != FLATMEM_STATUS_SUCCESS)
    throw Failure(std::string(call) + ": " + flatmem_status_string(status) + ": " + flatmem_last_error());
}

void Hash::add(const void *data, std::size_t bytes) {
  const auto *p = static_cast<const unsigned char *>(data);
  for (std::size_t i = 0; i < bytes; ++i) value = (value ^ p[i]) * 0x100000001b3ull;
}

namespace {

// n values uniform in [-0.5, 0.5), the stream'th sequence of a seed.
std::vector<float> uniform_floats(std::uint64_t seed, std::uint64_t stream, std::int64_t n) {
  flatmem_test::Random random(seed * 1000003ull + stream);
  std::vector<float> v(static_cast<std::size_t>(n));
  for (float &x : v) x = float(random.uniform() - 0.5);
  return v;
}

// A compact fp32 tensor over caller-owned data: ndim 0 (no shape), 1 or 2.
struct Tensor {
  std::int64_t shape[2] = {0, 0};
  DLTensor t{};
  Tensor(float *data, int ndim, std::int64_t rows = 1, std::int64_t cols = 1) : shape{rows, cols} {
    t.data = data;
    t.device = {kDLCPU, 0};
    t.ndim = ndim;
    t.dtype = {kDLFloat, 32, 1};
    t.shape = ndim ? shape : nullptr;
    if (ndim == 1) shape[0] = rows * cols;
  }
  DLTensor *dl() { return &t; }
};

int mod(int a, int n) { return ((a % n) + n) % n; }

// all_reduce: the sum over ranks of each rank's own random vector.
class AllReduce final : public Op {
 public:
  AllReduce(const Context &c, std::int64_t n) : c_(c), mine_(uniform_floats(c.seed, std::uint64_t(c.rank), n)),
                                                 sum_(mine_.size()) {}
  const char *name() const override { return "all_reduce"; }
  void run() override {
    Tensor in(mine_.data(), 1, std::int64_t(mine_.size())), out(sum_.data(), 1, std::int64_t(sum_.size()));
    check(flatmem_comm_all_reduce(c_.comm, in.dl(), out.dl(), 0, nullptr), "flatmem_comm_all_reduce");
  }
  std::uint64_t hash() const override {
    Hash h;
    h.add(sum_);
    return h.value;
  }
  // Against the double sum of every rank's vector (regenerated here): fp32
  // addition of `world` terms errs by at most (world - 1) * 2^-24 * sum |x|.
  std::string verify() const override {
    std::vector<double> exact(sum_.size()), magnitude(sum_.size());
    for (int r = 0; r < c_.world; ++r) {
      const std::vector<float> x = uniform_floats(c_.seed, std::uint64_t(r), std::int64_t(sum_.size()));
      for (std::size_t i = 0; i < x.size(); ++i) exact[i] += x[i], magnitude[i] += std::fabs(x[i]);
    }
    for (std::size_t i = 0; i < sum_.size(); ++i)
      if (std::fabs(sum_[i] - exact[i]) > (c_.world - 1) * 0x1.0p-24 * magnitude[i]) {
        std::ostringstream s;
        s << "all_reduce element " << i << ": " << sum_[i] << ", the double sum is " << exact[i];
        return s.str();
      }
    return "";
  }

 private:
  Context c_;
  std::vector<float> mine_, sum_;
};

// ring_shift: each rank sends its vector to rank + 1 and receives rank - 1's.
class RingShift final : public Op {
 public:
  RingShift(const Context &c, std::int64_t bytes)
      : c_(c), mine_(uniform_floats(c.seed, 100u + std::uint64_t(c.rank), bytes / 4)), got_(mine_.size()) {}
  const char *name() const override { return "ring_shift"; }
  void run() override {
    Tensor in(mine_.data(), 1, std::int64_t(mine_.size())), out(got_.data(), 1, std::int64_t(got_.size()));
    check(flatmem_comm_ring_shift(c_.comm, in.dl(), out.dl(), 0, nullptr), "flatmem_comm_ring_shift");
  }
  std::uint64_t hash() const override {
    Hash h;
    h.add(got_);
    return h.value;
  }
  std::string verify() const override {
    const int left = mod(c_.rank - 1, c_.world);
    return got_ == uniform_floats(c_.seed, 100u + std::uint64_t(left), std::int64_t(got_.size()))
               ? "" : "ring_shift: the block received is not rank " + std::to_string(left) + "'s";
  }

 private:
  Context c_;
  std::vector<float> mine_, got_;
};

// The features of a symmetric CLIP batch: rows of unit norm, k_i near q_i.
void clip_features(std::uint64_t seed, std::int64_t batch, std::int64_t d, std::vector<float> &q,
                   std::vector<float> &k) {
  flatmem_test::Random random(seed * 7919ull + 3);
  const auto width = static_cast<std::size_t>(d);
  q.assign(std::size_t(batch) * width, 0.0f);
  k.assign(q.size(), 0.0f);
  std::vector<double> a(width), b(width);
  for (std::size_t row = 0; row < std::size_t(batch); ++row) {
    double nq = 0, nk = 0;
    for (std::size_t j = 0; j < width; ++j) {
      a[j] = random.normal();
      b[j] = a[j] + random.normal();
      nq += a[j] * a[j], nk += b[j] * b[j];
    }
    for (std::size_t j = 0; j < width; ++j) {
      q[row * width + j] = float(a[j] / std::sqrt(nq));
      k[row * width + j] = float(b[j] / std::sqrt(nk));
    }
  }
}

// The loss, LSEs and gradients of one forward + backward; `comm` null: one process.
struct LossRun {
  std::vector<float> q, k, loss{0.0f}, row_lse, col_lse, dq, dk, ds{0.0f};
  float scale = 10.0f;

  LossRun(std::vector<float> q_rows, std::vector<float> k_rows, std::int64_t d)
      : q(std::move(q_rows)), k(std::move(k_rows)), row_lse(q.size() / std::size_t(d)), col_lse(row_lse.size()),
        dq(q.size()), dk(k.size()) {}

  void run(flatmem_contrastive_t *h, std::int64_t d) {
    const std::int64_t b = std::int64_t(row_lse.size());
    Tensor Q(q.data(), 2, b, d), K(k.data(), 2, b, d), S(&scale, 0), L(loss.data(), 0), RL(row_lse.data(), 1, b),
        CL(col_lse.data(), 1, b), DQ(dq.data(), 2, b, d), DK(dk.data(), 2, b, d), DS(ds.data(), 0);
    check(flatmem_contrastive_forward(h, Q.dl(), K.dl(), nullptr, S.dl(), L.dl(), RL.dl(), CL.dl(), nullptr, 0, nullptr),
          "flatmem_contrastive_forward");
    check(flatmem_contrastive_backward(h, Q.dl(), K.dl(), nullptr, S.dl(), RL.dl(), CL.dl(), nullptr, DQ.dl(), DK.dl(), DS.dl(), nullptr, 0,
                                       nullptr),
          "flatmem_contrastive_backward");
  }
};

flatmem_contrastive_t *loss_handle(flatmem_comm_t *comm) {
  flatmem_contrastive_options o = FLATMEM_CONTRASTIVE_OPTIONS_INIT;
  o.num_threads = 1;
  o.comm = comm;
  flatmem_contrastive_t *h = nullptr;
  check(flatmem_contrastive_create(&h, &o), "flatmem_contrastive_create");
  return h;
}

// ring_loss: the symmetric contrastive loss of one global batch, this rank's
// rows and columns, forward + backward.
class RingLoss final : public Op {
 public:
  RingLoss(const Context &c, std::int64_t batch, std::int64_t d) : c_(c), batch_(batch), d_(d) {
    std::vector<float> q, k;
    clip_features(c.seed, batch, d, q, k);
    const std::int64_t b = batch / c.world;
    const auto first = std::ptrdiff_t(b * c.rank * d), last = std::ptrdiff_t(b * (c.rank + 1) * d);
    run_ = std::make_unique<LossRun>(std::vector<float>(q.begin() + first, q.begin() + last),
                                     std::vector<float>(k.begin() + first, k.begin() + last), d);
    handle_ = loss_handle(c.comm);
  }
  ~RingLoss() override { flatmem_contrastive_destroy(handle_); }
  const char *name() const override { return "ring_loss"; }
  void run() override { run_->run(handle_, d_); }
  std::uint64_t hash() const override {
    Hash h;
    for (const auto *v : {&run_->loss, &run_->row_lse, &run_->col_lse, &run_->dq, &run_->dk, &run_->ds}) h.add(*v);
    return h.value;
  }
  // Against one process computing the whole batch: the ring adds the same
  // terms in another order, so fp32 rounding differs. The loss and ds are
  // differences of log-sum-exps of size ~ scale: a few fp32 ulps of that
  // (1e-5 * scale) bound them; gradients: 1e-5 of the largest.
  std::string verify() const override {
    std::vector<float> q, k;
    clip_features(c_.seed, batch_, d_, q, k);
    LossRun one(q, k, d_);
    flatmem_contrastive_t *h = loss_handle(nullptr);
    try {
      one.run(h, d_);
    } catch (...) {
      flatmem_contrastive_destroy(h);
      throw;
    }
    flatmem_contrastive_destroy(h);
    const std::size_t first = std::size_t(c_.rank) * run_->dq.size();
    auto close = [](float a, float b, float scale) { return std::fabs(a - b) <= 1e-5f * scale; };
    if (!close(run_->loss[0], one.loss[0], one.scale) || !close(run_->ds[0], one.ds[0], one.scale)) {
      std::ostringstream s;
      s.precision(9);
      s << "ring_loss: loss " << run_->loss[0] << ", ds " << run_->ds[0] << "; one process: " << one.loss[0]
        << ", " << one.ds[0];
      return s.str();
    }
    float largest = 0;
    for (float g : one.dq) largest = std::max(largest, std::fabs(g));
    for (std::size_t i = 0; i < run_->dq.size(); ++i)
      if (!close(run_->dq[i], one.dq[first + i], largest) || !close(run_->dk[i], one.dk[first + i], largest))
        return "ring_loss: dq/dk element " + std::to_string(i) + " differs from one process";
    return "";
  }

 private:
  Context c_;
  std::int64_t batch_, d_;
  std::unique_ptr<LossRun> run_;
  flatmem_contrastive_t *handle_ = nullptr;
};

// cyclic: a 3-stage MLP trained with cyclic data parallelism (DELAY1), the
// loop of tests/support/cyclic_train; its reference is the single-process
// simulation of the rule, which DELAY1 must match bit for bit.
class Cyclic final : public Op {
 public:
  Cyclic(const Context &c, std::int64_t steps, Progress progress) : c_(c), progress_(std::move(progress)) {
    setup_.steps = steps;
    setup_.rule = FLATMEM_CYCLIC_DELAY1;
    setup_.seed = c.seed;  // the model's initial parameters
  }
  ~Cyclic() override { flatmem_cyclic_destroy(handle_); }
  const char *name() const override { return "cyclic"; }
  void run() override {
    flatmem_cyclic_destroy(handle_);
    handle_ = nullptr;
    const test::CyclicOptions o = test::cyclic_options(setup_, sizeof(float));
    check(flatmem_cyclic_create(&handle_, c_.comm, &o.options), "flatmem_cyclic_create");
    run_ = test::RankRun<float>{test::StageMlp<float>::make(setup_.widths, setup_.seed), {}};
    const std::string error = test::train_rank<float>(handle_, setup_, c_.rank, c_.world, run_, progress_);
    if (!error.empty()) throw Failure(error);
  }
  std::uint64_t hash() const override {
    Hash h;
    for (const auto &p : run_.model.params) h.add(p);
    h.add(run_.losses);
    return h.value;
  }
  std::string verify() const override {
    const auto want = test::simulate<float>(setup_, c_.world)[std::size_t(c_.rank)];
    if (run_.model.params != want.model.params) return "cyclic: parameters differ from the simulation of DELAY1";
    if (run_.losses != want.losses) return "cyclic: losses differ from the simulation of DELAY1";
    return "";
  }

 private:
  Context c_;
  Progress progress_;
  test::TrainSetup setup_;
  test::RankRun<float> run_;
  flatmem_cyclic_t *handle_ = nullptr;
};

}  // namespace

std::vector<std::unique_ptr<Op>> make_ops(const Context &context, const Sizes &sizes, const Progress &progress) {
  std::vector<std::unique_ptr<Op>> ops;
  ops.push_back(std::make_unique<AllReduce>(context, sizes.all_reduce_elements));
  ops.push_back(std::make_unique<RingShift>(context, sizes.shift_bytes));
  ops.push_back(std::make_unique<RingLoss>(context, sizes.batch, sizes.d));
  ops.push_back(std::make_unique<Cyclic>(context, sizes.cyclic_steps, progress));
  return ops;
}

}  // namespace net

// The panel engine's ring blocks (cpu_fold_block, cpu_gradient_block of
// src/contrastive/panels/cpu_executor.hpp), proven by a ring of n = 1..4 ranks
// simulated in one thread, as the ring schedule runs them
// (docs/contrastive/ring.md): at step t rank r holds the block of owner
// o = (r - t) mod n.
//
// Forward: each block is folded into r's running row states; each block's
// fresh column states are merged over the ranks in ring order (owner first,
// as the relayed column statistics travel); the positives are taken from the
// block that holds them; then the LSE vectors and the loss are formed as
// cpu_forward's finish forms them. Backward with those LSE vectors: dq_r = s g
// / N (sum over blocks of Gt k_o), dk_o = s g / N (the block partials Gt^T q_r
// summed over ranks in ring order), ds = g / N (sum of the ds rows).
//
// Checked against the float64 materialised reference of the concatenated
// batch with support/tolerance.hpp's bounds (+ 2^-8 |G| where Gt is rounded
// to bf16, as test_panel_engine.cpp), and against cpu_forward / cpu_backward
// on the concatenated batch within the same bounds; one rank gives the single
// device's values exactly. Shards are uneven (a rank with one row or column,
// primes, shards not multiples of the panel or fold tile) and the panels are
// forced small so that a block has several panels (and 96 x 160 panels: a
// full fold tile and a short one each way). A wrong offset in one block moves
// the results beyond the bounds; a bad label gives NaN; a plan made for
// another shape is refused; no byte is written outside the workspace.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "contrastive/panels/cpu_executor.hpp"
#include "contrastive/panels/passes.hpp"
#include "contrastive/panels/plan.hpp"
#include "support/contrastive.hpp"
#include "support/random.hpp"
#include "support/reference.hpp"
#include "support/tolerance.hpp"

namespace panels = flatmem::contrastive::panels;
using flatmem::contrastive::Loss;
using panels::State;
using namespace flatmem_test;

namespace {

struct RingBlocksCase {
  bool symmetric = true;
  std::vector<std::int64_t> rows;  // b_r per rank
  std::vector<std::int64_t> cols;  // c_r per rank (empty: = rows; symmetric needs b_r = c_r)
  std::int64_t d = 1;
  int g_bits = 32;
  panels::Shape shape;  // the blocks' panels (and the single device's)
  std::uint64_t seed = 1;

  int ranks() const { return int(rows.size()); }
  std::int64_t columns(int r) const { return cols.empty() ? rows[r] : cols[r]; }
  Loss loss() const { return symmetric ? Loss::symmetric : Loss::infonce; }
};

std::string name_of(const RingBlocksCase &k) {
  std::string s = std::string(k.symmetric ? "symmetric" : "infonce") + " rows=";
  for (std::int64_t r : k.rows) s += std::to_string(r) + ",";
  s += " cols=";
  for (int r = 0; r < k.ranks(); ++r) s += std::to_string(k.columns(r)) + ",";
  return s + " d=" + std::to_string(k.d) + " g_bits=" + std::to_string(k.g_bits) + " panel=" +
         std::to_string(k.shape.rows) + "x" + std::to_string(k.shape.cols);
}

// The concatenated batch: unit rows (as CLIP's features), global labels.
struct Batch {
  std::int64_t b = 0, c = 0, d = 0;
  std::vector<float> q, k;
  std::vector<std::int64_t> labels;         // (b,) global columns, or empty (symmetric)
  std::vector<std::int64_t> row_off, col_off;  // per rank
  float scale = 14.285714f, dloss = 0.75f;
};

Batch make_batch(const RingBlocksCase &k) {
  Batch bt;
  bt.d = k.d;
  for (int r = 0; r < k.ranks(); ++r) {
    bt.row_off.push_back(bt.b), bt.col_off.push_back(bt.c);
    bt.b += k.rows[r], bt.c += k.columns(r);
  }
  Random rng(k.seed);
  const auto fill = [&](std::vector<float> &m, std::int64_t rows) {
    m.resize(std::size_t(rows * k.d));
    std::vector<double> row(std::size_t(k.d));
    for (std::int64_t r = 0; r < rows; ++r) {
      double norm = 0.0;
      for (double &v : row) v = rng.normal(), norm += v * v;
      for (std::int64_t e = 0; e < k.d; ++e) m[r * k.d + e] = float(row[e] / std::sqrt(norm));
    }
  };
  fill(bt.q, bt.b), fill(bt.k, bt.c);
  if (!k.symmetric) {
    for (std::int64_t i = 0; i < bt.b; ++i) bt.labels.push_back(rng.below(bt.c));
    // Some positives in the last rank's first column (a one-column shard in the cases below).
    bt.labels[0] = bt.col_off.back();
    bt.labels[bt.b - 1] = bt.col_off.back();
  }
  return bt;
}

flatmem::cpu_isa::Isa isa_in_use() {
  flatmem_cpu_isa in_use = FLATMEM_CPU_ISA_BASELINE;
  REQUIRE(flatmem_cpu_isa_get(&in_use, nullptr) == FLATMEM_STATUS_SUCCESS);
  return flatmem::cpu_isa::Isa(in_use);
}

struct Outputs {
  float loss = 0.0f, ds = 0.0f;
  std::vector<float> row_lse, col_lse, dq, dk;  // global order (ranks concatenated)
};

// An injected defect: the blocks rank `rank` computes for owner `owner` see
// their offsets shifted (rank -1: none).
struct Fault {
  int rank = -1, owner = -1;
  std::int64_t row_shift = 0, col_shift = 0;
};

panels::CpuBlock block_of(const RingBlocksCase &k, const Batch &bt, int r, int o, const Fault &fault) {
  panels::CpuBlock bl;
  bl.q = bt.q.data() + bt.row_off[r] * bt.d;
  bl.k = bt.k.data() + bt.col_off[o] * bt.d;
  bl.rows = k.rows[r], bl.cols = k.columns(o), bl.d = bt.d;
  bl.row_offset = bt.row_off[r], bl.col_offset = bt.col_off[o];
  if (fault.rank == r && fault.owner == o) bl.row_offset += fault.row_shift, bl.col_offset += fault.col_shift;
  bl.global_c = bt.c;
  bl.labels = bt.labels.empty() ? nullptr : bt.labels.data() + bt.row_off[r];
  bl.scale = bt.scale, bl.g_bits = k.g_bits, bl.isa = isa_in_use();
  return bl;
}

int owner_at(int r, int t, int n) { return ((r - t) % n + n) % n; }

double lse_of(State st) { return double(st.max) + std::log(double(st.sum)); }

// The ring of k.ranks() ranks, one after the other in this thread.
Outputs run_ring(const RingBlocksCase &k, const Batch &bt, const Fault &fault = {}) {
  const int n = k.ranks();
  const std::size_t ranks = std::size_t(n);
  const bool symmetric = k.symmetric;
  const float s = panels::checked_scale(bt.scale);

  // ---- forward
  std::vector<std::vector<State>> row_state(ranks), col_state(ranks);
  std::vector<std::vector<double>> positive(ranks);
  // partial_cols[o][r]: block o's column states as rank r folded them
  std::vector<std::vector<std::vector<State>>> partial_cols(ranks, std::vector<std::vector<State>>(ranks));
  for (int r = 0; r < n; ++r) {
    row_state[r].assign(std::size_t(k.rows[r]), panels::empty_state());
    positive[r].assign(std::size_t(k.rows[r]), NAN);
  }
  for (int r = 0; r < n; ++r)
    for (int t = 0; t < n; ++t) {
      const int o = owner_at(r, t, n);
      const panels::CpuBlock bl = block_of(k, bt, r, o, fault);
      const auto plan = panels::plan_forward(bl.rows, bl.cols, bl.d, k.loss(), 0, k.shape);
      std::vector<State> &cols = partial_cols[o][r];
      if (symmetric) cols.assign(std::size_t(bl.cols), panels::empty_state());
      GuardedBuffer ws(plan.bytes, std::size_t(8 * t));
      panels::cpu_fold_block(plan, bl, ws.data(), row_state[r].data(), symmetric ? cols.data() : nullptr);
      CHECK(ws.guards_intact());
      // The positives of the rows whose positive column this block holds (as cpu_forward's finish).
      for (std::int64_t i = 0; i < bl.rows; ++i) {
        const std::int64_t y = bl.labels ? bl.labels[i] : bl.row_offset + i;
        if (y < bl.col_offset || y >= bl.col_offset + bl.cols) continue;
        double dot = 0.0;
        for (std::int64_t e = 0; e < bl.d; ++e)
          dot += double(bl.q[i * bl.d + e]) * double(bl.k[(y - bl.col_offset) * bl.d + e]);
        positive[r][i] = double(s * float(dot));
      }
    }
  if (symmetric)
    for (int o = 0; o < n; ++o) {  // the relayed column statistics: owner first, then ring order
      col_state[o] = partial_cols[o][o];
      for (int t = 1; t < n; ++t) {
        const auto &part = partial_cols[o][std::size_t((o + t) % n)];
        for (std::size_t j = 0; j < part.size(); ++j) panels::merge(col_state[o][j], part[j]);
      }
    }
  Outputs out;
  std::vector<std::vector<float>> row_lse(ranks), col_lse(ranks);
  double total = 0.0;
  for (int r = 0; r < n; ++r) {
    for (std::int64_t i = 0; i < k.rows[r]; ++i) {
      const double rl = lse_of(row_state[r][i]);
      row_lse[r].push_back(float(rl));
      total += rl - positive[r][i];
      if (symmetric) {  // b_r = c_r: column i of rank r is row i's positive column
        const double cl = lse_of(col_state[r][i]);
        col_lse[r].push_back(float(cl));
        total += cl - positive[r][i];
      }
    }
    out.row_lse.insert(out.row_lse.end(), row_lse[r].begin(), row_lse[r].end());
    out.col_lse.insert(out.col_lse.end(), col_lse[r].begin(), col_lse[r].end());
  }
  const double inv_n = 1.0 / (symmetric ? 2.0 * double(bt.b) : double(bt.b));
  out.loss = float(total * inv_n);

  // ---- backward
  std::vector<std::vector<float>> dq_acc(ranks);
  std::vector<std::vector<double>> ds_rows(ranks);
  std::vector<std::vector<std::vector<float>>> partial_dk(ranks, std::vector<std::vector<float>>(ranks));
  for (int r = 0; r < n; ++r) {
    dq_acc[r].assign(std::size_t(k.rows[r] * bt.d), 0.0f);
    ds_rows[r].assign(std::size_t(k.rows[r]), 0.0);
  }
  for (int r = 0; r < n; ++r)
    for (int t = 0; t < n; ++t) {
      const int o = owner_at(r, t, n);
      const panels::CpuBlock bl = block_of(k, bt, r, o, fault);
      const auto plan = panels::plan_backward(bl.rows, bl.cols, bl.d, k.loss(), true, true, true, 0, k.shape);
      std::vector<float> &dk = partial_dk[o][r];
      dk.assign(std::size_t(bl.cols * bl.d), NAN);  // overwritten, not added to
      GuardedBuffer ws(plan.bytes, std::size_t(8 * t));
      panels::cpu_gradient_block(plan, bl, row_lse[r].data(),
                                 symmetric ? col_lse[o].data() : nullptr, ws.data(),
                                 dq_acc[r].data(), dk.data(), ds_rows[r].data());
      CHECK(ws.guards_intact());
    }
  const float mult = float(double(s) * double(bt.dloss) * inv_n);
  double ds_total = 0.0;
  for (int r = 0; r < n; ++r) {
    for (float v : dq_acc[r]) out.dq.push_back(mult * v);
    for (double v : ds_rows[r]) ds_total += v;
  }
  for (int o = 0; o < n; ++o) {  // the relayed partial dk: owner first, then ring order, in fp32
    std::vector<float> sum = partial_dk[o][o];
    for (int t = 1; t < n; ++t) {
      const auto &part = partial_dk[o][std::size_t((o + t) % n)];
      for (std::size_t e = 0; e < sum.size(); ++e) sum[e] += part[e];
    }
    for (float v : sum) out.dk.push_back(mult * v);
  }
  out.ds = float(double(bt.dloss) * inv_n * ds_total);
  return out;
}

// cpu_forward / cpu_backward on the concatenated batch, the same panel shape.
Outputs run_single(const RingBlocksCase &k, const Batch &bt, bool *dk_resident = nullptr) {
  panels::CpuProblem pr;
  pr.q = bt.q.data(), pr.k = bt.k.data();
  pr.labels = bt.labels.empty() ? nullptr : bt.labels.data();
  pr.scale = bt.scale, pr.g_bits = k.g_bits, pr.isa = isa_in_use();
  Outputs o;
  o.row_lse.resize(std::size_t(bt.b)), o.col_lse.resize(std::size_t(k.symmetric ? bt.c : 0));
  o.dq.resize(std::size_t(bt.b * bt.d)), o.dk.resize(std::size_t(bt.c * bt.d));
  const auto fp = panels::plan_forward(bt.b, bt.c, bt.d, k.loss(), 0, k.shape);
  std::vector<char> ws(fp.bytes);
  panels::cpu_forward(fp, pr, ws.data(), &o.loss, o.row_lse.data(), k.symmetric ? o.col_lse.data() : nullptr);
  const auto bp = panels::plan_backward(bt.b, bt.c, bt.d, k.loss(), true, true, true, 0, k.shape);
  if (dk_resident) *dk_resident = bp.dk_resident;
  ws.assign(bp.bytes, 0);
  panels::cpu_backward(bp, pr, o.row_lse.data(), k.symmetric ? o.col_lse.data() : nullptr, bt.dloss, ws.data(),
                       o.dq.data(), o.dk.data(), &o.ds);
  return o;
}

ReferenceProblem reference_of(const RingBlocksCase &k, const Batch &bt) {
  ReferenceProblem p;
  p.symmetric = k.symmetric, p.b = bt.b, p.c = bt.c, p.d = bt.d;
  p.q.assign(bt.q.begin(), bt.q.end()), p.k.assign(bt.k.begin(), bt.k.end());
  p.labels = bt.labels;
  p.scale = bt.scale, p.dloss = bt.dloss;
  return p;
}

// The values compared with (the reference's, or another run's).
struct Expected {
  double loss = 0.0, ds = 0.0;
  std::vector<double> row_lse, col_lse, dq, dk;
};
Expected expected_of(const ReferenceResult &r) { return {r.loss, r.ds, r.row_lse, r.col_lse, r.dq, r.dk}; }
Expected expected_of(const Outputs &o) {
  const auto wide = [](const std::vector<float> &v) { return std::vector<double>(v.begin(), v.end()); };
  return {o.loss, o.ds, wide(o.row_lse), wide(o.col_lse), wide(o.dq), wide(o.dk)};
}

// Entries outside test_panel_engine.cpp's bounds (NaN counts as outside).
struct Misses {
  bool loss = false, ds = false;
  int row_lse = 0, col_lse = 0, dq = 0, dk = 0;
  bool any() const { return loss || ds || row_lse || col_lse || dq || dk; }
};

struct Bounds {
  ReferenceResult ref;
  ForwardTolerance ft;
  BackwardTolerance bt;
  double g_round = 0.0;
};

Bounds bounds_of(const RingBlocksCase &k, const Batch &batch) {
  const ReferenceProblem p = reference_of(k, batch);
  Bounds b;
  b.ref = reference_loss(p);
  b.ft = forward_tolerance(p, b.ref);
  b.bt = backward_tolerance(p, b.ref, b.ft, Dtype::f32, Dtype::f32);
  b.g_round = k.g_bits == 16 ? 0x1p-8 * slack * batch.scale : 0.0;  // Gt rounded to bf16
  return b;
}

Misses misses(const Outputs &o, const Expected &e, const Bounds &b, float scale) {
  Misses m;
  const auto outside = [](double got, double want, double bound) { return !(std::fabs(got - want) <= bound); };
  m.loss = outside(o.loss, e.loss, b.ft.loss);
  for (std::size_t i = 0; i < e.row_lse.size(); ++i) m.row_lse += outside(o.row_lse[i], e.row_lse[i], b.ft.row_lse[i]);
  for (std::size_t j = 0; j < e.col_lse.size(); ++j) m.col_lse += outside(o.col_lse[j], e.col_lse[j], b.ft.col_lse[j]);
  for (std::size_t x = 0; x < e.dq.size(); ++x)
    m.dq += outside(o.dq[x], e.dq[x], b.bt.dq[x] + b.g_round * b.ref.dq_abs[x]);
  for (std::size_t x = 0; x < e.dk.size(); ++x)
    m.dk += outside(o.dk[x], e.dk[x], b.bt.dk[x] + b.g_round * b.ref.dk_abs[x]);
  m.ds = outside(o.ds, e.ds, b.bt.ds + b.g_round * b.ref.ds_abs / scale);
  return m;
}

void check_no_misses(const Misses &m) {
  CHECK(!m.loss);
  CHECK(m.row_lse == 0);
  CHECK(m.col_lse == 0);
  CHECK(m.dq == 0);
  CHECK(m.dk == 0);
  CHECK(!m.ds);
}

bool same_bits(const Outputs &a, const Outputs &b) {
  const auto eq = [](const std::vector<float> &x, const std::vector<float> &y) {
    return x.size() == y.size() && (x.empty() || std::memcmp(x.data(), y.data(), x.size() * sizeof(float)) == 0);
  };
  return std::memcmp(&a.loss, &b.loss, 4) == 0 && std::memcmp(&a.ds, &b.ds, 4) == 0 && eq(a.row_lse, b.row_lse) &&
         eq(a.col_lse, b.col_lse) && eq(a.dq, b.dq) && eq(a.dk, b.dk);
}

// Equal values (+0 == -0: a sum started from an accumulator of zeros).
bool same_values(const Outputs &a, const Outputs &b) {
  const auto eq = [](const std::vector<float> &x, const std::vector<float> &y) { return x == y; };
  return a.loss == b.loss && a.ds == b.ds && eq(a.row_lse, b.row_lse) && eq(a.col_lse, b.col_lse) &&
         eq(a.dq, b.dq) && eq(a.dk, b.dk);
}

void check_ring(const RingBlocksCase &k) {
  INFO(name_of(k));
  const Batch batch = make_batch(k);
  const Bounds b = bounds_of(k, batch);
  const Outputs ring = run_ring(k, batch);
  INFO("loss ", ring.loss, " reference ", b.ref.loss);
  check_no_misses(misses(ring, expected_of(b.ref), b, batch.scale));  // the float64 reference
  const Outputs single = run_single(k, batch);
  check_no_misses(misses(ring, expected_of(single), b, batch.scale));  // one device's panel walk
  CHECK(same_bits(ring, run_ring(k, batch)));                          // repeatable
}

const std::vector<std::vector<std::int64_t>> symmetric_shards = {{131}, {1, 131}, {67, 1, 131}, {200, 1, 37, 97}};
// InfoNCE: rows and columns sharded differently, c != b, a one-column shard.
const std::vector<std::vector<std::int64_t>> infonce_rows = {{131}, {1, 131}, {67, 1, 131}, {200, 1, 37, 97}};
const std::vector<std::vector<std::int64_t>> infonce_cols = {{257}, {257, 1}, {13, 160, 1}, {13, 160, 1, 229}};
const panels::Shape shapes[] = {{96, 160}, {5, 3}};

}  // namespace

TEST_CASE("contrastive/panels/ring_blocks/symmetric") {
  for (int g_bits : {32, 16})
    for (const panels::Shape &shape : shapes)
      for (const auto &rows : symmetric_shards) {
        RingBlocksCase k;
        k.symmetric = true, k.rows = rows, k.d = 33, k.g_bits = g_bits, k.shape = shape;
        k.seed = 100 + rows.size();
        check_ring(k);
      }
}

TEST_CASE("contrastive/panels/ring_blocks/infonce") {
  for (int g_bits : {32, 16})
    for (const panels::Shape &shape : shapes)
      for (std::size_t c = 0; c < infonce_rows.size(); ++c) {
        RingBlocksCase k;
        k.symmetric = false, k.rows = infonce_rows[c], k.cols = infonce_cols[c], k.d = 19, k.g_bits = g_bits;
        k.shape = shape, k.seed = 200 + c;
        check_ring(k);
      }
}

TEST_CASE("contrastive/panels/ring_blocks/one_rank_is_the_single_device_walk") {
  // One block is the whole matrix: the same panels in the same order, the
  // same sums (dq from an accumulator of zeros instead of a fresh one).
  for (bool symmetric : {true, false})
    for (int g_bits : {32, 16}) {
      RingBlocksCase k;
      k.symmetric = symmetric, k.rows = {131}, k.cols = symmetric ? std::vector<std::int64_t>{} : std::vector<std::int64_t>{257};
      k.d = 33, k.g_bits = g_bits, k.shape = {96, 160}, k.seed = 7;
      INFO(name_of(k));
      const Batch batch = make_batch(k);
      bool resident = false;
      const Outputs single = run_single(k, batch, &resident);
      REQUIRE(resident);  // dk in the rows sweep, as a block computes it
      CHECK(same_values(run_ring(k, batch), single));
    }
}

TEST_CASE("contrastive/panels/ring_blocks/wrong_offset_is_caught") {
  // The same rings with one block's offset off by one: outside the bounds.
  RingBlocksCase sym;
  sym.symmetric = true, sym.rows = {67, 1, 131}, sym.d = 33, sym.shape = {96, 160}, sym.seed = 103;
  RingBlocksCase info;
  info.symmetric = false, info.rows = {200, 1, 37, 97}, info.cols = {13, 160, 1, 229}, info.d = 19;
  info.shape = {96, 160}, info.seed = 203;
  struct Wrong {
    const RingBlocksCase *k;
    Fault fault;
    const char *what;
  };
  const Wrong wrongs[] = {
      {&sym, {1, 0, 0, 1}, "symmetric: rank 1's col_offset of block 0 + 1"},
      {&sym, {2, 2, 1, 0}, "symmetric: rank 2's row_offset of its own block + 1"},
      {&info, {0, 3, 0, -1}, "infonce: rank 0's col_offset of block 3 - 1"},
  };
  for (const Wrong &w : wrongs) {
    INFO(w.what);
    const Batch batch = make_batch(*w.k);
    const Bounds b = bounds_of(*w.k, batch);
    check_no_misses(misses(run_ring(*w.k, batch), expected_of(b.ref), b, batch.scale));  // right offsets: inside
    const Outputs wrong = run_ring(*w.k, batch, w.fault);
    const Misses m = misses(wrong, expected_of(b.ref), b, batch.scale);
    CHECK(m.loss);  // the finish takes the positive from the block that claims it
    CHECK(m.dq > 0);  // the gradient pass's positives (positive_of with the offsets)
    CHECK(m.dk > 0);
    CHECK(m.ds);
  }
}

TEST_CASE("contrastive/panels/ring_blocks/bad_label_and_refusals") {
  RingBlocksCase k;
  k.symmetric = false, k.rows = {67, 1, 131}, k.cols = {13, 160, 1}, k.d = 19, k.shape = {96, 160}, k.seed = 9;
  Batch batch = make_batch(k);
  batch.labels[100] = batch.c;  // out of range, on rank 2
  const Outputs o = run_ring(k, batch);
  CHECK(std::isnan(o.loss));
  CHECK(std::isnan(o.dq[100 * std::size_t(k.d)]));
  CHECK(std::isfinite(o.dq[0]));
  CHECK(std::isnan(o.dk[0]));  // every column meets the bad row

  // A plan for another block shape, a softmax block with a sigmoid plan, missing states.
  const panels::CpuBlock bl = block_of(k, batch, 0, 1, {});
  std::vector<State> rows(std::size_t(bl.rows), panels::empty_state());
  std::vector<float> row_lse(std::size_t(bl.rows), 0.0f), dq(std::size_t(bl.rows * bl.d), 0.0f);
  const auto other = panels::plan_forward(bl.rows, bl.cols + 1, bl.d, Loss::infonce, 0);
  std::vector<char> ws(other.bytes);
  CHECK_THROWS(panels::cpu_fold_block(other, bl, ws.data(), rows.data(), nullptr));
  const auto fwd = panels::plan_forward(bl.rows, bl.cols, bl.d, Loss::infonce, 0);
  CHECK_THROWS(panels::cpu_gradient_block(fwd, bl, row_lse.data(), nullptr, ws.data(), dq.data(), nullptr, nullptr));
  const auto sig = panels::plan_backward(bl.rows, bl.cols, bl.d, Loss::sigmoid, true, false, false, 0);
  ws.resize(sig.bytes);
  CHECK_THROWS(panels::cpu_gradient_block(sig, bl, row_lse.data(), nullptr, ws.data(), dq.data(), nullptr, nullptr));
  const auto sym = panels::plan_forward(bl.rows, bl.cols, bl.d, Loss::symmetric, 0);
  ws.resize(sym.bytes);
  CHECK_THROWS(panels::cpu_fold_block(sym, bl, ws.data(), rows.data(), nullptr));  // symmetric: column states
  panels::CpuBlock outside = bl;
  outside.col_offset = batch.c - bl.cols + 1;
  CHECK_THROWS(panels::cpu_fold_block(fwd, outside, ws.data(), rows.data(), nullptr));
}

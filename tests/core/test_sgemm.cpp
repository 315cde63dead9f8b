// flatmem's fp32 GEMM (src/core/gemm/sgemm.hpp) at every CPU ISA level this
// processor runs, each called explicitly (not through FLATMEM_CPU_ISA), against
// a float64 product of the same fp32 values: the four op combinations, sizes
// around every block edge (1 .. 1000, n past the 2048-column block), leading
// dimensions longer than the rows, alpha in {1, -0.5}, beta in {0, 1, 0.25},
// beta = 0 over a NaN-filled C, k = 0 and alpha = 0. Then bitwise
// reproducibility: the same inputs at other pointer alignments, and from two
// threads at once. It includes src/: the GEMM is internal.
//
// Bound (u = 2^-24, gamma_n = n u / (1 - n u), Higham, Accuracy and Stability,
// 3.1): an entry alpha sum_p a_ip b_pj + beta c_ij is a sum of k + 1 terms. Each
// k block's FMA chain rounds a term at most once per remaining step (the SSE2
// variant also rounds each product), and folding a block into C rounds once
// more for alpha acc + beta c (plus alpha acc, beta c themselves without FMA),
// so no term meets more than k + 2 roundings and
//   |C - C_exact| <= gamma_{k+2} (|alpha| sum_p |a_ip| |b_pj| + |beta| |c_ij|).
// The float64 reference errs by at most gamma64_{k+1} times the same sum
// (u64 = 2^-53), added to the tolerance. A dropped k step, a wrong packing
// index or a wrong edge copy moves an entry by a whole product |a b| ~ 0.3,
// while the bound is at most ~ 1000 x 6e-8 x sum|a||b|: for k = 1000 about
// 0.015 of the sum of magnitudes, for k = 16 about 1e-6 of it.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "core/gemm/sgemm.hpp"
#include <flatmem/flatmem.h>

namespace {

using flatmem::cpu_isa::Isa;
using flatmem::gemm::Op;

// Every ISA level up to the processor's best, least capable first.
std::vector<Isa> levels() {
  flatmem_cpu_isa best = FLATMEM_CPU_ISA_BASELINE;
  REQUIRE(flatmem_cpu_isa_get(nullptr, &best) == FLATMEM_STATUS_SUCCESS);
  std::vector<Isa> out;
  for (int level = FLATMEM_CPU_ISA_BASELINE; level <= int(best); ++level) out.push_back(Isa(level));
  return out;
}

const char *op_name(Op op) { return op == Op::none ? "N" : "T"; }

struct Problem {
  Op op_a = Op::none, op_b = Op::none;
  std::int64_t m = 0, n = 0, k = 0, lda = 0, ldb = 0, ldc = 0;
  float alpha = 1.0f, beta = 0.0f;
  std::vector<float> a, b, c;  // c: C before the call (NaN when beta == 0)

  // stored sizes: A is m x k (k x m transposed), B k x n (n x k transposed)
  std::int64_t a_rows() const { return op_a == Op::none ? m : k; }
  std::int64_t b_rows() const { return op_b == Op::none ? k : n; }
  float op_a_at(std::int64_t i, std::int64_t p) const {
    return op_a == Op::none ? a[std::size_t(i * lda + p)] : a[std::size_t(p * lda + i)];
  }
  float op_b_at(std::int64_t p, std::int64_t j) const {
    return op_b == Op::none ? b[std::size_t(p * ldb + j)] : b[std::size_t(j * ldb + p)];
  }
};

Problem make_problem(Op op_a, Op op_b, std::int64_t m, std::int64_t n, std::int64_t k, std::int64_t pad,
                     float alpha, float beta, std::uint32_t seed) {
  Problem p;
  p.op_a = op_a, p.op_b = op_b, p.m = m, p.n = n, p.k = k, p.alpha = alpha, p.beta = beta;
  p.lda = (op_a == Op::none ? k : m) + pad;
  p.ldb = (op_b == Op::none ? n : k) + pad;
  p.ldc = n + pad;
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);
  // padding holds NaN: reading it poisons an entry
  const float nan = std::numeric_limits<float>::quiet_NaN();
  p.a.assign(std::size_t(std::max<std::int64_t>(p.a_rows() * p.lda, 1)), nan);
  p.b.assign(std::size_t(std::max<std::int64_t>(p.b_rows() * p.ldb, 1)), nan);
  p.c.assign(std::size_t(m * p.ldc), nan);
  for (std::int64_t r = 0; r < p.a_rows(); ++r)
    for (std::int64_t j = 0; j < p.lda - pad; ++j) p.a[std::size_t(r * p.lda + j)] = uniform(rng);
  for (std::int64_t r = 0; r < p.b_rows(); ++r)
    for (std::int64_t j = 0; j < p.ldb - pad; ++j) p.b[std::size_t(r * p.ldb + j)] = uniform(rng);
  if (beta != 0.0f)
    for (std::int64_t i = 0; i < m; ++i)
      for (std::int64_t j = 0; j < n; ++j) p.c[std::size_t(i * p.ldc + j)] = uniform(rng);
  return p;
}

// C64 = alpha op(A) op(B) + beta C in float64 and the bound's magnitude
// |alpha| sum |a||b| + |beta||c| (op(A) and op(B)^T materialised as rows of k).
struct Reference {
  std::vector<double> value, magnitude;
};

Reference reference(const Problem &p) {
  std::vector<double> at(std::size_t(p.m * p.k)), bt(std::size_t(p.n * p.k));
  for (std::int64_t i = 0; i < p.m; ++i)
    for (std::int64_t q = 0; q < p.k; ++q) at[std::size_t(i * p.k + q)] = p.op_a_at(i, q);
  for (std::int64_t j = 0; j < p.n; ++j)
    for (std::int64_t q = 0; q < p.k; ++q) bt[std::size_t(j * p.k + q)] = p.op_b_at(q, j);
  Reference r;
  r.value.resize(std::size_t(p.m * p.n));
  r.magnitude.resize(std::size_t(p.m * p.n));
  for (std::int64_t i = 0; i < p.m; ++i)
    for (std::int64_t j = 0; j < p.n; ++j) {
      const double *x = at.data() + i * p.k, *y = bt.data() + j * p.k;
      double sum = 0.0, mag = 0.0;
      for (std::int64_t q = 0; q < p.k; ++q) {
        sum += x[q] * y[q];
        mag += std::fabs(x[q] * y[q]);
      }
      const double c = p.beta != 0.0f ? double(p.c[std::size_t(i * p.ldc + j)]) : 0.0;
      r.value[std::size_t(i * p.n + j)] = double(p.alpha) * sum + double(p.beta) * c;
      r.magnitude[std::size_t(i * p.n + j)] = std::fabs(double(p.alpha)) * mag + std::fabs(double(p.beta) * c);
    }
  return r;
}

std::vector<float> run(Isa isa, const Problem &p) {
  std::vector<float> c = p.c;
  flatmem::gemm::sgemm(isa, p.op_a, p.op_b, p.m, p.n, p.k, p.alpha, p.a.data(), p.lda, p.b.data(), p.ldb,
                       p.beta, c.data(), p.ldc);
  return c;
}

std::string describe(Isa isa, const Problem &p) {
  return std::string("kernel=") + flatmem::gemm::sgemm_kernel(isa) + " op=" + op_name(p.op_a) + op_name(p.op_b) +
         " m=" + std::to_string(p.m) + " n=" + std::to_string(p.n) + " k=" + std::to_string(p.k) +
         " lda=" + std::to_string(p.lda) + " ldb=" + std::to_string(p.ldb) + " ldc=" + std::to_string(p.ldc) +
         " alpha=" + std::to_string(p.alpha) + " beta=" + std::to_string(p.beta);
}

double gamma(double n, double u) { return n * u / (1.0 - n * u); }

// Every entry within the bound; C's padding untouched (still NaN).
void check(Isa isa, const Problem &p, const Reference &r) {
  const std::vector<float> c = run(isa, p);
  const double tol = gamma(double(p.k + 2), std::ldexp(1.0, -24)) + gamma(double(p.k + 1), std::ldexp(1.0, -53));
  std::int64_t bad = 0, first_i = -1, first_j = -1, padding_written = 0;
  double worst = 0.0;
  for (std::int64_t i = 0; i < p.m; ++i) {
    for (std::int64_t j = 0; j < p.n; ++j) {
      const double got = c[std::size_t(i * p.ldc + j)];
      const double err = std::fabs(got - r.value[std::size_t(i * p.n + j)]);
      const double bound = tol * r.magnitude[std::size_t(i * p.n + j)];
      if (!(err <= bound)) {
        if (bad++ == 0) first_i = i, first_j = j;
      }
      if (bound > 0.0 && err / bound > worst) worst = err / bound;
    }
    for (std::int64_t j = p.n; j < p.ldc; ++j)
      if (!std::isnan(c[std::size_t(i * p.ldc + j)])) ++padding_written;
  }
  const std::string where = describe(isa, p) + ": first bad entry (" + std::to_string(first_i) + ", " +
                            std::to_string(first_j) + "), largest error / bound " + std::to_string(worst);
  INFO(where);
  CHECK(bad == 0);
  CHECK(padding_written == 0);
}

const std::int64_t kSizes[] = {1, 2, 3, 5, 7, 13, 16, 17, 31, 33, 64, 97, 255, 256, 257, 513, 1000};
constexpr int kSizeCount = int(sizeof kSizes / sizeof kSizes[0]);
const float kAlphas[] = {1.0f, -0.5f};
const float kBetas[] = {0.0f, 1.0f, 0.25f};
const std::int64_t kPads[] = {0, 1, 7};

void check_ops(Op op_a, Op op_b) {
  const std::vector<Isa> isas = levels();
  for (Isa isa : isas)
    MESSAGE((std::string("sgemm at ") + flatmem_cpu_isa_name(flatmem_cpu_isa(isa)) + ": " +
            flatmem::gemm::sgemm_kernel(isa)));
  const int shift = 2 * int(op_a) + int(op_b);
  std::uint32_t seed = 1234u + std::uint32_t(shift);
  int index = 0;
  auto one = [&](std::int64_t m, std::int64_t n, std::int64_t k) {
    // pad, beta and alpha through all 18 combinations every 18 problems
    const Problem p = make_problem(op_a, op_b, m, n, k, kPads[index % 3], kAlphas[(index / 9) % 2],
                                   kBetas[(index / 3) % 3], seed++);
    ++index;
    const Reference r = reference(p);
    for (Isa isa : isas) check(isa, p, r);
  };
  // every combination of the small sizes (the edges of one register block)
  for (int i = 0; i < 8; ++i)
    for (int j = 0; j < 8; ++j)
      for (int l = 0; l < 8; l += 1 + (i + j) % 2) one(kSizes[i], kSizes[j], kSizes[l]);
  // every size once as m, as n and as k, in a different company for each op pair
  for (int i = 0; i < kSizeCount; ++i) {
    std::int64_t m = kSizes[i], n = kSizes[(i * 5 + 3 + shift) % kSizeCount],
                 k = kSizes[(i * 11 + 7 + 2 * shift) % kSizeCount];
    if (m * n * k > 150'000'000) k = 97;  // keep the float64 reference to seconds
    one(m, n, k);
  }
  // past the column block (2048) and the row block; k split in uneven blocks
  one(7, 4133, 300);
  one(401, 33, 1000);
  one(1000, 64, 777);
}

}  // namespace

TEST_CASE("core/sgemm/fp32/every_isa/NN") { check_ops(Op::none, Op::none); }
TEST_CASE("core/sgemm/fp32/every_isa/NT") { check_ops(Op::none, Op::transpose); }
TEST_CASE("core/sgemm/fp32/every_isa/TN") { check_ops(Op::transpose, Op::none); }
TEST_CASE("core/sgemm/fp32/every_isa/TT") { check_ops(Op::transpose, Op::transpose); }

// k = 0 and alpha = 0: C = beta C, A and B not read (they are NaN here); beta = 0 clears a NaN C.
TEST_CASE("core/sgemm/fp32/every_isa/k=0,alpha=0") {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const std::vector<float> a(64, nan), b(64, nan);
  for (Isa isa : levels()) {
    INFO((std::string("isa=") + flatmem::gemm::sgemm_kernel(isa)));
    for (const auto &[k, alpha] : {std::pair<std::int64_t, float>{0, 1.0f}, {5, 0.0f}}) {
      std::vector<float> c(3 * 4, nan);
      flatmem::gemm::sgemm(isa, Op::none, Op::none, 3, 2, k, alpha, a.data(), 5, b.data(), 2, 0.0f, c.data(), 4);
      for (int i = 0; i < 3; ++i) {
        CHECK(c[std::size_t(4 * i)] == 0.0f);
        CHECK(c[std::size_t(4 * i + 1)] == 0.0f);
        CHECK(std::isnan(c[std::size_t(4 * i + 2)]));  // ldc padding untouched
      }
      std::vector<float> d = {1.0f, -2.0f, 3.0f, 4.0f};
      flatmem::gemm::sgemm(isa, Op::transpose, Op::transpose, 2, 2, k, alpha, a.data(), 2, b.data(), 5, 0.25f,
                           d.data(), 2);
      CHECK(d == std::vector<float>{0.25f, -0.5f, 0.75f, 1.0f});
    }
  }
}

namespace {

// A copy of v starting `shift` floats into a fresh 64-byte-aligned buffer.
struct Shifted {
  std::vector<float> storage;
  float *data;
  Shifted(const std::vector<float> &v, int shift) : storage(v.size() + 32) {
    auto addr = reinterpret_cast<std::uintptr_t>(storage.data());
    data = storage.data() + ((64 - addr % 64) % 64) / sizeof(float) + shift;
    std::memcpy(data, v.data(), v.size() * sizeof(float));
  }
};

bool same_bits(const float *x, const float *y, std::size_t n) { return std::memcmp(x, y, n * sizeof(float)) == 0; }

}  // namespace

// The same inputs at other alignments of A, B and C, and from two threads at
// once (each its own packing buffers), give the same bits.
TEST_CASE("core/sgemm/fp32/every_isa/bitwise_across_alignment_and_threads") {
  const struct {
    Op op_a, op_b;
    std::int64_t m, n, k;
    float beta;
  } shapes[] = {{Op::none, Op::transpose, 97, 255, 257, 0.0f},
                {Op::none, Op::none, 300, 129, 513, 1.0f},
                {Op::transpose, Op::none, 129, 97, 300, 0.25f},
                {Op::transpose, Op::transpose, 33, 2100, 17, 1.0f}};
  for (Isa isa : levels())
    for (const auto &s : shapes) {
      const Problem p = make_problem(s.op_a, s.op_b, s.m, s.n, s.k, 3, -0.5f, s.beta, 77u);
      INFO(describe(isa, p));
      const std::vector<float> expected = run(isa, p);
      for (int shift = 1; shift < 16; shift += 5) {
        Shifted a(p.a, shift), b(p.b, (shift * 3) % 16), c(p.c, (shift * 7) % 16);
        flatmem::gemm::sgemm(isa, p.op_a, p.op_b, p.m, p.n, p.k, p.alpha, a.data, p.lda, b.data, p.ldb, p.beta,
                             c.data, p.ldc);
        CHECK(same_bits(c.data, expected.data(), expected.size()));
      }
      std::vector<float> out[2];
      auto work = [&](int t) {
        for (int rep = 0; rep < 3; ++rep) out[t] = run(isa, p);
      };
      std::thread other(work, 1);
      work(0);
      other.join();
      CHECK(same_bits(out[0].data(), expected.data(), expected.size()));
      CHECK(same_bits(out[1].data(), expected.data(), expected.size()));
    }
}

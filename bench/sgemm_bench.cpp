// sgemm_bench: flatmem's own fp32 GEMM (src/core/gemm/sgemm.hpp) against
// OpenBLAS's cblas_sgemm, single-threaded, at the contrastive tile shapes:
//   NT  logits = Q K^T        m = tile, n = tile, k = d
//   NN  dq    += G K          m = tile, n = d,    k = tile
//   TN  dk    += G^T Q        m = tile, n = d,    k = tile
// for every ISA level the processor runs (baseline, avx2, avx512; avx512bf16 and
// amx run avx512's kernel). OpenBLAS picks its kernels once, when it loads, from
// OPENBLAS_CORETYPE, so each level runs in a child process of this program with
// the matching OpenBLAS core (Prescott for baseline, Haswell for avx2, SkylakeX
// for avx512; "--coretype default" lets OpenBLAS choose) and OPENBLAS_NUM_THREADS=1;
// within a child both GEMMs run in the same process, alternating rounds, so a
// noisy machine shows in both columns. GFLOP/s = 2 m n k / seconds, best of
// --rounds rounds of at least --min-time each; "ratio" is flatmem / OpenBLAS.
// Pin it (taskset -c 1) on a shared machine.
//
//   sgemm_bench [--tile 512] [--dims 256,512,768] [--min-time 0.2] [--rounds 5]
//               [--isa baseline,avx2,avx512] [--coretype default]
#include <cblas.h>
#include <spawn.h>
#include <sys/wait.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "bench_support.hpp"
#include "core/gemm/sgemm.hpp"
#include <flatmem/flatmem.h>

extern char **environ;

namespace {

using flatmem::cpu_isa::Isa;
using flatmem::gemm::Op;

struct Options {
  std::int64_t tile = 512;
  std::vector<std::int64_t> dims = {256, 512, 768};
  double min_time = 0.2;
  int rounds = 5;
  std::vector<std::string> isas = {"baseline", "avx2", "avx512"};
  std::string coretype;  // empty: the one matching each ISA
};

const char *matching_coretype(const std::string &isa) {
  if (isa == "avx512") return "SkylakeX";
  if (isa == "avx2") return "Haswell";
  return "Prescott";
}

Isa isa_from_name(const std::string &name) {
  if (name == "avx512") return Isa::avx512;
  if (name == "avx2") return Isa::avx2;
  return Isa::baseline;
}

// Best seconds per call of each of two functions, their rounds alternating.
template <typename F, typename G>
std::pair<double, double> best_seconds(F &&f, G &&g, double min_time, int rounds) {
  f(), g();  // warm caches, pages and packing buffers
  auto round = [&](auto &&fn) {
    int reps = 0;
    const double t0 = bench::now_seconds();
    double t = t0;
    do {
      fn();
      ++reps;
      t = bench::now_seconds();
    } while (t - t0 < min_time);
    return (t - t0) / reps;
  };
  double best_f = 1e30, best_g = 1e30;
  for (int r = 0; r < rounds; ++r) {
    best_f = std::min(best_f, round(f));
    best_g = std::min(best_g, round(g));
  }
  return {best_f, best_g};
}

CBLAS_TRANSPOSE cblas_op(Op op) { return op == Op::none ? CblasNoTrans : CblasTrans; }

struct Product {
  const char *name;
  Op op_a, op_b;
  std::int64_t m, n, k;
  float beta;
};

void run_child(const Options &o, const std::string &isa_name) {
  const Isa isa = isa_from_name(isa_name);
  std::mt19937_64 rng(7);
  std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);
  const char *core = openblas_get_corename();
  for (std::int64_t d : o.dims) {
    const std::int64_t t = o.tile;
    const Product products[] = {{"NT logits = Q K^T", Op::none, Op::transpose, t, t, d, 0.0f},
                                {"NN dq += G K", Op::none, Op::none, t, d, t, 1.0f},
                                {"TN dk += G^T Q", Op::transpose, Op::none, t, d, t, 1.0f}};
    for (const Product &p : products) {
      const std::int64_t lda = p.op_a == Op::none ? p.k : p.m, ldb = p.op_b == Op::none ? p.n : p.k;
      std::vector<float> a(std::size_t(p.m * p.k)), b(std::size_t(p.k * p.n)), c0(std::size_t(p.m * p.n));
      for (float &x : a) x = uniform(rng);
      for (float &x : b) x = uniform(rng);
      for (float &x : c0) x = uniform(rng);
      std::vector<float> c_flatmem = c0, c_blas = c0;
      // accumulating products (beta = 1) grow C a little per call; the values stay tame
      auto ours = [&] {
        flatmem::gemm::sgemm(isa, p.op_a, p.op_b, p.m, p.n, p.k, 1.0f, a.data(), lda, b.data(), ldb, p.beta,
                             c_flatmem.data(), p.n);
      };
      auto theirs = [&] {
        cblas_sgemm(CblasRowMajor, cblas_op(p.op_a), cblas_op(p.op_b), int(p.m), int(p.n), int(p.k), 1.0f,
                    a.data(), int(lda), b.data(), int(ldb), p.beta, c_blas.data(), int(p.n));
      };
      // one call each from the same C: the two agree to fp32 rounding
      c_flatmem = c0, c_blas = c0;
      ours(), theirs();
      double diff = 0.0, scale = 0.0;
      for (std::size_t i = 0; i < c0.size(); ++i) {
        diff = std::max(diff, double(std::fabs(c_flatmem[i] - c_blas[i])));
        scale = std::max(scale, double(std::fabs(c_blas[i])));
      }
      const auto [s_ours, s_theirs] = best_seconds(ours, theirs, o.min_time, o.rounds);
      const double flops = 2.0 * double(p.m) * double(p.n) * double(p.k);
      std::printf("%-9s %-18s %-9s %-18s %4lld %4lld %4lld %9.1f %9.1f %6.2f   %.1e\n", isa_name.c_str(),
                  flatmem::gemm::sgemm_kernel(isa), core, p.name, (long long)p.m, (long long)p.n,
                  (long long)p.k, flops / s_ours * 1e-9, flops / s_theirs * 1e-9, s_theirs / s_ours,
                  scale > 0 ? diff / scale : diff);
      std::fflush(stdout);
    }
  }
}

std::string join(const std::vector<std::int64_t> &v) {
  std::string s;
  for (std::int64_t x : v) s += (s.empty() ? "" : ",") + std::to_string(x);
  return s;
}

}  // namespace

int main(int argc, char **argv) {
  Options o;
  std::string child;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "%s needs a value\n", arg.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    if (arg == "--tile") o.tile = std::stoll(value());
    else if (arg == "--dims") {
      o.dims.clear();
      for (const std::string &d : bench::split(value())) o.dims.push_back(std::stoll(d));
    } else if (arg == "--min-time") o.min_time = std::stod(value());
    else if (arg == "--rounds") o.rounds = std::stoi(value());
    else if (arg == "--isa") o.isas = bench::split(value());
    else if (arg == "--coretype") o.coretype = value();
    else if (arg == "--child") child = value();
    else {
      std::fprintf(stderr, "usage: %s [--tile N] [--dims a,b] [--min-time s] [--rounds n] [--isa list] "
                   "[--coretype name|default]\n", argv[0]);
      return 2;
    }
  }
  if (!child.empty()) {
    openblas_set_num_threads(1);
    run_child(o, child);
    return 0;
  }

  flatmem_cpu_isa best = FLATMEM_CPU_ISA_BASELINE;
  if (flatmem_cpu_isa_get(nullptr, &best) != FLATMEM_STATUS_SUCCESS) return 1;
  std::printf("sgemm_bench: single thread, tile %lld, d in {%s}; best ISA here %s; best of %d rounds of >= %.2f s\n",
              (long long)o.tile, join(o.dims).c_str(), flatmem_cpu_isa_name(best), o.rounds, o.min_time);
  std::printf("%-9s %-18s %-9s %-18s %4s %4s %4s %9s %9s %6s   %s\n", "isa", "flatmem kernel", "OpenBLAS",
              "product", "m", "n", "k", "flatmem", "OpenBLAS", "ratio", "max|diff|/max|C|");
  std::printf("%-9s %-18s %-9s %-18s %4s %4s %4s %9s %9s\n", "", "", "core", "", "", "", "", "GFLOP/s", "GFLOP/s");
  std::fflush(stdout);
  int status = 0;
  for (const std::string &isa : o.isas) {
    if (int(isa_from_name(isa)) > int(best)) {
      std::printf("%-9s not run: this processor's best is %s\n", isa.c_str(), flatmem_cpu_isa_name(best));
      continue;
    }
    const std::string core = o.coretype.empty() ? matching_coretype(isa) : o.coretype;
    std::vector<std::string> args = {argv[0], "--child", isa, "--tile", std::to_string(o.tile), "--dims",
                                     join(o.dims), "--min-time", std::to_string(o.min_time), "--rounds",
                                     std::to_string(o.rounds)};
    std::vector<std::string> env;
    for (char **e = environ; *e; ++e)
      if (std::strncmp(*e, "OPENBLAS_CORETYPE=", 18) != 0 && std::strncmp(*e, "OPENBLAS_NUM_THREADS=", 21) != 0)
        env.emplace_back(*e);
    if (core != "default") env.push_back("OPENBLAS_CORETYPE=" + core);
    env.push_back("OPENBLAS_NUM_THREADS=1");
    std::vector<char *> argp, envp;
    for (std::string &s : args) argp.push_back(s.data());
    for (std::string &s : env) envp.push_back(s.data());
    argp.push_back(nullptr), envp.push_back(nullptr);
    pid_t pid = 0;
    if (posix_spawn(&pid, "/proc/self/exe", nullptr, nullptr, argp.data(), envp.data()) != 0) {
      std::perror("posix_spawn");
      return 1;
    }
    int wstatus = 0;
    waitpid(pid, &wstatus, 0);
    if (!WIFEXITED(wstatus) || WEXITSTATUS(wstatus) != 0) status = 1;
  }
  return status;
}

// contrastive_bench -- the symmetric contrastive (CLIP) loss, forward +
// backward, fp32: flatmem against the materialised loss and against the four
// GEMMs that bound the fused design, side by side in one run.
//
//   contrastive_bench                       b in {1024, 4096, 16384, 65536}, d = 512
//   contrastive_bench --quick               b in {1024, 4096}, short timings
//   contrastive_bench --sizes 2048,8192 --dim 256 --csv bench/memory.csv
//
// Every (b, variant) runs in its own process (fork + exec of this binary with
// --worker), and the parent reads that child's peak resident set from wait4.
// "Extra memory" is the child's peak minus the peak of a child that only
// allocates and fills q, k, dq, dk: measured, not assumed. Each child sets its
// own BLAS threading through the environment before OpenBLAS loads:
//   flatmem         OPENBLAS_NUM_THREADS unset (OpenBLAS default: all cores)
//   flatmem-blas1   OPENBLAS_NUM_THREADS=1
//   naive, gemm4    OPENBLAS_NUM_THREADS unset: OpenBLAS threads each GEMM itself
//   tilegemm        flatmem's own single-threaded sgemm per tile (the engine of its fp32 rows)
//   flatmem-cache   as flatmem, with options.logit_cache_bytes = 4 b^2 (every
//                   logit tile kept for the backward: 6 b^2 d FLOPs)
// The flatmem variants run once per CPU ISA of --isas (default: avx512bf16,
// avx512 and avx2 where the CPU has them), the child started with
// FLATMEM_CPU_ISA set; the BLAS variants do not depend on it and run once. An
// ISA above the CPU's best is skipped with the reason ("CPU lacks ...").
//
// --dtypes fp32,bf16 (the default: both): the flatmem variants (flatmem,
// flatmem-cache, flatmem-blas1, sigmoid) run once per dtype as well. A bf16 row
// passes the fp32 features rounded to bf16 (round to nearest even) as kDLBfloat
// 16 tensors, with bf16 dq and dk (as a framework passes them); its "extra
// memory" is over an inputs process holding the same (bf16 q, k, dq, dk and the
// rounded values in fp32). The BLAS variants stay fp32: the bf16 rows' ratios
// to naive and gemm4 are against those fp32 times.
//
// Loss error: for every (b, dtype) a child computes the loss of the very inputs
// the rows used (bf16: the rounded values) in float64 (contrastive_variants.hpp:
// reference, sigmoid-reference; dgemm in column strips, the loss in double, no
// b x b matrix). Each row with a loss prints |L - L64| / |L64| beside its time.
// It costs 2 b^2 d FLOPs in dgemm plus two exp per logit: ~1/3 of the naive
// variant's work in double, a few seconds at b = 16384 on a 2-core machine, so it
// runs at every size up to --ref-max-batch (default 65536; above: "n/a").
// (flatmem built with FLATMEM_BLAS=SERIAL_STATIC carries its own serial
// OpenBLAS, which the variable does not reach; both rows then read the same.)
//
// --loss sigmoid (or all) times the sigmoid (SigLIP) loss instead (or as
// well), b in {4096, 16384, 65536} by default, logit bias --bias (-10):
//   sigmoid         flatmem_contrastive_sigmoid_value_and_grad (loss, dq, dk,
//                   ds, dt in one call), once per CPU ISA like flatmem
//   sigmoid-naive   the materialised loss (1 GEMM, element-wise, 2 GEMMs)
//   gemm3           the sigmoid's three GEMMs in column strips: its floor
// (all three with OpenBLAS threading as flatmem / naive / gemm4).
//
// Target of the bf16 rows (issue 32), at b = 16384 on a CPU with AVX512_BF16:
// flatmem bf16 [avx512bf16] at >= 1.7x the speed of flatmem fp32 (the fastest fp32
// row of any ISA), its loss fp32-accurate (relative error against float64 <=
// max(4x the fp32 row's, 2^-20)); "not measured: CPU lacks AVX512_BF16" elsewhere.
// The other half (<= 0.5x open_clip's bf16 time) is bench/torch_loss_bench.py's.
#include <flatmem/flatmem.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "bench_support.hpp"
#include "contrastive_variants.hpp"

namespace {

constexpr double MiB = 1024.0 * 1024.0, GiB = 1024.0 * MiB;

// Targets this benchmark reports against (docs/benchmarks/contrastive-cpu.md).
constexpr std::int64_t target_batch = 16384;
constexpr double target_vs_gemm4 = 1.15, target_vs_naive = 1.35;
constexpr std::int64_t memory_target_batch = 65536;
constexpr double memory_target_bytes = 64.0 * MiB;
// The sigmoid loss's targets (issue 17): against its three-GEMM floor, same memory target.
constexpr double sigmoid_target_vs_gemm3 = 1.15;
// bf16 (issue 32): flatmem bf16 >= 1.7x flatmem fp32's speed at b = 16384 under avx512bf16, with a
// loss error against float64 of at most max(4x the fp32 row's, 2^-20): fp32-accurate.
constexpr double bf16_target_speedup = 1.7, bf16_error_factor = 4.0, bf16_error_floor = 1.0 / 1048576.0;

const std::vector<std::string> clip_variants{"flatmem", "flatmem-cache", "flatmem-blas1", "naive", "gemm4",
                                             "tilegemm"};
const std::vector<std::string> sigmoid_variants{"sigmoid", "sigmoid-naive", "gemm3"};

struct Options {
  std::string loss = "clip";  // clip | sigmoid | all: which tables, and the default variants and sizes
  std::vector<std::int64_t> sizes{1024, 4096, 16384, 65536};
  std::int64_t d = 512;
  float scale = 14.3f;
  float bias = -10.0f;  // sigmoid variants' logit bias t
  double min_time = 10.0;
  int max_reps = 10;
  double mem_limit_gib = 20.0;
  std::int64_t strip = 2048, tile = 512, tilegemm_max_batch = 16384;
  int rounds = 2, large_rounds = 1;      // interleaved repetitions of all variants; "large": b > 16384
  std::vector<std::string> variants;  // empty: those of --loss
  std::vector<std::string> isas;  // FLATMEM_CPU_ISA values for the flatmem variants
  std::vector<std::string> dtypes{"fp32", "bf16"};  // input dtypes of the flatmem variants
  std::int64_t fp32_precision = FLATMEM_FP32_PRECISION_DEFAULT;  // --precision: options.fp32_precision
  std::int64_t ref_max_batch = 65536;  // float64 reference loss up to this b (0: none)
  std::string csv;
  bool check = false;  // --check: sigmoid and sigmoid-naive must agree within derived bounds
};

enum class BlasEnv { keep, all_cores, one };

struct VariantSpec {
  const char *name, *worker;
  BlasEnv env;
  const char *label;
};

const VariantSpec specs[] = {
    {"inputs", "inputs", BlasEnv::keep, "inputs only (baseline)"},
    {"flatmem", "flatmem", BlasEnv::all_cores, "flatmem"},
    {"flatmem-blas1", "flatmem", BlasEnv::one, "flatmem, OPENBLAS_NUM_THREADS=1"},
    {"naive", "naive", BlasEnv::all_cores, "naive materialised loss"},
    {"gemm4", "gemm4", BlasEnv::all_cores, "4 GEMMs in column strips"},
    {"tilegemm", "tilegemm", BlasEnv::one, "4 GEMMs in tiles, flatmem's sgemm per thread"},
    {"flatmem-cache", "flatmem", BlasEnv::all_cores, "flatmem, logit cache 4 b^2 bytes"},
    {"sigmoid", "sigmoid", BlasEnv::all_cores, "flatmem sigmoid loss (value_and_grad)"},
    {"sigmoid-naive", "sigmoid-naive", BlasEnv::all_cores, "naive materialised sigmoid loss"},
    {"gemm3", "gemm3", BlasEnv::all_cores, "3 GEMMs in column strips"},
    {"reference", "reference", BlasEnv::all_cores, "float64 CLIP loss (dgemm strips)"},
    {"sigmoid-reference", "sigmoid-reference", BlasEnv::all_cores, "float64 sigmoid loss (dgemm strips)"},
};

// The variants that run flatmem's own kernels: once per CPU ISA, and once per dtype.
bool runs_per_isa(const std::string &variant) { return variant.rfind("flatmem", 0) == 0 || variant == "sigmoid"; }

// The float64 reference of a variant's loss ("" for variants without a loss).
std::string reference_of(const std::string &variant) {
  if (variant == "flatmem" || variant == "flatmem-cache" || variant == "flatmem-blas1" || variant == "naive")
    return "reference";
  if (variant == "sigmoid" || variant == "sigmoid-naive") return "sigmoid-reference";
  return "";
}

// FLATMEM_CPU_ISA names in flatmem_cpu_isa order (baseline = 1 ... amx = 5).
const char *const isa_names[] = {"baseline", "avx2", "avx512", "avx512bf16", "amx"};
int isa_rank(const std::string &isa) {
  for (int i = 0; i < 5; ++i)
    if (isa == isa_names[i]) return i + 1;
  return 0;
}
// What a CPU below `isa` lacks, for the skip notes.
const char *isa_feature(const std::string &isa) {
  return isa == "amx"          ? "AMX-TILE and AMX-BF16 (or the kernel's permission for tile data)"
         : isa == "avx512bf16" ? "AVX512_BF16"
         : isa == "avx512"     ? "AVX-512 (x86-64-v4)"
                               : "AVX2 (x86-64-v3)";
}
flatmem_cpu_isa best_isa() {
  flatmem_cpu_isa best = FLATMEM_CPU_ISA_BASELINE;
  if (flatmem_cpu_isa_get(nullptr, &best) != FLATMEM_STATUS_SUCCESS) return FLATMEM_CPU_ISA_BASELINE;
  return best;
}

const VariantSpec &spec(const std::string &name) {
  for (const auto &s : specs)
    if (name == s.name) return s;
  throw std::runtime_error("unknown variant '" + name +
                           "' (flatmem, flatmem-cache, flatmem-blas1, naive, gemm4, tilegemm, sigmoid, "
                           "sigmoid-naive, gemm3)");
}

struct Run {
  std::int64_t b = 0;
  std::string variant, status = "ok", note;  // status: ok | skipped | failed
  std::string isa;                            // FLATMEM_CPU_ISA of a flatmem variant, else empty
  std::string dtype = "fp32";                 // q, k (and dq, dk) dtype: fp32 | bf16
  double peak_bytes = NAN, extra_bytes = NAN, planned_bytes = NAN;
  std::map<std::string, double> values;
  double value(const std::string &key) const {
    const auto it = values.find(key);
    return it == values.end() ? NAN : it->second;
  }
  bool ok() const { return status == "ok"; }
};

double flops(const std::string &variant, std::int64_t b, std::int64_t d) {
  const double bbd = double(b) * double(b) * double(d);
  if (variant == "inputs" || variant == "reference" || variant == "sigmoid-reference") return 0.0;
  // naive and the cached flatmem do not recompute the logits, nor does the sigmoid loss
  const bool three_products = variant == "naive" || variant == "flatmem-cache" || variant == "sigmoid" ||
                              variant == "sigmoid-naive" || variant == "gemm3";
  return three_products ? 6.0 * bbd : 8.0 * bbd;
}

// ---- formatting --------------------------------------------------------------

std::string format(const char *fmt, double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, fmt, v);
  return buf;
}
std::string seconds(double s) {
  if (!std::isfinite(s)) return "-";
  return s < 0.1 ? format("%.1f ms", 1e3 * s) : format(s < 10 ? "%.2f s" : "%.1f s", s);
}
std::string bytes(double b) {
  if (!std::isfinite(b)) return "-";
  const double a = std::fabs(b);
  return a >= GiB ? format("%.2f GiB", b / GiB) : a >= MiB ? format("%.1f MiB", b / MiB)
                                                          : format("%.0f KiB", b / 1024.0);
}
std::string ratio(double r) { return std::isfinite(r) ? format("%.2f\u00d7", r) : "-"; }

std::string blas_threading(const Run &r) {
  const double threads = r.value("blas_threads"), parallel = r.value("blas_parallel");
  if (!std::isfinite(threads) || threads < 0) return "BLAS: not OpenBLAS";
  const char *kind = parallel == 0 ? "sequential" : parallel == 1 ? "pthreads" : "OpenMP";
  return format("OpenBLAS %.0f thread(s), ", threads) + kind;
}

// ---- running one variant in a child process ----------------------------------

std::string self_path() {
  char buf[4096];
  const ssize_t n = readlink("/proc/self/exe", buf, sizeof buf - 1);
  if (n <= 0) throw std::runtime_error("readlink(/proc/self/exe) failed");
  buf[n] = '\0';
  return buf;
}

void set_blas_env(BlasEnv env) {
  if (env == BlasEnv::keep) return;
  for (const char *var : {"OPENBLAS_NUM_THREADS", "GOTO_NUM_THREADS", "OMP_NUM_THREADS"}) unsetenv(var);
  if (env == BlasEnv::one) setenv("OPENBLAS_NUM_THREADS", "1", 1);
}

Run run_child(const Options &o, const std::string &variant, std::int64_t b, const std::string &isa = "",
              const std::string &dtype = "fp32") {
  const VariantSpec &s = spec(variant);
  Run run;
  run.b = b;
  run.variant = variant;
  run.isa = isa;
  run.dtype = dtype;
  run.planned_bytes = bench::planned_extra_bytes(s.name, b, o.d, o.strip);
  int fds[2];
  if (pipe(fds) != 0) throw std::runtime_error(std::string("pipe: ") + std::strerror(errno));
  std::vector<std::string> args = {self_path(), "--worker", s.worker, "--batch", std::to_string(b),
                                   "--dim", std::to_string(o.d), "--scale", format("%.9g", o.scale),
                                   "--bias", format("%.9g", o.bias),
                                   "--min-time", format("%.9g", o.min_time), "--max-reps",
                                   std::to_string(o.max_reps), "--strip", std::to_string(o.strip),
                                   "--tile", std::to_string(o.tile), "--result-fd", std::to_string(fds[1]),
                                   "--dtype", dtype, "--fp32-precision", std::to_string(o.fp32_precision)};
  if (variant == "flatmem-cache")
    args.insert(args.end(), {"--logit-cache-bytes", std::to_string(4 * b * b)});
  std::fflush(stdout);
  const pid_t pid = fork();
  if (pid < 0) throw std::runtime_error(std::string("fork: ") + std::strerror(errno));
  if (pid == 0) {
    close(fds[0]);
    set_blas_env(s.env);
    if (!isa.empty()) setenv("FLATMEM_CPU_ISA", isa.c_str(), 1);
    std::vector<char *> argv;
    for (auto &a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    execv(argv[0], argv.data());
    std::_Exit(127);
  }
  close(fds[1]);
  std::string text;
  char buf[4096];
  for (ssize_t n; (n = read(fds[0], buf, sizeof buf)) != 0;) {
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) break;
    text.append(buf, std::size_t(n));
  }
  close(fds[0]);
  int status = 0;
  rusage usage{};
  while (wait4(pid, &status, 0, &usage) < 0 && errno == EINTR) {
  }
  run.peak_bytes = 1024.0 * double(usage.ru_maxrss);  // Linux: KiB
  std::istringstream lines(text);
  for (std::string line; std::getline(lines, line);) {
    const auto eq = line.find('=');
    if (eq == std::string::npos) continue;
    if (line.compare(0, eq, "error") == 0) run.note = line.substr(eq + 1);
    else run.values[line.substr(0, eq)] = std::strtod(line.c_str() + eq + 1, nullptr);
  }
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    run.status = "failed";
    if (run.note.empty())
      run.note = WIFSIGNALED(status) ? "killed by signal " + std::to_string(WTERMSIG(status))
                                     : "exit status " + std::to_string(WEXITSTATUS(status));
  }
  return run;
}

// ---- worker mode -----------------------------------------------------------------

int worker_main(int argc, char **argv) {
  bench::VariantConfig c;
  int fd = -1;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string key = argv[i], value = argv[i + 1];
    if (key == "--worker") c.variant = value;
    else if (key == "--batch") c.b = std::stoll(value);
    else if (key == "--dim") c.d = std::stoll(value);
    else if (key == "--scale") c.scale = std::stof(value);
    else if (key == "--bias") c.bias = std::stof(value);
    else if (key == "--min-time") c.min_time = std::stod(value);
    else if (key == "--max-reps") c.max_reps = std::stoi(value);
    else if (key == "--strip") c.strip = std::stoll(value);
    else if (key == "--tile") c.tile = std::stoll(value);
    else if (key == "--result-fd") fd = std::stoi(value);
    else if (key == "--logit-cache-bytes") c.logit_cache_bytes = std::stoull(value);
    else if (key == "--dtype") c.dtype = value;
    else if (key == "--fp32-precision") c.fp32_precision = std::stoll(value);
  }
  FILE *out = fd >= 0 ? fdopen(fd, "w") : stdout;
  try {
    for (const auto &[key, value] : bench::run_variant(c)) std::fprintf(out, "%s=%.17g\n", key.c_str(), value);
    std::fclose(out);
    return 0;
  } catch (const std::exception &e) {
    std::fprintf(out, "error=%s\n", e.what());
    std::fclose(out);
    return 1;
  }
}

// ---- the driver ------------------------------------------------------------------

void usage() {
  std::printf(
      "usage: contrastive_bench [--loss clip|sigmoid|all] [--sizes B1,B2,...] [--dim D] [--quick] [--csv PATH]\n"
      "                         [--variants flatmem,flatmem-cache,flatmem-blas1,naive,gemm4,tilegemm,\n"
      "                                     sigmoid,sigmoid-naive,gemm3] [--bias T]\n"
      "                         [--isas amx,avx512bf16,avx512,avx2,baseline] [--dtypes fp32,bf16]\n"
      "                         [--ref-max-batch B] [--precision default|tf32|full]\n"
      "                         [--min-time S] [--max-reps N] [--mem-limit-gib G]\n"
      "                         [--strip W] [--tile T] [--tilegemm-max-batch B] [--scale S]\n"
      "                         [--rounds N] [--large-rounds N]\n"
      "  symmetric contrastive loss, forward + backward, fp32, b = c; defaults: sizes\n"
      "  1024,4096,16384,65536, d 512, min-time 10 s, at most 10 timed runs, variants needing\n"
      "  more than 20 GiB skipped, gemm4 strips of 2048 columns, tilegemm (a diagnostic:\n"
      "  flatmem's GEMMs alone at its 512 x 512 tiles) up to b = 16384. All variants of one b\n"
      "  run in turn, --rounds times (default 2; --large-rounds, default 1, for b > 16384), and\n"
      "  each reports its fastest run: other work on the machine only ever adds time.\n"
      "  flatmem variants run once per --isas entry (FLATMEM_CPU_ISA; default avx512bf16, avx512\n"
      "  and avx2 where the CPU has them, or the FLATMEM_CPU_ISA already set; an ISA the CPU lacks\n"
      "  is skipped with the reason) and once per --dtypes entry (default fp32,bf16: bf16 q, k, dq,\n"
      "  dk, the fp32 features rounded to nearest even; the BLAS variants stay fp32).\n"
      "  Every row with a loss prints its relative error against the float64 loss of the same\n"
      "  inputs (bf16: the rounded values), computed in a child of its own for b <= --ref-max-batch\n"
      "  (default 65536; 0: never; above: n/a).\n"
      "  --precision: options.fp32_precision of the flatmem and sigmoid rows; on the CPU it only\n"
      "  changes bf16 rows at avx512bf16: default / full split G in two bf16 parts (about fp32\n"
      "  gradients), tf32 rounds G to bf16 once (bf16-accurate gradients, the fastest).\n"
      "  --quick: sizes 1024,4096, min-time 0.3 s, 1 round.\n"
      "  --loss sigmoid: the sigmoid (SigLIP) loss instead, value and all gradients in one call:\n"
      "  variants sigmoid (flatmem, per --isas entry), sigmoid-naive (materialised), gemm3 (its\n"
      "  3-GEMM floor), default sizes 4096,16384,65536, logit bias --bias (default -10, scale\n"
      "  --scale); --loss all: both sets of variants (CLIP sizes) and both sets of tables.\n"
      "  --check: also fail (exit 1) unless sigmoid and sigmoid-naive agree on the loss, ds and dt\n"
      "  within bounds derived from their arithmetic (the CTest smoke test bench/sigmoid_smoke).\n");
}

// avx512bf16, avx512 and avx2 where the CPU (and the library) has them, or the
// one FLATMEM_CPU_ISA already names.
std::vector<std::string> default_isas() {
  const char *env = std::getenv("FLATMEM_CPU_ISA");
  if (env && *env && std::string(env) != "auto") {
    std::string isa = env;
    for (auto &ch : isa) ch = char(std::tolower(static_cast<unsigned char>(ch)));
    return {isa};
  }
  const flatmem_cpu_isa best = best_isa();
  if (best == FLATMEM_CPU_ISA_AMX) return {"amx", "avx512bf16", "avx512", "avx2"};
  if (best == FLATMEM_CPU_ISA_AVX512BF16) return {"avx512bf16", "avx512", "avx2"};
  if (best == FLATMEM_CPU_ISA_AVX512) return {"avx512", "avx2"};
  return {flatmem_cpu_isa_name(best)};
}

Options parse(int argc, char **argv) {
  Options o;
  bool sizes_given = false;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) throw std::runtime_error(a + " needs a value");
      return argv[++i];
    };
    if (a == "--help" || a == "-h") {
      usage();
      std::exit(0);
    } else if (a == "--quick") {
      o.sizes = {1024, 4096};
      sizes_given = true;
      o.min_time = 0.3;
      o.rounds = 1;
    } else if (a == "--sizes") {
      o.sizes.clear();
      sizes_given = true;
      for (const auto &s : bench::split(value())) o.sizes.push_back(std::stoll(s));
    } else if (a == "--loss") o.loss = value();
    else if (a == "--dim") o.d = std::stoll(value());
    else if (a == "--scale") o.scale = std::stof(value());
    else if (a == "--bias") o.bias = std::stof(value());
    else if (a == "--min-time") o.min_time = std::stod(value());
    else if (a == "--max-reps") o.max_reps = std::stoi(value());
    else if (a == "--mem-limit-gib") o.mem_limit_gib = std::stod(value());
    else if (a == "--strip") o.strip = std::stoll(value());
    else if (a == "--tile") o.tile = std::stoll(value());
    else if (a == "--tilegemm-max-batch") o.tilegemm_max_batch = std::stoll(value());
    else if (a == "--rounds") o.rounds = std::stoi(value());
    else if (a == "--large-rounds") o.large_rounds = std::stoi(value());
    else if (a == "--variants") o.variants = bench::split(value());
    else if (a == "--isas") o.isas = bench::split(value());
    else if (a == "--dtypes") o.dtypes = bench::split(value());
    else if (a == "--precision") {
      const std::string p = value();
      if (p == "default") o.fp32_precision = FLATMEM_FP32_PRECISION_DEFAULT;
      else if (p == "tf32") o.fp32_precision = FLATMEM_FP32_PRECISION_TF32;
      else if (p == "full") o.fp32_precision = FLATMEM_FP32_PRECISION_FULL;
      else throw std::runtime_error("--precision: '" + p + "'; expected default, tf32 or full");
    }
    else if (a == "--ref-max-batch") o.ref_max_batch = std::stoll(value());
    else if (a == "--csv") o.csv = value();
    else if (a == "--check") o.check = true;
    else throw std::runtime_error("unknown argument '" + a + "' (see --help)");
  }
  if (o.loss != "clip" && o.loss != "sigmoid" && o.loss != "all")
    throw std::runtime_error("--loss: '" + o.loss + "'; expected clip, sigmoid or all");
  if (o.variants.empty()) {
    if (o.loss != "sigmoid") o.variants = clip_variants;
    if (o.loss != "clip") o.variants.insert(o.variants.end(), sigmoid_variants.begin(), sigmoid_variants.end());
  }
  if (o.loss == "sigmoid" && !sizes_given) o.sizes = {4096, 16384, 65536};
  for (const auto &v : o.variants) (void)spec(v);
  for (auto b : o.sizes)
    if (b < 1) throw std::runtime_error("--sizes: batch sizes must be >= 1");
  if (o.d < 1) throw std::runtime_error("--dim must be >= 1");
  if (o.check && (std::find(o.variants.begin(), o.variants.end(), "sigmoid") == o.variants.end() ||
                  std::find(o.variants.begin(), o.variants.end(), "sigmoid-naive") == o.variants.end()))
    throw std::runtime_error("--check compares sigmoid with sigmoid-naive: select both (--loss sigmoid)");
  if (o.isas.empty()) o.isas = default_isas();
  for (const auto &isa : o.isas)
    if (isa_rank(isa) == 0)
      throw std::runtime_error("--isas: '" + isa + "'; expected avx512bf16, avx512, avx2 or baseline");
  for (auto &dtype : o.dtypes) {
    if (dtype == "f32" || dtype == "float32") dtype = "fp32";
    if (dtype == "bfloat16") dtype = "bf16";
    if (dtype != "fp32" && dtype != "bf16")
      throw std::runtime_error("--dtypes: '" + dtype + "'; expected fp32 or bf16");
  }
  if (o.dtypes.empty()) throw std::runtime_error("--dtypes: at least one of fp32, bf16");
  return o;
}

std::string cpu_model() {
  std::ifstream in("/proc/cpuinfo");
  for (std::string line; std::getline(in, line);)
    if (line.rfind("model name", 0) == 0) return line.substr(line.find(':') + 2);
  return "unknown CPU";
}

double machine_ram_bytes() {
  const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
  return pages > 0 && page > 0 ? double(pages) * double(page) : NAN;
}

// Variants with a dtype dimension: the flatmem ones, the inputs baselines, the references.
bool has_dtype(const std::string &variant) {
  return runs_per_isa(variant) || variant == "inputs" || variant == "reference" || variant == "sigmoid-reference";
}

// The run of `variant` at b; for a flatmem variant the one under `isa`; for one with a
// dtype dimension the one of `dtype` (the BLAS variants are fp32 and serve every dtype).
const Run *find(const std::vector<Run> &runs, std::int64_t b, const std::string &variant,
                const std::string &isa = "", const std::string &dtype = "fp32") {
  for (const auto &r : runs)
    if (r.b == b && r.variant == variant && (!runs_per_isa(variant) || r.isa == isa) &&
        (!has_dtype(variant) || r.dtype == dtype))
      return &r;
  return nullptr;
}

// |L - L64| / |L64|: a run's loss against the float64 loss of its inputs (NaN without either).
double loss_error(const std::vector<Run> &runs, const Run *r) {
  const std::string ref = r && r->ok() ? reference_of(r->variant) : "";
  const Run *x = ref.empty() ? nullptr : find(runs, r->b, ref, "", r->dtype);
  if (!x || !x->ok()) return NAN;
  return std::fabs(r->value("loss") - x->value("loss")) / std::fabs(x->value("loss"));
}

// The error as a table cell: "n/a" where no reference was computed (--ref-max-batch).
std::string error_cell(const std::vector<Run> &runs, const Run *r) {
  if (!r || !r->ok()) return "-";
  const double e = loss_error(runs, r);
  if (std::isfinite(e)) return format("%.1e", e);
  const Run *x = find(runs, r->b, reference_of(r->variant), "", r->dtype);
  return x && x->status == "skipped" ? "n/a" : "-";
}

void print_progress(const Run &r, const Options &o, const std::vector<Run> &runs) {
  std::string name = r.variant;
  if (!r.isa.empty() || r.dtype != "fp32")
    name += " [" + r.isa + (r.isa.empty() || r.dtype == "fp32" ? "" : ", ") + (r.dtype == "fp32" ? "" : r.dtype) + "]";
  std::printf("  %-28s ", name.c_str());
  if (!r.ok()) {
    std::printf("%s: %s\n", r.status.c_str(), r.note.c_str());
    return;
  }
  if (r.variant == "reference" || r.variant == "sigmoid-reference") {
    std::printf("loss %.15g (float64, %s, strips of %.0f columns)\n", r.value("loss"), seconds(r.value("ref_s")).c_str(),
                r.value("strip"));
    return;
  }
  const std::int64_t d = o.d;
  const double total = r.value("total_s");
  if (std::isfinite(total)) {
    const bool split = r.value("fwd_s") > 0.0;  // tilegemm times only the whole
    std::printf("fwd %-9s bwd %-9s best %-9s (%2.0f runs) %5.0f GFLOP/s  ",
                split ? seconds(r.value("fwd_s")).c_str() : "-", split ? seconds(r.value("bwd_s")).c_str() : "-",
                seconds(total).c_str(), r.value("reps"), flops(r.variant, r.b, d) / total / 1e9);
  }
  std::printf("peak %-10s extra %-10s %s", bytes(r.peak_bytes).c_str(),
              r.variant == "inputs" ? "-" : bytes(r.extra_bytes).c_str(), blas_threading(r).c_str());
  if (!reference_of(r.variant).empty()) std::printf("  loss err %s", error_cell(runs, &r).c_str());
  std::printf("\n");
}

double total_of(const Run *r) { return r && r->ok() ? r->value("total_s") : NAN; }

std::string time_cell(const Run *r) {
  if (!r) return "-";
  if (r->status == "skipped") return r->note;
  if (!r->ok()) return "failed";
  return seconds(r->value("total_s"));
}

std::string memory_cell(const Run *r) {
  if (!r) return "-";
  if (r->status == "skipped") return r->note;
  if (!r->ok()) return "failed";
  return bytes(r->extra_bytes);
}

void write_csv(const std::string &path, const std::vector<Run> &runs, const Options &o) {
  std::ofstream out(path);
  if (!out) throw std::runtime_error("cannot write " + path);
  out << "batch,dim,variant,isa,status,fwd_s,bwd_s,total_s,reps,gflops,peak_rss_bytes,extra_bytes,"
         "planned_extra_bytes,workspace_bytes,median_total_s,loss,blas_threads,blas_parallel,machine_ram_bytes,"
         "dtype,loss_rel_err,reference_loss,reference_s,note\n";
  for (const auto &r : runs) {
    const double total = r.value("total_s");
    const double gflops = r.ok() && std::isfinite(total) && total > 0 ? flops(r.variant, r.b, o.d) / total / 1e9 : NAN;
    const double ws = std::fmax(r.value("workspace_forward"), r.value("workspace_backward"));
    auto num = [](double v) { return std::isfinite(v) ? format("%.9g", v) : std::string(); };
    std::string note = r.note;
    for (auto &ch : note)
      if (ch == ',' || ch == '\n') ch = ';';
    out << r.b << ',' << o.d << ',' << r.variant << ',' << r.isa << ',' << r.status << ',' << num(r.value("fwd_s")) << ','
        << num(r.value("bwd_s")) << ',' << num(total) << ',' << num(r.value("reps")) << ',' << num(gflops)
        << ',' << num(r.peak_bytes) << ',' << num(r.extra_bytes) << ',' << num(r.planned_bytes) << ','
        << num(ws) << ',' << num(r.value("median_total_s")) << ',' << num(r.value("loss")) << ',' << num(r.value("blas_threads")) << ','
        << num(r.value("blas_parallel")) << ',' << num(machine_ram_bytes()) << ',' << r.dtype << ','
        << num(loss_error(runs, &r)) << ',';
    const std::string ref = reference_of(r.variant);
    const Run *x = ref.empty() ? nullptr : find(runs, r.b, ref, "", r.dtype);
    out << (x && x->ok() ? format("%.17g", x->value("loss")) : std::string()) << ',' << num(r.value("ref_s")) << ','
        << note << '\n';
  }
}

bool selects_any(const Options &o, const std::vector<std::string> &family) {
  for (const auto &v : o.variants)
    if (std::find(family.begin(), family.end(), v) != family.end()) return true;
  return false;
}

const char *verdict(double value, double limit) {
  return !std::isfinite(value) ? "not measured" : value <= limit ? "MET" : "MISSED";
}

// "- flatmem extra memory < 64.0 MiB at b = 65536: ..." for the run of `variant` there.
void print_memory_target(const std::vector<Run> &runs, const Options &o, const std::string &variant) {
  const Run *m = find(runs, memory_target_batch, variant, o.isas.front());
  const double mem = m && m->ok() ? m->extra_bytes : NAN;
  std::printf("- %s extra memory < %s at b = %lld: %s -> %s\n", variant.c_str(), bytes(memory_target_bytes).c_str(),
              (long long)memory_target_batch, bytes(mem).c_str(),
              !std::isfinite(mem) ? "not measured" : mem < memory_target_bytes ? "MET" : "MISSED");
}

// "loss, flatmem vs naive (same features): b=... [isa]: L vs L (rel. diff ...)" (fp32 rows: naive is fp32).
void print_loss_agreement(const std::vector<Run> &runs, const Options &o, const std::string &variant,
                          const std::string &naive) {
  std::printf("\nloss, %s vs naive (same features, fp32):", variant.c_str());
  for (auto b : o.sizes)
    for (const auto &isa : o.isas) {
      const Run *f = find(runs, b, variant, isa), *n = find(runs, b, naive);
      if (f && n && f->ok() && n->ok())
        std::printf("  b=%lld [%s]: %.6f vs %.6f (rel. diff %.1e)", (long long)b, isa.c_str(), f->value("loss"),
                    n->value("loss"), std::fabs(f->value("loss") - n->value("loss")) / std::fabs(n->value("loss")));
    }
  std::printf("\n");
}

// Every row's loss against the float64 loss of its own inputs (bf16 rows: the rounded values).
void print_loss_errors(const std::vector<Run> &runs, const Options &o, const std::string &reference,
                       const std::vector<std::string> &variants) {
  std::printf("\nloss against float64 (%s of the same inputs; |L - L64| / |L64|):\n", reference.c_str());
  for (auto b : o.sizes)
    for (const auto &dtype : o.dtypes) {
      const Run *x = find(runs, b, reference, "", dtype);
      if (!x) continue;
      if (!x->ok()) {
        std::printf("- b = %lld, %s: %s\n", (long long)b, dtype.c_str(), x->note.c_str());
        continue;
      }
      std::printf("- b = %lld, %s inputs: L64 = %.12f;", (long long)b, dtype.c_str(), x->value("loss"));
      for (const auto &v : variants) {
        if (std::find(o.variants.begin(), o.variants.end(), v) == o.variants.end()) continue;
        if (!runs_per_isa(v)) {
          if (dtype != "fp32") continue;
          const Run *r = find(runs, b, v);
          if (r && r->ok()) std::printf("  %s %.1e", v.c_str(), loss_error(runs, r));
          continue;
        }
        for (const auto &isa : o.isas) {
          const Run *r = find(runs, b, v, isa, dtype);
          if (r && r->ok()) std::printf("  %s [%s] %.1e", v.c_str(), isa.c_str(), loss_error(runs, r));
        }
      }
      std::printf("\n");
    }
}

// Whether this CPU (as flatmem sees it) runs `isa`.
bool isa_available(const std::string &isa) { return isa_rank(isa) <= int(best_isa()); }

// The fastest fp32 run of `variant` at b over every ISA run (flatmem's own fp32 speed).
const Run *fastest_fp32(const std::vector<Run> &runs, const Options &o, std::int64_t b, const std::string &variant) {
  const Run *best = nullptr;
  for (const auto &isa : o.isas) {
    const Run *r = find(runs, b, variant, isa, "fp32");
    if (r && r->ok() && (!best || r->value("total_s") < best->value("total_s"))) best = r;
  }
  return best;
}

// bf16 (issue 32): at b = 16384 under avx512bf16, flatmem bf16 >= 1.7x flatmem fp32's speed with an
// fp32-accurate loss; "not measured: CPU lacks AVX512_BF16" where it does.
void print_bf16_targets(const std::vector<Run> &runs, const Options &o, const std::string &variant,
                        bool with_target) {
  if (std::find(o.dtypes.begin(), o.dtypes.end(), "bf16") == o.dtypes.end()) return;
  const std::string isa = "avx512bf16";
  const char *label = with_target ? "" : " (no target; for information)";
  if (!isa_available(isa)) {
    std::printf("- [%s] %s bf16 >= %.1fx %s fp32's speed at b = %lld, fp32-accurate loss%s: not measured: CPU "
                "lacks AVX512_BF16 (best ISA here: %s)\n", isa.c_str(), variant.c_str(), bf16_target_speedup,
                variant.c_str(), (long long)target_batch, label, flatmem_cpu_isa_name(best_isa()));
    return;
  }
  const Run *h = find(runs, target_batch, variant, isa, "bf16"), *f = fastest_fp32(runs, o, target_batch, variant);
  const Run *same = find(runs, target_batch, variant, isa, "fp32");
  const double speedup = total_of(f) / total_of(h);  // fp32 time / bf16 time
  const double e16 = loss_error(runs, h), e32 = loss_error(runs, same && same->ok() ? same : f);
  const double bound = std::fmax(bf16_error_factor * (std::isfinite(e32) ? e32 : 0.0), bf16_error_floor);
  const bool speed_ok = std::isfinite(speedup) && speedup >= bf16_target_speedup;
  const bool error_ok = std::isfinite(e16) && e16 <= bound;
  std::printf("- [%s] %s bf16 >= %.1fx %s fp32's speed at b = %lld%s: bf16 %s, fp32 %s [%s] -> %s faster: %s\n",
              isa.c_str(), variant.c_str(), bf16_target_speedup, variant.c_str(), (long long)target_batch, label,
              seconds(total_of(h)).c_str(), seconds(total_of(f)).c_str(), f ? f->isa.c_str() : "-",
              ratio(speedup).c_str(), !std::isfinite(speedup) ? "not measured" : speed_ok ? "MET" : "MISSED");
  std::printf("- [%s] %s bf16 loss fp32-accurate at b = %lld (error vs float64 <= max(%.0fx fp32's %s, 2^-20)): "
              "%s -> %s\n", isa.c_str(), variant.c_str(), (long long)target_batch, bf16_error_factor,
              std::isfinite(e32) ? format("%.1e", e32).c_str() : "-", std::isfinite(e16) ? format("%.1e", e16).c_str() : "-",
              !std::isfinite(e16) ? "not measured" : error_ok ? "MET" : "MISSED");
  if (with_target)
    std::printf("- [%s] flatmem bf16 <= 0.5x open_clip's bf16 time at b = %lld: measured by "
                "bench/torch_loss_bench.py (open_clip runs there)\n", isa.c_str(), (long long)target_batch);
}

void print_clip_tables(const std::vector<Run> &runs, const Options &o) {
  std::printf("\n### Symmetric contrastive loss, forward + backward, d = %lld (%s, %d threads)\n\n",
              (long long)o.d, cpu_model().c_str(), bench::hardware_threads());
  std::printf("| b | CPU ISA | dtype | flatmem | loss err | flatmem, cache 4b^2 | loss err | naive (materialised, fp32) "
              "| 4 GEMMs (floor, fp32) | flatmem / 4 GEMMs | cached / 4 GEMMs | flatmem / naive "
              "| flatmem / fp32 flatmem | cached / fp32 cached | flatmem GFLOP/s "
              "| extra memory: flatmem | extra memory: cached | extra memory: naive | flatmem workspace |\n");
  std::printf("|---:|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n");
  for (auto b : o.sizes)
    for (const auto &isa : o.isas)
      for (const auto &dtype : o.dtypes) {
        const Run *f = find(runs, b, "flatmem", isa, dtype), *fc = find(runs, b, "flatmem-cache", isa, dtype),
                  *f32 = find(runs, b, "flatmem", isa), *fc32 = find(runs, b, "flatmem-cache", isa),
                  *n = find(runs, b, "naive"), *g = find(runs, b, "gemm4");
        const double tf = total_of(f), tc = total_of(fc), tn = total_of(n), tg = total_of(g);
        const double ws = f && f->ok() ? std::fmax(f->value("workspace_forward"), f->value("workspace_backward")) : NAN;
        const bool same = dtype == "fp32";
        std::printf("| %lld | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |\n",
                    (long long)b, isa.c_str(), dtype.c_str(), time_cell(f).c_str(), error_cell(runs, f).c_str(),
                    time_cell(fc).c_str(), error_cell(runs, fc).c_str(), time_cell(n).c_str(), time_cell(g).c_str(),
                    ratio(tf / tg).c_str(), ratio(tc / tg).c_str(), ratio(tf / tn).c_str(),
                    same ? "-" : ratio(tf / total_of(f32)).c_str(), same ? "-" : ratio(tc / total_of(fc32)).c_str(),
                    std::isfinite(tf) ? format("%.0f", flops("flatmem", b, o.d) / tf / 1e9).c_str() : "-",
                    memory_cell(f).c_str(), memory_cell(fc).c_str(), memory_cell(n).c_str(), bytes(ws).c_str());
      }
  std::printf("\nflatmem and the 4 GEMMs: 8 b^2 d FLOPs; naive and flatmem with the logit cache: 6 b^2 d (they "
              "keep the logits instead of recomputing them; naive also 2 b^2 fp32 of memory, the cache 1 b^2 "
              "fp32). Extra memory: peak RSS of the variant's process minus that of a process holding only q, k, "
              "dq, dk (of the row's dtype; bf16 rows: also the rounded features in fp32, in both). Times: fastest "
              "timed run. CPU ISA: FLATMEM_CPU_ISA of the flatmem runs (the BLAS variants do not depend on it). "
              "dtype: of q, k, dq, dk (bf16: the fp32 features rounded to nearest even); naive and the 4 GEMMs "
              "are fp32 in every row. loss err: |L - L64| / |L64|, L64 the float64 loss of the same inputs "
              "(n/a: b > --ref-max-batch). flatmem / fp32 flatmem: the bf16 row's time over the fp32 row's of "
              "the same ISA.\n");

  std::printf("\n### Where the time goes, and BLAS threading\n\n");
  std::printf("| b | CPU ISA | dtype | flatmem forward | flatmem backward | flatmem (OpenBLAS default threads) | flatmem "
              "(OPENBLAS_NUM_THREADS=1) | tile GEMMs only (%lld^2 tiles, fp32) | 4 GEMMs in %lld-column strips |\n",
              (long long)o.tile, (long long)o.strip);
  std::printf("|---:|---|---|---:|---:|---:|---:|---:|---:|\n");
  for (auto b : o.sizes)
    for (const auto &isa : o.isas)
      for (const auto &dtype : o.dtypes) {
        const Run *f = find(runs, b, "flatmem", isa, dtype), *f1 = find(runs, b, "flatmem-blas1", isa, dtype),
                  *t = find(runs, b, "tilegemm"), *g = find(runs, b, "gemm4");
        std::printf("| %lld | %s | %s | %s | %s | %s | %s | %s | %s |\n", (long long)b, isa.c_str(), dtype.c_str(),
                    f && f->ok() ? seconds(f->value("fwd_s")).c_str() : "-",
                    f && f->ok() ? seconds(f->value("bwd_s")).c_str() : "-", time_cell(f).c_str(),
                    time_cell(f1).c_str(), time_cell(t).c_str(), time_cell(g).c_str());
      }
  for (const char *v : {"flatmem", "flatmem-blas1", "naive", "gemm4", "tilegemm"})
    for (const auto &r : runs)
      if (r.variant == v && r.ok()) {
        std::printf("%s%s: %s\n", v == std::string("flatmem") ? "\nBLAS threading in effect (the benchmark's "
                                                                "OpenBLAS; flatmem may carry its own):\n" : "",
                    spec(v).label, blas_threading(r).c_str());
        break;
      }

  print_loss_agreement(runs, o, "flatmem", "naive");
  print_loss_errors(runs, o, "reference", {"flatmem", "flatmem-cache", "flatmem-blas1", "naive"});

  std::printf("\n### Targets\n\n");
  const Run *g = find(runs, target_batch, "gemm4"), *n = find(runs, target_batch, "naive");
  for (const auto &isa : o.isas) {
    if (!isa_available(isa)) {
      std::printf("- [%s] flatmem targets at b = %lld: not measured: CPU lacks %s\n", isa.c_str(),
                  (long long)target_batch, isa_feature(isa));
      continue;
    }
    const Run *f = find(runs, target_batch, "flatmem", isa);
    const double r1 = total_of(f) / total_of(g), r2 = total_of(f) / total_of(n);
    std::printf("- [%s] flatmem <= %.2fx the 4-GEMM time at b = %lld: %s -> %s\n", isa.c_str(), target_vs_gemm4,
                (long long)target_batch, ratio(r1).c_str(), verdict(r1, target_vs_gemm4));
    std::printf("- [%s] flatmem <= %.2fx the naive loss at b = %lld: %s -> %s\n", isa.c_str(), target_vs_naive,
                (long long)target_batch, ratio(r2).c_str(), verdict(r2, target_vs_naive));
  }
  print_memory_target(runs, o, "flatmem");
  print_bf16_targets(runs, o, "flatmem", true);
}

void print_sigmoid_tables(const std::vector<Run> &runs, const Options &o) {
  std::printf("\n### Sigmoid (SigLIP) loss, value and gradients (loss, dq, dk, ds, dt), d = %lld, "
              "s = %.1f, t = %.1f (%s, %d threads)\n\n",
              (long long)o.d, o.scale, o.bias, cpu_model().c_str(), bench::hardware_threads());
  std::printf("| b | CPU ISA | dtype | flatmem sigmoid | loss err | naive (materialised, fp32) | 3 GEMMs (floor, fp32) "
              "| sigmoid / 3 GEMMs | sigmoid / naive | sigmoid / fp32 sigmoid | sigmoid GFLOP/s | peak memory: sigmoid "
              "| peak memory: naive | extra memory: sigmoid | extra memory: naive | extra memory: 3 GEMMs "
              "| sigmoid workspace |\n");
  std::printf("|---:|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n");
  auto peak_cell = [](const Run *r) { return r && r->ok() ? bytes(r->peak_bytes) : memory_cell(r); };
  for (auto b : o.sizes)
    for (const auto &isa : o.isas)
      for (const auto &dtype : o.dtypes) {
        const Run *f = find(runs, b, "sigmoid", isa, dtype), *f32 = find(runs, b, "sigmoid", isa),
                  *n = find(runs, b, "sigmoid-naive"), *g = find(runs, b, "gemm3");
        const double tf = total_of(f), tn = total_of(n), tg = total_of(g);
        std::printf("| %lld | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |\n",
                    (long long)b, isa.c_str(), dtype.c_str(), time_cell(f).c_str(), error_cell(runs, f).c_str(),
                    time_cell(n).c_str(), time_cell(g).c_str(), ratio(tf / tg).c_str(), ratio(tf / tn).c_str(),
                    dtype == "fp32" ? "-" : ratio(tf / total_of(f32)).c_str(),
                    std::isfinite(tf) ? format("%.0f", flops("sigmoid", b, o.d) / tf / 1e9).c_str() : "-",
                    peak_cell(f).c_str(), peak_cell(n).c_str(), memory_cell(f).c_str(), memory_cell(n).c_str(),
                    memory_cell(g).c_str(), bytes(f && f->ok() ? f->value("workspace_forward") : NAN).c_str());
      }
  std::printf("\nAll three: 6 b^2 d FLOPs (one logit product, two gradient products; the sigmoid's gradient "
              "needs no row or column normaliser, so flatmem computes the loss and every gradient in one tile "
              "walk). naive: X = s Q K^T materialised (b^2 fp32), G written over it. 3 GEMMs: in %lld-column "
              "strips, no element-wise work. Peak memory: peak RSS of the variant's process; extra: minus that "
              "of a process holding only q, k, dq, dk (of the row's dtype). Times: fastest timed run. CPU ISA: "
              "FLATMEM_CPU_ISA of the flatmem runs. dtype: of q, k, dq, dk (bf16: the fp32 features rounded to "
              "nearest even); naive and the 3 GEMMs are fp32 in every row. loss err: |L - L64| / |L64| against "
              "the float64 loss of the same inputs.\n", (long long)o.strip);

  print_loss_agreement(runs, o, "sigmoid", "sigmoid-naive");
  print_loss_errors(runs, o, "sigmoid-reference", {"sigmoid", "sigmoid-naive"});

  std::printf("\n### Sigmoid targets\n\n");
  const Run *g = find(runs, target_batch, "gemm3");
  for (const auto &isa : o.isas) {
    if (!isa_available(isa)) {
      std::printf("- [%s] sigmoid targets at b = %lld: not measured: CPU lacks %s\n", isa.c_str(),
                  (long long)target_batch, isa_feature(isa));
      continue;
    }
    const double r = total_of(find(runs, target_batch, "sigmoid", isa)) / total_of(g);
    std::printf("- [%s] sigmoid <= %.2fx the 3-GEMM time at b = %lld: %s -> %s\n", isa.c_str(),
                sigmoid_target_vs_gemm3, (long long)target_batch, ratio(r).c_str(), verdict(r, sigmoid_target_vs_gemm3));
  }
  print_memory_target(runs, o, "sigmoid");
  print_bf16_targets(runs, o, "sigmoid", false);
}

// --check: flatmem's sigmoid (every ISA) against sigmoid-naive on the same features. Both
// approximate the exact loss; their difference is within the sum of their error bounds (u =
// 2^-24, gamma_n = n u / (1 - n u), first order, times slack 2 as in tests/contrastive/
// sigmoid_reference.hpp, whose bounds give flatmem's half). A = max |q_i| |k_j| >= every
// sum_t |q_it k_jt|; S = sum_ij |G_ij| (from the naive run); each logit of either is within
// dx = s gamma_{d+2} A + u (s A + |t|) of the exact one.
//   loss  flatmem: dx S + 4u b + 2u L. naive (fp32 terms and row sums): dx S + 2.2u b
//         (exp 0.1u, fp32 log1p series 2.1u) + (u + gamma_b) L (rounding of each term, row
//         sums) + u (2 (s A + |t|) + 1.4) (the diagonal swapped in by difference).
//   dt    flatmem: (dx + 10u) S + 2u |dt|. naive: (dx + 5u + gamma_b) S + 4u (swap).
//   ds    flatmem: (dx + 10u + gamma_d) S A + 2u |ds|. naive: G X / s with |X / s - raw| <=
//         dx / s: S [(dx + 6u + gamma_b)(A + dx / s) + dx / s] + 2u A + u |ds|.
bool check_sigmoid(const std::vector<Run> &runs, const Options &o) {
  constexpr double u = 1.0 / 16777216.0, slack = 2.0;
  auto gamma = [&](double n) { return n * u / (1.0 - n * u); };
  bool ok = true;
  std::printf("\n### Check: sigmoid against sigmoid-naive (bounds derived in contrastive_bench.cpp)\n\n");
  for (auto b : o.sizes) {
    const Run *n = find(runs, b, "sigmoid-naive");
    if (!n || !n->ok()) {
      std::printf("- b = %lld: no sigmoid-naive run to check against -> FAILED\n", (long long)b);
      ok = false;
      continue;
    }
    const double s = o.scale, t = std::fabs(o.bias), d = double(o.d), bb = double(b);
    const double A = n->value("max_dot_bound"), S = n->value("sum_abs_g");
    const double dx = s * gamma(d + 2.0) * A + u * (s * A + t);
    const double L = std::fabs(n->value("loss")), dt = std::fabs(n->value("dbias")),
                 ds = std::fabs(n->value("dscale"));
    const double tol_loss = slack * (2.0 * dx * S + 6.2 * u * bb + (3.0 * u + gamma(bb)) * L +
                                     u * (2.0 * (s * A + t) + 1.4));
    const double tol_dt = slack * ((2.0 * dx + 15.0 * u + gamma(bb)) * S + 2.0 * u * dt + 4.0 * u);
    const double tol_ds = slack * (S * ((dx + 10.0 * u + gamma(d)) * A + (dx + 6.0 * u + gamma(bb)) *
                                   (A + dx / s) + dx / s) + 2.0 * u * A + 3.0 * u * ds);
    for (const auto &isa : o.isas) {
      const Run *f = find(runs, b, "sigmoid", isa);
      if (!f || !f->ok()) {
        std::printf("- b = %lld [%s]: no sigmoid run -> FAILED\n", (long long)b, isa.c_str());
        ok = false;
        continue;
      }
      const struct {
        const char *name, *key;
        double tolerance;
      } quantities[] = {{"loss", "loss", tol_loss}, {"ds", "dscale", tol_ds}, {"dt", "dbias", tol_dt}};
      for (const auto &q : quantities) {
        const double diff = std::fabs(f->value(q.key) - n->value(q.key));
        const bool pass = diff <= q.tolerance;  // NaN fails
        ok = ok && pass;
        std::printf("- b = %lld [%s] %-4s flatmem %.9g naive %.9g: |diff| %.3g <= %.3g -> %s\n", (long long)b,
                    isa.c_str(), q.name, f->value(q.key), n->value(q.key), diff, q.tolerance, pass ? "ok" : "FAILED");
      }
    }
  }
  return ok;
}

int driver_main(int argc, char **argv) {
  const Options o = parse(argc, argv);
  const bool clip = selects_any(o, clip_variants), sigmoid = selects_any(o, sigmoid_variants);
  std::string dtype_list;
  for (const auto &dtype : o.dtypes) dtype_list += (dtype_list.empty() ? "" : ", ") + dtype;
  if (clip)
    std::printf("contrastive_bench: symmetric contrastive loss, forward + backward, %s, d = %lld, s = %.1f\n",
                dtype_list.c_str(), (long long)o.d, o.scale);
  if (sigmoid)
    std::printf("contrastive_bench: sigmoid (SigLIP) loss, value and gradients in one call, %s, d = %lld, "
                "s = %.1f, t = %.1f\n", dtype_list.c_str(), (long long)o.d, o.scale, o.bias);
  std::printf("machine: %s, %d hardware threads, %s RAM\n", cpu_model().c_str(), bench::hardware_threads(),
              bytes(machine_ram_bytes()).c_str());
  std::printf("flatmem %s; benchmark BLAS: %s\n", flatmem_version_string(), bench::blas_config().c_str());
  flatmem_cpu_isa best = FLATMEM_CPU_ISA_BASELINE;
  flatmem_cpu_isa_get(nullptr, &best);
  std::string isa_list;
  for (const auto &isa : o.isas) isa_list += (isa_list.empty() ? "" : ", ") + isa;
  std::printf("CPU ISA: best %s; flatmem runs under %s (FLATMEM_CPU_ISA)\n", flatmem_cpu_isa_name(best),
              isa_list.c_str());
  for (const auto &isa : o.isas)
    if (!isa_available(isa))
      std::printf("  %s rows: not run: CPU lacks %s\n", isa.c_str(), isa_feature(isa));
    else
      for (int level = FLATMEM_CPU_ISA_BASELINE; level <= FLATMEM_CPU_ISA_AMX; ++level)
        if (isa == flatmem_cpu_isa_name(flatmem_cpu_isa(level)))
          std::printf("  engine: %s\n", flatmem_cpu_isa_engine(flatmem_cpu_isa(level)));
  std::printf("dtypes of the flatmem rows: %s; float64 reference loss for b <= %lld; fp32_precision %s\n",
              dtype_list.c_str(), (long long)o.ref_max_batch,
              o.fp32_precision == FLATMEM_FP32_PRECISION_TF32  ? "tf32 (bf16 at avx512bf16: G rounded once)"
              : o.fp32_precision == FLATMEM_FP32_PRECISION_FULL ? "full"
                                                                : "default");
  double load[3] = {NAN, NAN, NAN};
  if (getloadavg(load, 3) == 3)  // other work on the machine slows every column: say how much ran
    std::printf("load average at start: %.2f %.2f %.2f\n", load[0], load[1], load[2]);
  if (clip)
    std::printf("targets: flatmem <= %.2fx 4 GEMMs and <= %.2fx naive at b = %lld; extra memory < %s at b = %lld\n",
                target_vs_gemm4, target_vs_naive, (long long)target_batch, bytes(memory_target_bytes).c_str(),
                (long long)memory_target_batch);
  if (sigmoid)
    std::printf("sigmoid targets: sigmoid <= %.2fx 3 GEMMs at b = %lld; extra memory < %s at b = %lld\n",
                sigmoid_target_vs_gemm3, (long long)target_batch, bytes(memory_target_bytes).c_str(),
                (long long)memory_target_batch);
  std::vector<Run> runs;
  const double limit = o.mem_limit_gib * GiB;
  for (auto b : o.sizes) {
    const double inputs_bytes = 4.0 * 4.0 * double(b) * double(o.d);
    std::printf("\nb = %lld (q, k, dq, dk: %s; one b x b fp32 matrix: %s)\n", (long long)b,
                bytes(inputs_bytes).c_str(), bytes(4.0 * double(b) * double(b)).c_str());
    // the inputs-only baselines (one per dtype of the flatmem rows), then the float64 references
    std::map<std::string, double> baseline_peak;
    bool baselines_ok = true;
    const bool per_dtype = std::any_of(o.variants.begin(), o.variants.end(), runs_per_isa);
    for (const auto &dtype : o.dtypes) {
      if (dtype != "fp32" && !per_dtype) continue;
      Run baseline = run_child(o, "inputs", b, "", dtype);
      print_progress(baseline, o, runs);
      runs.push_back(baseline);
      baselines_ok = baselines_ok && baseline.ok();
      baseline_peak[dtype] = baseline.peak_bytes;
    }
    if (!baseline_peak.count("fp32")) {  // the BLAS variants' (fp32) baseline
      Run baseline = run_child(o, "inputs", b);
      print_progress(baseline, o, runs);
      runs.push_back(baseline);
      baselines_ok = baselines_ok && baseline.ok();
      baseline_peak["fp32"] = baseline.peak_bytes;
    }
    if (!baselines_ok) continue;
    for (const char *ref : {"reference", "sigmoid-reference"}) {
      const bool wanted = std::any_of(o.variants.begin(), o.variants.end(),
                                      [&](const std::string &v) { return reference_of(v) == ref; });
      if (!wanted) continue;
      for (const auto &dtype : o.dtypes) {
        if (dtype != "fp32" && !per_dtype) continue;
        Run r;
        r.b = b;
        r.variant = ref;
        r.dtype = dtype;
        if (o.ref_max_batch <= 0 || b > o.ref_max_batch) {
          r.status = "skipped";
          r.note = "n/a (b > --ref-max-batch " + std::to_string(o.ref_max_batch) + ")";
        } else {
          r = run_child(o, ref, b, "", dtype);
        }
        print_progress(r, o, runs);
        runs.push_back(r);
      }
    }
    const std::size_t first = runs.size();
    struct Job {
      std::string variant, isa, dtype;
    };
    std::vector<Job> jobs;
    for (const auto &v : o.variants)
      if (runs_per_isa(v))
        for (const auto &isa : o.isas)
          for (const auto &dtype : o.dtypes) jobs.push_back({v, isa, dtype});
      else
        jobs.push_back({v, "", "fp32"});
    const int rounds = std::max(1, b > target_batch ? o.large_rounds : o.rounds);
    for (int round = 0; round < rounds; ++round) {
      if (rounds > 1) std::printf(" round %d of %d\n", round + 1, rounds);
      for (std::size_t i = 0; i < jobs.size(); ++i) {
        const auto &[v, isa, dtype] = jobs[i];
        Run r;
        r.b = b;
        r.variant = v;
        r.isa = isa;
        r.dtype = dtype;
        r.planned_bytes = bench::planned_extra_bytes(v, b, o.d, o.strip);
        if (!isa.empty() && !isa_available(isa)) {
          r.status = "skipped";
          r.note = std::string("not run: CPU lacks ") + isa_feature(isa);
        } else if (v == "tilegemm" && b > o.tilegemm_max_batch) {
          r.status = "skipped";
          r.note = "not run (diagnostic, --tilegemm-max-batch)";
        } else if (inputs_bytes + r.planned_bytes > limit) {
          r.status = "skipped";
          r.note = "n/a (needs " + bytes(r.planned_bytes) + ")";
        } else {
          r = run_child(o, v, b, isa, dtype);
          r.extra_bytes = r.peak_bytes - baseline_peak[dtype];
        }
        if (round == 0 || r.status != "skipped") print_progress(r, o, runs);
        if (round == 0) {
          runs.push_back(r);
          continue;
        }
        // keep the fastest round's times; memory: the largest peak seen
        Run &kept = runs[first + i];
        const double peak = std::fmax(kept.peak_bytes, r.peak_bytes);
        if (r.ok() && (!kept.ok() || r.value("total_s") < kept.value("total_s"))) kept = r;
        else if (!r.ok() && r.status == "failed") kept = r;
        kept.peak_bytes = peak;
        kept.extra_bytes = peak - baseline_peak[dtype];
      }
    }
  }
  if (clip) print_clip_tables(runs, o);
  if (sigmoid) print_sigmoid_tables(runs, o);
  if (!o.csv.empty()) {
    write_csv(o.csv, runs, o);
    std::printf("\nwrote %s\n", o.csv.c_str());
  }
  if (o.check && !check_sigmoid(runs, o)) return 1;
  for (const auto &r : runs)
    if (r.status == "failed") return 1;
  return 0;
}

}  // namespace

int main(int argc, char **argv) {
  try {
    if (argc > 1 && std::string(argv[1]) == "--worker") return worker_main(argc, argv);
    return driver_main(argc, argv);
  } catch (const std::exception &e) {
    std::fprintf(stderr, "contrastive_bench: %s\n", e.what());
    return 2;
  }
}

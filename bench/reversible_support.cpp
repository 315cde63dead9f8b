#include "reversible_support.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <stdexcept>

#include "bench_support.hpp"

namespace bench::reversible {

constexpr double MiB = 1024.0 * 1024.0, GiB = 1024.0 * MiB;

void check(flatmem_status status, const char *what) {
  if (status != FLATMEM_STATUS_SUCCESS)
    throw std::runtime_error(std::string(what) + ": " + flatmem_status_string(status) + ": " +
                             flatmem_last_error());
}

const char *mode_name(flatmem_reversible_mode mode) {
  switch (mode) {
    case FLATMEM_REVERSIBLE_STANDARD: return "STANDARD";
    case FLATMEM_REVERSIBLE_VANILLA: return "VANILLA";
    case FLATMEM_REVERSIBLE_OVERLAPPED: return "OVERLAPPED";
    case FLATMEM_REVERSIBLE_AUTO: return "AUTO";
    default: return "?";
  }
}

// ---- options ---------------------------------------------------------------------------

namespace {

void validate(const SegmentOptions &o) {
  if (o.depths.empty() || o.batches.empty()) throw std::runtime_error("--depths and --batches need values");
  for (int d : o.depths)
    if (d < 1 || d > 65536) throw std::runtime_error("--depths: each depth must be in 1..65536");
  for (auto b : o.batches)
    if (b < 1) throw std::runtime_error("--batches: each batch must be >= 1");
  if (o.tokens < 1 || o.width < 1 || o.heads < 1 || o.hidden < 1 || o.width % o.heads != 0)
    throw std::runtime_error("--tokens, --width, --heads, --hidden must be >= 1, width a multiple of heads");
  if (o.rounds < 1 || o.warmup < 1) throw std::runtime_error("--rounds and --warmup must be >= 1");
}

}  // namespace

bool parse_segment_options(int argc, char **argv, SegmentOptions &o, const QuickSettings &quick_settings,
                           const std::function<void()> &usage, const ExtraArgument &extra) {
  bool quick = false, set_depths = false, set_batches = false, set_tokens = false, set_rounds = false;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    const std::function<std::string()> value = [&]() -> std::string {
      if (i + 1 >= argc) throw std::runtime_error(a + " needs a value");
      return argv[++i];
    };
    if (a == "--help" || a == "-h") {
      usage();
      std::exit(0);
    } else if (a == "--quick") quick = true;
    else if (a == "--depths") {
      o.depths.clear();
      for (const auto &s : bench::split(value())) o.depths.push_back(std::stoi(s));
      set_depths = true;
    } else if (a == "--batches") {
      o.batches.clear();
      for (const auto &s : bench::split(value())) o.batches.push_back(std::stoll(s));
      set_batches = true;
    } else if (a == "--tokens") o.tokens = std::stoll(value()), set_tokens = true;
    else if (a == "--width") o.width = std::stoi(value());
    else if (a == "--heads") o.heads = std::stoi(value());
    else if (a == "--hidden") o.hidden = std::stoi(value());
    else if (a == "--rounds") o.rounds = std::stoi(value()), set_rounds = true;
    else if (a == "--warmup") o.warmup = std::stoi(value());
    else if (a == "--csv") o.csv = value();
    else if (!extra || !extra(a, value)) throw std::runtime_error("unknown argument '" + a + "' (see --help)");
  }
  if (quick) {
    if (!set_depths) o.depths = quick_settings.depths;
    if (!set_batches) o.batches = quick_settings.batches;
    if (!set_tokens) o.tokens = quick_settings.tokens;
    if (!set_rounds) o.rounds = quick_settings.rounds;
  }
  validate(o);
  return quick;
}

// ---- the model -------------------------------------------------------------------------

ParameterShapes parameter_shapes(flatmem_block_kind kind, const SegmentOptions &o) {
  const std::int64_t w = o.width;
  const bool attention = kind == FLATMEM_BLOCK_ATTENTION;
  const std::int64_t inner = attention ? 3 * w : o.hidden;  // qkv or fc1 columns
  const std::int64_t second_rows = attention ? w : o.hidden;  // proj or fc2 rows
  return {{{w}, {w}, {w, inner}, {inner}, {second_rows, w}, {w}}};
}

std::int64_t numel(const std::vector<std::int64_t> &shape) {
  std::int64_t n = 1;
  for (auto e : shape) n *= e;
  return n;
}

std::uint64_t block_seed(flatmem_block_kind kind, int layer) {
  return (kind == FLATMEM_BLOCK_ATTENTION ? 1000 : 1001) + 2 * std::uint64_t(layer);
}

void initial_parameter(int index, float *data, std::int64_t n, std::uint64_t seed) {
  if (index == 0) std::fill(data, data + n, 1.0f);  // LayerNorm weight
  else if (index == 2 || index == 4)                // the two weight matrices
    bench::fill_normal(data, n, 0.0f, 0.02f, seed * 8 + std::uint64_t(index));
  else std::fill(data, data + n, 0.0f);  // biases
}

void initial_inputs(float *x, float *dy1, float *dy2, std::int64_t n, std::int64_t batch) {
  bench::fill_normal(x, n, 0.0f, 1.0f, 11 + std::uint64_t(batch));
  bench::fill_normal(dy1, n, 0.0f, 1.0f, 12 + std::uint64_t(batch));
  bench::fill_normal(dy2, n, 0.0f, 1.0f, 13 + std::uint64_t(batch));
}

flatmem_block_options block_options(flatmem_block_kind kind, const SegmentOptions &o, flatmem_block_math math) {
  flatmem_block_options opt;
  FM_CHECK(flatmem_block_options_init(&opt, sizeof(flatmem_block_options)));
  opt.kind = kind;
  opt.width = o.width;
  opt.heads = o.heads;
  opt.hidden = o.hidden;
  opt.math = math;
  return opt;
}

BlockPtr create_block(const flatmem_block_options &options) {
  flatmem_block_t *raw = nullptr;
  FM_CHECK(flatmem_block_create(&raw, &options));
  return BlockPtr(raw);
}

SegmentPtr make_segment(const std::vector<flatmem_reversible_block> &blocks, int depth,
                        flatmem_reversible_mode mode, int num_threads) {
  flatmem_reversible_options opt;
  FM_CHECK(flatmem_reversible_options_init(&opt, sizeof(flatmem_reversible_options)));
  opt.mode = mode;
  opt.num_threads = num_threads;
  flatmem_reversible_t *h = nullptr;
  FM_CHECK(flatmem_reversible_create(&h, blocks.data(), depth, &opt));
  return SegmentPtr(h);
}

// ---- statistics, comparisons, formatting ---------------------------------------------------

double median(std::vector<double> v) {
  if (v.empty()) return NAN;
  std::sort(v.begin(), v.end());
  return v.size() % 2 ? v[v.size() / 2] : 0.5 * (v[v.size() / 2 - 1] + v[v.size() / 2]);
}

double max_abs(const float *x, std::int64_t n) {
  double m = 0;
  for (std::int64_t i = 0; i < n; ++i) m = std::max(m, double(std::fabs(x[i])));
  return m;
}

double max_abs_diff(const float *a, const float *b, std::int64_t n) {
  double m = 0;
  for (std::int64_t i = 0; i < n; ++i) m = std::max(m, double(std::fabs(a[i] - b[i])));
  return m;
}

bool same_bits(const float *a, const float *b, std::int64_t n) {
  return std::memcmp(a, b, std::size_t(n) * sizeof(float)) == 0;
}

std::string format(const char *fmt, double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, fmt, v);
  return buf;
}

std::string bytes_str(double b) {
  if (!std::isfinite(b)) return "-";
  const double a = std::fabs(b);
  return a >= GiB ? format("%.2f GiB", b / GiB) : a >= MiB ? format("%.1f MiB", b / MiB)
                                                          : format("%.0f KiB", b / 1024.0);
}

std::string seconds(double s) {
  if (!std::isfinite(s)) return "-";
  return s < 1.0 ? format("%.0f ms", 1e3 * s) : format("%.2f s", s);
}

std::string milliseconds(double s) { return std::isfinite(s) ? format("%.2f ms", 1e3 * s) : "-"; }

std::string ratio(double r) { return std::isfinite(r) ? format("%.2f\u00d7", r) : "-"; }

std::string rate_str(double v) { return std::isfinite(v) ? format(v < 10 ? "%.2f" : "%.1f", v) : "-"; }

std::string csv_number(double v) { return std::isfinite(v) ? format("%.9g", v) : std::string(); }

// ---- peak memory by depth ------------------------------------------------------------------

double depth_growth(const SegmentOptions &o, const PeakOf &peak, std::int64_t batch, int mode) {
  if (o.depths.size() < 2) return NAN;
  return peak(o.depths.back(), batch, mode) / peak(o.depths.front(), batch, mode);
}

void print_peak_by_depth(const SegmentOptions &o, const PeakOf &peak,
                         const std::function<double(std::int64_t batch)> &state_bytes) {
  const bool growth = o.depths.size() > 1;
  std::printf("| batch | state |");
  for (int m = 0; m < num_modes; ++m) {
    for (int d : o.depths) std::printf(" %s d=%d |", mode_name(modes[m]), d);
    if (growth) std::printf(" %s d=%d/d=%d |", mode_name(modes[m]), o.depths.back(), o.depths.front());
  }
  std::printf("\n|---:|---:|");
  for (int m = 0; m < num_modes; ++m)
    for (std::size_t i = 0; i < o.depths.size() + (growth ? 1 : 0); ++i) std::printf("---:|");
  std::printf("\n");
  for (auto b : o.batches) {
    std::printf("| %lld | %s |", (long long)b, bytes_str(state_bytes(b)).c_str());
    for (int m = 0; m < num_modes; ++m) {
      for (int d : o.depths) std::printf(" %s |", bytes_str(peak(d, b, m)).c_str());
      if (growth) std::printf(" %s |", ratio(depth_growth(o, peak, b, m)).c_str());
    }
    std::printf("\n");
  }
}

int guarded_main(const char *program, int (*run)(int, char **), int argc, char **argv) {
  try {
    return run(argc, argv);
  } catch (const std::exception &e) {
    std::fprintf(stderr, "%s: %s\n", program, e.what());
    return 1;
  }
}

}  // namespace bench::reversible

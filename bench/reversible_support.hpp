// What the two reversible-segment benchmarks share: reversible_bench (CPU) and
// cuda/reversible_cuda_bench (GPU) run the same ViT-like segment of built-in
// blocks -- F_k = attention block k, G_k = MLP block k, parameters from the same
// fixed-seed generator -- through the same four modes, with the same options
// and the same tables. Here: status checking, the mode list, the shared
// command-line options, the blocks' parameter shapes and initial values,
// medians, number formatting, host-side comparisons of dX, and the
// peak-memory-by-depth table.
#pragma once

#include <flatmem/flatmem.h>

#include <array>
#include <cstdio>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace bench::reversible {

// ---- statuses ------------------------------------------------------------------------

// Throws std::runtime_error "<what>: <status>: <flatmem_last_error()>" unless success.
void check(flatmem_status status, const char *what);
#define FM_CHECK(call) ::bench::reversible::check((call), #call)

// ---- modes ---------------------------------------------------------------------------

inline constexpr int num_modes = 4;
// Table order; the indices below name them.
inline constexpr std::array<flatmem_reversible_mode, num_modes> modes = {
    FLATMEM_REVERSIBLE_STANDARD, FLATMEM_REVERSIBLE_VANILLA, FLATMEM_REVERSIBLE_OVERLAPPED,
    FLATMEM_REVERSIBLE_AUTO};
enum ModeIndex { STD = 0, VAN = 1, OVL = 2, AUT = 3 };

const char *mode_name(flatmem_reversible_mode mode);

// AUTO's probe backwards (V, O, V, O) before it chooses (src/reversible/auto_mode.hpp).
inline constexpr int auto_probe_backwards = 4;

// ---- options -------------------------------------------------------------------------

// The options both benchmarks take (the model, the sweep, the repetitions).
struct SegmentOptions {
  std::vector<int> depths{12, 24};
  std::vector<std::int64_t> batches;
  std::int64_t tokens = 197;
  int width = 384, heads = 6, hidden = 1536;
  int rounds = 3, warmup = 1;
  std::string csv;
};

// What --quick sets where the command line did not.
struct QuickSettings {
  std::vector<int> depths;
  std::vector<std::int64_t> batches;
  std::int64_t tokens = 16;
  int rounds = 1;
};

// An argument of the benchmark's own: return true when `arg` is one (take its
// value with value(), which fails when there is none), false when unknown.
using ExtraArgument = std::function<bool(const std::string &arg, const std::function<std::string()> &value)>;

// Parses --depths, --batches, --tokens, --width, --heads, --hidden, --rounds,
// --warmup, --csv and --quick into `options` (which holds the defaults), hands
// any other argument to `extra`, prints usage() and exits 0 on --help/-h,
// checks the values (std::runtime_error naming the option). Returns whether
// --quick was given.
bool parse_segment_options(int argc, char **argv, SegmentOptions &options, const QuickSettings &quick,
                           const std::function<void()> &usage, const ExtraArgument &extra);

// ---- the model -----------------------------------------------------------------------

// The six parameter shapes of a block, in flatmem's order (reversible.h):
//   ATTENTION: ln_w (w), ln_b (w), qkv_w (w, 3w), qkv_b (3w), proj_w (w, w), proj_b (w)
//   MLP:       ln_w (w), ln_b (w), fc1_w (w, hidden), fc1_b (hidden), fc2_w (hidden, w), fc2_b (w)
using ParameterShapes = std::array<std::vector<std::int64_t>, FLATMEM_BLOCK_NUM_PARAMETERS>;
ParameterShapes parameter_shapes(flatmem_block_kind kind, const SegmentOptions &o);

std::int64_t numel(const std::vector<std::int64_t> &shape);

// The generator seed of layer k's block of this kind (attention 1000 + 2k, MLP 1001 + 2k).
std::uint64_t block_seed(flatmem_block_kind kind, int layer);

// Initial values of parameter `index` of a block (numel elements at data):
// LayerNorm weight 1, weights (2 and 4) N(0, 0.02) from (block_seed, index), biases 0.
void initial_parameter(int index, float *data, std::int64_t numel, std::uint64_t block_seed);

// The segment input and upstream gradients of a batch (n elements each):
// x ~ N(0, 1) "token embeddings" (both residual streams start as x), dy1 and
// dy2 ~ N(0, 1), each from a seed of its own and the batch size.
void initial_inputs(float *x, float *dy1, float *dy2, std::int64_t n, std::int64_t batch);

// flatmem_block_options of the model for this kind, with the given product math.
flatmem_block_options block_options(flatmem_block_kind kind, const SegmentOptions &o,
                                    flatmem_block_math math = FLATMEM_BLOCK_MATH_FP32);

struct BlockDeleter {
  void operator()(flatmem_block_t *b) const { flatmem_block_destroy(b); }
};
struct SegmentDeleter {
  void operator()(flatmem_reversible_t *h) const { flatmem_reversible_destroy(h); }
};
using BlockPtr = std::unique_ptr<flatmem_block_t, BlockDeleter>;
using SegmentPtr = std::unique_ptr<flatmem_reversible_t, SegmentDeleter>;

BlockPtr create_block(const flatmem_block_options &options);

// A segment over the first `depth` of `blocks` in `mode` (num_threads: CPU threads, 0 = all).
SegmentPtr make_segment(const std::vector<flatmem_reversible_block> &blocks, int depth,
                        flatmem_reversible_mode mode, int num_threads);

// ---- statistics, comparisons, formatting ------------------------------------------------

double median(std::vector<double> values);  // NAN when empty

double max_abs(const float *x, std::int64_t n);
double max_abs_diff(const float *a, const float *b, std::int64_t n);
bool same_bits(const float *a, const float *b, std::int64_t n);

std::string format(const char *fmt, double v);
std::string bytes_str(double bytes);        // "12 KiB", "3.4 MiB", "1.23 GiB"; "-" if not finite
std::string seconds(double s);              // "12 ms", "1.23 s"; "-" if not finite
std::string milliseconds(double s);         // "12.34 ms"; "-" if not finite
std::string ratio(double r);                // "1.23x" (multiplication sign); "-" if not finite
std::string rate_str(double per_second);    // "1.23", "123.4"; "-" if not finite
std::string csv_number(double v);           // "%.9g"; empty if not finite

// ---- peak memory by depth ----------------------------------------------------------------

// peak(depth, batch, mode index): bytes, NAN when not measured (or the configuration did not run).
using PeakOf = std::function<double(int depth, std::int64_t batch, int mode)>;

// The markdown table: one row per batch -- the state size for scale, then per
// mode its peak at each depth and, with two depths or more, the ratio of the
// last depth's peak to the first's.
void print_peak_by_depth(const SegmentOptions &o, const PeakOf &peak,
                         const std::function<double(std::int64_t batch)> &state_bytes);

// peak(last depth) / peak(first depth) for one mode and batch (NAN with one depth).
double depth_growth(const SegmentOptions &o, const PeakOf &peak, std::int64_t batch, int mode);

// The exit status of a run: 1, with a line on stderr per (depth, batch) row,
// when OVERLAPPED's or AUTO's dX differed from VANILLA's; else 0. Row has
// depth, batch, overlapped_bitwise and auto_bitwise.
template <typename Rows>
int bitwise_exit_status(const char *program, const Rows &rows) {
  int status = 0;
  for (const auto &r : rows)
    if (!r.overlapped_bitwise || !r.auto_bitwise) {
      std::fprintf(stderr, "%s: depth %d, batch %lld: dX of OVERLAPPED/AUTO differ from VANILLA's\n", program,
                   int(r.depth), (long long)r.batch);
      status = 1;
    }
  return status;
}

// main's body: run(argc, argv), an exception printed as "<program>: <what>" (exit 1).
int guarded_main(const char *program, int (*run)(int, char **), int argc, char **argv);

}  // namespace bench::reversible

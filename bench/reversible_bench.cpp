// reversible_bench -- a ViT-like reversible segment of flatmem's built-in
// blocks, forward + backward, fp32, CPU: STANDARD (ordinary backprop, the
// baseline), VANILLA (rebuild then gradients), OVERLAPPED (the rebuild of
// block k-1 on a second thread while block k's gradients run) and AUTO, side
// by side in one process.
//
//   reversible_bench                              depths 12,24; batches 1,2,4,8; 197 tokens
//   reversible_bench --batches 8,16,32 --csv bench/reversible_bench.csv
//   reversible_bench --quick                      depth 2, batch 1, 16 tokens, 1 round (CTest smoke)
//
// Block k: F_k = its own FLATMEM_BLOCK_ATTENTION (pre-LN MHSA, width 384,
// 6 heads), G_k = its own FLATMEM_BLOCK_MLP (pre-LN, hidden 1536, exact GELU),
// parameters drawn once from a fixed-seed generator (weights N(0, 0.02), biases
// 0, LayerNorm weight 1, bias 0). State (batch, tokens, width) fp32; the two
// residual streams both start as the same N(0, 1) "token embeddings".
//
// For each (depth, batch):
//   1. memory pass, one mode at a time on a fresh handle: trim the heap, reset
//      the kernel's peak-RSS mark, run the warm-up forward + backward(s)
//      (AUTO: two, its VANILLA and its OVERLAPPED probe), read VmHWM. "Peak" = VmHWM minus the RSS at the reset: what the handle and
//      its calls added above the baseline (parameters, gradients, inputs and
//      outputs, all allocated and touched before).
//   2. timed pass: --rounds rounds, each running every mode once (the order
//      rotates per round so that no mode always follows the same one); each
//      mode reports the median of its forward + backward times. Parameter
//      gradients (accumulated by the blocks) are zeroed before every forward,
//      outside the timed interval. AUTO runs on a fresh handle that has made
//      its choice (4 probe backwards, untimed) before the rounds. Allocator: the memory pass needs glibc's
//      mmap threshold at 1 MiB (freed buffers leave the resident set); that
//      would make every per-call buffer of 1 MiB and more (the built-in
//      blocks allocate their scratch per call) a fresh mapping paid in page
//      faults, so the timed pass runs where glibc's dynamic threshold settles
//      by itself (32 MiB; --timing-mmap-threshold 1048576 to time under the
//      memory pass's policy). Minor page faults per step are reported.
//   3. checks: dX of OVERLAPPED and AUTO bitwise equal to VANILLA's,
//      STANDARD's within fp32 rounding; the rebuild error over depth
//      (flatmem_reversible_rebuild_error).
// Every flatmem status is checked; a failure prints flatmem_last_error() and
// exits with status 1.
#include <flatmem/flatmem.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <memory>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "bench_support.hpp"
#include "reversible_support.hpp"

namespace {

using namespace bench::reversible;

// ---- options ---------------------------------------------------------------------

struct Options : SegmentOptions {
  int threads = 0;
  std::size_t timing_mmap_threshold = std::size_t(32) << 20;  // glibc's cap; 1 MiB = the memory pass's policy
};

void usage() {
  std::printf(
      "usage: reversible_bench [--depths 12,24] [--batches 1,2,4,8] [--rounds N] [--warmup N]\n"
      "                        [--threads N] [--tokens T] [--width W] [--heads H] [--hidden M]\n"
      "                        [--timing-mmap-threshold BYTES] [--csv PATH] [--quick]\n"
      "  A reversible segment of built-in pre-LN attention (F) and MLP (G) blocks, fp32, CPU,\n"
      "  forward + backward in the modes STANDARD, VANILLA, OVERLAPPED and AUTO. Defaults:\n"
      "  depths 12,24, batches 1,2,4,8, 197 tokens, width 384, 6 heads, hidden 1536, 3 timed\n"
      "  rounds (median reported) after 1 warm-up (AUTO: its 4 probe backwards), threads 0 =\n"
      "  all online processors (the segment's num_threads).\n"
      "  Allocator: the memory pass runs with glibc's M_MMAP_THRESHOLD at 1 MiB (freed buffers\n"
      "  leave the resident set, so peaks are attributable); the timed pass with\n"
      "  --timing-mmap-threshold (default 32 MiB, where glibc's dynamic threshold settles;\n"
      "  1048576 times under the memory pass's policy, where every large per-call buffer is a\n"
      "  fresh mapping). Page faults per step are reported either way.\n"
      "  --quick: depth 2, batch 1, 16 tokens, 1 round (a smoke test; explicit options win).\n");
}

Options parse(int argc, char **argv) {
  Options o;
  o.batches = {1, 2, 4, 8};
  const QuickSettings quick{{2}, {1}, 16, 1};  // depth 2, batch 1, 16 tokens, 1 round
  parse_segment_options(argc, argv, o, quick, usage, [&](const std::string &a, const auto &value) {
    if (a == "--threads") o.threads = std::stoi(value());
    else if (a == "--timing-mmap-threshold") o.timing_mmap_threshold = std::stoull(value());
    else return false;
    return true;
  });
  if (o.threads < 0) throw std::runtime_error("--threads must be >= 0");
  if (o.timing_mmap_threshold < 4096 || o.timing_mmap_threshold > (std::size_t(32) << 20))
    throw std::runtime_error("--timing-mmap-threshold must be in 4096 .. 33554432 (glibc's cap)");
  return o;
}

// ---- tensors -----------------------------------------------------------------------

// An owning fp32 CPU tensor (64-byte aligned, touched) with its DLTensor.
class Tensor {
 public:
  Tensor() = default;
  explicit Tensor(std::vector<std::int64_t> shape) : shape_(std::move(shape)) {
    numel_ = 1;
    for (auto e : shape_) numel_ *= e;
    const std::size_t bytes = (std::size_t(numel_) * sizeof(float) + 63) / 64 * 64;
    data_.reset(static_cast<float *>(std::aligned_alloc(64, bytes)));
    if (!data_) throw std::runtime_error("out of memory allocating " + std::to_string(bytes) + " bytes");
    bench::touch(data_.get(), bytes);
    dl_.data = data_.get();
    dl_.device = {kDLCPU, 0};
    dl_.ndim = int(shape_.size());
    dl_.dtype = {kDLFloat, 32, 1};
    dl_.shape = shape_.data();
    dl_.strides = nullptr;
    dl_.byte_offset = 0;
  }
  float *data() { return data_.get(); }
  const float *data() const { return data_.get(); }
  std::int64_t numel() const { return numel_; }
  std::size_t bytes() const { return std::size_t(numel_) * sizeof(float); }
  DLTensor *dl() { return &dl_; }
  const DLTensor *dl() const { return &dl_; }
  void zero() { std::memset(data_.get(), 0, bytes()); }

 private:
  struct Free {
    void operator()(float *p) const { std::free(p); }
  };
  std::unique_ptr<float, Free> data_;
  std::vector<std::int64_t> shape_;
  std::int64_t numel_ = 0;
  DLTensor dl_{};
};

// ---- the model: one attention and one MLP block per layer --------------------------

struct BuiltinBlock {
  BlockPtr block;
  std::array<Tensor, FLATMEM_BLOCK_NUM_PARAMETERS> params, grads;
};

BuiltinBlock make_block(flatmem_block_kind kind, const Options &o, int layer) {
  BuiltinBlock b;
  b.block = create_block(block_options(kind, o));
  const ParameterShapes shapes = parameter_shapes(kind, o);
  std::array<DLTensor, FLATMEM_BLOCK_NUM_PARAMETERS> p{}, g{};
  for (int i = 0; i < FLATMEM_BLOCK_NUM_PARAMETERS; ++i) {
    b.params[i] = Tensor(shapes[i]);
    b.grads[i] = Tensor(shapes[i]);
    initial_parameter(i, b.params[i].data(), b.params[i].numel(), block_seed(kind, layer));
    p[i] = *b.params[i].dl();
    g[i] = *b.grads[i].dl();
  }
  FM_CHECK(flatmem_block_set_parameters(b.block.get(), p.data(), g.data()));
  return b;
}

struct Model {
  std::vector<BuiltinBlock> attention, mlp;
  std::vector<flatmem_reversible_block> blocks;  // block k: F = attention[k], G = mlp[k]

  Model(int depth, const Options &o) {
    for (int k = 0; k < depth; ++k) {
      attention.push_back(make_block(FLATMEM_BLOCK_ATTENTION, o, k));
      mlp.push_back(make_block(FLATMEM_BLOCK_MLP, o, k));
      flatmem_reversible_block rb{};
      FM_CHECK(flatmem_block_function(attention.back().block.get(), &rb.f));
      FM_CHECK(flatmem_block_function(mlp.back().block.get(), &rb.g));
      blocks.push_back(rb);
    }
  }
  // The blocks accumulate their parameter gradients: zero those of the first `depth` blocks.
  void zero_grads(int depth) {
    for (int k = 0; k < depth; ++k)
      for (int i = 0; i < FLATMEM_BLOCK_NUM_PARAMETERS; ++i) attention[k].grads[i].zero(), mlp[k].grads[i].zero();
  }
  double parameter_bytes(int depth) const {
    double s = 0;
    for (int k = 0; k < depth; ++k)
      for (int i = 0; i < FLATMEM_BLOCK_NUM_PARAMETERS; ++i)
        s += double(attention[k].params[i].bytes() + mlp[k].params[i].bytes());
    return s;
  }
};

// ---- one (depth, batch) configuration ------------------------------------------------

struct ModeResult {
  std::vector<double> total_s, fwd_s, bwd_s, faults;  // faults: minor page faults per forward + backward
  double peak_bytes = NAN, workspace_bytes = NAN;
  double total() const { return median(total_s); }
  double best() const { return total_s.empty() ? NAN : *std::min_element(total_s.begin(), total_s.end()); }
  double fwd() const { return median(fwd_s); }
  double page_faults() const { return median(faults); }
  double bwd() const { return median(bwd_s); }
};

struct Row {
  int depth = 0;
  std::int64_t batch = 0;
  std::array<ModeResult, num_modes> r;
  flatmem_reversible_mode auto_ran = FLATMEM_REVERSIBLE_AUTO;
  bool auto_switched = false;  // AUTO ran different modes across the timed rounds
  bool overlapped_bitwise = false, auto_bitwise = false;
  double standard_rel_diff = NAN;  // max |dX_std - dX_van| / max |dX_van|
  double baseline_rss = NAN, state_bytes = NAN;
  double cpu_share = NAN, load1 = NAN;  // timed pass: process CPU time / (wall time x threads); < 1: cores idle or taken
  std::vector<double> rebuild_errors;
  double sps(int m) const { return double(batch) / r[m].total(); }
};

double max_abs(const Tensor &t) { return bench::reversible::max_abs(t.data(), t.numel()); }
double max_abs_diff(const Tensor &a, const Tensor &b) {
  return bench::reversible::max_abs_diff(a.data(), b.data(), a.numel());
}
bool same_bits(const Tensor &a, const Tensor &b) {
  return a.numel() == b.numel() && bench::reversible::same_bits(a.data(), b.data(), a.numel());
}

// User + system CPU seconds of this process (all threads).
double cpu_seconds() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return double(u.ru_utime.tv_sec + u.ru_stime.tv_sec) + 1e-6 * double(u.ru_utime.tv_usec + u.ru_stime.tv_usec);
}
// Minor page faults of this process so far (first touches of fresh memory).
double minor_faults() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return double(u.ru_minflt);
}

Row run_config(Model &model, const Options &o, int threads, int depth, std::int64_t batch) {
  Row row;
  row.depth = depth;
  row.batch = batch;
  const std::vector<std::int64_t> shape = {batch, o.tokens, o.width};
  constexpr std::uint64_t seed = 7, offset = 0;

  // Inputs, upstream gradients and every mode's outputs: allocated and touched
  // before any measurement, so they are part of the baseline.
  Tensor x1(shape), x2(shape), dy1(shape), dy2(shape);
  initial_inputs(x1.data(), dy1.data(), dy2.data(), x1.numel(), batch);
  std::memcpy(x2.data(), x1.data(), x1.bytes());  // X1 = X2 = the token embeddings
  std::array<Tensor, num_modes> y1, y2, dx1, dx2;
  for (int m = 0; m < num_modes; ++m) y1[m] = Tensor(shape), y2[m] = Tensor(shape), dx1[m] = Tensor(shape),
                                      dx2[m] = Tensor(shape);
  row.state_bytes = double(x1.bytes());

  std::array<SegmentPtr, num_modes> seg;
  auto step = [&](int m, double *fwd_s, double *bwd_s) {
    model.zero_grads(depth);
    const double t0 = bench::now_seconds();
    FM_CHECK(flatmem_reversible_forward(seg[m].get(), x1.dl(), x2.dl(), seed, offset, y1[m].dl(), y2[m].dl(),
                                        nullptr, 0, nullptr));
    const double t1 = bench::now_seconds();
    FM_CHECK(flatmem_reversible_backward(seg[m].get(), y1[m].dl(), y2[m].dl(), dy1.dl(), dy2.dl(), seed, offset,
                                         dx1[m].dl(), dx2[m].dl(), nullptr, nullptr, nullptr, 0, nullptr));
    const double t2 = bench::now_seconds();
    if (fwd_s) *fwd_s = t1 - t0;
    if (bwd_s) *bwd_s = t2 - t1;
  };

  // 1. memory pass: each mode on a fresh handle, its warm-up inside the peak window.
  bench::malloc_for_peak_measurement();
  row.baseline_rss = 1024.0 * double(bench::proc_status_kb("VmRSS"));
  for (int m = 0; m < num_modes; ++m) {
    bench::PeakRss peak;
    peak.start();
    seg[m] = make_segment(model.blocks, depth, modes[m], o.threads);
    size_t fw = 0, bw = 0;
    FM_CHECK(flatmem_reversible_forward_workspace_size(seg[m].get(), x1.dl(), &fw));
    FM_CHECK(flatmem_reversible_backward_workspace_size(seg[m].get(), x1.dl(), &bw));
    row.r[m].workspace_bytes = double(std::max(fw, bw));
    // AUTO: at least its first two probes (one VANILLA, one OVERLAPPED backward).
    const int warmups = modes[m] == FLATMEM_REVERSIBLE_AUTO ? std::max(o.warmup, 2) : o.warmup;
    for (int w = 0; w < warmups; ++w) step(m, nullptr, nullptr);
    row.r[m].peak_bytes = peak.bytes();
  }

  // 2. timed pass: rounds interleave the modes, starting one further each round.
  // Under the timing allocator policy, AUTO gets a fresh handle and makes its
  // choice there (its probe backwards, untimed): probes timed under the memory
  // pass's policy would include page faults the timed steps do not pay. The
  // probes (VANILLA and OVERLAPPED, the most scratch alive at once) also grow
  // the heap to what a step needs before the first timed step.
  bench::malloc_for_timing(o.timing_mmap_threshold);
  seg[AUT].reset();
  seg[AUT] = make_segment(model.blocks, depth, FLATMEM_REVERSIBLE_AUTO, o.threads);
  for (int w = 0; w < std::max(o.warmup, auto_probe_backwards); ++w) step(AUT, nullptr, nullptr);
  bool auto_seen[4] = {false, false, false, false};
  const double cpu0 = cpu_seconds(), wall0 = bench::now_seconds();
  for (int round = 0; round < o.rounds; ++round)
    for (int i = 0; i < num_modes; ++i) {
      const int m = (round + i) % num_modes;
      double f = 0, b = 0;
      const double faults0 = minor_faults();
      step(m, &f, &b);
      row.r[m].faults.push_back(minor_faults() - faults0);
      row.r[m].fwd_s.push_back(f);
      row.r[m].bwd_s.push_back(b);
      row.r[m].total_s.push_back(f + b);
      if (modes[m] == FLATMEM_REVERSIBLE_AUTO) {
        FM_CHECK(flatmem_reversible_last_mode(seg[m].get(), &row.auto_ran));
        if (int(row.auto_ran) >= 0 && int(row.auto_ran) < 4) auto_seen[int(row.auto_ran)] = true;
      }
    }
  double load[1];
  if (getloadavg(load, 1) == 1) row.load1 = load[0];
  row.cpu_share = (cpu_seconds() - cpu0) / ((bench::now_seconds() - wall0) * double(threads));
  row.auto_switched = int(auto_seen[0]) + int(auto_seen[1]) + int(auto_seen[2]) + int(auto_seen[3]) > 1;

  // 3. checks: values do not depend on the mode.
  row.overlapped_bitwise = same_bits(dx1[OVL], dx1[VAN]) && same_bits(dx2[OVL], dx2[VAN]);
  row.auto_bitwise = same_bits(dx1[AUT], dx1[VAN]) && same_bits(dx2[AUT], dx2[VAN]);
  const double scale = std::max(max_abs(dx1[VAN]), max_abs(dx2[VAN]));
  row.standard_rel_diff =
      std::max(max_abs_diff(dx1[STD], dx1[VAN]), max_abs_diff(dx2[STD], dx2[VAN])) / std::max(scale, 1e-30);

  bench::malloc_for_peak_measurement();  // hand the timed pass's heap back

  // The rebuild error over depth (allocates O(depth) states; after the measurements).
  for (auto &s : seg)
    if (&s != &seg[VAN]) s.reset();
  std::vector<double> errors(std::size_t(depth), NAN);
  std::int64_t eshape[1] = {depth};
  DLTensor e{errors.data(), {kDLCPU, 0}, 1, {kDLFloat, 64, 1}, eshape, nullptr, 0};
  FM_CHECK(flatmem_reversible_rebuild_error(seg[VAN].get(), x1.dl(), x2.dl(), seed, offset, &e, nullptr));
  row.rebuild_errors = errors;
  return row;
}

// ---- output ------------------------------------------------------------------------

void print_progress(const Row &row) {
  for (int m = 0; m < num_modes; ++m) {
    const ModeResult &r = row.r[m];
    std::printf("  %-10s fwd %-8s bwd %-8s fwd+bwd %-8s %7s samples/s  peak +%-10s (workspace query %s) "
                "%6.0f page faults/step%s\n",
                mode_name(modes[m]), seconds(r.fwd()).c_str(), seconds(r.bwd()).c_str(), seconds(r.total()).c_str(),
                rate_str(row.sps(m)).c_str(), bytes_str(r.peak_bytes).c_str(), bytes_str(r.workspace_bytes).c_str(),
                r.page_faults(),
                m == AUT ? (std::string(", ran ") + mode_name(row.auto_ran) + (row.auto_switched ? " (switched)" : ""))
                               .c_str()
                         : "");
  }
  std::printf("  dX: OVERLAPPED %s VANILLA, AUTO %s VANILLA (bitwise); STANDARD vs VANILLA max rel. diff %.1e; "
              "rebuild error at block 0: %.1e; CPU share while timed %.0f%%\n",
              row.overlapped_bitwise ? "==" : "!=", row.auto_bitwise ? "==" : "!=", row.standard_rel_diff,
              row.rebuild_errors.empty() ? NAN : row.rebuild_errors.front(), 100.0 * row.cpu_share);
}

const Row *find(const std::vector<Row> &rows, int depth, std::int64_t batch) {
  for (const auto &r : rows)
    if (r.depth == depth && r.batch == batch) return &r;
  return nullptr;
}

void print_tables(const std::vector<Row> &rows, const Options &o, int threads) {
  std::printf("\n### Reversible ViT-like segment, forward + backward, fp32, CPU (%s, %d threads)\n\n",
              bench::cpu_model_name().c_str(), threads);
  std::printf("Width %d, %d heads, MLP hidden %d, %lld tokens; median of %d rounds. Throughput in samples/s "
              "(higher is better); ratios of throughput (> 1: the first is faster).\n\n",
              o.width, o.heads, o.hidden, (long long)o.tokens, o.rounds);
  std::printf("| depth | batch | STANDARD | VANILLA | OVERLAPPED | AUTO | OVERLAPPED/VANILLA | AUTO/VANILLA "
              "| VANILLA/STANDARD | AUTO ran | OVERLAPPED/VANILLA, fastest rounds | CPU share |\n");
  std::printf("|---:|---:|---:|---:|---:|---:|---:|---:|---:|:---|---:|---:|\n");
  for (const auto &r : rows)
    std::printf("| %d | %lld | %s | %s | %s | %s | %s | %s | %s | %s%s | %s | %.0f%% |\n", r.depth,
                (long long)r.batch, rate_str(r.sps(STD)).c_str(), rate_str(r.sps(VAN)).c_str(),
                rate_str(r.sps(OVL)).c_str(), rate_str(r.sps(AUT)).c_str(), ratio(r.sps(OVL) / r.sps(VAN)).c_str(),
                ratio(r.sps(AUT) / r.sps(VAN)).c_str(), ratio(r.sps(VAN) / r.sps(STD)).c_str(),
                mode_name(r.auto_ran), r.auto_switched ? " (switched)" : "",
                ratio(r.r[VAN].best() / r.r[OVL].best()).c_str(), 100.0 * r.cpu_share);
  std::printf("\nCPU share: process CPU time / (wall time x %d threads) over the timed rounds, all modes together; "
              "below 100%% when the library's threads wait or when other work on the machine takes cores "
              "(then every time is inflated; see the load average).\n",
              threads);
  std::printf("\nVANILLA/STANDARD: reversible recompute costs ~4/3 the work, so ~0.75\u00d7 is the expectation "
              "without overlap. AUTO is timed on a handle that made its choice in %d untimed probe backwards "
              "(V, O, V, O).\n",
              auto_probe_backwards);

  std::printf("\n### Peak memory above the baseline, by depth\n\n");
  std::printf("Peak RSS during a fresh handle's warm-up forward + backward(s), minus the RSS before (parameters, "
              "gradients, inputs and outputs already resident). One state (batch x %lld x %d fp32) is given "
              "for scale.\n\n",
              (long long)o.tokens, o.width);
  print_peak_by_depth(
      o,
      [&](int d, std::int64_t b, int m) {
        const Row *r = find(rows, d, b);
        return r ? r->r[m].peak_bytes : NAN;
      },
      [&](std::int64_t b) {
        const Row *r = find(rows, o.depths.front(), b);
        return r ? r->state_bytes : NAN;
      });

  // The rebuild error over depth for the deepest configuration.
  const Row *deep = nullptr;
  for (const auto &r : rows)
    if (!deep || r.depth > deep->depth || (r.depth == deep->depth && r.batch > deep->batch)) deep = &r;
  if (deep && !deep->rebuild_errors.empty()) {
    const int n = deep->depth;
    std::printf("\n### Rebuild error over depth (depth %d, batch %lld)\n\n", n, (long long)deep->batch);
    std::printf("errors[k] = max |rebuilt - true| / max |true| over both streams of block k's input, rebuilt "
                "from the segment output through blocks n-1 .. k (fp32 residual streams).\n\n");
    std::vector<int> ks = {n - 1, n - 2, 3 * n / 4, n / 2, n / 4, 1, 0};
    ks.erase(std::remove_if(ks.begin(), ks.end(), [&](int k) { return k < 0 || k >= n; }), ks.end());
    std::sort(ks.begin(), ks.end(), std::greater<int>());
    ks.erase(std::unique(ks.begin(), ks.end()), ks.end());
    std::printf("| k | blocks rebuilt | errors[k] |\n|---:|---:|---:|\n");
    for (int k : ks) std::printf("| %d | %d | %.2e |\n", k, n - k, deep->rebuild_errors[std::size_t(k)]);
    std::printf("\nerrors[0] (whole segment) per configuration:");
    for (const auto &r : rows)
      std::printf("  d=%d,b=%lld: %.1e", r.depth, (long long)r.batch,
                  r.rebuild_errors.empty() ? NAN : r.rebuild_errors.front());
    std::printf("\n");
  }
}

void write_csv(const std::string &path, const std::vector<Row> &rows, const Options &o, int threads) {
  std::ofstream out(path);
  if (!out) throw std::runtime_error("cannot write " + path);
  const auto num = csv_number;
  out << "depth,batch,tokens,width,heads,hidden,threads,rounds";
  for (const char *m : {"standard", "vanilla", "overlapped", "auto"})
    out << ',' << m << "_samples_per_s," << m << "_median_s," << m << "_fwd_median_s," << m << "_bwd_median_s,"
        << m << "_best_s," << m << "_peak_bytes," << m << "_workspace_bytes," << m << "_page_faults";
  out << ",overlapped_over_vanilla,auto_over_vanilla,vanilla_over_standard,auto_ran,auto_switched,"
         "overlapped_bitwise_vanilla,auto_bitwise_vanilla,standard_vs_vanilla_rel_diff,rebuild_error_block0,"
         "rebuild_error_last_block,state_bytes,baseline_rss_bytes,cpu_share,load_avg_1min,timing_mmap_threshold\n";
  for (const auto &r : rows) {
    out << r.depth << ',' << r.batch << ',' << o.tokens << ',' << o.width << ',' << o.heads << ',' << o.hidden << ','
        << threads << ',' << o.rounds;
    for (int m = 0; m < num_modes; ++m)
      out << ',' << num(r.sps(m)) << ',' << num(r.r[m].total()) << ',' << num(r.r[m].fwd()) << ','
          << num(r.r[m].bwd()) << ',' << num(r.r[m].best()) << ',' << num(r.r[m].peak_bytes) << ',' << num(r.r[m].workspace_bytes) << ','
          << num(r.r[m].page_faults());
    out << ',' << num(r.sps(OVL) / r.sps(VAN)) << ',' << num(r.sps(AUT) / r.sps(VAN)) << ','
        << num(r.sps(VAN) / r.sps(STD)) << ',' << mode_name(r.auto_ran) << ',' << int(r.auto_switched) << ','
        << int(r.overlapped_bitwise) << ',' << int(r.auto_bitwise) << ',' << num(r.standard_rel_diff) << ','
        << num(r.rebuild_errors.empty() ? NAN : r.rebuild_errors.front()) << ','
        << num(r.rebuild_errors.empty() ? NAN : r.rebuild_errors.back()) << ',' << num(r.state_bytes) << ','
        << num(r.baseline_rss) << ',' << num(r.cpu_share) << ',' << num(r.load1) << ',' << o.timing_mmap_threshold << '\n';
  }
  if (!out) throw std::runtime_error("error writing " + path);
}

int run(int argc, char **argv) {
  const Options o = parse(argc, argv);
  const int threads = o.threads > 0 ? o.threads : bench::hardware_threads();
  std::printf("reversible_bench: built-in pre-LN attention (F) + MLP (G) blocks, width %d, %d heads, hidden %d, "
              "%lld tokens, fp32\n",
              o.width, o.heads, o.hidden, (long long)o.tokens);
  std::printf("machine: %s, %d hardware threads; segment num_threads %d%s; flatmem %s\n",
              bench::cpu_model_name().c_str(), bench::hardware_threads(), threads,
              o.threads == 0 ? " (0 = all online)" : "", flatmem_version_string());
  flatmem_cpu_isa in_use = FLATMEM_CPU_ISA_DEFAULT, best = FLATMEM_CPU_ISA_DEFAULT;
  if (flatmem_cpu_isa_get(&in_use, &best) == FLATMEM_STATUS_SUCCESS)
    std::printf("CPU ISA of the blocks' element-wise kernels: %s (best %s; FLATMEM_CPU_ISA caps it)\n",
                flatmem_cpu_isa_name(in_use), flatmem_cpu_isa_name(best));
  std::printf("glibc M_MMAP_THRESHOLD: 1 MiB while measuring memory, %s while timing\n",
              bytes_str(double(o.timing_mmap_threshold)).c_str());
  double load[3] = {NAN, NAN, NAN};
  if (getloadavg(load, 3) == 3) std::printf("load average at start: %.2f %.2f %.2f\n", load[0], load[1], load[2]);
  if (!bench::reset_peak_rss())
    std::printf("warning: /proc/self/clear_refs is not writable: peak memory cannot be measured\n");

  const int max_depth = *std::max_element(o.depths.begin(), o.depths.end());
  Model model(max_depth, o);  // depth d uses blocks 0 .. d-1
  std::printf("parameters: %s per block, %s for depth %d (gradients as much again)\n",
              bytes_str(model.parameter_bytes(1)).c_str(), bytes_str(model.parameter_bytes(max_depth)).c_str(),
              max_depth);

  std::vector<Row> rows;
  const double started = bench::now_seconds();
  for (int depth : o.depths)
    for (auto batch : o.batches) {
      std::printf("\ndepth %d, batch %lld\n", depth, (long long)batch);
      std::fflush(stdout);
      rows.push_back(run_config(model, o, threads, depth, batch));
      print_progress(rows.back());
      std::fflush(stdout);
    }
  print_tables(rows, o, threads);
  if (getloadavg(load, 3) == 3) std::printf("\nload average at end: %.2f %.2f %.2f\n", load[0], load[1], load[2]);
  std::printf("total time: %.1f s\n", bench::now_seconds() - started);
  if (!o.csv.empty()) {
    write_csv(o.csv, rows, o, threads);
    std::printf("wrote %s\n", o.csv.c_str());
  }
  return bench::reversible::bitwise_exit_status("reversible_bench", rows);
}

}  // namespace

int main(int argc, char **argv) { return bench::reversible::guarded_main("reversible_bench", run, argc, argv); }

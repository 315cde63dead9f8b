// A small family of F / G callbacks for testing reversible segments, and an
// independent double-precision reference (ordinary backprop that stores every
// activation) of a segment built from them.
//
// ToyFunction, on a state of rows x width (fp32 or fp64; computes in the
// state's type):
//     mixing:      y = dropout(tanh(x W + b))      W: width x width
//     elementwise: y = dropout(tanh(x * w + b))    w, b: width (per column)
//     dropout(t)_ij = t_ij * keep_ij / (1 - p),  keep_ij = u(seed, offset + i*width + j) >= p
// with (seed, offset) the context's (flatmem_reversible_block_seed(...)).
// The VJP adds into dx and accumulates dW (or dw) and db in double.
#pragma once

#include <flatmem/flatmem.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <vector>

namespace flatmem_test {

struct ToyFunction {
  int width = 0;
  bool mixing = true;
  double dropout = 0;
  std::vector<double> weight, bias;       // W (width*width) or w (width); b (width)
  std::vector<double> d_weight, d_bias;   // accumulated by the VJP
  // Failure injection: the call (counting forward and vjp calls together)
  // with this 1-based number returns fail_status with a message.
  std::int64_t fail_on_call = 0;
  flatmem_status fail_status = FLATMEM_STATUS_INVALID_ARGUMENT;
  std::atomic<std::int64_t> calls{0};
  std::atomic<std::int64_t> vjp_calls{0};
  // Set when a callback was entered while another callback of this same
  // object was running (the header promises that never happens).
  std::atomic<int> running{0};
  std::atomic<bool> overlapped_itself{false};

  ToyFunction(int width, bool mixing, std::uint64_t seed, double scale = 0.5);
  flatmem_reversible_function function();
  void zero_gradients();
};

// n blocks of (F, G) toy functions over rows x width states.
struct ToySegment {
  std::vector<std::unique_ptr<ToyFunction>> f, g;
  std::vector<flatmem_reversible_block> blocks;
  ToySegment(int n, int width, bool mixing, std::uint64_t seed, double dropout = 0,
             double scale = 0.5);
  void zero_gradients();
};

// The reference: forward storing activations, backward by the chain rule,
// all in double. Parameter gradients are returned per function.
struct ReferenceResult {
  std::vector<double> y1, y2, dx1, dx2;
  std::vector<std::vector<double>> d_weight_f, d_bias_f, d_weight_g, d_bias_g;
};
ReferenceResult reference_segment(const ToySegment &segment, std::int64_t rows,
                                  const std::vector<double> &x1, const std::vector<double> &x2,
                                  const std::vector<double> &dy1, const std::vector<double> &dy2,
                                  std::uint64_t seed, std::uint64_t offset);

// The documented seed derivation, written from the header's formula.
std::uint64_t documented_block_seed(std::uint64_t seed, std::int32_t block, std::int32_t part);

}  // namespace flatmem_test

// libFuzzer target: reversible segments and the built-in blocks as a hostile caller
// drives them -- flatmem_block_create with any options (any struct_size, kind, width,
// heads, hidden, eps, math), flatmem_block_set_parameters with mutated parameter and
// gradient tensors, flatmem_reversible_create over those blocks or over caller callbacks
// (NULL function pointers included) with any options, the workspace queries, forward and
// backward with mutated states and any workspace.
//
// Checks beyond the sanitizers: every failure has a message and writes no output (outputs
// are sentinel-filled first); every success leaves the message empty; with finite inputs
// and default epsilon a successful forward / backward gives finite outputs.
//
// Input layout: Plan, then values for hostile fields, then tensor mutations, then values.
#include <cmath>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <flatmem/flatmem.h>

#include "support/fuzz_input.hpp"
#include "support/fuzz_tensor.hpp"

using namespace flatmem_fuzz;

namespace {

struct Plan {
  std::uint8_t kind_f, kind_g, width, heads, hidden, eps, math, block_size, mutate_parameters,
      gradients, callbacks, num_blocks, mode, threads, segment_size, batch, tokens, state_ndim,
      workspace_forward, workspace_backward, nan, rebuilt, fresh_outputs;
};

std::int64_t pick(Reader &in, std::uint8_t choice, std::initializer_list<std::int64_t> table) {
  const std::size_t i = choice % (table.size() + 1);
  return i < table.size() ? table.begin()[i] : in.hostile_int64();
}

// A caller callback: y = x / 2 (the VJP dx = dy / 2), any fp dtype handled as fp32 bytes.
flatmem_status half_forward(void *, const flatmem_reversible_context *, const DLTensor *x, DLTensor *y, void *) {
  std::int64_t n = 1;
  for (int i = 0; i < x->ndim; ++i) n *= x->shape[i];
  const auto *in = reinterpret_cast<const float *>(static_cast<const char *>(x->data) + x->byte_offset);
  auto *out = reinterpret_cast<float *>(static_cast<char *>(y->data) + y->byte_offset);
  if (x->dtype.bits != 32) return FLATMEM_STATUS_SUCCESS;  // leaves y as it is: fine for fuzzing
  for (std::int64_t i = 0; i < n; ++i) out[i] = in[i] / 2;
  return FLATMEM_STATUS_SUCCESS;
}
flatmem_status half_vjp(void *user, const flatmem_reversible_context *context, const DLTensor *,
                        const void *, const DLTensor *dy, DLTensor *dx) {
  return half_forward(user, context, dy, dx, nullptr);
}
flatmem_status failing_forward(void *, const flatmem_reversible_context *, const DLTensor *, DLTensor *, void *) {
  flatmem_reversible_callback_error("the fuzzer's callback refuses");
  return FLATMEM_STATUS_INVALID_ARGUMENT;
}

// One built-in block with its twelve tensors.
struct Block {
  flatmem_block_t *handle = nullptr;
  std::vector<std::unique_ptr<FuzzTensor>> parameters, gradients;
  ~Block() { flatmem_block_destroy(handle); }
};

std::vector<std::vector<std::int64_t>> parameter_shapes(std::int64_t kind, std::int64_t w, std::int64_t h) {
  if (kind == FLATMEM_BLOCK_ATTENTION) return {{w}, {w}, {w, 3 * w}, {3 * w}, {w, w}, {w}};
  return {{w}, {w}, {w, h}, {h}, {h, w}, {w}};
}

// Creates the block and sets its parameters; false when a call failed (as it may).
bool make_block(Reader &in, const Plan &p, std::uint8_t kind_choice, Block &block, std::int64_t width) {
  flatmem_block_options o = FLATMEM_BLOCK_OPTIONS_INIT;
  o.kind = static_cast<flatmem_block_kind>(pick(in, kind_choice, {FLATMEM_BLOCK_ATTENTION, FLATMEM_BLOCK_MLP, 0}));
  o.width = std::int32_t(width);
  o.heads = std::int32_t(pick(in, p.heads, {0, 1, 2, 3, -1}));
  o.hidden = std::int32_t(pick(in, p.hidden, {0, 5, 1, -1}));
  static constexpr float eps[] = {0.0f, 1e-5f, -1.0f, 1e-30f};
  o.layer_norm_eps = p.eps % 5 < 4 ? eps[p.eps % 5] : std::nanf("");
  o.math = static_cast<flatmem_block_math>(pick(in, p.math, {0, 1}));
  o.struct_size = hostile_struct_size(p.block_size, sizeof o);
  if (!check_status(flatmem_block_create(&block.handle, &o), "flatmem_block_create")) return false;

  const std::int64_t hidden = o.hidden > 0 ? std::int64_t(o.hidden) : 4 * width;
  for (const auto &shape : parameter_shapes(o.kind, width, hidden)) {
    block.parameters.push_back(std::make_unique<FuzzTensor>(f32(), shape));
    block.gradients.push_back(std::make_unique<FuzzTensor>(f32(), shape));
  }
  if (p.mutate_parameters % 3 == 2) {
    std::vector<FuzzTensor *> all;
    for (auto &t : block.parameters) all.push_back(t.get());
    for (auto &t : block.gradients) all.push_back(t.get());
    all[in.pick(all.size())]->mutate(in);
  }
  DLTensor parameters[FLATMEM_BLOCK_NUM_PARAMETERS], gradients[FLATMEM_BLOCK_NUM_PARAMETERS];
  for (int i = 0; i < FLATMEM_BLOCK_NUM_PARAMETERS; ++i) {
    block.parameters[std::size_t(i)]->materialize();
    block.parameters[std::size_t(i)]->fill(in, false);
    block.gradients[std::size_t(i)]->materialize();
    block.gradients[std::size_t(i)]->fill_sentinel();
    parameters[i] = block.parameters[std::size_t(i)]->tensor();
    gradients[i] = block.gradients[std::size_t(i)]->tensor();
  }
  const bool with_gradients = p.gradients % 4 != 3;
  return check_status(flatmem_block_set_parameters(block.handle, parameters, with_gradients ? gradients : nullptr),
                      "flatmem_block_set_parameters");
}

void expect_unwritten(const char *call, std::initializer_list<const FuzzTensor *> outputs) {
  for (const FuzzTensor *t : outputs)
    if (t->written()) violation(call, std::string("failed (") + flatmem_last_error() + ") but wrote an output");
}

void expect_finite(const char *call, std::initializer_list<const FuzzTensor *> outputs) {
  for (const FuzzTensor *t : outputs)
    for (std::int64_t i = 0; i < t->elements(); ++i)
      if (!std::isfinite(t->f32_at(i)))
        violation(call, "output element " + std::to_string(i) + " is not finite for finite inputs");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t *data, std::size_t size) {
  Reader in(data, size);
  const Plan p = read_plan<Plan>(in);
  const auto width = std::int64_t(std::int32_t(pick(in, p.width, {4, 1, 2, 6, 8, 0, -1})));  // the field is int32

  // The blocks: built-in F and G, or caller callbacks.
  flatmem_reversible_block block{};
  Block f, g;
  const bool builtin = p.callbacks % 4 != 3;
  if (builtin) {
    if (!make_block(in, p, p.kind_f, f, width) || !make_block(in, p, p.kind_g ^ 1, g, width)) return 0;
    check_status(flatmem_block_function(f.handle, &block.f), "flatmem_block_function");
    check_status(flatmem_block_function(g.handle, &block.g), "flatmem_block_function");
  } else {
    block.f = {half_forward, half_vjp, nullptr, nullptr};
    block.g = {p.callbacks & 0x10 ? failing_forward : half_forward, half_vjp, nullptr, nullptr};
    if (p.callbacks & 0x20) block.f.forward = nullptr;
    if (p.callbacks & 0x40) block.g.vjp = nullptr;
  }
  const auto num_blocks = std::int32_t(pick(in, p.num_blocks, {2, 1, 3, 0, -1}));
  // The array holds num_blocks entries when that is a size we can give (else NULL: refused).
  const bool array_fits = num_blocks >= 1 && num_blocks <= 64;
  std::vector<flatmem_reversible_block> blocks(array_fits ? std::size_t(num_blocks) : 1, block);
  flatmem_reversible_options o = FLATMEM_REVERSIBLE_OPTIONS_INIT;
  o.mode = static_cast<flatmem_reversible_mode>(pick(in, p.mode, {0, 1, 2, 3}));
  o.num_threads = std::int32_t(pick(in, p.threads, {1, 2, 0, 3, -1, 257}));
  o.struct_size = hostile_struct_size(p.segment_size, sizeof o);
  flatmem_reversible_t *segment = nullptr;
  if (!check_status(flatmem_reversible_create(&segment, p.callbacks == 255 || (!array_fits && num_blocks > 0) ? nullptr : blocks.data(),
                                              num_blocks, &o),
                    "flatmem_reversible_create"))
    return 0;

  // States (batch, tokens, width) or (tokens, width).
  const std::int64_t batch = 1 + p.batch % 3, tokens = 1 + p.tokens % 6;
  const std::vector<std::int64_t> shape = p.state_ndim % 2 ? std::vector<std::int64_t>{tokens, width}
                                                           : std::vector<std::int64_t>{batch, tokens, width};
  FuzzTensor x1(f32(), shape), x2(f32(), shape), y1(f32(), shape), y2(f32(), shape);
  mutate_some(in, {&x1, &x2, &y1, &y2});
  for (FuzzTensor *t : {&x1, &x2, &y1, &y2}) t->materialize();
  bool nonfinite = x1.fill(in, p.nan % 2 == 1);
  nonfinite = x2.fill(in, p.nan % 2 == 1) || nonfinite;
  y1.fill_sentinel();
  y2.fill_sentinel();
  size_t queried = 0;
  check_status(flatmem_reversible_forward_workspace_size(segment, x1.get(), &queried),
               "flatmem_reversible_forward_workspace_size");
  Workspace workspace;
  workspace.choose(p.workspace_forward, queried);
  const bool forward_ok = check_status(
      flatmem_reversible_forward(segment, x1.get(), x2.get(), 7, 0, y1.get(), y2.get(), workspace.pointer,
                                 workspace.bytes, nullptr),
      "flatmem_reversible_forward");
  if (!forward_ok) expect_unwritten("flatmem_reversible_forward", {&y1, &y2});
  const bool trusted = forward_ok && !nonfinite && p.eps % 5 < 2;
  if (trusted) expect_finite("flatmem_reversible_forward", {&y1, &y2});

  // Backward from the forward's outputs (or fresh states), into sentinel-filled outputs.
  FuzzTensor fresh1(f32(), shape), fresh2(f32(), shape), dy1(f32(), shape), dy2(f32(), shape);
  FuzzTensor dx1(f32(), shape), dx2(f32(), shape), r1(f32(), shape), r2(f32(), shape);
  const bool fresh = !forward_ok || p.fresh_outputs % 2 == 1;
  const bool rebuilt = p.rebuilt % 3 != 0, lopsided = p.rebuilt % 3 == 2 && p.rebuilt & 0x80;
  mutate_some(in, {fresh ? &fresh1 : nullptr, fresh ? &fresh2 : nullptr, &dy1, &dy2, &dx1, &dx2,
                   rebuilt ? &r1 : nullptr, rebuilt ? &r2 : nullptr});
  for (FuzzTensor *t : {&fresh1, &fresh2, &dy1, &dy2, &dx1, &dx2, &r1, &r2}) t->materialize();
  fresh1.fill(in, false);
  fresh2.fill(in, false);
  dy1.fill(in, p.nan % 4 == 3);
  dy2.fill(in, false);
  for (FuzzTensor *t : {&dx1, &dx2, &r1, &r2}) t->fill_sentinel();
  check_status(flatmem_reversible_backward_workspace_size(segment, x1.get(), &queried),
               "flatmem_reversible_backward_workspace_size");
  workspace.choose(p.workspace_backward, queried);
  FuzzTensor &out1 = fresh ? fresh1 : y1, &out2 = fresh ? fresh2 : y2;
  const bool backward_ok = check_status(
      flatmem_reversible_backward(segment, out1.get(), out2.get(), dy1.get(), dy2.get(), 7, 0, dx1.get(),
                                  dx2.get(), rebuilt ? r1.get() : nullptr,
                                  rebuilt && !lopsided ? r2.get() : nullptr, workspace.pointer,
                                  workspace.bytes, nullptr),
      "flatmem_reversible_backward");
  if (!backward_ok) expect_unwritten("flatmem_reversible_backward", {&dx1, &dx2, &r1, &r2});
  if (backward_ok && trusted && !fresh && p.nan % 4 != 3) expect_finite("flatmem_reversible_backward", {&dx1, &dx2});
  check_status(flatmem_reversible_destroy(segment), "flatmem_reversible_destroy");
  return 0;
}

// Bad input to reversible segments: each case asserts the status, that the
// message names the argument, and that nothing the caller owns was written.
// Failing callbacks: the status surfaces with the block index, nothing
// hangs (also when the failure is on the OVERLAPPED rebuild thread), and the
// handle keeps working.
#include <doctest/doctest.h>
#include <flatmem/flatmem.h>

#include <string>
#include <vector>

#include "support/cuda_presence.hpp"
#include "support/segment_run.hpp"
#include "support/toy_reversible.hpp"

using namespace flatmem_test;

namespace {

bool message_has(const std::string &needle) {
  const std::string text = flatmem_last_error();
  const bool found = text.find(needle) != std::string::npos;
  if (!found) MESSAGE("last error was: ", text);
  return found;
}

// A segment, its handle and correctly shaped tensors (outputs hold sentinel
// bytes until written).
struct Fixture {
  explicit Fixture(flatmem_reversible_mode mode = FLATMEM_REVERSIBLE_VANILLA, int depth = 3,
                   Dtype dtype = Dtype::f32)
      : segment(depth, 6, true, 1), in(dtype, 5, 6, 2) {
    flatmem_reversible_options o = FLATMEM_REVERSIBLE_OPTIONS_INIT;
    o.mode = mode;
    o.num_threads = 2;
    REQUIRE(flatmem_reversible_create(&h, segment.blocks.data(), depth, &o) == FLATMEM_STATUS_SUCCESS);
    for (HostTensor *t : {&y1, &y2, &dx1, &dx2, &x1, &x2}) *t = HostTensor::matrix(dtype, 5, 6);
  }
  ~Fixture() { flatmem_reversible_destroy(h); }
  flatmem_status forward() {
    return flatmem_reversible_forward(h, in.x1.dl(), in.x2.dl(), 1, 2, y1.dl(), y2.dl(), nullptr, 0, nullptr);
  }
  flatmem_status backward() {
    return flatmem_reversible_backward(h, y1.dl(), y2.dl(), in.dy1.dl(), in.dy2.dl(), 1, 2, dx1.dl(),
                                       dx2.dl(), x1.dl(), x2.dl(), nullptr, 0, nullptr);
  }
  bool outputs_untouched(std::initializer_list<HostTensor *> ts) const {
    for (HostTensor *t : ts)
      if (!t->all_bytes_are(sentinel_byte)) return false;
    return true;
  }
  ToySegment segment;
  SegmentInputs in;
  HostTensor y1, y2, dx1, dx2, x1, x2;
  flatmem_reversible_t *h = nullptr;
};

}  // namespace

TEST_CASE("reversible/bad_input/create") {
  ToySegment segment(2, 4, true, 1);
  flatmem_reversible_t *h = reinterpret_cast<flatmem_reversible_t *>(0x1);
  CHECK(flatmem_reversible_create(nullptr, segment.blocks.data(), 2, nullptr) == FLATMEM_STATUS_INVALID_ARGUMENT);
  CHECK(message_has("out"));
  CHECK(flatmem_reversible_create(&h, nullptr, 2, nullptr) == FLATMEM_STATUS_INVALID_ARGUMENT);
  CHECK(message_has("blocks"));
  CHECK(flatmem_reversible_create(&h, segment.blocks.data(), 0, nullptr) == FLATMEM_STATUS_INVALID_ARGUMENT);
  CHECK(message_has("num_blocks"));
  CHECK(flatmem_reversible_create(&h, segment.blocks.data(), -3, nullptr) == FLATMEM_STATUS_INVALID_ARGUMENT);
  CHECK(flatmem_reversible_create(&h, segment.blocks.data(), 65537, nullptr) == FLATMEM_STATUS_INVALID_ARGUMENT);
  auto blocks = segment.blocks;
  blocks[1].g.vjp = nullptr;
  CHECK(flatmem_reversible_create(&h, blocks.data(), 2, nullptr) == FLATMEM_STATUS_INVALID_ARGUMENT);
  CHECK(message_has("blocks[1].g.vjp"));
  blocks = segment.blocks;
  blocks[0].f.forward = nullptr;
  CHECK(flatmem_reversible_create(&h, blocks.data(), 2, nullptr) == FLATMEM_STATUS_INVALID_ARGUMENT);
  CHECK(message_has("blocks[0].f.forward"));
  flatmem_reversible_options o = FLATMEM_REVERSIBLE_OPTIONS_INIT;
  o.mode = flatmem_reversible_mode(9);
  CHECK(flatmem_reversible_create(&h, segment.blocks.data(), 2, &o) == FLATMEM_STATUS_INVALID_ARGUMENT);
  CHECK(message_has("options.mode"));
  o = FLATMEM_REVERSIBLE_OPTIONS_INIT;
  o.num_threads = -1;
  CHECK(flatmem_reversible_create(&h, segment.blocks.data(), 2, &o) == FLATMEM_STATUS_INVALID_ARGUMENT);
  CHECK(message_has("options.num_threads"));
  o = FLATMEM_REVERSIBLE_OPTIONS_INIT;
  o.struct_size = 0;
  CHECK(flatmem_reversible_create(&h, segment.blocks.data(), 2, &o) == FLATMEM_STATUS_INVALID_ARGUMENT);
  CHECK(message_has("struct_size"));
  CHECK(h == reinterpret_cast<flatmem_reversible_t *>(0x1));  // untouched on error
  CHECK(flatmem_reversible_destroy(nullptr) == FLATMEM_STATUS_SUCCESS);
  CHECK(flatmem_reversible_options_init(nullptr, sizeof(flatmem_reversible_options)) == FLATMEM_STATUS_INVALID_ARGUMENT);
}

// An older caller's smaller options struct: the library reads only its part.
TEST_CASE("reversible/options/short_struct_size") {
  ToySegment segment(2, 4, true, 1);
  flatmem_reversible_options o = FLATMEM_REVERSIBLE_OPTIONS_INIT;
  o.mode = FLATMEM_REVERSIBLE_OVERLAPPED;
  o.num_threads = 77777;  // beyond the struct the caller claims
  o.struct_size = offsetof(flatmem_reversible_options, num_threads);
  flatmem_reversible_t *h = nullptr;
  REQUIRE(flatmem_reversible_create(&h, segment.blocks.data(), 2, &o) == FLATMEM_STATUS_SUCCESS);
  flatmem_reversible_destroy(h);
}

TEST_CASE("reversible/bad_input/forward_tensors") {
  Fixture f;
  CHECK(flatmem_reversible_forward(nullptr, f.in.x1.dl(), f.in.x2.dl(), 0, 0, f.y1.dl(), f.y2.dl(), nullptr, 0, nullptr) ==
        FLATMEM_STATUS_INVALID_ARGUMENT);
  CHECK(message_has("handle"));
  CHECK(flatmem_reversible_forward(f.h, nullptr, f.in.x2.dl(), 0, 0, f.y1.dl(), f.y2.dl(), nullptr, 0, nullptr) ==
        FLATMEM_STATUS_INVALID_ARGUMENT);
  CHECK(message_has("x1"));
  CHECK(flatmem_reversible_forward(f.h, f.in.x1.dl(), f.in.x2.dl(), 0, 0, f.y1.dl(), nullptr, nullptr, 0, nullptr) ==
        FLATMEM_STATUS_INVALID_ARGUMENT);
  CHECK(message_has("y2"));

  // Shape mismatch.
  HostTensor wide = HostTensor::matrix(Dtype::f32, 5, 7);
  CHECK(flatmem_reversible_forward(f.h, f.in.x1.dl(), wide.dl(), 0, 0, f.y1.dl(), f.y2.dl(), nullptr, 0, nullptr) ==
        FLATMEM_STATUS_INVALID_ARGUMENT);
  CHECK(message_has("x2: shape (5, 7) differs from x1's (5, 6)"));
  // Dtype: fp16 is not a state dtype; fp64 next to fp32 is a mismatch.
  HostTensor half = HostTensor::matrix(Dtype::f16, 5, 6);
  CHECK(flatmem_reversible_forward(f.h, half.dl(), f.in.x2.dl(), 0, 0, f.y1.dl(), f.y2.dl(), nullptr, 0, nullptr) ==
        FLATMEM_STATUS_INVALID_ARGUMENT);
  CHECK(message_has("x1: dtype float16 is not accepted; a state is float32 or float64"));
  HostTensor dbl = HostTensor::matrix(Dtype::f64, 5, 6);
  CHECK(flatmem_reversible_forward(f.h, f.in.x1.dl(), f.in.x2.dl(), 0, 0, dbl.dl(), f.y2.dl(), nullptr, 0, nullptr) ==
        FLATMEM_STATUS_INVALID_ARGUMENT);
  CHECK(message_has("y1: dtype is fp64 but x1 is fp32"));
  // Mixed devices.
  HostTensor on_gpu = HostTensor::matrix(Dtype::f32, 5, 6);
  on_gpu.dl()->device = DLDevice{kDLCUDA, 0};
  CHECK(flatmem_reversible_forward(f.h, f.in.x1.dl(), on_gpu.dl(), 0, 0, f.y1.dl(), f.y2.dl(), nullptr, 0, nullptr) ==
        FLATMEM_STATUS_INVALID_ARGUMENT);
  CHECK(message_has("x2: device"));
  // All "on CUDA" but host memory: refused, naming x1 -- UNSUPPORTED in a
  // CPU-only build (or without a CUDA driver), INVALID_ARGUMENT ("not device
  // memory") where the CUDA backend can look at the pointer.
  const flatmem_status all_gpu = flatmem_reversible_forward(f.h, on_gpu.dl(), on_gpu.dl(), 0, 0, on_gpu.dl(),
                                                            on_gpu.dl(), nullptr, 0, nullptr);
  CHECK_MESSAGE(all_gpu == flatmem_test::status_for_host_memory_labelled_cuda(), std::string(flatmem_last_error()));
  CHECK(message_has("x1"));
  // Non-compact strides.
  HostTensor padded = HostTensor::matrix(Dtype::f32, 5, 6, 8);
  CHECK(flatmem_reversible_forward(f.h, padded.dl(), f.in.x2.dl(), 0, 0, f.y1.dl(), f.y2.dl(), nullptr, 0, nullptr) ==
        FLATMEM_STATUS_INVALID_ARGUMENT);
  CHECK(message_has("x1: strides are not compact"));
  // y1 and y2 the same buffer.
  CHECK(flatmem_reversible_forward(f.h, f.in.x1.dl(), f.in.x2.dl(), 0, 0, f.y1.dl(), f.y1.dl(), nullptr, 0, nullptr) ==
        FLATMEM_STATUS_INVALID_ARGUMENT);
  CHECK(message_has("y1 and y2"));
  // An extent of 0, a NULL data pointer, a misaligned one.
  HostTensor empty = HostTensor::matrix(Dtype::f32, 5, 6);
  empty.dl()->shape[0] = 0;
  CHECK(flatmem_reversible_forward(f.h, empty.dl(), f.in.x2.dl(), 0, 0, f.y1.dl(), f.y2.dl(), nullptr, 0, nullptr) ==
        FLATMEM_STATUS_INVALID_ARGUMENT);
  CHECK(message_has("x1: shape (0, 6)"));
  HostTensor no_data = HostTensor::matrix(Dtype::f32, 5, 6);
  no_data.dl()->data = nullptr;
  CHECK(flatmem_reversible_forward(f.h, f.in.x1.dl(), f.in.x2.dl(), 0, 0, no_data.dl(), f.y2.dl(), nullptr, 0, nullptr) ==
        FLATMEM_STATUS_INVALID_ARGUMENT);
  CHECK(message_has("y1: data is NULL"));
  HostTensor misaligned = HostTensor::matrix(Dtype::f32, 5, 6);
  misaligned.dl()->byte_offset = 2;
  CHECK(flatmem_reversible_forward(f.h, f.in.x1.dl(), f.in.x2.dl(), 0, 0, f.y1.dl(), misaligned.dl(), nullptr, 0, nullptr) ==
        FLATMEM_STATUS_INVALID_ARGUMENT);
  CHECK(message_has("y2: data + byte_offset"));
  // Sizes that overflow 64 bits.
  HostTensor huge = HostTensor::matrix(Dtype::f32, 5, 6);
  huge.dl()->shape[0] = std::int64_t(1) << 62;
  CHECK(flatmem_reversible_forward(f.h, huge.dl(), f.in.x2.dl(), 0, 0, f.y1.dl(), f.y2.dl(), nullptr, 0, nullptr) ==
        FLATMEM_STATUS_INVALID_ARGUMENT);
  CHECK(message_has("overflows"));
  // Workspace too small, and NULL with a size.
  std::size_t bytes = 0;
  REQUIRE(flatmem_reversible_forward_workspace_size(f.h, f.in.x1.dl(), &bytes) == FLATMEM_STATUS_SUCCESS);
  std::vector<char> small(bytes - 1);
  CHECK(flatmem_reversible_forward(f.h, f.in.x1.dl(), f.in.x2.dl(), 0, 0, f.y1.dl(), f.y2.dl(), small.data(),
                                   small.size(), nullptr) == FLATMEM_STATUS_WORKSPACE_TOO_SMALL);
  CHECK(message_has("workspace"));
  CHECK(flatmem_reversible_forward(f.h, f.in.x1.dl(), f.in.x2.dl(), 0, 0, f.y1.dl(), f.y2.dl(), nullptr, 16,
                                   nullptr) == FLATMEM_STATUS_INVALID_ARGUMENT);
  CHECK(f.outputs_untouched({&f.y1, &f.y2}));
  // After all that, a good call works with exactly the queried workspace.
  std::vector<char> exact(bytes);
  CHECK(flatmem_reversible_forward(f.h, f.in.x1.dl(), f.in.x2.dl(), 0, 0, f.y1.dl(), f.y2.dl(), exact.data(),
                                   exact.size(), nullptr) == FLATMEM_STATUS_SUCCESS);
  CHECK(std::string(flatmem_last_error()).empty());
}

TEST_CASE("reversible/bad_input/backward_tensors") {
  Fixture f;
  REQUIRE(f.forward() == FLATMEM_STATUS_SUCCESS);
  HostTensor wide = HostTensor::matrix(Dtype::f32, 5, 7);
  CHECK(flatmem_reversible_backward(f.h, f.y1.dl(), f.y2.dl(), wide.dl(), f.in.dy2.dl(), 1, 2, f.dx1.dl(),
                                    f.dx2.dl(), nullptr, nullptr, nullptr, 0, nullptr) == FLATMEM_STATUS_INVALID_ARGUMENT);
  CHECK(message_has("dy1: shape (5, 7) differs from y1's (5, 6)"));
  CHECK(flatmem_reversible_backward(f.h, f.y1.dl(), f.y2.dl(), f.in.dy1.dl(), f.in.dy2.dl(), 1, 2, nullptr,
                                    f.dx2.dl(), nullptr, nullptr, nullptr, 0, nullptr) == FLATMEM_STATUS_INVALID_ARGUMENT);
  CHECK(message_has("dx1"));
  CHECK(flatmem_reversible_backward(f.h, f.y1.dl(), f.y2.dl(), f.in.dy1.dl(), f.in.dy2.dl(), 1, 2, f.dx1.dl(),
                                    f.dx2.dl(), f.x1.dl(), nullptr, nullptr, 0, nullptr) == FLATMEM_STATUS_INVALID_ARGUMENT);
  CHECK(message_has("x2: NULL while x1 is not"));
  CHECK(flatmem_reversible_backward(f.h, f.y1.dl(), f.y2.dl(), f.in.dy1.dl(), f.in.dy2.dl(), 1, 2, f.dx1.dl(),
                                    f.dx1.dl(), nullptr, nullptr, nullptr, 0, nullptr) == FLATMEM_STATUS_INVALID_ARGUMENT);
  CHECK(message_has("dx1 and dx2"));
  HostTensor on_gpu = HostTensor::matrix(Dtype::f32, 5, 6);
  on_gpu.dl()->device = DLDevice{kDLCUDA, 1};
  CHECK(flatmem_reversible_backward(f.h, f.y1.dl(), f.y2.dl(), f.in.dy1.dl(), on_gpu.dl(), 1, 2, f.dx1.dl(),
                                    f.dx2.dl(), nullptr, nullptr, nullptr, 0, nullptr) == FLATMEM_STATUS_INVALID_ARGUMENT);
  CHECK(message_has("dy2: device"));
  CHECK(f.outputs_untouched({&f.dx1, &f.dx2, &f.x1, &f.x2}));
  // dx may alias dy exactly (gradients in place).
  HostTensor dy1 = HostTensor::matrix(Dtype::f32, 5, 6), dy2 = HostTensor::matrix(Dtype::f32, 5, 6);
  for (std::int64_t r = 0; r < 5; ++r)
    for (int c = 0; c < 6; ++c) dy1.set(r, c, f.in.dy1.get(r, c)), dy2.set(r, c, f.in.dy2.get(r, c));
  REQUIRE(f.backward() == FLATMEM_STATUS_SUCCESS);
  REQUIRE(flatmem_reversible_backward(f.h, f.y1.dl(), f.y2.dl(), dy1.dl(), dy2.dl(), 1, 2, dy1.dl(), dy2.dl(),
                                      nullptr, nullptr, nullptr, 0, nullptr) == FLATMEM_STATUS_SUCCESS);
  CHECK(dy1.same_bits(f.dx1));
  CHECK(dy2.same_bits(f.dx2));
}

// residual_size callbacks whose answers are each allowed (2^62 bytes) but whose sum is not:
// the workspace queries refuse it naming the block, instead of a size that wrapped
// (issue 42: the sum once wrapped negative and the query answered 448 bytes).
flatmem_status huge_residual(void *, const flatmem_reversible_context *, const DLTensor *, size_t *bytes) {
  *bytes = std::size_t(1) << 62;
  return FLATMEM_STATUS_SUCCESS;
}

TEST_CASE("reversible/bad_input/residual_sizes_that_overflow_together") {
  ToySegment segment(2, 6, true, 1);
  std::vector<flatmem_reversible_block> blocks = segment.blocks;
  blocks[1].f.residual_size = huge_residual;
  blocks[1].g.residual_size = huge_residual;
  flatmem_reversible_t *h = nullptr;
  flatmem_reversible_options o = FLATMEM_REVERSIBLE_OPTIONS_INIT;
  o.mode = FLATMEM_REVERSIBLE_VANILLA;
  REQUIRE(flatmem_reversible_create(&h, blocks.data(), 2, &o) == FLATMEM_STATUS_SUCCESS);
  SegmentInputs in(Dtype::f32, 5, 6, 2);
  std::size_t bytes = 12345;
  CHECK(flatmem_reversible_backward_workspace_size(h, in.x1.dl(), &bytes) == FLATMEM_STATUS_INVALID_ARGUMENT);
  CHECK(message_has("block 1"));
  CHECK(message_has("beyond any memory"));
  CHECK(bytes == 12345);
  flatmem_reversible_destroy(h);
}

TEST_CASE("reversible/bad_input/standard_needs_its_forward") {
  Fixture f(FLATMEM_REVERSIBLE_STANDARD);
  CHECK(f.backward() == FLATMEM_STATUS_INVALID_ARGUMENT);
  CHECK(message_has("STANDARD mode needs a preceding forward"));
  CHECK(f.outputs_untouched({&f.dx1, &f.dx2, &f.x1, &f.x2}));
  REQUIRE(f.forward() == FLATMEM_STATUS_SUCCESS);
  CHECK(f.backward() == FLATMEM_STATUS_SUCCESS);
}

TEST_CASE("reversible/bad_input/rebuild_error_tensor") {
  Fixture f;
  HostTensor wrong = HostTensor::vector(Dtype::f64, 2);  // 3 blocks
  CHECK(flatmem_reversible_rebuild_error(f.h, f.in.x1.dl(), f.in.x2.dl(), 0, 0, wrong.dl(), nullptr) ==
        FLATMEM_STATUS_INVALID_ARGUMENT);
  CHECK(message_has("errors: expected a contiguous fp64 CPU vector of 3"));
  CHECK(wrong.all_bytes_are(sentinel_byte));
  CHECK(flatmem_reversible_rebuild_error(f.h, f.in.x1.dl(), f.in.x2.dl(), 0, 0, nullptr, nullptr) ==
        FLATMEM_STATUS_INVALID_ARGUMENT);
}

// A failing callback, at every call position of forward and backward, in
// every mode: its status and the injected message come back with the block
// index; outputs stay untouched; the handle works afterwards.
TEST_CASE("reversible/failing_callback/every_position") {
  for (auto mode : {FLATMEM_REVERSIBLE_STANDARD, FLATMEM_REVERSIBLE_VANILLA, FLATMEM_REVERSIBLE_OVERLAPPED,
                    FLATMEM_REVERSIBLE_AUTO}) {
    CAPTURE(int(mode));
    // Per ToyFunction: forward pass 1 call; backward 1 rebuild forward (not
    // in STANDARD) + 1 vjp.
    for (int block = 0; block < 3; ++block)
      for (int part = 0; part < 2; ++part)
        for (int call = 1; call <= 3; ++call) {
          CAPTURE(block);
          CAPTURE(part);
          CAPTURE(call);
          Fixture f(mode);
          ToyFunction &fn = part == 0 ? *f.segment.f[block] : *f.segment.g[block];
          fn.fail_on_call = call;
          fn.fail_status = FLATMEM_STATUS_OUT_OF_MEMORY;
          const flatmem_status forward = f.forward();
          if (call == 1) {
            CHECK(forward == FLATMEM_STATUS_OUT_OF_MEMORY);
            CHECK(message_has("block " + std::to_string(block) + ", " + (part ? "G" : "F") + " forward"));
            CHECK(message_has("toy failure injected at call 1"));
            CHECK(f.outputs_untouched({&f.y1, &f.y2}));
            fn.fail_on_call = 0;
            REQUIRE(f.forward() == FLATMEM_STATUS_SUCCESS);
            continue;
          }
          REQUIRE(forward == FLATMEM_STATUS_SUCCESS);
          const flatmem_status backward = f.backward();
          const bool standard = mode == FLATMEM_REVERSIBLE_STANDARD;
          if (standard && call == 3) {
            CHECK(backward == FLATMEM_STATUS_SUCCESS);  // STANDARD makes one call per function
            continue;
          }
          CHECK(backward == FLATMEM_STATUS_OUT_OF_MEMORY);
          CHECK(message_has("block " + std::to_string(block) + ", " + (part ? "G" : "F")));
          CHECK(message_has("toy failure injected"));
          CHECK(f.outputs_untouched({&f.dx1, &f.dx2, &f.x1, &f.x2}));
          // The handle still works, and gives the right answer.
          fn.fail_on_call = 0;
          f.segment.zero_gradients();
          REQUIRE(f.backward() == FLATMEM_STATUS_SUCCESS);
          const ReferenceResult ref =
              reference_segment(f.segment, 5, f.in.x1.values(), f.in.x2.values(), f.in.dy1.values(),
                                f.in.dy2.values(), 1, 2);
          const std::vector<double> got = f.dx2.values();
          for (std::size_t i = 0; i < got.size(); ++i) CHECK(got[i] == doctest::Approx(ref.dx2[i]).epsilon(1e-4));
        }
  }
}

// A callback returning a status flatmem does not define becomes INTERNAL,
// naming the value; a failure without a message names the status.
TEST_CASE("reversible/failing_callback/unknown_status_and_no_message") {
  Fixture f(FLATMEM_REVERSIBLE_OVERLAPPED, 4);
  f.segment.g[2]->fail_on_call = 2;  // its rebuild forward, on the rebuild thread
  f.segment.g[2]->fail_status = flatmem_status(1234);
  REQUIRE(f.forward() == FLATMEM_STATUS_SUCCESS);
  CHECK(f.backward() == FLATMEM_STATUS_INTERNAL);
  CHECK(message_has("block 2, G forward (rebuild)"));
  CHECK(message_has("unknown status 1234"));
}

// Many overlapped backwards failing at random places never hang.
TEST_CASE("reversible/failing_callback/overlapped_no_hang") {
  Fixture f(FLATMEM_REVERSIBLE_OVERLAPPED, 8);
  REQUIRE(f.forward() == FLATMEM_STATUS_SUCCESS);
  for (int i = 0; i < 200; ++i) {
    ToyFunction &fn = (i % 2) ? *f.segment.f[std::size_t(i % 8)] : *f.segment.g[std::size_t((i / 2) % 8)];
    fn.calls = 0;
    fn.fail_on_call = 1 + i % 2;  // rebuild forward or vjp
    CHECK(f.backward() != FLATMEM_STATUS_SUCCESS);
    fn.fail_on_call = 0;
  }
  CHECK(f.backward() == FLATMEM_STATUS_SUCCESS);
}

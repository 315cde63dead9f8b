// Regression tests for what the libFuzzer targets (tests/fuzz/) found: DLTensor fields a C
// caller may fill with anything must be refused with a status, never read in a way that is
// undefined behaviour in the C++ library (the ASan+UBSan build, scripts/test-sanitize.sh,
// aborts on it).
//  - device.device_type outside DLDeviceType's enumerators (43, INT32_MIN): loading such a
//    value as the C++ enum is undefined; it is read as its 32-bit storage.
//  - byte_offset so large that data + byte_offset wraps around: pointer arithmetic that
//    overflows is undefined; the address is formed in integer arithmetic.
#include <doctest/doctest.h>
#include <flatmem/flatmem.h>

#include <climits>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

namespace {

// A compact fp32 tensor over `values` whose device type is stored as any 32-bit value.
struct Tensor {
  std::vector<float> values;
  std::vector<std::int64_t> shape;
  DLTensor t{};
  Tensor(std::vector<std::int64_t> extents, std::int32_t device_type)
      : values(std::size_t(extents.empty() ? 1 : extents[0] * (extents.size() > 1 ? extents[1] : 1)), 0.5f),
        shape(std::move(extents)) {
    t.data = values.data();
    std::memcpy(&t.device.device_type, &device_type, sizeof device_type);  // as a C caller may
    t.dtype = DLDataType{kDLFloat, 32, 1};
    t.ndim = int(shape.size());
    t.shape = shape.data();
  }
};

void expect_refused_naming(flatmem_status status, const std::string &text) {
  CHECK(status != FLATMEM_STATUS_SUCCESS);
  const std::string message = flatmem_last_error();
  INFO("message: " << message);
  CHECK(message.find(text) != std::string::npos);
}

}  // namespace

TEST_CASE("core/tensor/device_type outside DLDeviceType is refused (contrastive, reversible, comm)") {
  for (const std::int32_t type : {43, INT32_MIN, -1}) {
    CAPTURE(type);
    const std::string named = "type " + std::to_string(type);
    flatmem_contrastive_t *loss = nullptr;
    REQUIRE(flatmem_contrastive_create(&loss, nullptr) == FLATMEM_STATUS_SUCCESS);
    Tensor q({4, 3}, type), k({4, 3}, kDLCPU);
    std::size_t bytes = 0;
    expect_refused_naming(flatmem_contrastive_forward_workspace_size(loss, &q.t, &k.t, &bytes), named);
    flatmem_contrastive_destroy(loss);

    flatmem_block_options bo = FLATMEM_BLOCK_OPTIONS_INIT;
    bo.kind = FLATMEM_BLOCK_MLP;
    bo.width = 3;
    flatmem_block_t *block = nullptr;
    REQUIRE(flatmem_block_create(&block, &bo) == FLATMEM_STATUS_SUCCESS);
    flatmem_reversible_block rb{};
    REQUIRE(flatmem_block_function(block, &rb.f) == FLATMEM_STATUS_SUCCESS);
    rb.g = rb.f;
    flatmem_reversible_t *segment = nullptr;
    REQUIRE(flatmem_reversible_create(&segment, &rb, 1, nullptr) == FLATMEM_STATUS_SUCCESS);
    Tensor x1({2, 3}, type), x2({2, 3}, kDLCPU);
    expect_refused_naming(flatmem_reversible_forward_workspace_size(segment, &x1.t, &bytes), named);
    Tensor y1({2, 3}, kDLCPU), y2({2, 3}, kDLCPU);
    // x2 has a good device, x1 the bad one: the comparison of the two must not load it as the enum.
    expect_refused_naming(flatmem_reversible_forward(segment, &x2.t, &x1.t, 0, 0, &y1.t, &y2.t, nullptr, 0, nullptr),
                          std::to_string(type));
    flatmem_reversible_destroy(segment);
    flatmem_block_destroy(block);

    flatmem_comm_t *comm = nullptr;
    REQUIRE(flatmem_comm_create_local(&comm, 1, nullptr) == FLATMEM_STATUS_SUCCESS);
    Tensor message({2}, type);
    flatmem_comm_request_t *request = nullptr;
    expect_refused_naming(flatmem_comm_isend(comm, &message.t, 0, 1, &request, nullptr), named);
    CHECK(request == nullptr);
    flatmem_comm_destroy(comm);
  }
}

TEST_CASE("core/tensor/byte_offset that wraps data + byte_offset around: no pointer overflow") {
  flatmem_contrastive_t *loss = nullptr;
  REQUIRE(flatmem_contrastive_create(&loss, nullptr) == FLATMEM_STATUS_SUCCESS);
  Tensor q({4, 3}, kDLCPU), k({4, 3}, kDLCPU);
  // data + byte_offset wraps to data - 64. Every tensor field is checked, byte_offset
  // included (flatmem.h, Conventions: "byte extents fit in 64 bits"), size queries too: the
  // documented outcome is INVALID_ARGUMENT naming q and the overflow, with nothing written.
  q.t.byte_offset = ~std::uint64_t(0) - 63;
  std::size_t bytes = 12345;
  const flatmem_status status = flatmem_contrastive_forward_workspace_size(loss, &q.t, &k.t, &bytes);
  const std::string message = flatmem_last_error();
  CHECK_MESSAGE(status == FLATMEM_STATUS_INVALID_ARGUMENT, message);
  CHECK_MESSAGE(message.find("q") != std::string::npos, message);
  CHECK_MESSAGE(message.find("overflows") != std::string::npos, message);
  CHECK(bytes == 12345);
  flatmem_contrastive_destroy(loss);
}

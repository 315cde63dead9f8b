// Regression tests for what tests/fuzz/fuzz_cyclic found:
//  - flatmem_cyclic_options.timeout_ms is bounded like every communicator timeout (1 ms ..
//    a day, 0 = the communicator's default). A huge value used to be accepted and then
//    overflowed the nanosecond deadline of the condition variable flatmem_cyclic_next
//    waits on (undefined behaviour; in practice a deadline in the past or far future).
//  - flatmem_cyclic_reduce refuses a gradient whose data + byte_offset is not aligned to
//    its element size (it used to read it as floats: misaligned loads, undefined).
#include <doctest/doctest.h>
#include <flatmem/flatmem.h>

#include <cstdint>
#include <vector>
#include <string>

namespace {

flatmem_status create_with_timeout(std::int64_t timeout_ms, std::string *message) {
  flatmem_comm_t *comm = nullptr;
  REQUIRE(flatmem_comm_create_local(&comm, 1, nullptr) == FLATMEM_STATUS_SUCCESS);
  flatmem_cyclic_options o = FLATMEM_CYCLIC_OPTIONS_INIT;
  o.stages = 2;
  o.steps = 1;
  o.timeout_ms = timeout_ms;
  flatmem_cyclic_t *handle = nullptr;
  const flatmem_status status = flatmem_cyclic_create(&handle, comm, &o);
  *message = flatmem_last_error();
  if (status == FLATMEM_STATUS_SUCCESS) CHECK(flatmem_cyclic_destroy(handle) == FLATMEM_STATUS_SUCCESS);
  else CHECK(handle == nullptr);
  flatmem_comm_destroy(comm);
  return status;
}

}  // namespace

TEST_CASE("cyclic/options/timeout_ms beyond a day is refused, a day is accepted") {
  std::string message;
  for (const std::int64_t too_long : {std::int64_t(24) * 3600 * 1000 + 1, std::int64_t(578911237572657152),
                                      INT64_MAX}) {
    CAPTURE(too_long);
    CHECK(create_with_timeout(too_long, &message) == FLATMEM_STATUS_INVALID_ARGUMENT);
    CHECK(message.find("options.timeout_ms") != std::string::npos);
  }
  CHECK(create_with_timeout(std::int64_t(24) * 3600 * 1000, &message) == FLATMEM_STATUS_SUCCESS);
  CHECK(create_with_timeout(0, &message) == FLATMEM_STATUS_SUCCESS);
  CHECK(create_with_timeout(-5, &message) == FLATMEM_STATUS_INVALID_ARGUMENT);
}

TEST_CASE("cyclic/reduce/a misaligned gradient is refused and the handle goes on") {
  flatmem_comm_t *comm = nullptr;
  REQUIRE(flatmem_comm_create_local(&comm, 1, nullptr) == FLATMEM_STATUS_SUCCESS);
  flatmem_cyclic_options o = FLATMEM_CYCLIC_OPTIONS_INIT;
  o.stages = 1;
  o.steps = 1;
  flatmem_cyclic_t *handle = nullptr;
  REQUIRE(flatmem_cyclic_create(&handle, comm, &o) == FLATMEM_STATUS_SUCCESS);
  flatmem_cyclic_action a{};
  do REQUIRE(flatmem_cyclic_next(handle, &a, sizeof(flatmem_cyclic_action)) == FLATMEM_STATUS_SUCCESS);
  while (a.kind != FLATMEM_CYCLIC_BACKWARD);
  std::vector<float> storage(9, 1.0f);
  std::int64_t shape[1] = {8};
  DLTensor g{};
  g.data = storage.data();
  g.byte_offset = 2;  // data + 2: not a float boundary
  g.device = DLDevice{kDLCPU, 0};
  g.dtype = DLDataType{kDLFloat, 32, 1};
  g.ndim = 1;
  g.shape = shape;
  CHECK(flatmem_cyclic_reduce(handle, a.stage, &g) == FLATMEM_STATUS_INVALID_ARGUMENT);
  CHECK(std::string(flatmem_last_error()).find("aligned") != std::string::npos);
  g.byte_offset = 4;  // aligned: accepted
  CHECK(flatmem_cyclic_reduce(handle, a.stage, &g) == FLATMEM_STATUS_SUCCESS);
  do REQUIRE(flatmem_cyclic_next(handle, &a, sizeof(flatmem_cyclic_action)) == FLATMEM_STATUS_SUCCESS);
  while (a.kind != FLATMEM_CYCLIC_DONE);
  CHECK(flatmem_cyclic_destroy(handle) == FLATMEM_STATUS_SUCCESS);
  flatmem_comm_destroy(comm);
}

// tests/fuzz/fuzz_cyclic_stages found the stage-parallel handle's accumulate adding a
// misaligned gradient as floats (misaligned loads in the micro-batch sum, undefined): it
// is refused like flatmem_cyclic_reduce's (the check is shared), and the handle goes on.
TEST_CASE("cyclic stages/accumulate/a misaligned gradient is refused and the handle goes on") {
  flatmem_comm_t *comm = nullptr;
  REQUIRE(flatmem_comm_create_local(&comm, 1, nullptr) == FLATMEM_STATUS_SUCCESS);
  flatmem_cyclic_stages_options o = FLATMEM_CYCLIC_STAGES_OPTIONS_INIT;
  o.stages = 1;
  o.micro_batches = 3;  // micro-batches 1 and 2 are added into the sum of micro-batch 0
  o.steps = 1;
  flatmem_cyclic_stages_t *handle = nullptr;
  REQUIRE(flatmem_cyclic_stages_create(&handle, comm, &o) == FLATMEM_STATUS_SUCCESS);
  std::vector<double> storage(9, 1.0);
  std::int64_t shape[1] = {8};
  DLTensor g{};
  g.data = storage.data();
  g.device = DLDevice{kDLCPU, 0};
  g.dtype = DLDataType{kDLFloat, 64, 1};
  g.ndim = 1;
  g.shape = shape;
  int backwards = 0;
  for (;;) {
    flatmem_cyclic_stages_action a{};
    REQUIRE(flatmem_cyclic_stages_next(handle, &a, sizeof(flatmem_cyclic_stages_action)) == FLATMEM_STATUS_SUCCESS);
    if (a.kind == FLATMEM_CYCLIC_DONE) break;
    if (a.kind != FLATMEM_CYCLIC_BACKWARD) continue;
    ++backwards;
    for (const std::uint64_t misaligned : {1, 4, 7}) {  // not a double boundary
      CAPTURE(misaligned);
      g.byte_offset = misaligned;
      CHECK(flatmem_cyclic_stages_accumulate(handle, &g) == FLATMEM_STATUS_INVALID_ARGUMENT);
      CHECK(std::string(flatmem_last_error()).find("aligned") != std::string::npos);
    }
    g.byte_offset = 8;  // aligned: accepted
    CHECK(flatmem_cyclic_stages_accumulate(handle, &g) == FLATMEM_STATUS_SUCCESS);
  }
  CHECK(backwards == 3);
  CHECK(flatmem_cyclic_stages_destroy(handle) == FLATMEM_STATUS_SUCCESS);
  flatmem_comm_destroy(comm);
}

// tests/fuzz/fuzz_cyclic found a relayed handle whose staging (allocated by the first
// flatmem_cyclic_set_shard) could not be allocated: the failure left the element size
// recorded and the staging empty, so the next set_shard "succeeded" over no staging (the
// relay would then have written past it). Now the call fails with OUT_OF_MEMORY naming
// options.parameter_count and changes nothing, every time. Not in sanitizer builds: their
// allocators abort on such a request instead of failing it.
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define FLATMEM_TEST_SANITIZED 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
#define FLATMEM_TEST_SANITIZED 1
#endif
#endif
#ifndef FLATMEM_TEST_SANITIZED
TEST_CASE("cyclic relay/set_shard/staging that cannot be allocated: OUT_OF_MEMORY, nothing registered, again") {
  flatmem_comm_t *comm = nullptr;
  REQUIRE(flatmem_comm_create_local(&comm, 1, nullptr) == FLATMEM_STATUS_SUCCESS);
  const std::int64_t count[1] = {std::int64_t(1) << 40};  // the header's largest stage: 8 TiB of staging
  flatmem_cyclic_options o = FLATMEM_CYCLIC_OPTIONS_INIT;
  o.stages = 1;
  o.steps = 1;
  o.parameters = FLATMEM_CYCLIC_PARAMETERS_RELAYED;
  o.parameter_count = count;
  flatmem_cyclic_t *handle = nullptr;
  REQUIRE(flatmem_cyclic_create(&handle, comm, &o) == FLATMEM_STATUS_SUCCESS);
  float element = 0.0f;  // set_shard reads only the metadata
  std::int64_t shape[1] = {count[0]};
  DLTensor shard{};
  shard.data = &element;
  shard.device = DLDevice{kDLCPU, 0};
  shard.dtype = DLDataType{kDLFloat, 32, 1};
  shard.ndim = 1;
  shard.shape = shape;
  for (int attempt = 0; attempt < 2; ++attempt) {
    CAPTURE(attempt);
    CHECK(flatmem_cyclic_set_shard(handle, 0, &shard) == FLATMEM_STATUS_OUT_OF_MEMORY);
    CHECK(std::string(flatmem_last_error()).find("options.parameter_count") != std::string::npos);
  }
  flatmem_cyclic_action a{};
  CHECK(flatmem_cyclic_next(handle, &a, sizeof(flatmem_cyclic_action)) == FLATMEM_STATUS_INVALID_ARGUMENT);  // stage 0 has no shard
  CHECK(flatmem_cyclic_destroy(handle) == FLATMEM_STATUS_SUCCESS);
  flatmem_comm_destroy(comm);
}
#endif

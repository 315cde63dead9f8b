// Links into test_gpu_contrastive_panels and test_gpu_sigmoid_panels: the CUDA
// values and determinism suites (test_gpu_values.cpp, test_gpu_determinism.cpp)
// and the sigmoid suite (test_gpu_sigmoid.cpp) once more with the panel engine
// forced (FLATMEM_CUDA_ENGINE=panels, read when each handle is created) and its
// dial at 1 byte, so that every shape runs the smallest panels (128 x 128):
// shapes up to 2053 then cross panel edges in both directions, with short last
// panels and short fold tiles. The cases below prove the panels ran: their
// workspace holds cuBLASLt's 4 MiB, which the tile kernels' never does at
// these shapes.
#include <doctest/doctest.h>
#include <flatmem/flatmem.h>

#include <cstdlib>

#include "contrastive/gpu/gpu_call.hpp"
#include "support/contrastive.hpp"
#include "support/gpu.hpp"

namespace {
const bool engine_forced = [] {
  setenv("FLATMEM_CUDA_ENGINE", "panels", 1);
  setenv("FLATMEM_CUDA_PANEL_BYTES", "1", 1);
  return true;
}();
}  // namespace

TEST_CASE("gpu/contrastive/panels/the_panel_engine_runs") {
  REQUIRE(engine_forced);
  using namespace flatmem_test;
  const auto handle = create_handle(make_options(FLATMEM_CONTRASTIVE_SYMMETRIC, 0, 0, 0, FLATMEM_NONFINITE_PROPAGATE));
  HostTensor q = HostTensor::matrix(Dtype::bf16, 300, 64, 64), k = HostTensor::matrix(Dtype::bf16, 300, 64, 64);
  DeviceTensor dq(q), dk(k);
  std::size_t bytes = 0;
  REQUIRE(flatmem_contrastive_forward_workspace_size(handle.get(), dq.dl(), dk.dl(), &bytes) ==
          FLATMEM_STATUS_SUCCESS);
  CHECK(bytes >= std::size_t(4) << 20);
}

TEST_CASE("gpu/contrastive/panels/the_panel_engine_runs_the_sigmoid_loss") {
  REQUIRE(engine_forced);
  using namespace flatmem_test;
  const auto handle = create_handle(make_options(FLATMEM_CONTRASTIVE_SIGMOID, 0, 0, 0, FLATMEM_NONFINITE_PROPAGATE));
  HostTensor q = HostTensor::matrix(Dtype::bf16, 300, 64, 64), k = HostTensor::matrix(Dtype::bf16, 300, 64, 64);
  DeviceTensor dq(q), dk(k);
  std::size_t bytes = 0;
  REQUIRE(flatmem_contrastive_sigmoid_workspace_size(handle.get(), dq.dl(), dk.dl(), dq.dl(), dk.dl(), &bytes) ==
          FLATMEM_STATUS_SUCCESS);
  CHECK(bytes >= std::size_t(4) << 20);
}

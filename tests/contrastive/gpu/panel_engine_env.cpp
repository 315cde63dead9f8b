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

// The workspace a handle of `loss` asks for at 300 x 64 bf16 on the device.
std::size_t workspace_at_300(flatmem_contrastive_loss loss) {
  using namespace flatmem_test;
  REQUIRE(engine_forced);
  const auto handle = create_handle(make_options(loss, 0, 0, 0, FLATMEM_NONFINITE_PROPAGATE));
  HostTensor q = HostTensor::matrix(Dtype::bf16, 300, 64, 64), k = HostTensor::matrix(Dtype::bf16, 300, 64, 64);
  DeviceTensor dq(q), dk(k);
  std::size_t bytes = 0;
  const flatmem_status status =
      loss == FLATMEM_CONTRASTIVE_SIGMOID
          ? flatmem_contrastive_sigmoid_workspace_size(handle.get(), dq.dl(), dk.dl(), dq.dl(), dk.dl(), &bytes)
          : flatmem_contrastive_forward_workspace_size(handle.get(), dq.dl(), dk.dl(), &bytes);
  REQUIRE_MESSAGE(status == FLATMEM_STATUS_SUCCESS, flatmem_last_error());
  return bytes;
}

TEST_CASE("gpu/contrastive/panels/the_panel_engine_runs") {
  CHECK(workspace_at_300(FLATMEM_CONTRASTIVE_SYMMETRIC) >= std::size_t(4) << 20);
}

TEST_CASE("gpu/contrastive/panels/the_panel_engine_runs_the_sigmoid_loss") {
  CHECK(workspace_at_300(FLATMEM_CONTRASTIVE_SIGMOID) >= std::size_t(4) << 20);
}

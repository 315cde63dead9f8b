// The stage-parallel handle's device side in a build without the NCCL
// transport: read_memory refuses options.memory = CUDA first, so these are
// never reached from the C API.
#include "core/error.hpp"
#include "cyclic/stages/device_boundaries.hpp"

namespace flatmem::cyclic::stages {

std::unique_ptr<DeviceBoundaries> device_boundaries(comm::Communicator &, const std::array<Link, 4> &, int,
                                                    comm::Milliseconds) {
  fail(FLATMEM_STATUS_UNSUPPORTED, "options.memory: CUDA, but this flatmem was built without NCCL (FLATMEM_WITH_NCCL)");
}

}  // namespace flatmem::cyclic::stages

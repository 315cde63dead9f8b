// The device transport of a library built without NCCL (FLATMEM_WITH_NCCL=OFF,
// NCCL not found, or no CUDA toolkit): flatmem_comm_init_device fails with
// UNSUPPORTED and the communicator stays usable for host buffers.
#include "comm/device_transport.hpp"
#include "core/error.hpp"

namespace flatmem::comm {

bool device_transport_built() { return false; }

std::unique_ptr<DeviceTransport> create_device_transport(Communicator &, int, Milliseconds) {
  fail(FLATMEM_STATUS_UNSUPPORTED,
       "init_device: this flatmem was built without NCCL (FLATMEM_WITH_NCCL); "
       "kDLCUDA buffers cannot be sent");
}

}  // namespace flatmem::comm

#include "comm/communicator.hpp"

#include "comm/device_transport.hpp"

namespace flatmem::comm {

void Communicator::set_device(std::unique_ptr<DeviceTransport> device) {
  device_ = std::move(device);
}

}  // namespace flatmem::comm

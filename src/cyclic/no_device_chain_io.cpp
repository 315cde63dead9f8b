// Device gradients and relays in a build without the NCCL transport:
// read_memory refuses options.memory = CUDA first, so these are never
// reached from the C API.
#include "core/error.hpp"
#include "cyclic/chain_io.hpp"
#include "cyclic/relay_links.hpp"

namespace flatmem::cyclic {
namespace {

[[noreturn]] void unsupported() {
  fail(FLATMEM_STATUS_UNSUPPORTED, "options.memory: CUDA, but this flatmem was built without NCCL (FLATMEM_WITH_NCCL)");
}

}  // namespace

bool device_chains_built() { return false; }

std::unique_ptr<ChainIo> device_chain_io(comm::Communicator &, comm::Milliseconds) { unsupported(); }

void check_device_memory(const void *, int, const char *) { unsupported(); }

void check_device_stream(void *, int, const char *) { unsupported(); }

std::shared_ptr<void> device_gradient_ready(const void *, std::size_t, int, void *) { unsupported(); }

std::unique_ptr<RelayLinks> relay_links(comm::Communicator &, const RelayPlan &, comm::Milliseconds,
                                        std::function<void(std::int64_t)>) {
  unsupported();
}

}  // namespace flatmem::cyclic

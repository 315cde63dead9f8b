// extern "C" flatmem_comm_create_local: an in-process group of communicators
// (src/comm/local/). The other communicator entry points are in comm.cpp.
#include <memory>
#include <vector>

#include "comm/local/local_comm.hpp"
#include "comm/options.hpp"
#include "core/error.hpp"

using namespace flatmem;

namespace {
constexpr std::int32_t max_local_ranks = 4096;
}

extern "C" flatmem_status flatmem_comm_create_local(flatmem_comm_t **comms, int32_t world_size,
                                                    const flatmem_comm_options *options) {
  return guarded([&] {
    if (comms == nullptr) invalid("comms: NULL; pass an array of world_size pointers");
    if (world_size < 1 || world_size > max_local_ranks)
      invalid("world_size: ", world_size, "; expected 1 .. ", max_local_ranks);
    const comm::Config config = comm::resolve_config(options);
    auto ranks = comm::local::create_group(world_size, config.timeout);
    std::vector<std::unique_ptr<flatmem_comm_s>> handles;
    handles.reserve(ranks.size());
    for (auto &rank : ranks) handles.push_back(std::make_unique<flatmem_comm_s>(flatmem_comm_s{std::move(rank)}));
    for (std::size_t r = 0; r < handles.size(); ++r) comms[r] = handles[r].release();
  });
}

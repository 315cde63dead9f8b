// extern "C" flatmem_cyclic_* of the ZeRO relay mode: argument checks and
// exception -> status; the relay is src/cyclic/relay.cpp.
#include <flatmem/cyclic.h>

#include <algorithm>
#include <cstring>

#include "core/abi_struct.hpp"
#include "core/error.hpp"
#include "cyclic/runtime.hpp"

using namespace flatmem;
using flatmem::cyclic::Runtime;

using flatmem::cyclic::runtime_of;

extern "C" {

flatmem_status flatmem_cyclic_set_shard(flatmem_cyclic_t *handle, int32_t stage, DLTensor *shard) {
  return guarded([&] { runtime_of(handle).set_shard(stage, shard, nullptr); });
}

flatmem_status flatmem_cyclic_set_shard_stream(flatmem_cyclic_t *handle, int32_t stage, DLTensor *shard,
                                               void *stream) {
  return guarded([&] { runtime_of(handle).set_shard(stage, shard, stream); });
}

flatmem_status flatmem_cyclic_shard_range(const flatmem_cyclic_t *handle, int32_t stage, int32_t rank,
                                          int64_t *begin, int64_t *end) {
  return guarded([&] {
    const Runtime &r = runtime_of(handle);
    if (begin == nullptr) invalid("begin: NULL");
    if (end == nullptr) invalid("end: NULL");
    const auto range = r.shard_range(stage, rank);
    *begin = range.first;
    *end = range.second;
  });
}

flatmem_status flatmem_cyclic_parameters(flatmem_cyclic_t *handle, DLTensor *full) {
  return guarded([&] { runtime_of(handle).parameters(full, nullptr); });
}

flatmem_status flatmem_cyclic_parameters_stream(flatmem_cyclic_t *handle, DLTensor *full, void *stream) {
  return guarded([&] { runtime_of(handle).parameters(full, stream); });
}

flatmem_status flatmem_cyclic_relay_stats(const flatmem_cyclic_t *handle, int64_t first, int64_t count,
                                          flatmem_cyclic_relay_time_step *stats, size_t element_size,
                                          int64_t *written) {
  return guarded([&] {
    const Runtime &r = runtime_of(handle);
    if (written == nullptr) invalid("written: NULL");
    const StructArrayOut<flatmem_cyclic_relay_time_step> out(stats, element_size, count, "stats",
                                                              "element_size");
    *written = r.relay_stats(first, count, out);
  });
}

flatmem_status flatmem_cyclic_relay_summary_get(const flatmem_cyclic_t *handle,
                                                flatmem_cyclic_relay_summary *summary,
                                                size_t summary_size) {
  return guarded([&] {
    const Runtime &r = runtime_of(handle);
    flatmem_cyclic_relay_summary out{};
    r.relay_summary(out);
    write_struct(summary, summary_size, out, "summary", "summary_size");
  });
}

}  // extern "C"

// extern "C" flatmem_cyclic_*: argument checks and exception -> status; the
// schedule is src/cyclic/schedule.cpp, the runtime src/cyclic/runtime.cpp.
#include <flatmem/cyclic.h>

#include <memory>

#include "comm/communicator.hpp"
#include "comm/options.hpp"
#include "core/abi_struct.hpp"
#include "core/error.hpp"
#include "core/options.hpp"
#include "cyclic/runtime.hpp"

using namespace flatmem;
using flatmem::cyclic::Runtime;

namespace {

constexpr std::int64_t default_history = 65536;
constexpr std::int64_t max_history = std::int64_t(1) << 26;

using flatmem::cyclic::runtime_of;

cyclic::Settings read_settings(const flatmem_cyclic_options *options, comm::Communicator &c) {
  if (options == nullptr) invalid("options: NULL; stages and steps are required");
  const auto o = read_options(options, "FLATMEM_CYCLIC_OPTIONS_INIT / flatmem_cyclic_options_init");
  cyclic::Settings s;
  s.schedule = cyclic::make_schedule(c.size(), o.stages, o.steps, enum_value(o.rule), "options");
  const auto stages = static_cast<std::size_t>(o.stages);
  s.activation_bytes.assign(stages, 1);
  if (o.activation_bytes != nullptr) {
    for (std::size_t j = 0; j < stages; ++j) {
      const std::int64_t b = o.activation_bytes[j];
      if (b < 0 || b > (std::int64_t(1) << 50))
        invalid("options.activation_bytes[", j, "]: ", b, "; expected 0 .. 2^50");
      s.activation_bytes[j] = b;
    }
  }
  if (o.timeout_ms < 0) invalid("options.timeout_ms: ", o.timeout_ms, "; expected > 0, or 0 for the communicator's default");
  // Bounded like every communicator timeout (1 ms .. a day): a larger one overflowed the
  // condition variable's nanosecond deadline.
  s.timeout = flatmem::comm::resolve_timeout(o.timeout_ms, c.default_timeout(), "options.timeout_ms");
  const std::int32_t nonfinite = enum_value(o.nonfinite);
  if (nonfinite != FLATMEM_NONFINITE_ERROR && nonfinite != FLATMEM_NONFINITE_PROPAGATE)
    invalid("options.nonfinite: ", nonfinite, "; expected FLATMEM_NONFINITE_ERROR or _PROPAGATE");
  s.scan_nonfinite = nonfinite == FLATMEM_NONFINITE_ERROR;
  if (o.history < 0 || o.history > max_history)
    invalid("options.history: ", o.history, "; expected 1 .. 2^26 time steps, or 0 for ", default_history);
  s.history = o.history == 0 ? default_history : o.history;
  cyclic::read_parameter_options(enum_value(o.parameters), o.parameter_count, s);
  cyclic::read_memory_option(enum_value(o.memory), s);
  return s;
}

void check_rank(const cyclic::Schedule &s, std::int32_t rank) {
  if (rank < 0 || rank >= s.world) invalid("rank: ", rank, "; expected 0 .. ", s.world - 1);
}

template <typename Out>
void require(const Out *out, const char *name) {
  if (out == nullptr) invalid(name, ": NULL");
}

}  // namespace

extern "C" {

flatmem_status flatmem_cyclic_schedule_offset(const flatmem_cyclic_schedule *schedule, int32_t rank,
                                              int64_t *offset) {
  return guarded([&] {
    const cyclic::Schedule s = cyclic::read_schedule(schedule);
    require(offset, "offset");
    check_rank(s, rank);
    *offset = s.offset(rank);
  });
}

flatmem_status flatmem_cyclic_schedule_delay(const flatmem_cyclic_schedule *schedule, int32_t rank,
                                             int32_t stage, int32_t *delay) {
  return guarded([&] {
    const cyclic::Schedule s = cyclic::read_schedule(schedule);
    require(delay, "delay");
    check_rank(s, rank);
    if (stage < 0 || stage >= s.stages) invalid("stage: ", stage, "; expected 0 .. ", s.stages - 1);
    *delay = s.delay(rank, stage);
  });
}

flatmem_status flatmem_cyclic_schedule_length(const flatmem_cyclic_schedule *schedule,
                                              int64_t *time_steps) {
  return guarded([&] {
    const cyclic::Schedule s = cyclic::read_schedule(schedule);
    require(time_steps, "time_steps");
    *time_steps = s.length();
  });
}

flatmem_status flatmem_cyclic_schedule_action(const flatmem_cyclic_schedule *schedule, int32_t rank,
                                              int64_t time_step, flatmem_cyclic_action *action,
                                              size_t action_size) {
  return guarded([&] {
    const cyclic::Schedule s = cyclic::read_schedule(schedule);
    check_rank(s, rank);
    if (time_step < 0) invalid("time_step: ", time_step, "; expected >= 0");
    write_struct(action, action_size, s.action(rank, time_step), "action", "action_size");
  });
}

flatmem_status flatmem_cyclic_options_init(flatmem_cyclic_options *options, size_t struct_size) {
  return guarded([&] {
    init_struct(options, struct_size, flatmem_cyclic_options FLATMEM_CYCLIC_OPTIONS_INIT, "options");
  });
}

flatmem_status flatmem_cyclic_create(flatmem_cyclic_t **out, flatmem_comm_t *comm,
                                     const flatmem_cyclic_options *options) {
  return guarded([&] {
    require(out, "out");
    if (comm == nullptr || !comm->impl) invalid("comm: NULL");
    comm::Communicator &c = *comm->impl;
    auto handle = std::make_unique<flatmem_cyclic_s>();
    handle->impl = std::make_unique<Runtime>(c, read_settings(options, c));
    *out = handle.release();
  });
}

flatmem_status flatmem_cyclic_destroy(flatmem_cyclic_t *handle) {
  return guarded([&] { delete handle; });
}

flatmem_status flatmem_cyclic_get_schedule(const flatmem_cyclic_t *handle,
                                           flatmem_cyclic_schedule *schedule, size_t schedule_size) {
  return guarded([&] {
    const cyclic::Schedule &s = runtime_of(handle).schedule();
    flatmem_cyclic_schedule out = FLATMEM_CYCLIC_SCHEDULE_INIT;
    out.world_size = s.world;
    out.stages = s.stages;
    out.steps = s.steps;
    out.rule = s.rule;
    out.struct_size = schedule_size;
    write_struct(schedule, schedule_size, out, "schedule", "schedule_size");
  });
}

flatmem_status flatmem_cyclic_next(flatmem_cyclic_t *handle, flatmem_cyclic_action *action,
                                   size_t action_size) {
  return guarded([&] {
    Runtime &r = runtime_of(handle);
    require(action, "action");
    check_struct_size(action_size, "action_size");  // before next(), which advances the handle
    put_struct(action, action_size, r.next());
  });
}

flatmem_status flatmem_cyclic_reduce(flatmem_cyclic_t *handle, int32_t stage, DLTensor *gradient) {
  return guarded([&] { runtime_of(handle).reduce(stage, gradient, nullptr); });
}

flatmem_status flatmem_cyclic_reduce_stream(flatmem_cyclic_t *handle, int32_t stage, DLTensor *gradient,
                                            void *stream) {
  return guarded([&] { runtime_of(handle).reduce(stage, gradient, stream); });
}

flatmem_status flatmem_cyclic_stats(const flatmem_cyclic_t *handle, int64_t first, int64_t count,
                                    flatmem_cyclic_time_step_stats *stats, size_t element_size,
                                    int64_t *written) {
  return guarded([&] {
    const Runtime &r = runtime_of(handle);
    require(written, "written");
    const StructArrayOut<flatmem_cyclic_time_step_stats> out(stats, element_size, count, "stats",
                                                              "element_size");
    *written = r.stats(first, count, out);
  });
}

flatmem_status flatmem_cyclic_summary_get(const flatmem_cyclic_t *handle,
                                          flatmem_cyclic_summary *summary, size_t summary_size) {
  return guarded([&] {
    const Runtime &r = runtime_of(handle);
    write_struct(summary, summary_size, r.summary(), "summary", "summary_size");
  });
}

}  // extern "C"

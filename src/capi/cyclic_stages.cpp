// extern "C" flatmem_cyclic_stages_*: argument checks and exception -> status;
// the schedule is schedule.cpp, the runtime runtime.cpp (this folder).
#include <flatmem/cyclic_stages.h>

#include <memory>

#include "comm/communicator.hpp"
#include "comm/options.hpp"
#include "core/abi_struct.hpp"
#include "core/error.hpp"
#include "core/options.hpp"
#include "cyclic/chain_io.hpp"
#include "cyclic/stages/runtime.hpp"

using namespace flatmem;
using flatmem::cyclic::stages::StageRuntime;
using flatmem::cyclic::stages::StageSchedule;

namespace {

constexpr std::int64_t default_history = 65536;
constexpr std::int64_t max_history = std::int64_t(1) << 26;
constexpr std::int64_t max_boundary_bytes = std::int64_t(1) << 40;

StageRuntime &runtime(flatmem_cyclic_stages_t *handle) {
  if (handle == nullptr || !handle->impl) invalid("handle: NULL");
  return *handle->impl;
}
const StageRuntime &runtime(const flatmem_cyclic_stages_t *handle) {
  if (handle == nullptr || !handle->impl) invalid("handle: NULL");
  return *handle->impl;
}

template <typename Out>
void require(const Out *out, const char *name) {
  if (out == nullptr) invalid(name, ": NULL");
}

void check_stage(const StageSchedule &s, std::int32_t stage) {
  if (stage < 0 || stage >= s.stages) invalid("stage: ", stage, "; expected 0 .. ", s.stages - 1);
}

cyclic::stages::StageSettings read_settings(const flatmem_cyclic_stages_options *options,
                                            comm::Communicator &c) {
  if (options == nullptr) invalid("options: NULL; stages, micro_batches and steps are required");
  const auto o = read_options(options, "FLATMEM_CYCLIC_STAGES_OPTIONS_INIT / flatmem_cyclic_stages_options_init");
  cyclic::stages::StageSettings s;
  s.schedule = cyclic::stages::make_stage_schedule(o.stages, o.micro_batches, o.steps, enum_value(o.rule), "options");
  if (o.stages != c.size())
    invalid("options.stages: ", o.stages, " but the communicator has ", c.size(),
            " ranks; the stage-parallel mode runs stage j on rank j (one rank per stage)");
  const auto stages = static_cast<std::size_t>(o.stages);
  if (stages > 1 && o.boundary_bytes == nullptr)
    invalid("options.boundary_bytes: NULL; required when stages > 1 (stages - 1 entries)");
  for (std::size_t j = 0; j + 1 < stages; ++j) {
    const std::int64_t b = o.boundary_bytes[j];
    if (b < 0 || b > max_boundary_bytes)
      invalid("options.boundary_bytes[", j, "]: ", b, "; expected 0 .. 2^40");
    s.boundary_bytes.push_back(b);
  }
  s.activation_bytes.assign(stages, 1);
  if (o.activation_bytes != nullptr)
    for (std::size_t j = 0; j < stages; ++j) {
      const std::int64_t b = o.activation_bytes[j];
      if (b < 0 || b > (std::int64_t(1) << 40))
        invalid("options.activation_bytes[", j, "]: ", b, "; expected 0 .. 2^40");
      s.activation_bytes[j] = b;
    }
  if (o.timeout_ms < 0)
    invalid("options.timeout_ms: ", o.timeout_ms, "; expected > 0, or 0 for the communicator's default");
  s.timeout = comm::resolve_timeout(o.timeout_ms, c.default_timeout(), "options.timeout_ms");
  if (o.history < 0 || o.history > max_history)
    invalid("options.history: ", o.history, "; expected 1 .. 2^26 time steps, or 0 for ", default_history);
  s.history = o.history == 0 ? default_history : o.history;
  s.device = cyclic::read_memory(enum_value(o.memory));
  return s;
}

}  // namespace

extern "C" {

flatmem_status flatmem_cyclic_stages_schedule_offset(const flatmem_cyclic_stages_schedule *schedule,
                                                     int32_t micro_batch, int64_t *offset) {
  return guarded([&] {
    const StageSchedule s = cyclic::stages::read_stage_schedule(schedule);
    require(offset, "offset");
    if (micro_batch < 0 || micro_batch >= s.micro_batches)
      invalid("micro_batch: ", micro_batch, "; expected 0 .. ", s.micro_batches - 1);
    *offset = s.offset(micro_batch);
  });
}

flatmem_status flatmem_cyclic_stages_schedule_period(const flatmem_cyclic_stages_schedule *schedule,
                                                     int64_t *period) {
  return guarded([&] {
    const StageSchedule s = cyclic::stages::read_stage_schedule(schedule);
    require(period, "period");
    *period = s.period();
  });
}

flatmem_status flatmem_cyclic_stages_schedule_length(const flatmem_cyclic_stages_schedule *schedule,
                                                     int64_t *time_steps) {
  return guarded([&] {
    const StageSchedule s = cyclic::stages::read_stage_schedule(schedule);
    require(time_steps, "time_steps");
    *time_steps = s.length();
  });
}

flatmem_status flatmem_cyclic_stages_schedule_versions_kept(const flatmem_cyclic_stages_schedule *schedule,
                                                            int32_t stage, int32_t *versions_kept) {
  return guarded([&] {
    const StageSchedule s = cyclic::stages::read_stage_schedule(schedule);
    require(versions_kept, "versions_kept");
    check_stage(s, stage);
    *versions_kept = s.versions_kept(stage);
  });
}

flatmem_status flatmem_cyclic_stages_schedule_actions(const flatmem_cyclic_stages_schedule *schedule,
                                                      int32_t stage, int64_t time_step,
                                                      flatmem_cyclic_stages_action *actions,
                                                      size_t element_size, int32_t capacity,
                                                      int32_t *count) {
  return guarded([&] {
    const StageSchedule s = cyclic::stages::read_stage_schedule(schedule);
    require(count, "count");
    check_stage(s, stage);
    if (time_step < 0) invalid("time_step: ", time_step, "; expected >= 0");
    if (capacity < 0) invalid("capacity: ", capacity, "; expected >= 0");
    const StructArrayOut<flatmem_cyclic_stages_action> out(actions, element_size, capacity, "actions",
                                                            "element_size");
    const auto all = time_step < s.length() ? s.actions(stage, time_step)
                                            : std::vector<flatmem_cyclic_stages_action>{};
    for (std::size_t i = 0; i < all.size() && i < std::size_t(capacity); ++i) out.put(std::int64_t(i), all[i]);
    *count = std::int32_t(all.size());
  });
}

flatmem_status flatmem_cyclic_stages_schedule_occupancy(const flatmem_cyclic_stages_schedule *schedule,
                                                        int32_t stage,
                                                        flatmem_cyclic_stages_occupancy *occupancy,
                                                        size_t occupancy_size) {
  return guarded([&] {
    const StageSchedule s = cyclic::stages::read_stage_schedule(schedule);
    check_stage(s, stage);
    write_struct(occupancy, occupancy_size, s.occupancy(stage), "occupancy", "occupancy_size");
  });
}

flatmem_status flatmem_cyclic_stages_options_init(flatmem_cyclic_stages_options *options,
                                                  size_t struct_size) {
  return guarded([&] {
    init_struct(options, struct_size, flatmem_cyclic_stages_options FLATMEM_CYCLIC_STAGES_OPTIONS_INIT,
                "options");
  });
}

flatmem_status flatmem_cyclic_stages_create(flatmem_cyclic_stages_t **out, flatmem_comm_t *comm,
                                            const flatmem_cyclic_stages_options *options) {
  return guarded([&] {
    require(out, "out");
    if (comm == nullptr || !comm->impl) invalid("comm: NULL");
    comm::Communicator &c = *comm->impl;
    auto handle = std::make_unique<flatmem_cyclic_stages_s>();
    handle->impl = std::make_unique<StageRuntime>(c, read_settings(options, c));
    *out = handle.release();
  });
}

flatmem_status flatmem_cyclic_stages_destroy(flatmem_cyclic_stages_t *handle) {
  return guarded([&] { delete handle; });
}

flatmem_status flatmem_cyclic_stages_get_schedule(const flatmem_cyclic_stages_t *handle,
                                                  flatmem_cyclic_stages_schedule *schedule,
                                                  size_t schedule_size) {
  return guarded([&] {
    const StageSchedule &s = runtime(handle).schedule();
    flatmem_cyclic_stages_schedule out = FLATMEM_CYCLIC_STAGES_SCHEDULE_INIT;
    out.stages = s.stages;
    out.micro_batches = s.micro_batches;
    out.steps = s.steps;
    out.rule = s.rule;
    out.struct_size = schedule_size;
    write_struct(schedule, schedule_size, out, "schedule", "schedule_size");
  });
}

flatmem_status flatmem_cyclic_stages_next(flatmem_cyclic_stages_t *handle,
                                          flatmem_cyclic_stages_action *action, size_t action_size) {
  return guarded([&] {
    StageRuntime &r = runtime(handle);
    require(action, "action");
    check_struct_size(action_size, "action_size");  // before next(), which advances the handle
    put_struct(action, action_size, r.next());
  });
}

flatmem_status flatmem_cyclic_stages_send(flatmem_cyclic_stages_t *handle, const DLTensor *tensor) {
  return guarded([&] { runtime(handle).send(tensor, nullptr); });
}

flatmem_status flatmem_cyclic_stages_send_stream(flatmem_cyclic_stages_t *handle, const DLTensor *tensor,
                                                 void *stream) {
  return guarded([&] { runtime(handle).send(tensor, stream); });
}

flatmem_status flatmem_cyclic_stages_receive(flatmem_cyclic_stages_t *handle, DLTensor *into) {
  return guarded([&] { runtime(handle).receive(into, nullptr); });
}

flatmem_status flatmem_cyclic_stages_receive_stream(flatmem_cyclic_stages_t *handle, DLTensor *into,
                                                    void *stream) {
  return guarded([&] { runtime(handle).receive(into, stream); });
}

flatmem_status flatmem_cyclic_stages_accumulate(flatmem_cyclic_stages_t *handle, const DLTensor *gradient) {
  return guarded([&] { runtime(handle).accumulate(gradient, nullptr); });
}

flatmem_status flatmem_cyclic_stages_accumulate_stream(flatmem_cyclic_stages_t *handle,
                                                       const DLTensor *gradient, void *stream) {
  return guarded([&] { runtime(handle).accumulate(gradient, stream); });
}

flatmem_status flatmem_cyclic_stages_average(const flatmem_cyclic_stages_t *handle, DLTensor *out) {
  return guarded([&] { runtime(handle).average(out, nullptr); });
}

flatmem_status flatmem_cyclic_stages_average_stream(const flatmem_cyclic_stages_t *handle, DLTensor *out,
                                                    void *stream) {
  return guarded([&] { runtime(handle).average(out, stream); });
}

flatmem_status flatmem_cyclic_stages_stats(const flatmem_cyclic_stages_t *handle, int64_t first,
                                           int64_t count, flatmem_cyclic_stages_time_step_stats *stats,
                                           size_t element_size, int64_t *written) {
  return guarded([&] {
    const StageRuntime &r = runtime(handle);
    require(written, "written");
    const StructArrayOut<flatmem_cyclic_stages_time_step_stats> out(stats, element_size, count, "stats",
                                                                     "element_size");
    *written = r.stats(first, count, out);
  });
}

flatmem_status flatmem_cyclic_stages_summary_get(const flatmem_cyclic_stages_t *handle,
                                                 flatmem_cyclic_stages_summary *summary,
                                                 size_t summary_size) {
  return guarded([&] {
    const StageRuntime &r = runtime(handle);
    write_struct(summary, summary_size, r.summary(), "summary", "summary_size");
  });
}

}  // extern "C"

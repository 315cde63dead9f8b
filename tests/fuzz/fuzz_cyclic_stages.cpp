// libFuzzer target: stage-parallel cyclic training (flatmem/cyclic_stages.h) as a hostile
// caller drives it.
//  1. The pure schedule queries (offset, period, length, versions_kept, actions, occupancy)
//     with any schedule struct (struct_size games, stages / micro-batches / steps at and
//     past their limits, any rule), micro-batch, stage, time step and capacity. Oracle:
//     the header's formulas -- every returned action belongs to the stage and time step
//     asked, its time step is F(j, m, s) or B(j, m, s) of its micro-batch and step, its
//     version is s or s - 1 (never past s, never < 0), the flags follow its kind and stage,
//     backwards come before forwards by ascending micro-batch; nothing is written past the
//     capacity nor on failure. For small schedules a walk over every time step of the
//     stage checks that each (micro-batch, step) runs one forward and one backward, that
//     updates come in order 0 .. S-1, and that every action's version is one of the
//     versions_kept newest (the slot arithmetic the caller relies on).
//  2. flatmem_cyclic_stages_create over an in-process group of 1 with hostile options
//     (struct_size, stages, micro_batches, steps, rule, boundary_bytes, activation_bytes,
//     timeout, history; NULL comm / options): it must refuse with a message or succeed;
//     then a short run of next / accumulate (mutated gradients) / average / a send or
//     receive the action does not list, the stats and summary, and destroy, always clean.
//
// Input layout: Plan, then values for hostile fields, tensor mutations, element values.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include <flatmem/flatmem.h>

#include "support/fuzz_input.hpp"
#include "support/fuzz_tensor.hpp"

using namespace flatmem_fuzz;

namespace {

struct Plan {
  std::uint8_t stages, micro_batches, steps, rule, schedule_size, micro_batch, stage, time_step, capacity,
      create_size, boundary_bytes, activation_bytes, timeout, history, null_comm, run_length, gradient_dtype,
      misuse, stats_first, stats_count, nan;
};

std::int64_t pick(Reader &in, std::uint8_t choice, std::initializer_list<std::int64_t> table) {
  const std::size_t i = choice % (table.size() + 1);
  return i < table.size() ? table.begin()[i] : in.hostile_int64();
}

std::string describe(const flatmem_cyclic_stages_action &a) {
  return "action (time step " + std::to_string(a.time_step) + ", kind " + std::to_string(a.kind) + ", stage " +
         std::to_string(a.stage) + ", micro-batch " + std::to_string(a.micro_batch) + ", step " +
         std::to_string(a.step) + ", version " + std::to_string(a.version) + ", update " +
         std::to_string(a.update_step) + ")";
}

// The schedule's numbers the checks need (valid schedule: every query succeeded).
struct Shape {
  std::int64_t L, N, S, P;
  std::vector<std::int64_t> offset;  // per micro-batch (N <= 65535)
};

// One action of `stage` at `tau`, against the header's formulas.
void check_action(const flatmem_cyclic_stages_action &a, const Shape &s, std::int32_t stage, std::int64_t tau,
                  const char *call) {
  std::string bad;
  const bool work = a.kind == FLATMEM_CYCLIC_FORWARD || a.kind == FLATMEM_CYCLIC_BACKWARD;
  if (a.time_step != tau) bad = "time_step is not the one asked";
  else if (a.stage != stage) bad = "stage is not the one asked";
  else if (!work && a.kind != FLATMEM_CYCLIC_IDLE) bad = "kind";
  else if (work && (a.micro_batch < 0 || a.micro_batch >= s.N)) bad = "micro_batch";
  else if (work && (a.step < 0 || a.step >= s.S)) bad = "step";
  else if (work && (a.version < 0 || a.version > a.step || a.version < a.step - 1)) bad = "version (not s or s - 1)";
  else if (!work && (a.micro_batch != -1 || a.step != -1 || a.version != -1)) bad = "IDLE with a micro-batch";
  else if (a.update_step < -1 || a.update_step >= s.S) bad = "update_step";
  else if (!work && a.update_step < 0) bad = "IDLE without an update";
  else if (a.activations_held < 0 || a.activations_held > s.N) bad = "activations_held";
  if (bad.empty() && work) {
    const std::int64_t phase = a.kind == FLATMEM_CYCLIC_FORWARD ? stage : 2 * s.L - 1 - stage;
    const std::int64_t expected = s.offset[std::size_t(a.micro_batch)] + s.P * a.step + phase + (break_oracle() ? 1 : 0);
    const bool forward = a.kind == FLATMEM_CYCLIC_FORWARD;
    if (tau != expected) bad = "time step is not F / B = offset(m) + P s + phase (" + std::to_string(expected) + ")";
    else if (a.receives != (forward ? stage > 0 : stage < s.L - 1)) bad = "receives";
    else if (a.sends != (forward ? stage < s.L - 1 : stage > 0)) bad = "sends";
    else if (a.accumulates != (forward ? 0 : 1)) bad = "accumulates";
  }
  if (bad.empty() && !work && (a.receives || a.sends || a.accumulates)) bad = "IDLE with a transfer";
  if (!bad.empty()) violation(call, bad + ": " + describe(a));
}

// The first `written` of a stage's `count` actions at a time step: order (backwards, then
// forwards, by micro-batch), index_in_time_step / actions_in_time_step.
void check_time_step(const flatmem_cyclic_stages_action *a, std::int32_t written, std::int32_t count, const Shape &s,
                     std::int32_t stage, std::int64_t tau, const char *call) {
  for (std::int32_t i = 0; i < written; ++i) {
    check_action(a[i], s, stage, tau, call);
    if (a[i].index_in_time_step != i || a[i].actions_in_time_step != count)
      violation(call, "index_in_time_step / actions_in_time_step wrong: " + describe(a[i]));
    if (i > 0) {
      const auto rank = [](const flatmem_cyclic_stages_action &x) {
        return x.kind == FLATMEM_CYCLIC_BACKWARD ? 0 : x.kind == FLATMEM_CYCLIC_FORWARD ? 1 : 2;
      };
      const bool ordered = rank(a[i - 1]) < rank(a[i]) ||
                           (rank(a[i - 1]) == rank(a[i]) && a[i - 1].micro_batch < a[i].micro_batch) ||
                           (rank(a[i]) == 2 && rank(a[i - 1]) == 2);
      if (!ordered) violation(call, "out of order: " + describe(a[i - 1]) + " before " + describe(a[i]));
    }
  }
}

// Every time step of a small schedule's stage: one forward and one backward per
// (micro-batch, step), updates 0 .. S-1 in order, versions among the K newest.
void walk(const flatmem_cyclic_stages_schedule &sched, const Shape &s, std::int32_t stage, std::int64_t length,
          std::int32_t kept) {
  constexpr const char *call = "flatmem_cyclic_stages_schedule_actions";
  std::vector<std::uint8_t> seen(std::size_t(s.N * s.S), 0);
  std::int64_t newest = 0;  // the newest version formed so far
  std::vector<flatmem_cyclic_stages_action> actions(std::size_t(2 * s.N + s.S + 2));
  for (std::int64_t tau = 0; tau < length + 2; ++tau) {
    std::int32_t count = -7;
    if (!check_status(flatmem_cyclic_stages_schedule_actions(&sched, stage, tau, actions.data(), sizeof(flatmem_cyclic_stages_action),
                                                             std::int32_t(actions.size()), &count), call))
      violation(call, "refused time step " + std::to_string(tau) + " of a valid schedule");
    if (count < 0 || count > std::int32_t(actions.size())) violation(call, "count " + std::to_string(count));
    if (tau >= length && count != 0) violation(call, "actions at or after the schedule's length");
    check_time_step(actions.data(), count, count, s, stage, tau, call);
    for (std::int32_t i = 0; i < count; ++i) {
      const auto &a = actions[std::size_t(i)];
      if (a.update_step >= 0) {
        if (a.update_step != newest) violation(call, "update out of order: " + describe(a));
        ++newest;
      }
      if (a.kind == FLATMEM_CYCLIC_IDLE) continue;
      if (a.version > newest || a.version <= newest - kept)
        violation(call, "version " + std::to_string(a.version) + " not among the " + std::to_string(kept) +
                            " kept (newest " + std::to_string(newest) + "): " + describe(a));
      auto &bits = seen[std::size_t(a.step * s.N + a.micro_batch)];
      const std::uint8_t bit = a.kind == FLATMEM_CYCLIC_FORWARD ? 1 : 2;
      if ((bits & bit) || (bit == 2 && !(bits & 1))) violation(call, "repeated or backward before forward: " + describe(a));
      bits |= bit;
    }
  }
  if (newest != s.S) violation(call, "the walk formed version " + std::to_string(newest) + ", not S");
  for (std::uint8_t bits : seen)
    if (bits != 3) violation(call, "a (micro-batch, step) without its forward and backward");
}

void fuzz_schedule(Reader &in, const Plan &p) {
  flatmem_cyclic_stages_schedule sched = FLATMEM_CYCLIC_STAGES_SCHEDULE_INIT;
  sched.stages = std::int32_t(pick(in, p.stages, {1, 2, 3, 4, 5, 0, -1, 65535, 65536}));
  sched.micro_batches = std::int32_t(pick(in, p.micro_batches, {1, 2, 3, 4, 7, 8, 0, -1, 65535, 65536}));
  sched.steps = pick(in, p.steps, {1, 2, 3, 5, 0, -1, std::int64_t(1) << 40, (std::int64_t(1) << 40) + 1});
  sched.rule = static_cast<flatmem_cyclic_rule>(pick(in, p.rule, {0, 1, 2}));
  sched.struct_size = hostile_struct_size(p.schedule_size, sizeof sched);
  const bool null_schedule = p.schedule_size == 255;
  const flatmem_cyclic_stages_schedule *arg = null_schedule ? nullptr : &sched;
  const std::int32_t m = std::int32_t(pick(in, p.micro_batch, {0, 1, std::int64_t(sched.micro_batches) - 1,
                                                               sched.micro_batches, -1}));
  const std::int32_t stage = std::int32_t(pick(in, p.stage, {0, 1, std::int64_t(sched.stages) - 1, sched.stages, -1}));
  const std::int64_t tau = pick(in, p.time_step, {0, 1, 2, 5, 17, 40, -1});
  const std::int32_t capacity = std::int32_t(pick(in, p.capacity, {16, 0, 1, 2, -1}));

  std::int64_t offset = -7, period = -7, length = -7;
  std::int32_t kept = -7, count = -7;
  flatmem_cyclic_stages_occupancy occupancy;
  std::memset(&occupancy, kSentinel, sizeof occupancy);
  const flatmem_cyclic_stages_occupancy untouched = occupancy;
  std::vector<flatmem_cyclic_stages_action> actions(17);
  std::memset(actions.data(), kSentinel, actions.size() * sizeof actions[0]);
  const bool offset_ok = check_status(flatmem_cyclic_stages_schedule_offset(arg, m, &offset),
                                      "flatmem_cyclic_stages_schedule_offset");
  const bool period_ok = check_status(flatmem_cyclic_stages_schedule_period(arg, &period),
                                      "flatmem_cyclic_stages_schedule_period");
  const bool length_ok = check_status(flatmem_cyclic_stages_schedule_length(arg, &length),
                                      "flatmem_cyclic_stages_schedule_length");
  const bool kept_ok = check_status(flatmem_cyclic_stages_schedule_versions_kept(arg, stage, &kept),
                                    "flatmem_cyclic_stages_schedule_versions_kept");
  const bool occupancy_ok = check_status(flatmem_cyclic_stages_schedule_occupancy(arg, stage, &occupancy, sizeof(flatmem_cyclic_stages_occupancy)),
                                         "flatmem_cyclic_stages_schedule_occupancy");
  const bool actions_ok = check_status(
      flatmem_cyclic_stages_schedule_actions(arg, stage, tau, capacity > 0 ? actions.data() + 1 : nullptr, sizeof(flatmem_cyclic_stages_action),
                                             std::min<std::int32_t>(capacity, 16), &count),
      "flatmem_cyclic_stages_schedule_actions");
  if (!offset_ok && offset != -7) violation("flatmem_cyclic_stages_schedule_offset", "failed but wrote *offset");
  if (!period_ok && period != -7) violation("flatmem_cyclic_stages_schedule_period", "failed but wrote *period");
  if (!length_ok && length != -7) violation("flatmem_cyclic_stages_schedule_length", "failed but wrote *time_steps");
  if (!kept_ok && kept != -7) violation("flatmem_cyclic_stages_schedule_versions_kept", "failed but wrote *versions_kept");
  if (!actions_ok && count != -7) violation("flatmem_cyclic_stages_schedule_actions", "failed but wrote *count");
  if (!occupancy_ok && std::memcmp(&occupancy, &untouched, sizeof occupancy) != 0)
    violation("flatmem_cyclic_stages_schedule_occupancy", "failed but wrote *occupancy");
  const bool all_ok = offset_ok && period_ok && length_ok && kept_ok && occupancy_ok && actions_ok;
  if (!all_ok) return;
  // A schedule all six accepted: the formulas.
  const std::int64_t L = sched.stages, N = sched.micro_batches;
  if (offset != m * 2 * L / N) violation("flatmem_cyclic_stages_schedule_offset", "offset(" + std::to_string(m) + ") = " + std::to_string(offset) + ", not floor(m 2L / N)");
  const std::int64_t last_offset = (N - 1) * 2 * L / N;
  const bool sync = sched.struct_size >= offsetof(flatmem_cyclic_stages_schedule, rule) + 4 && sched.rule == FLATMEM_CYCLIC_SYNC;
  if (period != 2 * L + (sync ? last_offset : 0)) violation("flatmem_cyclic_stages_schedule_period", "period " + std::to_string(period));
  if (kept < 1 || kept > 2) violation("flatmem_cyclic_stages_schedule_versions_kept", "K = " + std::to_string(kept));
  if (sync && kept != 1) violation("flatmem_cyclic_stages_schedule_versions_kept", "SYNC keeps 2 versions");
  if (!(occupancy.busy_fraction > 0 && occupancy.busy_fraction <= 1) || occupancy.peak_actions < 1 ||
      occupancy.peak_activations_held < 1 || occupancy.peak_activations_held > N ||
      !(occupancy.mean_activations_held > 0 && occupancy.mean_activations_held <= occupancy.peak_activations_held))
    violation("flatmem_cyclic_stages_schedule_occupancy", "out of range");
  const std::int64_t S = sched.steps;
  const std::int64_t expected_length = last_offset + period * (S - 1) + 2 * L - 1 + 2;  // B(0, N-1, S-1) + 2
  if (length != expected_length) violation("flatmem_cyclic_stages_schedule_length", "length " + std::to_string(length) + ", expected " + std::to_string(expected_length));
  Shape shape{L, N, S, period, {}};
  shape.offset.resize(std::size_t(N));
  for (std::int64_t i = 0; i < N; ++i) shape.offset[std::size_t(i)] = i * 2 * L / N;
  if (count < 0) violation("flatmem_cyclic_stages_schedule_actions", "negative count");
  const std::int32_t written = std::min(count, std::max<std::int32_t>(std::min<std::int32_t>(capacity, 16), 0));
  check_time_step(actions.data() + 1, written, count, shape, stage, tau, "flatmem_cyclic_stages_schedule_actions");
  // Nothing past the capacity (nor before the array).
  const auto *bytes = reinterpret_cast<const unsigned char *>(actions.data());
  const auto clean = [&](std::size_t from, std::size_t to) {
    for (std::size_t i = from; i < to; ++i)
      if (bytes[i] != kSentinel) violation("flatmem_cyclic_stages_schedule_actions", "wrote past the capacity");
  };
  clean(0, sizeof actions[0]);
  clean((1 + std::size_t(written)) * sizeof actions[0], actions.size() * sizeof actions[0]);
  if (length <= 400 && N * S <= 256 && sched.struct_size == sizeof sched) walk(sched, shape, stage, length, kept);
}

void fuzz_runtime(Reader &in, const Plan &p) {
  flatmem_comm_options comm_options = FLATMEM_COMM_OPTIONS_INIT;
  comm_options.timeout_ms = 2000;  // nothing should wait in a group of 1; if it does, fail fast
  flatmem_comm_t *comm = nullptr;
  if (!check_status(flatmem_comm_create_local(&comm, 1, &comm_options), "flatmem_comm_create_local"))
    violation("flatmem_comm_create_local", "a group of 1 with valid options was refused");

  flatmem_cyclic_stages_options o = FLATMEM_CYCLIC_STAGES_OPTIONS_INIT;
  o.stages = std::int32_t(pick(in, p.stages, {1, 2, 0, -1, 65536}));
  o.micro_batches = std::int32_t(pick(in, p.micro_batches, {1, 2, 3, 5, 0, -1, 65535, 65536}));
  o.steps = pick(in, p.steps, {1, 2, 3, 0, -1, std::int64_t(1) << 40});
  o.rule = static_cast<flatmem_cyclic_rule>(pick(in, p.rule, {0, 1, 2}));
  std::vector<std::int64_t> boundary, activation;
  if (p.boundary_bytes % 3 != 0 && o.stages >= 1 && o.stages <= 65535) {
    boundary.resize(std::size_t(std::max(o.stages - 1, 1)));
    for (auto &v : boundary) v = p.boundary_bytes % 3 == 1 ? in.byte() : in.hostile_int64();
    o.boundary_bytes = boundary.data();
  }
  if (p.activation_bytes % 3 != 0 && o.stages >= 1 && o.stages <= 65535) {
    activation.resize(std::size_t(o.stages));
    for (auto &v : activation) v = p.activation_bytes % 3 == 1 ? in.byte() : in.hostile_int64();
    o.activation_bytes = activation.data();
  }
  o.timeout_ms = pick(in, p.timeout, {0, 500, 1, -1});
  o.history = pick(in, p.history, {0, 1, 4, -1});
  // The documented limit, 2^26 time steps, is 3 GiB of records allocated at create: past
  // the fuzzer's 2 GiB malloc limit. Values up to it are capped at 2^20 (those past it, and
  // negative ones, stay: they must be refused).
  if (o.history > (std::int64_t(1) << 20) && o.history <= (std::int64_t(1) << 26)) o.history = std::int64_t(1) << 20;
  o.struct_size = hostile_struct_size(p.create_size, sizeof o);

  flatmem_cyclic_stages_t *handle = nullptr;
  const bool created = check_status(
      flatmem_cyclic_stages_create(&handle, p.null_comm % 8 == 7 ? nullptr : comm, p.create_size == 255 ? nullptr : &o),
      "flatmem_cyclic_stages_create");
  if (!created && handle != nullptr) violation("flatmem_cyclic_stages_create", "failed but set *out");
  if (created) {
    flatmem_cyclic_stages_schedule s{};
    check_status(flatmem_cyclic_stages_get_schedule(handle, &s, hostile_struct_size(p.schedule_size, sizeof s)),
                 "flatmem_cyclic_stages_get_schedule");
    static const DLDataType dtypes[] = {f32(), f64(), f16()};
    std::vector<std::unique_ptr<FuzzTensor>> tensors;
    const auto tensor = [&](bool mutate) {
      auto t = std::make_unique<FuzzTensor>(dtypes[p.gradient_dtype % 3],
                                            std::vector<std::int64_t>{1 + p.gradient_dtype / 3 % 16});
      if (mutate) mutate_some(in, {t.get()});
      t->materialize();
      t->fill(in, p.nan % 2 == 1);
      tensors.push_back(std::move(t));
      return tensors.back()->get();
    };
    const int run = 1 + p.run_length % 24;
    for (int i = 0; i < run; ++i) {
      flatmem_cyclic_stages_action a, untouched;
      std::memset(&a, kSentinel, sizeof a);
      std::memcpy(&untouched, &a, sizeof a);
      const bool ok = check_status(flatmem_cyclic_stages_next(handle, &a, sizeof(flatmem_cyclic_stages_action)), "flatmem_cyclic_stages_next");
      if (!ok) {
        if (std::memcmp(&a, &untouched, sizeof a) != 0) violation("flatmem_cyclic_stages_next", "failed but wrote *action");
        if (p.misuse % 8 != 7) break;  // a skipped accumulate: next refuses; do it now
      }
      if (ok && a.kind == FLATMEM_CYCLIC_DONE) break;
      const bool misuse_now = i == run / 2;
      if (ok && a.update_step >= 0 && !(p.misuse % 8 == 1 && misuse_now))
        check_status(flatmem_cyclic_stages_average(handle, tensor(p.gradient_dtype % 5 == 4)), "flatmem_cyclic_stages_average");
      if (misuse_now && p.misuse % 8 == 2)  // stage 0 of 1: nothing to receive or send
        check_status(flatmem_cyclic_stages_receive(handle, tensor(true)), "flatmem_cyclic_stages_receive");
      if (misuse_now && p.misuse % 8 == 3)
        check_status(flatmem_cyclic_stages_send(handle, tensor(true)), "flatmem_cyclic_stages_send");
      if (misuse_now && p.misuse % 8 == 4)  // average outside an update
        check_status(flatmem_cyclic_stages_average(handle, tensor(false)), "flatmem_cyclic_stages_average");
      if (!ok || a.kind != FLATMEM_CYCLIC_BACKWARD || (p.misuse % 8 == 7 && misuse_now)) continue;
      check_status(flatmem_cyclic_stages_accumulate(handle, tensor(p.gradient_dtype % 5 == 4)),
                   "flatmem_cyclic_stages_accumulate");
      if (misuse_now && p.misuse % 8 == 5)  // twice
        check_status(flatmem_cyclic_stages_accumulate(handle, tensor(false)), "flatmem_cyclic_stages_accumulate");
    }
    std::vector<flatmem_cyclic_stages_time_step_stats> stats(64);
    const std::int64_t first = pick(in, p.stats_first, {0, 1, 5, -1});
    const std::int64_t count = pick(in, p.stats_count, {64, 1, 0, -1, std::numeric_limits<std::int64_t>::min()});
    std::int64_t written = -7;
    const bool stats_ok = check_status(flatmem_cyclic_stages_stats(handle, first, std::min<std::int64_t>(count, 64),
                                                                   stats.data(), sizeof(flatmem_cyclic_stages_time_step_stats), &written),
                                       "flatmem_cyclic_stages_stats");
    if (stats_ok && (written < 0 || written > std::min<std::int64_t>(count, 64)))
      violation("flatmem_cyclic_stages_stats", "*written = " + std::to_string(written));
    flatmem_cyclic_stages_summary summary{};
    check_status(flatmem_cyclic_stages_summary_get(handle, &summary, sizeof(flatmem_cyclic_stages_summary)), "flatmem_cyclic_stages_summary_get");
    check_status(flatmem_cyclic_stages_destroy(handle), "flatmem_cyclic_stages_destroy");
  }
  // The handle may have poisoned the group (destroy before DONE): abort is always allowed.
  check_status(flatmem_comm_abort(comm), "flatmem_comm_abort");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t *data, std::size_t size) {
  Reader in(data, size);
  const Plan p = read_plan<Plan>(in);
  if (p.null_comm & 0x80) fuzz_runtime(in, p);
  else fuzz_schedule(in, p);
  return 0;
}

// libFuzzer target: cyclic data parallelism as a hostile caller drives it.
//  1. The schedule queries (offset, delay, length, action) with any schedule struct
//     (any struct_size, world size, stages, steps, rule), rank, stage and time step;
//     on success the results are checked against the schedule's invariants, and for
//     small schedules a walk over every time step checks that each rank runs every
//     stage's forward and backward exactly `steps` times, forwards in stage order.
//  2. flatmem_cyclic_create over an in-process group of 1 (flatmem_comm_create_local)
//     with any options (struct_size, stages, steps, rule, activation_bytes, timeout,
//     nonfinite, history), then a short run of next / reduce (mutated gradient tensors)
//     and the stats / summary queries.
//  3. The ZeRO relay options of flatmem_cyclic_create on the same group of 1 (parameters
//     REPLICATED / RELAYED / hostile; parameter_count NULL, small, hostile; with every
//     rule: RELAYED must be refused unless DELAY1), then flatmem_cyclic_shard_range
//     (checked against [k c_j, min((k+1) c_j, n_j)) with c_j = ceil(n_j / N)),
//     flatmem_cyclic_set_shard and flatmem_cyclic_parameters with mutated tensors and
//     hostile stages (skipped sometimes: next must then refuse), the relay statistics and
//     summary with hostile struct_size; a REPLICATED handle refuses the relay calls; a
//     successful parameters() on one rank returns the registered shard exactly.
// Every failure must come with a message; a failing next writes no action.
//
// Input layout: Plan, then values for hostile fields, then tensor mutations, values.
#include <algorithm>
#include <cmath>
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
  std::uint8_t world, stages, steps, rule, schedule_size, rank, stage, time_step, create_size,
      activation_bytes, timeout, nonfinite, history, null_comm, run_length, gradient_dtype,
      skip_reduce, stats_first, stats_count, nan, parameters, parameter_count, shard, relay_misuse;
};

std::int64_t pick(Reader &in, std::uint8_t choice, std::initializer_list<std::int64_t> table) {
  const std::size_t i = choice % (table.size() + 1);
  return i < table.size() ? table.begin()[i] : in.hostile_int64();
}

void check_action(const flatmem_cyclic_action &a, const flatmem_cyclic_schedule &s, const char *call) {
  const bool work = a.kind == FLATMEM_CYCLIC_FORWARD || a.kind == FLATMEM_CYCLIC_BACKWARD;
  std::string bad;
  if (a.kind < FLATMEM_CYCLIC_IDLE || a.kind > FLATMEM_CYCLIC_DONE) bad = "kind";
  else if (work ? (a.stage < 0 || a.stage >= s.stages) : a.stage != -1) bad = "stage";
  else if (work ? (a.step < 0 || a.step >= s.steps) : a.step != -1) bad = "step";
  else if (a.activations_held < 0 || a.activations_held > s.stages) bad = "activations_held";
  else if (a.phase < -1 || a.phase >= 2 * s.stages) bad = "phase";
  else if (a.update_stage < -1 || a.update_stage >= s.stages) bad = "update_stage";
  else if ((a.update_stage == -1) != (a.update_step == -1)) bad = "update_step";
  if (!bad.empty())
    violation(call, "action field " + bad + " out of range: kind " + std::to_string(a.kind) + " stage " +
                        std::to_string(a.stage) + " step " + std::to_string(a.step) + " held " +
                        std::to_string(a.activations_held) + " phase " + std::to_string(a.phase) +
                        " update " + std::to_string(a.update_stage) + "/" + std::to_string(a.update_step));
}

// Every time step of rank `rank` of a small schedule: each stage's forward and backward
// run `steps` times, and step t's forwards come in stage order 0 .. L-1.
void walk(const flatmem_cyclic_schedule &s, std::int32_t rank, std::int64_t length) {
  std::vector<std::int64_t> forwards(std::size_t(s.stages), 0), backwards(std::size_t(s.stages), 0);
  for (std::int64_t t = 0; t < length; ++t) {
    flatmem_cyclic_action a{};
    if (!check_status(flatmem_cyclic_schedule_action(&s, rank, t, &a, sizeof(flatmem_cyclic_action)), "flatmem_cyclic_schedule_action"))
      violation("flatmem_cyclic_schedule_action", "refused time step " + std::to_string(t) +
                                                      " < length " + std::to_string(length));
    check_action(a, s, "flatmem_cyclic_schedule_action");
    if (a.time_step != t) violation("flatmem_cyclic_schedule_action", "time_step differs from the one asked");
    if (a.kind == FLATMEM_CYCLIC_FORWARD) {
      if (forwards[std::size_t(a.stage)] != a.step)
        violation("flatmem_cyclic_schedule_action", "forward of stage " + std::to_string(a.stage) +
                                                        " for step " + std::to_string(a.step) + " out of order");
      ++forwards[std::size_t(a.stage)];
    }
    if (a.kind == FLATMEM_CYCLIC_BACKWARD) ++backwards[std::size_t(a.stage)];
  }
  for (std::int32_t j = 0; j < s.stages; ++j)
    if (forwards[std::size_t(j)] != s.steps || backwards[std::size_t(j)] != s.steps)
      violation("flatmem_cyclic_schedule_action",
                "rank " + std::to_string(rank) + " stage " + std::to_string(j) + ": " +
                    std::to_string(forwards[std::size_t(j)]) + " forwards, " +
                    std::to_string(backwards[std::size_t(j)]) + " backwards; expected " +
                    std::to_string(s.steps) + " each");
}

void fuzz_schedule(Reader &in, const Plan &p) {
  flatmem_cyclic_schedule s = FLATMEM_CYCLIC_SCHEDULE_INIT;
  s.world_size = std::int32_t(pick(in, p.world, {1, 2, 3, 4, 8, 0, -1, 1048577}));
  s.stages = std::int32_t(pick(in, p.stages, {1, 2, 3, 4, 7, 0, 65536}));
  s.steps = pick(in, p.steps, {1, 2, 3, 5, 0, -1, (std::int64_t(1) << 40) + 1});
  s.rule = static_cast<flatmem_cyclic_rule>(pick(in, p.rule, {0, 1, 2}));
  s.struct_size = hostile_struct_size(p.schedule_size, sizeof s);
  const std::int32_t rank = std::int32_t(pick(in, p.rank, {0, 1, 2, std::int64_t(s.world_size) - 1, s.world_size, -1}));
  const std::int32_t stage = std::int32_t(pick(in, p.stage, {0, 1, std::int64_t(s.stages) - 1, s.stages, -1}));
  const std::int64_t time_step = pick(in, p.time_step, {0, 1, 2, 5, 17, -1});
  const bool null_schedule = p.schedule_size == 255;

  std::int64_t offset = -7, length = -7;
  std::int32_t delay = -7;
  flatmem_cyclic_action action{};
  const flatmem_cyclic_schedule *arg = null_schedule ? nullptr : &s;
  const bool offset_ok = check_status(flatmem_cyclic_schedule_offset(arg, rank, &offset), "flatmem_cyclic_schedule_offset");
  const bool delay_ok = check_status(flatmem_cyclic_schedule_delay(arg, rank, stage, &delay), "flatmem_cyclic_schedule_delay");
  const bool length_ok = check_status(flatmem_cyclic_schedule_length(arg, &length), "flatmem_cyclic_schedule_length");
  const bool action_ok = check_status(flatmem_cyclic_schedule_action(arg, rank, time_step, &action, sizeof(flatmem_cyclic_action)), "flatmem_cyclic_schedule_action");
  if (!offset_ok && offset != -7) violation("flatmem_cyclic_schedule_offset", "failed but wrote *offset");
  if (!delay_ok && delay != -7) violation("flatmem_cyclic_schedule_delay", "failed but wrote *delay");
  if (!length_ok && length != -7) violation("flatmem_cyclic_schedule_length", "failed but wrote *time_steps");
  if (offset_ok && offset < 0) violation("flatmem_cyclic_schedule_offset", "negative offset");
  if (delay_ok && delay < 0) violation("flatmem_cyclic_schedule_delay", "negative delay");
  if (length_ok && length < 1) violation("flatmem_cyclic_schedule_length", "length < 1");
  if (length_ok && offset_ok && offset >= length) violation("flatmem_cyclic_schedule_offset", "offset past the schedule");
  if (action_ok) check_action(action, s, "flatmem_cyclic_schedule_action");
  if (length_ok && offset_ok && length <= 512 && s.struct_size == sizeof s) walk(s, rank, length);
}

const DLDataType dtypes[] = {f32(), f64(), f16()};

// The relay calls of one handle (RELAYED or not: a REPLICATED handle must refuse them).
class Relay {
 public:
  Relay(Reader &in, const Plan &p, flatmem_cyclic_t *handle, bool relayed, const flatmem_cyclic_options &o,
        DLDataType dtype)
      : in_(in), p_(p), handle_(handle), relayed_(relayed), dtype_(dtype) {
    if (o.parameter_count != nullptr) counts_.assign(o.parameter_count, o.parameter_count + o.stages);
  }

  std::int64_t count(std::int32_t stage) const {
    return stage >= 0 && std::size_t(stage) < counts_.size() ? counts_[std::size_t(stage)] : 1;
  }

  // shard_range for each stage (and a hostile stage / rank), then set_shard.
  void register_shards() {
    const std::int32_t stages = std::int32_t(std::min<std::size_t>(counts_.empty() ? 1 : counts_.size(), 8));
    shards_.resize(std::size_t(stages));
    for (std::int32_t j = 0; j < stages; ++j) {
      std::int32_t stage = j, rank = 0;
      if (p_.relay_misuse % 8 == 1 && j == 0) stage = std::int32_t(in_.hostile_int64());
      if (p_.relay_misuse % 8 == 2 && j == 0) rank = std::int32_t(in_.hostile_int64());
      std::int64_t begin = -7, end = -7;
      const bool ok = check_status(flatmem_cyclic_shard_range(handle_, stage, rank, &begin, &end),
                                   "flatmem_cyclic_shard_range");
      if (ok && !relayed_) violation("flatmem_cyclic_shard_range", "answered for a REPLICATED handle");
      if (!ok && (begin != -7 || end != -7)) violation("flatmem_cyclic_shard_range", "failed but wrote *begin / *end");
      // One rank owns everything: [0, n_j) (c_j = n_j).
      if (ok && (begin != 0 || end != count(stage)))
        violation("flatmem_cyclic_shard_range", "stage " + std::to_string(stage) + " of n = " +
                                                    std::to_string(count(stage)) + " on 1 rank: [" +
                                                    std::to_string(begin) + ", " + std::to_string(end) + ")");
      if (p_.relay_misuse % 8 == 3 && j == stages - 1) continue;  // one stage never registered
      auto shard = std::make_unique<FuzzTensor>(dtype_, std::vector<std::int64_t>{ok ? end - begin : count(j)});
      if (p_.shard % 4 == 3) mutate_some(in_, {shard.get()});
      shard->materialize();
      shard->fill(in_, p_.nan % 4 == 3);
      const std::int32_t target = p_.relay_misuse % 8 == 4 && j == 0 ? std::int32_t(in_.hostile_int64()) : j;
      const bool set = check_status(flatmem_cyclic_set_shard(handle_, target, p_.shard % 8 == 6 ? nullptr : shard->get()),
                                    "flatmem_cyclic_set_shard");
      if (set && !relayed_) violation("flatmem_cyclic_set_shard", "accepted by a REPLICATED handle");
      if (set && std::size_t(target) < shards_.size()) shards_[std::size_t(target)] = std::move(shard);  // the caller's until destroy
    }
  }

  // During a FORWARD / BACKWARD: the full stage (skipped or doubled sometimes).
  void parameters(const flatmem_cyclic_action &a, bool misuse_now) {
    if (misuse_now && p_.relay_misuse % 8 == 5) return;  // next must refuse
    auto full = std::make_unique<FuzzTensor>(dtype_, std::vector<std::int64_t>{count(a.stage)});
    if (p_.shard % 4 == 2) mutate_some(in_, {full.get()});
    full->materialize();
    full->fill_sentinel();
    const bool ok = check_status(flatmem_cyclic_parameters(handle_, full->get()), "flatmem_cyclic_parameters");
    if (ok && !relayed_) violation("flatmem_cyclic_parameters", "accepted by a REPLICATED handle");
    if (!ok && full->written()) violation("flatmem_cyclic_parameters", "failed but wrote `full`");
    // One rank: the full stage is its own shard (this caller never updates it).
    const FuzzTensor *shard = std::size_t(a.stage) < shards_.size() ? shards_[std::size_t(a.stage)].get() : nullptr;
    if (ok && shard != nullptr && full->honest() && shard->honest())
      for (std::int64_t i = 0; i < std::min(full->elements(), shard->elements()); ++i)
        if (!(full->value_at(i) == shard->value_at(i) + (break_oracle() ? 1 : 0)) && !std::isnan(shard->value_at(i)))
          violation("flatmem_cyclic_parameters", "element " + std::to_string(i) + " differs from the registered shard");
    if (misuse_now && p_.relay_misuse % 8 == 6)
      check_status(flatmem_cyclic_parameters(handle_, full->get()), "flatmem_cyclic_parameters");
  }

  void statistics() {
    std::vector<unsigned char> buffer(64 * (sizeof(flatmem_cyclic_relay_time_step) + 64), 0);
    const std::size_t size = hostile_struct_size(p_.relay_misuse / 8, sizeof(flatmem_cyclic_relay_time_step));
    const std::int64_t count = size == 0 ? 0 : std::int64_t(buffer.size() / size);
    std::int64_t written = -7;
    const bool ok = check_status(
        flatmem_cyclic_relay_stats(handle_, 0, std::min<std::int64_t>(count, 64),
                                   reinterpret_cast<flatmem_cyclic_relay_time_step *>(buffer.data()), size, &written),
        "flatmem_cyclic_relay_stats");
    if (ok && !relayed_) violation("flatmem_cyclic_relay_stats", "answered for a REPLICATED handle");
    if (ok && (written < 0 || written > std::min<std::int64_t>(count, 64)))
      violation("flatmem_cyclic_relay_stats", "*written = " + std::to_string(written));
    flatmem_cyclic_relay_summary summary{};
    const bool summary_ok = check_status(
        flatmem_cyclic_relay_summary_get(handle_, &summary, hostile_struct_size(p_.relay_misuse / 32, sizeof summary)),
        "flatmem_cyclic_relay_summary_get");
    if (summary_ok && !relayed_) violation("flatmem_cyclic_relay_summary_get", "answered for a REPLICATED handle");
  }

 private:
  Reader &in_;
  const Plan &p_;
  flatmem_cyclic_t *handle_;
  bool relayed_;
  DLDataType dtype_;
  std::vector<std::int64_t> counts_;
  std::vector<std::unique_ptr<FuzzTensor>> shards_;
};

void fuzz_runtime(Reader &in, const Plan &p) {
  flatmem_comm_options comm_options = FLATMEM_COMM_OPTIONS_INIT;
  comm_options.timeout_ms = 2000;  // nothing should wait in a group of 1; if it does, fail fast
  flatmem_comm_t *comm = nullptr;
  if (!check_status(flatmem_comm_create_local(&comm, 1, &comm_options), "flatmem_comm_create_local"))
    violation("flatmem_comm_create_local", "a group of 1 with valid options was refused");

  flatmem_cyclic_options o = FLATMEM_CYCLIC_OPTIONS_INIT;
  o.stages = std::int32_t(pick(in, p.stages, {1, 2, 3, 4, 0, -1, 65536}));
  o.steps = pick(in, p.steps, {1, 2, 3, 0, -1});
  o.rule = static_cast<flatmem_cyclic_rule>(pick(in, p.rule, {0, 1, 2}));
  std::vector<std::int64_t> activation_bytes;
  if (p.activation_bytes % 3 != 0 && o.stages >= 1 && o.stages <= 65535) {
    activation_bytes.resize(std::size_t(o.stages));
    for (auto &v : activation_bytes) v = p.activation_bytes % 3 == 1 ? in.byte() : in.hostile_int64();
    o.activation_bytes = activation_bytes.data();
  }
  o.timeout_ms = pick(in, p.timeout, {0, 500, 1, -1});
  o.nonfinite = static_cast<flatmem_nonfinite_policy>(pick(in, p.nonfinite, {0, 1}));
  o.history = pick(in, p.history, {0, 1, 4, -1});
  // The documented limit, 2^26 time steps, is 3 GiB of records allocated at create: past
  // the fuzzer's 2 GiB malloc limit. Values up to it are capped at 2^20 (those past it, and
  // negative ones, stay: they must be refused).
  if (o.history > (std::int64_t(1) << 20) && o.history <= (std::int64_t(1) << 26)) o.history = std::int64_t(1) << 20;
  // Any 32-bit value a C caller may store (memcpy: not a C++ enum conversion).
  const std::int32_t parameters = std::int32_t(pick(in, p.parameters, {0, 1, 1, 1}));
  std::memcpy(&o.parameters, &parameters, sizeof parameters);
  std::vector<std::int64_t> parameter_count;
  if (p.parameter_count % 4 != 3 && o.stages >= 1 && o.stages <= 65535) {
    parameter_count.resize(std::size_t(o.stages));
    for (auto &v : parameter_count) v = p.parameter_count % 4 == 2 ? in.hostile_int64() : 1 + in.byte() % 16;
    // A stage of 2^16 .. 2^40 elements is valid and its staging (K copies, zero-filled by
    // set_shard) may really be allocated: gigabytes past the fuzzer's RSS limit. Such sizes
    // become 2^40, whose staging cannot be allocated (OUT_OF_MEMORY, the path under test).
    for (auto &v : parameter_count)
      if (v > (std::int64_t(1) << 16) && v < (std::int64_t(1) << 40)) v = std::int64_t(1) << 40;
    o.parameter_count = parameter_count.data();
  }
  o.struct_size = hostile_struct_size(p.create_size, sizeof o);
  const bool options_read = p.create_size != 255;
  std::int32_t rule;
  std::memcpy(&rule, &o.rule, sizeof rule);
  const bool relayed = options_read && o.struct_size >= offsetof(flatmem_cyclic_options, parameters) + 4 &&
                       parameters == FLATMEM_CYCLIC_PARAMETERS_RELAYED;
  const bool delay1 = options_read && (o.struct_size < offsetof(flatmem_cyclic_options, rule) + 4 ||
                                       rule == FLATMEM_CYCLIC_DELAY1);

  flatmem_cyclic_t *handle = nullptr;
  const bool created = check_status(
      flatmem_cyclic_create(&handle, p.null_comm % 8 == 7 ? nullptr : comm, p.create_size == 255 ? nullptr : &o),
      "flatmem_cyclic_create");
  if (!created && handle != nullptr) violation("flatmem_cyclic_create", "failed but set *out");
  if (created && relayed && !delay1) violation("flatmem_cyclic_create", "RELAYED accepted with a rule other than DELAY1");
  Relay relay(in, p, handle, relayed, o, dtypes[p.gradient_dtype % 3]);
  if (created) {
    flatmem_cyclic_schedule s{};
    check_status(flatmem_cyclic_get_schedule(handle, &s, hostile_struct_size(p.schedule_size, sizeof s)),
                 "flatmem_cyclic_get_schedule");
    // A short run: next, and reduce on each backward (a mutated gradient sometimes).
    relay.register_shards();
    std::vector<std::unique_ptr<FuzzTensor>> gradients;
    const int run = 1 + p.run_length % 24;
    for (int i = 0; i < run; ++i) {
      flatmem_cyclic_action a, untouched;
      std::memset(&a, kSentinel, sizeof a);
      std::memcpy(&untouched, &a, sizeof a);
      const bool ok = check_status(flatmem_cyclic_next(handle, &a, sizeof(flatmem_cyclic_action)), "flatmem_cyclic_next");
      if (!ok) {
        if (std::memcmp(&a, &untouched, sizeof a) != 0)
          violation("flatmem_cyclic_next", "failed but wrote *action");
        break;
      }
      if (a.kind == FLATMEM_CYCLIC_DONE) break;
      if (a.kind == FLATMEM_CYCLIC_FORWARD || a.kind == FLATMEM_CYCLIC_BACKWARD) relay.parameters(a, i == run / 2);
      if (a.kind != FLATMEM_CYCLIC_BACKWARD || (p.skip_reduce % 8 == 7 && i == run / 2)) continue;
      const std::int64_t elements = relayed ? relay.count(a.stage) : 1 + p.gradient_dtype / 3 % 16;
      auto g = std::make_unique<FuzzTensor>(dtypes[p.gradient_dtype % 3], std::vector<std::int64_t>{elements});
      if (p.gradient_dtype % 5 == 4) mutate_some(in, {g.get()});
      g->materialize();
      g->fill(in, p.nan % 2 == 1);
      const std::int32_t stage = p.skip_reduce % 8 == 6 ? a.stage + 1 : a.stage;
      check_status(flatmem_cyclic_reduce(handle, stage, g->get()), "flatmem_cyclic_reduce");
      gradients.push_back(std::move(g));  // the buffer belongs to the handle until its update
    }
    std::vector<flatmem_cyclic_time_step_stats> stats(64);
    const std::int64_t first = pick(in, p.stats_first, {0, 1, 5, -1});
    const std::int64_t count = std::int64_t(pick(in, p.stats_count, {64, 1, 0, -1, std::numeric_limits<std::int64_t>::min()}));
    std::int64_t written = -7;
    const bool stats_ok = check_status(flatmem_cyclic_stats(handle, first, std::min<std::int64_t>(count, 64),
                                                            stats.data(), sizeof(flatmem_cyclic_time_step_stats), &written), "flatmem_cyclic_stats");
    if (stats_ok && (written < 0 || written > std::min<std::int64_t>(count, 64)))
      violation("flatmem_cyclic_stats", "*written = " + std::to_string(written) + " for count " + std::to_string(count));
    flatmem_cyclic_summary summary{};
    check_status(flatmem_cyclic_summary_get(handle, &summary, sizeof(flatmem_cyclic_summary)), "flatmem_cyclic_summary_get");
    relay.statistics();
    check_status(flatmem_cyclic_destroy(handle), "flatmem_cyclic_destroy");
  }
  // The handle may have poisoned the group (destroy in flight): abort is always allowed.
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

// The cyclic schedule's public query functions (flatmem_cyclic_schedule_offset,
// _delay, _length, _action) against an independent model written here from the
// definitions at the top of include/flatmem/cyclic.h -- nothing of src/ is used.
//
// The model simulates every rank time step by time step: its local time, the
// forward / backward it runs, and the averaged gradients it applies (one queue
// of pending steps per stage, applied at the stage's forward slot of step
// s + 1 + delay, also in the idle drain after the last step). The gradient of
// (step, stage) becomes available the time step after the LAST rank's backward
// of that stage in that step; the model asserts that it never applies one
// earlier. The library's actions are compared field by field with the model at
// every global time step up to the length and a few past it, and checked again
// directly against the header's properties (one forward and one backward per
// (step, stage), their order and times, updates once each, in step order, at
// most one step late, activations held, DONE and the tightness of the length,
// the memory sum of N = 2L ranks). Bad input: the documented status, a message
// naming the argument, outputs untouched.
#include <doctest/doctest.h>
#include <flatmem/flatmem.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <sstream>
#include <string>
#include <vector>

namespace {

// ---------------------------------------------------------------------------
// Test parameters
// ---------------------------------------------------------------------------

const std::vector<int> kWorlds = {1, 2, 3, 4, 5, 6, 7, 8, 9, 16, 33};
const std::vector<int> kStages = {1, 2, 3, 4, 5, 6, 11};
const std::vector<std::int64_t> kSteps = {1, 2, 3, 7};
// Time steps queried past the schedule's length.
constexpr std::int64_t kPast = 3;

const char *rule_name(flatmem_cyclic_rule rule) {
  switch (rule) {
    case FLATMEM_CYCLIC_DELAY1: return "DELAY1";
    case FLATMEM_CYCLIC_NEWEST: return "NEWEST";
    case FLATMEM_CYCLIC_SYNC: return "SYNC";
    default: return "?";
  }
}

const char *kind_name(int kind) {
  switch (kind) {
    case FLATMEM_CYCLIC_IDLE: return "IDLE";
    case FLATMEM_CYCLIC_FORWARD: return "FORWARD";
    case FLATMEM_CYCLIC_BACKWARD: return "BACKWARD";
    case FLATMEM_CYCLIC_DONE: return "DONE";
    default: return "?";
  }
}

flatmem_cyclic_schedule make_schedule(int world, int stages, std::int64_t steps, flatmem_cyclic_rule rule) {
  flatmem_cyclic_schedule s = FLATMEM_CYCLIC_SCHEDULE_INIT;
  s.world_size = world;
  s.stages = stages;
  s.steps = steps;
  s.rule = rule;
  return s;
}

std::string describe(const flatmem_cyclic_schedule &s) {
  std::ostringstream o;
  o << "N=" << s.world_size << " L=" << s.stages << " S=" << s.steps << " " << rule_name(s.rule);
  return o.str();
}

// Collects mismatches of one schedule (the first few, with their context) so
// that a wrong schedule reports readably instead of thousands of CHECKs.
struct Failures {
  std::string where;
  std::vector<std::string> first;
  std::int64_t checked = 0;
  std::int64_t failed = 0;

  template <typename... Parts>
  void expect(bool ok, const Parts &...parts) {
    ++checked;
    if (ok) return;
    ++failed;
    if (first.size() >= 25) return;
    std::ostringstream o;
    o << where << ": ";
    (o << ... << parts);
    first.push_back(o.str());
  }

  std::string text() const {
    std::string all;
    for (const auto &line : first) all += line + "\n";
    if (failed > std::int64_t(first.size()))
      all += "... and " + std::to_string(failed - std::int64_t(first.size())) + " more\n";
    return all;
  }
};

std::int64_t g_checked = 0;  // elementary comparisons over the whole run (reported)

void report(const Failures &f) {
  g_checked += f.checked;
  CHECK_MESSAGE(f.failed == 0, f.text());
}

// ---------------------------------------------------------------------------
// The independent model (from the header's definitions only)
// ---------------------------------------------------------------------------

struct Slot {
  int kind = FLATMEM_CYCLIC_IDLE;
  std::int32_t stage = -1;
  std::int64_t step = -1;
  std::int32_t update_stage = -1;
  std::int64_t update_step = -1;
  std::int32_t held = 0;
  std::int32_t phase = -1;
};

struct Model {
  int N = 1, L = 1;
  std::int64_t S = 1;
  flatmem_cyclic_rule rule = FLATMEM_CYCLIC_DELAY1;

  std::int64_t period() const { return 2 * std::int64_t(L); }

  // offset(r) = floor(r * 2L / N), 0 for every rank under SYNC.
  std::int64_t offset(int r) const {
    if (rule == FLATMEM_CYCLIC_SYNC) return 0;
    const std::int64_t num = std::int64_t(r) * period();
    std::int64_t q = 0;
    while ((q + 1) * N <= num) ++q;  // floor by counting, not by the same division
    return q;
  }

  // SYNC 0; DELAY1 1; NEWEST 0 iff offset(N-1) - offset(r) <= 2j.
  int delay(int r, int j) const {
    if (rule == FLATMEM_CYCLIC_SYNC) return 0;
    if (rule == FLATMEM_CYCLIC_DELAY1) return 1;
    return offset(N - 1) - offset(r) <= 2 * std::int64_t(j) ? 0 : 1;
  }
};

struct Simulation {
  std::int64_t length = 0;                 // global time steps until all ranks are done
  std::vector<std::int64_t> last_event;    // per rank: last time step with an action or update
  std::vector<std::vector<Slot>> slots;    // [rank][time step], 0 .. length + kPast - 1
  std::vector<std::string> model_errors;   // the model's own assertions
};

// Rank by rank, time step by time step. Ranks are visited in order 0 .. N-1
// inside a time step, so rank N-1's backward at tau makes the gradient
// available from tau + 1 on for every rank.
Simulation simulate(const Model &m) {
  Simulation sim;
  const int N = m.N, L = m.L;
  const std::int64_t P = m.period();
  // available[s][j]: first time step at which the average of (s, j) exists; -1 not yet.
  std::vector<std::vector<std::int64_t>> available(std::size_t(m.S), std::vector<std::int64_t>(std::size_t(L), -1));
  // next_update[r][j]: the step whose average rank r applies next to stage j.
  std::vector<std::vector<std::int64_t>> next_update(std::size_t(N), std::vector<std::int64_t>(std::size_t(L), 0));
  sim.slots.assign(std::size_t(N), {});
  sim.last_event.assign(std::size_t(N), -1);
  std::vector<bool> finished(std::size_t(N), false);

  for (std::int64_t tau = 0;; ++tau) {
    bool all_finished = true;
    for (int r = 0; r < N; ++r) {
      Slot a;
      const std::int64_t t = tau - m.offset(r);
      if (t >= 0) {
        const std::int64_t k = t / P;  // local step
        const std::int64_t p = t % P;  // phase
        if (k < m.S) {
          a.step = k;
          a.phase = std::int32_t(p);
          if (p < L) {
            a.kind = FLATMEM_CYCLIC_FORWARD;
            a.stage = std::int32_t(p);
          } else {
            a.kind = FLATMEM_CYCLIC_BACKWARD;
            a.stage = std::int32_t(2 * L - 1 - p);
            if (r == N - 1) available[std::size_t(k)][std::size_t(a.stage)] = tau + 1;
          }
          a.held = a.stage + 1;
        }
        // The forward slot of stage p (also in the drain after the last step)
        // carries the update of that stage whose time has come.
        if (p < L) {
          const int j = int(p);
          std::int64_t &next = next_update[std::size_t(r)][std::size_t(j)];
          const std::int64_t due = k - 1 - m.delay(r, j);  // the step applied in this slot
          if (next < m.S && due > next)
            sim.model_errors.push_back("model skipped an update: rank " + std::to_string(r) + " stage " +
                                       std::to_string(j) + " step " + std::to_string(next));
          if (next < m.S && due == next) {
            const std::int64_t avail = available[std::size_t(next)][std::size_t(j)];
            if (avail < 0 || avail > tau)
              sim.model_errors.push_back("model applies a gradient before it exists: rank " + std::to_string(r) +
                                         " stage " + std::to_string(j) + " step " + std::to_string(next) +
                                         " at time step " + std::to_string(tau));
            a.update_stage = j;
            a.update_step = next;
            ++next;
          }
        }
        if (a.kind != FLATMEM_CYCLIC_IDLE || a.update_stage >= 0) sim.last_event[std::size_t(r)] = tau;
        bool done = k >= m.S;
        for (int j = 0; j < L; ++j) done = done && next_update[std::size_t(r)][std::size_t(j)] == m.S;
        if (done) finished[std::size_t(r)] = true;
      }
      all_finished = all_finished && finished[std::size_t(r)];
      sim.slots[std::size_t(r)].push_back(a);
    }
    if (all_finished) break;
    if (tau > m.offset(N - 1) + (m.S + 4) * P) {
      sim.model_errors.push_back("model never finishes");
      break;
    }
  }
  for (int r = 0; r < N; ++r) sim.length = std::max(sim.length, sim.last_event[std::size_t(r)] + 1);
  // Idle until the length, DONE from it on.
  for (int r = 0; r < N; ++r) {
    auto &line = sim.slots[std::size_t(r)];
    line.resize(std::size_t(sim.length));
    for (std::int64_t tau = 0; tau < kPast; ++tau) {
      Slot done;
      done.kind = FLATMEM_CYCLIC_DONE;
      line.push_back(done);
    }
  }
  return sim;
}

// ---------------------------------------------------------------------------
// The library
// ---------------------------------------------------------------------------

flatmem_cyclic_action lib_action(const flatmem_cyclic_schedule &s, int r, std::int64_t tau) {
  flatmem_cyclic_action a;
  std::memset(&a, 0x5a, sizeof a);
  const flatmem_status st = flatmem_cyclic_schedule_action(&s, r, tau, &a, sizeof(flatmem_cyclic_action));
  REQUIRE_MESSAGE(st == FLATMEM_STATUS_SUCCESS, describe(s), " rank ", r, " time step ", tau, ": ",
                  flatmem_last_error());
  return a;
}

std::int64_t lib_offset(const flatmem_cyclic_schedule &s, int r) {
  std::int64_t v = -777;
  const flatmem_status st = flatmem_cyclic_schedule_offset(&s, r, &v);
  REQUIRE_MESSAGE(st == FLATMEM_STATUS_SUCCESS, describe(s), " rank ", r, ": ", flatmem_last_error());
  return v;
}

int lib_delay(const flatmem_cyclic_schedule &s, int r, int j) {
  std::int32_t v = -777;
  const flatmem_status st = flatmem_cyclic_schedule_delay(&s, r, j, &v);
  REQUIRE_MESSAGE(st == FLATMEM_STATUS_SUCCESS, describe(s), " rank ", r, " stage ", j, ": ", flatmem_last_error());
  return v;
}

std::int64_t lib_length(const flatmem_cyclic_schedule &s) {
  std::int64_t v = -777;
  const flatmem_status st = flatmem_cyclic_schedule_length(&s, &v);
  REQUIRE_MESSAGE(st == FLATMEM_STATUS_SUCCESS, describe(s), ": ", flatmem_last_error());
  return v;
}

// All actions of all ranks at time steps 0 .. until - 1.
std::vector<std::vector<flatmem_cyclic_action>> lib_actions(const flatmem_cyclic_schedule &s, std::int64_t until) {
  std::vector<std::vector<flatmem_cyclic_action>> all(std::size_t(s.world_size));
  for (int r = 0; r < s.world_size; ++r)
    for (std::int64_t tau = 0; tau < until; ++tau) all[std::size_t(r)].push_back(lib_action(s, r, tau));
  return all;
}

// ---------------------------------------------------------------------------
// The checks of one schedule
// ---------------------------------------------------------------------------

// Every field of the library's actions equals the model's.
void compare_with_model(const flatmem_cyclic_schedule &s, const Model &m, const Simulation &sim,
                        const std::vector<std::vector<flatmem_cyclic_action>> &got, Failures &f) {
  for (int r = 0; r < m.N; ++r) {
    f.expect(lib_offset(s, r) == m.offset(r), "offset(", r, ") = ", lib_offset(s, r), ", model ", m.offset(r));
    for (int j = 0; j < m.L; ++j)
      f.expect(lib_delay(s, r, j) == m.delay(r, j), "delay(", r, ", ", j, ") = ", lib_delay(s, r, j), ", model ",
               m.delay(r, j));
    const auto &want = sim.slots[std::size_t(r)];
    const auto &line = got[std::size_t(r)];
    for (std::size_t tau = 0; tau < want.size() && tau < line.size(); ++tau) {
      const flatmem_cyclic_action &a = line[tau];
      const Slot &w = want[tau];
      const bool same = a.time_step == std::int64_t(tau) && int(a.kind) == w.kind && a.stage == w.stage &&
                        a.step == w.step && a.update_stage == w.update_stage && a.update_step == w.update_step &&
                        a.activations_held == w.held && a.phase == w.phase;
      f.expect(same, "rank ", r, " time step ", tau, ": library {", a.time_step, " ", kind_name(a.kind), " stage ",
               a.stage, " step ", a.step, " update ", a.update_stage, "/", a.update_step, " held ",
               a.activations_held, " phase ", a.phase, "}, model {", kind_name(w.kind), " stage ", w.stage,
               " step ", w.step, " update ", w.update_stage, "/", w.update_step, " held ", w.held, " phase ",
               w.phase, "}");
    }
  }
}

// The header's properties, checked on the library's actions directly.
void check_properties(const flatmem_cyclic_schedule &s, const Model &m, std::int64_t length,
                      const std::vector<std::vector<flatmem_cyclic_action>> &got, Failures &f) {
  const int N = m.N, L = m.L;
  const std::int64_t S = m.S, P = m.period();
  const std::int64_t last_offset = lib_offset(s, N - 1);

  for (int r = 0; r < N; ++r) {
    const auto &line = got[std::size_t(r)];
    const std::int64_t off = lib_offset(s, r);
    f.expect(off >= 0 && off < P && (r == 0 || off >= lib_offset(s, r - 1)), "offset(", r, ") = ", off,
             " out of order or range");
    // Forwards and backwards in time order: (kind, stage, step, tau).
    std::int64_t expected_index = 0;  // position in F0..F(L-1) B(L-1)..B0 of step 0, 1, ...
    std::vector<std::int64_t> applied(std::size_t(L), 0);  // updates applied so far per stage
    for (std::int64_t tau = 0; tau < std::int64_t(line.size()); ++tau) {
      const flatmem_cyclic_action &a = line[std::size_t(tau)];
      f.expect(a.time_step == tau, "rank ", r, " time step ", tau, ": time_step field ", a.time_step);
      // DONE exactly from the length on.
      f.expect((a.kind == FLATMEM_CYCLIC_DONE) == (tau >= length), "rank ", r, " time step ", tau, " (length ",
               length, "): kind ", kind_name(a.kind));
      // Idle before the offset: nothing at all.
      if (tau < off)
        f.expect(a.kind == FLATMEM_CYCLIC_IDLE && a.update_stage == -1 && a.update_step == -1 && a.stage == -1 &&
                     a.step == -1 && a.activations_held == 0 && a.phase == -1,
                 "rank ", r, " time step ", tau, " before its offset ", off, " is not an empty IDLE");
      const bool works = a.kind == FLATMEM_CYCLIC_FORWARD || a.kind == FLATMEM_CYCLIC_BACKWARD;
      if (works) {
        // The expected next action of the rank's sequence, at its closed-form time.
        const std::int64_t k = expected_index / P, p = expected_index % P;
        const int want_kind = p < L ? FLATMEM_CYCLIC_FORWARD : FLATMEM_CYCLIC_BACKWARD;
        const std::int64_t want_stage = p < L ? p : 2 * L - 1 - p;
        f.expect(k < S && a.kind == want_kind && a.stage == want_stage && a.step == k && a.phase == p &&
                     tau == off + k * P + p && a.activations_held == a.stage + 1,
                 "rank ", r, " time step ", tau, ": ", kind_name(a.kind), " stage ", a.stage, " step ", a.step,
                 " phase ", a.phase, " held ", a.activations_held, "; expected ", kind_name(want_kind), " stage ",
                 want_stage, " step ", k, " phase ", p, " at time step ", off + k * P + p);
        ++expected_index;
      } else {
        f.expect(a.stage == -1 && a.step == -1 && a.phase == -1 && a.activations_held == 0, "rank ", r,
                 " time step ", tau, ": ", kind_name(a.kind), " with stage ", a.stage, " step ", a.step, " phase ",
                 a.phase, " held ", a.activations_held);
      }
      if (a.update_stage >= 0 || a.update_step >= 0) {
        const int j = a.update_stage;
        const std::int64_t u = a.update_step;
        f.expect(j >= 0 && j < L && u >= 0 && u < S && a.kind != FLATMEM_CYCLIC_DONE && a.kind != FLATMEM_CYCLIC_BACKWARD,
                 "rank ", r, " time step ", tau, ": bad update ", j, "/", u, " on ", kind_name(a.kind));
        if (j < 0 || j >= L || u < 0 || u >= S) continue;
        // Once each, in step order, per stage.
        f.expect(u == applied[std::size_t(j)], "rank ", r, " time step ", tau, ": applies step ", u, " to stage ",
                 j, " after ", applied[std::size_t(j)], " updates of it");
        applied[std::size_t(j)] = u + 1;
        // At the forward slot of stage j in step u + 1 + delay.
        const std::int64_t t = tau - off;
        const std::int64_t k = t / P, p = t % P;
        const int d = lib_delay(s, r, j);
        f.expect(t >= 0 && p == j && k == u + 1 + d && (d == 0 || d == 1), "rank ", r, " time step ", tau,
                 ": update of stage ", j, " step ", u, " at local step ", k, " phase ", p, " (delay ", d, ")");
        // A forward of that stage, or IDLE in the drain after the last step.
        if (k < S)
          f.expect(a.kind == FLATMEM_CYCLIC_FORWARD && a.stage == j, "rank ", r, " time step ", tau,
                   ": update of stage ", j, " not at its forward");
        else
          f.expect(a.kind == FLATMEM_CYCLIC_IDLE && a.stage == -1, "rank ", r, " time step ", tau,
                   ": drain update of stage ", j, " on ", kind_name(a.kind));
        // Never before the gradient exists: the time step after rank N-1's
        // backward of stage j in step u (the others' backwards come no later).
        const std::int64_t backward_last = last_offset + u * P + (2 * L - 1 - j);
        f.expect(tau >= backward_last + 1, "rank ", r, " time step ", tau, ": update of stage ", j, " step ", u,
                 " before the gradient exists (rank ", N - 1, " backward at ", backward_last, ")");
        // Never more than one step late.
        f.expect(k - 1 - u <= 1, "rank ", r, ": update of stage ", j, " step ", u, " applied in step ", k);
      }
      // The parameters a forward sees: stage j at step k has all averages up to
      // step k - 1 - delay applied (DELAY1: k - 2 on every rank, SYNC: k - 1).
      if (a.kind == FLATMEM_CYCLIC_FORWARD && a.stage >= 0 && a.stage < L) {
        const std::int64_t want = std::max<std::int64_t>(0, a.step - lib_delay(s, r, a.stage));
        f.expect(applied[std::size_t(a.stage)] == want, "rank ", r, " forward of stage ", a.stage, " step ",
                 a.step, " sees ", applied[std::size_t(a.stage)], " updates, expected ", want);
      }
    }
    f.expect(expected_index == S * P, "rank ", r, ": ", expected_index, " forwards and backwards, expected ", S * P);
    for (int j = 0; j < L; ++j)
      f.expect(applied[std::size_t(j)] == S, "rank ", r, " stage ", j, ": ", applied[std::size_t(j)],
               " updates applied, expected ", S);
  }

  // Delays per the header's rule; under NEWEST delay 0 exactly when the
  // schedule lets this step's average arrive by the forward that needs it.
  for (int r = 0; r < N; ++r)
    for (int j = 0; j < L; ++j) {
      const int d = lib_delay(s, r, j);
      if (m.rule == FLATMEM_CYCLIC_SYNC) f.expect(d == 0, "SYNC delay(", r, ", ", j, ") = ", d);
      if (m.rule == FLATMEM_CYCLIC_DELAY1) f.expect(d == 1, "DELAY1 delay(", r, ", ", j, ") = ", d);
      if (m.rule == FLATMEM_CYCLIC_NEWEST) {
        const std::int64_t needed = lib_offset(s, r) + P + j;            // forward of j in step s + 1 (s = 0)
        const std::int64_t exists = last_offset + (2 * L - 1 - j) + 1;   // after rank N-1's backward of j in step s
        f.expect(d == (needed >= exists ? 0 : 1), "NEWEST delay(", r, ", ", j, ") = ", d, ": needed at ", needed,
                 ", exists from ", exists);
      }
    }

  // The length is tight: some rank acts or updates at length - 1.
  bool busy_at_end = false;
  for (int r = 0; r < N; ++r) {
    const auto &a = got[std::size_t(r)][std::size_t(length - 1)];
    busy_at_end = busy_at_end || a.kind == FLATMEM_CYCLIC_FORWARD || a.kind == FLATMEM_CYCLIC_BACKWARD ||
                  a.update_stage >= 0;
  }
  f.expect(busy_at_end, "no rank does anything at time step length - 1 = ", length - 1);
}

// Runs every check on one schedule.
void check_schedule(int world, int stages, std::int64_t steps, flatmem_cyclic_rule rule) {
  const flatmem_cyclic_schedule s = make_schedule(world, stages, steps, rule);
  Model m;
  m.N = world;
  m.L = stages;
  m.S = steps;
  m.rule = rule;
  Failures f;
  f.where = describe(s);
  const Simulation sim = simulate(m);
  for (const auto &e : sim.model_errors) f.expect(false, e);
  const std::int64_t length = lib_length(s);
  f.expect(length == sim.length, "length ", length, ", model ", sim.length);
  const std::int64_t until = std::max(length, sim.length) + kPast;
  const auto got = lib_actions(s, until);
  compare_with_model(s, m, sim, got, f);
  if (length >= 1) check_properties(s, m, length, got, f);
  // DONE far beyond the end too.
  for (int r = 0; r < world; ++r)
    for (std::int64_t tau : {length + 100, std::int64_t(1) << 40, INT64_MAX}) {
      const flatmem_cyclic_action a = lib_action(s, r, tau);
      f.expect(a.kind == FLATMEM_CYCLIC_DONE && a.time_step == tau && a.update_stage == -1 && a.stage == -1 &&
                   a.activations_held == 0,
               "rank ", r, " time step ", tau, ": ", kind_name(a.kind));
    }
  report(f);
}

void check_rule(flatmem_cyclic_rule rule) {
  int schedules = 0;
  for (int world : kWorlds)
    for (int stages : kStages)
      for (std::int64_t steps : kSteps) {
        check_schedule(world, stages, steps, rule);
        ++schedules;
      }
  MESSAGE(std::string(rule_name(rule)), ": ", schedules, " schedules, ", g_checked, " comparisons so far");
}

// Sum over ranks of activations_held at every time step 0 .. length - 1.
std::vector<std::int64_t> activation_sum(const flatmem_cyclic_schedule &s) {
  const std::int64_t length = lib_length(s);
  std::vector<std::int64_t> sum(std::size_t(length), 0);
  for (int r = 0; r < s.world_size; ++r)
    for (std::int64_t tau = 0; tau < length; ++tau) {
      const flatmem_cyclic_action a = lib_action(s, r, tau);
      REQUIRE(a.activations_held >= 0);
      REQUIRE(a.activations_held <= s.stages);
      sum[std::size_t(tau)] += a.activations_held;
    }
  return sum;
}

// Checks a NULL-free failing call: status, message naming `needle`.
void expect_invalid(flatmem_status got, const char *needle) {
  const std::string message = flatmem_last_error();
  INFO("status ", flatmem_status_string(got), ", message \"", message, "\", expected it to name \"", needle, "\"");
  CHECK(got == FLATMEM_STATUS_INVALID_ARGUMENT);
  CHECK(message.find(needle) != std::string::npos);
}

// The four functions on a schedule that is wrong in one field: each refuses,
// names the field, and leaves its output alone.
void expect_schedule_refused(const flatmem_cyclic_schedule &bad, const char *needle) {
  std::int64_t offset = -12345;
  expect_invalid(flatmem_cyclic_schedule_offset(&bad, 0, &offset), needle);
  CHECK(offset == -12345);
  std::int32_t delay = -12345;
  expect_invalid(flatmem_cyclic_schedule_delay(&bad, 0, 0, &delay), needle);
  CHECK(delay == -12345);
  std::int64_t length = -12345;
  expect_invalid(flatmem_cyclic_schedule_length(&bad, &length), needle);
  CHECK(length == -12345);
  flatmem_cyclic_action a, before;
  std::memset(&a, 0x3c, sizeof a);
  std::memcpy(&before, &a, sizeof a);
  expect_invalid(flatmem_cyclic_schedule_action(&bad, 0, 0, &a, sizeof(flatmem_cyclic_action)), needle);
  CHECK(std::memcmp(&a, &before, sizeof a) == 0);
}

}  // namespace

// ---------------------------------------------------------------------------
// Hand-computed offsets and delays (validate the model and the library both)
// ---------------------------------------------------------------------------

TEST_CASE("cyclic/schedule/hand-computed offsets and delays") {
  struct Case {
    int N, L;
    std::vector<std::int64_t> offsets;
  };
  // floor(r * 2L / N) by hand, including 2L/N not whole and N > 2L.
  const std::vector<Case> cases = {
      {1, 3, {0}},
      {2, 2, {0, 2}},
      {3, 2, {0, 1, 2}},                 // 4/3
      {4, 2, {0, 1, 2, 3}},
      {5, 1, {0, 0, 0, 1, 1}},           // 2/5: lockstep groups
      {5, 3, {0, 1, 2, 3, 4}},           // 6/5
      {7, 2, {0, 0, 1, 1, 2, 2, 3}},     // 4/7
      {8, 4, {0, 1, 2, 3, 4, 5, 6, 7}},  // N = 2L
      {6, 5, {0, 1, 3, 5, 6, 8}},        // 10/6
      {9, 4, {0, 0, 1, 2, 3, 4, 5, 6, 7}},
  };
  for (const Case &c : cases)
    for (flatmem_cyclic_rule rule : {FLATMEM_CYCLIC_DELAY1, FLATMEM_CYCLIC_NEWEST, FLATMEM_CYCLIC_SYNC}) {
      const flatmem_cyclic_schedule s = make_schedule(c.N, c.L, 2, rule);
      Model m;
      m.N = c.N;
      m.L = c.L;
      m.S = 2;
      m.rule = rule;
      CAPTURE(describe(s));
      for (int r = 0; r < c.N; ++r) {
        CAPTURE(r);
        const std::int64_t want = rule == FLATMEM_CYCLIC_SYNC ? 0 : c.offsets[std::size_t(r)];
        CHECK(m.offset(r) == want);
        CHECK(lib_offset(s, r) == want);
      }
    }
  // NEWEST, N = 4, L = 2 (offsets 0 1 2 3, offset(N-1) = 3): delay 0 iff 3 - offset(r) <= 2j.
  {
    const flatmem_cyclic_schedule s = make_schedule(4, 2, 3, FLATMEM_CYCLIC_NEWEST);
    const int want[4][2] = {{1, 1}, {1, 0}, {1, 0}, {0, 0}};
    for (int r = 0; r < 4; ++r)
      for (int j = 0; j < 2; ++j) {
        CAPTURE(r);
        CAPTURE(j);
        CHECK(lib_delay(s, r, j) == want[r][j]);
      }
  }
  // NEWEST, N = 7, L = 2 (offsets 0 0 1 1 2 2 3): gap 3 3 2 2 1 1 0.
  {
    const flatmem_cyclic_schedule s = make_schedule(7, 2, 3, FLATMEM_CYCLIC_NEWEST);
    const int want[7][2] = {{1, 1}, {1, 1}, {1, 0}, {1, 0}, {1, 0}, {1, 0}, {0, 0}};
    for (int r = 0; r < 7; ++r)
      for (int j = 0; j < 2; ++j) {
        CAPTURE(r);
        CAPTURE(j);
        CHECK(lib_delay(s, r, j) == want[r][j]);
      }
  }
  // N = 1, L = 1, S = 1 by hand: F0 B0, then the update of step 0 at the
  // forward slot of step 1 (+ delay): DELAY1 length 2 + 2 + 1 = 5, NEWEST and
  // SYNC (delay 0 for the last rank) length 2 + 1 = 3.
  CHECK(lib_length(make_schedule(1, 1, 1, FLATMEM_CYCLIC_DELAY1)) == 5);
  CHECK(lib_length(make_schedule(1, 1, 1, FLATMEM_CYCLIC_NEWEST)) == 3);
  CHECK(lib_length(make_schedule(1, 1, 1, FLATMEM_CYCLIC_SYNC)) == 3);
  {
    const flatmem_cyclic_schedule s = make_schedule(1, 1, 1, FLATMEM_CYCLIC_DELAY1);
    const flatmem_cyclic_action a0 = lib_action(s, 0, 0), a1 = lib_action(s, 0, 1), a2 = lib_action(s, 0, 2),
                                a4 = lib_action(s, 0, 4), a5 = lib_action(s, 0, 5);
    CHECK(a0.kind == FLATMEM_CYCLIC_FORWARD);
    CHECK(a1.kind == FLATMEM_CYCLIC_BACKWARD);
    CHECK(a2.kind == FLATMEM_CYCLIC_IDLE);
    CHECK(a2.update_stage == -1);
    CHECK(a4.kind == FLATMEM_CYCLIC_IDLE);
    CHECK(a4.update_stage == 0);
    CHECK(a4.update_step == 0);
    CHECK(a5.kind == FLATMEM_CYCLIC_DONE);
  }
}

// ---------------------------------------------------------------------------
// The whole schedule against the model, every rule
// ---------------------------------------------------------------------------

TEST_CASE("cyclic/schedule/model/DELAY1") { check_rule(FLATMEM_CYCLIC_DELAY1); }
TEST_CASE("cyclic/schedule/model/NEWEST") { check_rule(FLATMEM_CYCLIC_NEWEST); }
TEST_CASE("cyclic/schedule/model/SYNC") { check_rule(FLATMEM_CYCLIC_SYNC); }

// ---------------------------------------------------------------------------
// Memory: the sum of activations held over the ranks
// ---------------------------------------------------------------------------

TEST_CASE("cyclic/schedule/memory") {
  int constant_cases = 0;
  for (int N : kWorlds)
    for (int L : kStages)
      for (std::int64_t S : kSteps) {
        const flatmem_cyclic_schedule sync = make_schedule(N, L, S, FLATMEM_CYCLIC_SYNC);
        const std::vector<std::int64_t> sync_sum = activation_sum(sync);
        const std::int64_t sync_peak = *std::max_element(sync_sum.begin(), sync_sum.end());
        CAPTURE(describe(sync));
        CHECK(sync_peak == std::int64_t(N) * L);
        for (flatmem_cyclic_rule rule : {FLATMEM_CYCLIC_DELAY1, FLATMEM_CYCLIC_NEWEST}) {
          const flatmem_cyclic_schedule s = make_schedule(N, L, S, rule);
          CAPTURE(describe(s));
          const std::vector<std::int64_t> sum = activation_sum(s);
          const std::int64_t peak = *std::max_element(sum.begin(), sum.end());
          CHECK(peak <= sync_peak);
          // N a multiple of 2L (lockstep groups of N / 2L), or N even with 2L/N
          // whole: a rank's activations at phase p and p + L add up to L + 1 and
          // the offsets pair up L apart, so once all ranks started (offset(N-1))
          // and before any finished (rank 0's last backward is at S * 2L - 1),
          // the sum is constant. (With N odd and 2L/N whole -- N = 1, or N = 3
          // and L = 6 -- it is not, although the header's overview says so.)
          const bool flat = N % (2 * L) == 0 || (N % 2 == 0 && (2 * L) % N == 0);
          if (!flat) continue;
          ++constant_cases;
          const std::int64_t from = lib_offset(s, N - 1), to = S * 2 * L;
          REQUIRE(from < to);
          Failures f;
          f.where = describe(s);
          for (std::int64_t tau = from; tau < to; ++tau)
            f.expect(2 * sum[std::size_t(tau)] == std::int64_t(N) * (L + 1), "time step ", tau, ": sum ",
                     sum[std::size_t(tau)], ", expected N(L+1)/2 = ", std::int64_t(N) * (L + 1), "/2");
          report(f);
          if (N == 2 * L && S >= 2) CHECK(peak * 2 * L == sync_peak * (L + 1));  // (L+1)/2L of the SYNC peak
        }
      }
  MESSAGE(constant_cases, " schedules (N a multiple of 2L, or N even dividing 2L) checked for a constant sum");
  CHECK(constant_cases > 0);
}

// ---------------------------------------------------------------------------
// Limits accepted, bad input refused
// ---------------------------------------------------------------------------

TEST_CASE("cyclic/schedule/limits") {
  // The largest documented values are accepted and compute without overflow.
  const flatmem_cyclic_schedule big = make_schedule(1 << 20, 65535, std::int64_t(1) << 40, FLATMEM_CYCLIC_NEWEST);
  Model m;
  m.N = 1 << 20;
  m.L = 65535;
  m.S = std::int64_t(1) << 40;
  m.rule = FLATMEM_CYCLIC_NEWEST;
  for (int r : {0, 1, 7, 12345, (1 << 20) - 1}) {
    CAPTURE(r);
    CHECK(lib_offset(big, r) == (std::int64_t(r) * 2 * 65535) / (1 << 20));
    CHECK(lib_delay(big, r, 0) == m.delay(r, 0));
    CHECK(lib_delay(big, r, 65534) == m.delay(r, 65534));
  }
  std::int64_t length = -1;
  CHECK(flatmem_cyclic_schedule_length(&big, &length) == FLATMEM_STATUS_SUCCESS);
  CHECK(std::string(flatmem_last_error()).empty());
  CHECK(length > (std::int64_t(1) << 40) * 2 * 65535);
  // Mid-run action of the last rank: phase and step from its offset.
  const std::int64_t off = lib_offset(big, (1 << 20) - 1);
  const std::int64_t tau = off + 1000 * 131070 + 65535 + 3;  // step 1000, backward of stage 65535 - 4
  const flatmem_cyclic_action a = lib_action(big, (1 << 20) - 1, tau);
  CHECK(a.kind == FLATMEM_CYCLIC_BACKWARD);
  CHECK(a.step == 1000);
  CHECK(a.stage == 65535 - 4);
  CHECK(a.phase == 65535 + 3);
}

TEST_CASE("cyclic/schedule/bad-input/null-schedule") {
  std::int64_t offset = -12345, length = -12345;
  std::int32_t delay = -12345;
  flatmem_cyclic_action a, before;
  std::memset(&a, 0x3c, sizeof a);
  std::memcpy(&before, &a, sizeof a);
  expect_invalid(flatmem_cyclic_schedule_offset(nullptr, 0, &offset), "schedule");
  expect_invalid(flatmem_cyclic_schedule_delay(nullptr, 0, 0, &delay), "schedule");
  expect_invalid(flatmem_cyclic_schedule_length(nullptr, &length), "schedule");
  expect_invalid(flatmem_cyclic_schedule_action(nullptr, 0, 0, &a, sizeof(flatmem_cyclic_action)), "schedule");
  CHECK(offset == -12345);
  CHECK(delay == -12345);
  CHECK(length == -12345);
  CHECK(std::memcmp(&a, &before, sizeof a) == 0);
}

TEST_CASE("cyclic/schedule/bad-input/null-output") {
  const flatmem_cyclic_schedule s = make_schedule(4, 2, 3, FLATMEM_CYCLIC_DELAY1);
  expect_invalid(flatmem_cyclic_schedule_offset(&s, 0, nullptr), "offset");
  expect_invalid(flatmem_cyclic_schedule_delay(&s, 0, 0, nullptr), "delay");
  expect_invalid(flatmem_cyclic_schedule_length(&s, nullptr), "time_steps");
  expect_invalid(flatmem_cyclic_schedule_action(&s, 0, 0, nullptr, sizeof(flatmem_cyclic_action)), "action");
}

TEST_CASE("cyclic/schedule/bad-input/struct_size-0") {
  flatmem_cyclic_schedule s = make_schedule(4, 2, 3, FLATMEM_CYCLIC_DELAY1);
  s.struct_size = 0;
  expect_schedule_refused(s, "struct_size");
}

TEST_CASE("cyclic/schedule/bad-input/world_size") {
  expect_schedule_refused(make_schedule(0, 2, 3, FLATMEM_CYCLIC_DELAY1), "world_size");
  expect_schedule_refused(make_schedule(-1, 2, 3, FLATMEM_CYCLIC_NEWEST), "world_size");
  expect_schedule_refused(make_schedule((1 << 20) + 1, 2, 3, FLATMEM_CYCLIC_SYNC), "world_size");
}

TEST_CASE("cyclic/schedule/bad-input/stages") {
  expect_schedule_refused(make_schedule(4, 0, 3, FLATMEM_CYCLIC_DELAY1), "stages");
  expect_schedule_refused(make_schedule(4, 65536, 3, FLATMEM_CYCLIC_DELAY1), "stages");
  expect_schedule_refused(make_schedule(4, -3, 3, FLATMEM_CYCLIC_SYNC), "stages");
}

TEST_CASE("cyclic/schedule/bad-input/steps") {
  expect_schedule_refused(make_schedule(4, 2, 0, FLATMEM_CYCLIC_DELAY1), "steps");
  expect_schedule_refused(make_schedule(4, 2, -1, FLATMEM_CYCLIC_NEWEST), "steps");
  expect_schedule_refused(make_schedule(4, 2, (std::int64_t(1) << 40) + 1, FLATMEM_CYCLIC_SYNC), "steps");
}

TEST_CASE("cyclic/schedule/bad-input/rule") {
  expect_schedule_refused(make_schedule(4, 2, 3, flatmem_cyclic_rule(7)), "rule");
  expect_schedule_refused(make_schedule(4, 2, 3, flatmem_cyclic_rule(-1)), "rule");
}

TEST_CASE("cyclic/schedule/bad-input/rank") {
  const flatmem_cyclic_schedule s = make_schedule(4, 2, 3, FLATMEM_CYCLIC_NEWEST);
  for (int rank : {-1, 4}) {
    CAPTURE(rank);
    std::int64_t offset = -12345;
    expect_invalid(flatmem_cyclic_schedule_offset(&s, rank, &offset), "rank");
    CHECK(offset == -12345);
    std::int32_t delay = -12345;
    expect_invalid(flatmem_cyclic_schedule_delay(&s, rank, 0, &delay), "rank");
    CHECK(delay == -12345);
    flatmem_cyclic_action a, before;
    std::memset(&a, 0x3c, sizeof a);
    std::memcpy(&before, &a, sizeof a);
    expect_invalid(flatmem_cyclic_schedule_action(&s, rank, 0, &a, sizeof(flatmem_cyclic_action)), "rank");
    CHECK(std::memcmp(&a, &before, sizeof a) == 0);
  }
}

TEST_CASE("cyclic/schedule/bad-input/stage") {
  const flatmem_cyclic_schedule s = make_schedule(4, 2, 3, FLATMEM_CYCLIC_NEWEST);
  for (int stage : {-1, 2}) {
    CAPTURE(stage);
    std::int32_t delay = -12345;
    expect_invalid(flatmem_cyclic_schedule_delay(&s, 1, stage, &delay), "stage");
    CHECK(std::string(flatmem_last_error()).find("stages") == std::string::npos);  // the argument, not the field
    CHECK(delay == -12345);
  }
}

TEST_CASE("cyclic/schedule/bad-input/time_step") {
  const flatmem_cyclic_schedule s = make_schedule(4, 2, 3, FLATMEM_CYCLIC_DELAY1);
  for (std::int64_t tau : {std::int64_t(-1), INT64_MIN}) {
    CAPTURE(tau);
    flatmem_cyclic_action a, before;
    std::memset(&a, 0x3c, sizeof a);
    std::memcpy(&before, &a, sizeof a);
    expect_invalid(flatmem_cyclic_schedule_action(&s, 0, tau, &a, sizeof(flatmem_cyclic_action)), "time_step");
    CHECK(std::memcmp(&a, &before, sizeof a) == 0);
  }
  // A good call afterwards clears the message.
  std::int64_t length = -1;
  CHECK(flatmem_cyclic_schedule_length(&s, &length) == FLATMEM_STATUS_SUCCESS);
  CHECK(std::string(flatmem_last_error()).empty());
}

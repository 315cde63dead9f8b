// Drives a cyclic schedule with synthetic gradients ("ramps": deterministic
// values per rank, stage, step and element) and records every update the
// handle returns, so that runs over different memory (host, device) or
// worlds can be compared bitwise with each other and with the average
// computed here from the header's definition. The buffers are behind
// RampBuffers: host vectors here, device memory in tests/cyclic/gpu.
#pragma once

#include <flatmem/flatmem.h>

#include <cstdint>
#include <cstring>
#include <exception>
#include <functional>
#include <iomanip>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "support/cyclic_train.hpp"

namespace test {

// Elements of stage j's gradient (several thousand: the device kernels run
// more than one block; different per stage).
inline std::int64_t ramp_size(int stage) { return 4099 + 1000 * std::int64_t(stage); }

// Element i of the gradient of rank r, stage j, step s: small values with
// many significant bits, so that the sums and the scaling round.
template <typename T>
T ramp_value(int rank, int stage, std::int64_t step, std::int64_t i) {
  const std::int64_t k = (i * 7 + stage * 13 + step * 5 + rank * 11) % 101 - 50;
  return T(double(k) * 0.0137 + 0.001 * double(rank + 1) + 1e-7 * double(i % 17));
}

template <typename T>
std::vector<T> ramp(int rank, int stage, std::int64_t step) {
  std::vector<T> v(std::size_t(ramp_size(stage)));
  for (std::size_t i = 0; i < v.size(); ++i) v[i] = ramp_value<T>(rank, stage, step, std::int64_t(i));
  return v;
}

// The average of flatmem/cyclic.h: ((g_0 + g_1) + g_2) + ... in T, then
// times 1/N rounded to T (N = 1: the gradient itself).
template <typename T>
std::vector<T> ramp_average(int world, int stage, std::int64_t step) {
  std::vector<T> sum = ramp<T>(0, stage, step);
  for (int r = 1; r < world; ++r) {
    const std::vector<T> g = ramp<T>(r, stage, step);
    for (std::size_t i = 0; i < sum.size(); ++i) sum[i] = sum[i] + g[i];
  }
  if (world > 1) {
    const T factor = T(1.0 / double(world));
    for (T &x : sum) x = x * factor;
  }
  return sum;
}

// Two gradient buffers per stage (DELAY1 / NEWEST keep step s in flight
// during the backward of s + 1): buffer (stage, step % 2).
template <typename T>
class RampBuffers {
 public:
  virtual ~RampBuffers() = default;
  virtual DLTensor *tensor(int stage, int parity) = 0;
  virtual void write(int stage, int parity, const std::vector<T> &values) = 0;
  virtual std::vector<T> read(int stage, int parity) = 0;
};

template <typename T>
class HostRampBuffers final : public RampBuffers<T> {
 public:
  explicit HostRampBuffers(int stages) : data_(std::size_t(2 * stages)), shapes_(data_.size()), tensors_(data_.size()) {
    for (int j = 0; j < stages; ++j)
      for (int p = 0; p < 2; ++p) {
        const std::size_t k = index(j, p);
        data_[k].assign(std::size_t(ramp_size(j)), T(0));
        shapes_[k] = ramp_size(j);
        tensors_[k] = vector_tensor<T>(data_[k].data(), &shapes_[k]);
      }
  }
  DLTensor *tensor(int stage, int parity) override { return &tensors_[index(stage, parity)]; }
  void write(int stage, int parity, const std::vector<T> &values) override { data_[index(stage, parity)] = values; }
  std::vector<T> read(int stage, int parity) override { return data_[index(stage, parity)]; }

 private:
  static std::size_t index(int stage, int parity) { return std::size_t(2 * stage + parity); }
  std::vector<std::vector<T>> data_;  // never resized after construction: the tensors point into it
  std::vector<std::int64_t> shapes_;
  std::vector<DLTensor> tensors_;
};

template <typename T>
struct RampUpdate {
  std::int32_t stage;
  std::int64_t step;
  std::vector<T> values;  // the buffer when flatmem_cyclic_next returned the update
};

// How a rank hands a gradient over (default: flatmem_cyclic_reduce). Runs on
// the rank's thread; a status other than SUCCESS ends the rank's run.
using RampHandOver = std::function<flatmem_status(flatmem_cyclic_t *, const flatmem_cyclic_action &, DLTensor *)>;

template <typename T>
struct RampRank {
  std::vector<RampUpdate<T>> updates;
  std::string error;                  // "" = the schedule ran to DONE
  flatmem_cyclic_action last{};       // the last action flatmem_cyclic_next returned
};

// One rank's schedule: at each BACKWARD writes ramp(rank, stage, step) into
// buffer (stage, step % 2) and hands it over; at each update reads it back.
template <typename T>
void drive_ramp(flatmem_cyclic_t *h, int rank, RampBuffers<T> &buffers, RampRank<T> &out,
                const RampHandOver &hand_over = nullptr) {
  for (;;) {
    flatmem_cyclic_action a{};
    const flatmem_status st = flatmem_cyclic_next(h, &a, sizeof(flatmem_cyclic_action));
    if (st != FLATMEM_STATUS_SUCCESS) {
      out.error = call_failed("flatmem_cyclic_next", st);
      return;
    }
    out.last = a;
    if (a.kind == FLATMEM_CYCLIC_DONE) return;
    if (a.update_stage >= 0)
      out.updates.push_back({a.update_stage, a.update_step, buffers.read(a.update_stage, int(a.update_step % 2))});
    if (a.kind != FLATMEM_CYCLIC_BACKWARD) continue;
    const int parity = int(a.step % 2);
    buffers.write(a.stage, parity, ramp<T>(rank, a.stage, a.step));
    DLTensor *t = buffers.tensor(a.stage, parity);
    const flatmem_status handed = hand_over ? hand_over(h, a, t) : flatmem_cyclic_reduce(h, a.stage, t);
    if (handed != FLATMEM_STATUS_SUCCESS) {
      out.error = call_failed("hand-over (flatmem_cyclic_reduce)", handed);
      return;
    }
  }
}

struct RampSetup {
  int stages = 3;
  std::int64_t steps = 4;
  flatmem_cyclic_rule rule = FLATMEM_CYCLIC_DELAY1;
  flatmem_cyclic_memory memory = FLATMEM_CYCLIC_MEMORY_HOST;
  flatmem_nonfinite_policy nonfinite = FLATMEM_NONFINITE_ERROR;
  std::int64_t timeout_ms = 20000;
};

// What each rank of a world needs besides the setup (defaults: host buffers,
// no device transport, flatmem_cyclic_reduce). Called on the rank's thread.
template <typename T>
struct RampRankSetup {
  std::function<flatmem_status(flatmem_comm_t *, int rank)> init_comm;  // e.g. flatmem_comm_init_device
  std::function<std::unique_ptr<RampBuffers<T>>(int rank)> buffers;
  std::function<RampHandOver(int rank)> hand_over;
};

// One rank of run_ramp_world, on its thread. Returns false when the rank
// gave up before create (then it released comm with flatmem_comm_abort, so
// that its peers fail fast instead of waiting for it).
template <typename T>
bool run_ramp_rank(const RampSetup &s, int r, flatmem_comm_t *comm, const RampRankSetup<T> &rank_setup,
                   RampRank<T> &out) {
  if (rank_setup.init_comm)
    if (const flatmem_status st = rank_setup.init_comm(comm, r); st != FLATMEM_STATUS_SUCCESS) {
      out.error = call_failed("init_comm (flatmem_comm_init_device)", st);
      flatmem_comm_abort(comm);
      return false;
    }
  // The buffers outlive the handle (it may still hold them when it is destroyed).
  const std::unique_ptr<RampBuffers<T>> buffers =
      rank_setup.buffers ? rank_setup.buffers(r) : std::make_unique<HostRampBuffers<T>>(s.stages);
  flatmem_cyclic_options o;
  flatmem_cyclic_options_init(&o, sizeof(flatmem_cyclic_options));
  o.stages = s.stages;
  o.steps = s.steps;
  o.rule = s.rule;
  o.timeout_ms = s.timeout_ms;
  o.nonfinite = s.nonfinite;
  o.memory = s.memory;
  flatmem_cyclic_t *h = nullptr;
  if (const flatmem_status st = flatmem_cyclic_create(&h, comm, &o); st != FLATMEM_STATUS_SUCCESS) {
    out.error = call_failed("flatmem_cyclic_create", st);
    return true;
  }
  const std::unique_ptr<flatmem_cyclic_t, flatmem_status (*)(flatmem_cyclic_t *)> handle(h, flatmem_cyclic_destroy);
  drive_ramp<T>(h, r, *buffers, out, rank_setup.hand_over ? rank_setup.hand_over(r) : RampHandOver());
  return true;
}

// `world` ranks on threads over an in-process group, one handle each.
template <typename T>
std::vector<RampRank<T>> run_ramp_world(const RampSetup &s, int world, const RampRankSetup<T> &rank_setup = {}) {
  std::vector<RampRank<T>> ranks(static_cast<std::size_t>(world));
  std::vector<flatmem_comm_t *> comms(static_cast<std::size_t>(world), nullptr);
  if (const flatmem_status st = flatmem_comm_create_local(comms.data(), world, nullptr); st != FLATMEM_STATUS_SUCCESS) {
    for (RampRank<T> &r : ranks) r.error = call_failed("flatmem_comm_create_local", st);
    return ranks;
  }
  std::vector<std::thread> threads;
  for (int r = 0; r < world; ++r)
    threads.emplace_back([&, r] {
      RampRank<T> &out = ranks[std::size_t(r)];
      flatmem_comm_t *comm = comms[std::size_t(r)];
      bool keeps_comm = true;
      try {
        keeps_comm = run_ramp_rank<T>(s, r, comm, rank_setup, out);
      } catch (const std::exception &e) {  // a failed CUDA call of the test's own buffers
        out.error = std::string("exception: ") + e.what();
        flatmem_comm_abort(comm);
        keeps_comm = false;
      }
      if (!keeps_comm) comms[std::size_t(r)] = nullptr;  // released already
    });
  for (std::thread &t : threads) t.join();
  for (flatmem_comm_t *c : comms) flatmem_comm_destroy(c);
  return ranks;
}

// Whether every (stage, step) of the schedule was updated exactly once, in a
// per-stage increasing step order; "" or what is wrong.
template <typename T>
std::string ramp_updates_complete(const std::vector<RampUpdate<T>> &updates, int stages, std::int64_t steps) {
  std::vector<std::int64_t> next_step(std::size_t(stages), 0);
  for (const RampUpdate<T> &u : updates) {
    if (u.stage < 0 || u.stage >= stages) return "update of stage " + std::to_string(u.stage);
    if (u.step != next_step[std::size_t(u.stage)])
      return "stage " + std::to_string(u.stage) + ": update of step " + std::to_string(u.step) + ", expected step " +
             std::to_string(next_step[std::size_t(u.stage)]);
    ++next_step[std::size_t(u.stage)];
  }
  for (int j = 0; j < stages; ++j)
    if (next_step[std::size_t(j)] != steps)
      return "stage " + std::to_string(j) + ": " + std::to_string(next_step[std::size_t(j)]) + " updates, expected " +
             std::to_string(steps);
  return "";
}

// Bitwise equality of two value vectors: "" or the first differing element.
template <typename T>
std::string ramp_bits_differ(const std::vector<T> &got, const std::vector<T> &want) {
  if (got.size() != want.size())
    return std::to_string(got.size()) + " elements, expected " + std::to_string(want.size());
  for (std::size_t i = 0; i < got.size(); ++i)
    if (std::memcmp(&got[i], &want[i], sizeof(T)) != 0) {
      std::ostringstream m;
      m << std::setprecision(17) << "element " << i << ": " << double(got[i]) << ", expected " << double(want[i]);
      return m.str();
    }
  return "";
}

}  // namespace test

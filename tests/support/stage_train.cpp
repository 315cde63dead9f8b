#include "support/stage_train.hpp"

#include <map>
#include <thread>

namespace test {
namespace {

#define STAGE_CALL(call)                                                  \
  do {                                                                    \
    const flatmem_status stage_call_status = (call);                      \
    if (stage_call_status != FLATMEM_STATUS_SUCCESS) return call_failed(#call, stage_call_status); \
  } while (0)

// flatmem_cyclic_stages_<which>(h, t), or calls.<which> when given (named
// as the plain call in errors).
#define STAGE_TENSOR_CALL(which, a, t)                                                       \
  do {                                                                                        \
    const flatmem_status stage_call_status =                                                  \
        calls.which ? calls.which(h, (a), (t)) : flatmem_cyclic_stages_##which(h, (t));       \
    if (stage_call_status != FLATMEM_STATUS_SUCCESS)                                          \
      return call_failed("flatmem_cyclic_stages_" #which, stage_call_status);                 \
  } while (0)

// What a stage keeps of one micro-batch between its forward and backward.
template <typename T>
struct Held {
  std::vector<T> x, y, dy;  // input, output, dL/doutput (last stage: from the loss)
};

}  // namespace

template <typename T>
std::string train_stage(flatmem_cyclic_stages_t *h, const TrainSetup &setup, int micro_batches, int stage,
                        StageRun<T> &run, const StageHook &hook, const StageCalls &calls) {
  const int L = setup.stages(), j = stage, rows = setup.rows;
  const std::size_t in = std::size_t(setup.widths[std::size_t(j)]), out = std::size_t(setup.widths[std::size_t(j) + 1]);
  StageMlp<T> model = StageMlp<T>::make(setup.widths, setup.seed);
  flatmem_cyclic_stages_schedule schedule = FLATMEM_CYCLIC_STAGES_SCHEDULE_INIT;
  STAGE_CALL(flatmem_cyclic_stages_get_schedule(h, &schedule, sizeof(flatmem_cyclic_stages_schedule)));
  std::int32_t K = 0;
  STAGE_CALL(flatmem_cyclic_stages_schedule_versions_kept(&schedule, j, &K));
  run.versions_kept = K;
  std::vector<std::vector<T>> slots(std::size_t(K), model.params[std::size_t(j)]);
  std::vector<std::int64_t> slot_version(std::size_t(K), -1);
  slot_version[0] = 0;
  std::map<std::int64_t, Held<T>> held;  // by s * N + m
  std::vector<T> average(model.param_count(j)), grad(model.param_count(j)), dx;
  std::int64_t grad_shape = std::int64_t(grad.size()), x_shape = std::int64_t(rows * in),
               y_shape = std::int64_t(rows * out);
  run.losses.assign(j + 1 == L ? std::size_t(micro_batches) : 0, {});
  const T lr = T(setup.lr);
  const auto use = [&](std::int64_t version) -> std::string {
    const std::size_t slot = std::size_t(version % K);
    if (slot_version[slot] != version)
      return "slot " + std::to_string(slot) + " holds version " + std::to_string(slot_version[slot]) +
             " but the action uses version " + std::to_string(version);
    model.params[std::size_t(j)] = slots[slot];
    return "";
  };
  for (;;) {
    flatmem_cyclic_stages_action a{};
    STAGE_CALL(flatmem_cyclic_stages_next(h, &a, sizeof(flatmem_cyclic_stages_action)));
    if (a.kind == FLATMEM_CYCLIC_DONE) break;
    if (a.update_step >= 0) {
      const std::int64_t v = a.update_step;
      DLTensor t = vector_tensor(average.data(), &grad_shape);
      STAGE_TENSOR_CALL(average, a, &t);
      const std::string e = use(v);
      if (!e.empty()) return "update: " + e;
      model.sgd(j, average.data(), lr);
      slots[std::size_t((v + 1) % K)] = model.params[std::size_t(j)];
      slot_version[std::size_t((v + 1) % K)] = v + 1;
    }
    const std::int64_t key = a.step * micro_batches + a.micro_batch;
    if (a.kind == FLATMEM_CYCLIC_FORWARD) {
      const std::string e = use(a.version);
      if (!e.empty()) return "forward: " + e;
      Held<T> &m = held[key];
      m.x.resize(std::size_t(rows) * in);
      m.y.resize(std::size_t(rows) * out);
      std::vector<T> target(j + 1 == L ? m.y.size() : 0);
      if (j == 0) {
        std::vector<T> t0(std::size_t(rows) * std::size_t(setup.widths.back()));
        task_batch<T>((a.step * micro_batches + a.micro_batch) * rows, rows, setup.widths[0],
                      setup.widths.back(), m.x.data(), t0.data());
        if (L == 1) target = t0;
      }
      if (j + 1 == L && L > 1) {
        std::vector<T> x0(std::size_t(rows) * std::size_t(setup.widths[0]));
        task_batch<T>((a.step * micro_batches + a.micro_batch) * rows, rows, setup.widths[0],
                      setup.widths.back(), x0.data(), target.data());
      }
      if (a.receives) {
        DLTensor t = vector_tensor(m.x.data(), &x_shape);
        STAGE_TENSOR_CALL(receive, a, &t);
      }
      model.forward(j, m.x.data(), m.y.data(), rows);
      if (j + 1 == L) {
        m.dy.resize(m.y.size());
        run.losses[std::size_t(a.micro_batch)].push_back(
            mse_loss<T>(m.y.data(), target.data(), rows, int(out), m.dy.data()));
      }
      if (a.sends) {
        DLTensor t = vector_tensor(m.y.data(), &y_shape);
        STAGE_TENSOR_CALL(send, a, &t);
      }
    } else if (a.kind == FLATMEM_CYCLIC_BACKWARD) {
      const std::string e = use(a.version);
      if (!e.empty()) return "backward: " + e;
      auto it = held.find(key);
      if (it == held.end()) return "backward before forward of micro-batch " + std::to_string(a.micro_batch);
      Held<T> &m = it->second;
      if (a.receives) {
        m.dy.resize(m.y.size());
        DLTensor t = vector_tensor(m.dy.data(), &y_shape);
        STAGE_TENSOR_CALL(receive, a, &t);
      }
      dx.resize(m.x.size());
      model.backward(j, m.x.data(), m.y.data(), m.dy.data(), j > 0 ? dx.data() : nullptr, grad.data(), rows);
      DLTensor g = vector_tensor(grad.data(), &grad_shape);
      STAGE_TENSOR_CALL(accumulate, a, &g);
      if (a.sends) {
        DLTensor t = vector_tensor(dx.data(), &x_shape);
        STAGE_TENSOR_CALL(send, a, &t);
      }
      held.erase(it);
    }
    if (hook) hook(a);
  }
  if (!held.empty()) return std::to_string(held.size()) + " micro-batches still held at DONE";
  const std::int64_t S = setup.steps;
  if (slot_version[std::size_t(S % K)] != S)
    return "at DONE slot " + std::to_string(S % K) + " holds version " +
           std::to_string(slot_version[std::size_t(S % K)]) + ", not " + std::to_string(S);
  run.params = slots[std::size_t(S % K)];
  return "";
}

StageOptions stage_options(const TrainSetup &setup, int micro_batches, std::size_t element_bytes,
                           std::int64_t timeout_ms) {
  StageOptions o{};
  flatmem_cyclic_stages_options_init(&o.options, sizeof(flatmem_cyclic_stages_options));
  const int L = setup.stages();
  for (int j = 0; j < L; ++j) {
    const std::int64_t rows = setup.rows, e = std::int64_t(element_bytes);
    if (j + 1 < L) o.boundary_bytes.push_back(rows * setup.widths[std::size_t(j) + 1] * e);
    o.activation_bytes.push_back(rows * (setup.widths[std::size_t(j)] + setup.widths[std::size_t(j) + 1]) * e);
  }
  o.options.stages = L;
  o.options.micro_batches = micro_batches;
  o.options.steps = setup.steps;
  o.options.rule = setup.rule;
  o.options.boundary_bytes = o.boundary_bytes.empty() ? nullptr : o.boundary_bytes.data();
  o.options.activation_bytes = o.activation_bytes.data();
  o.options.timeout_ms = timeout_ms;
  return o;
}

template <typename T>
StageTraining<T> train_stages_local(const TrainSetup &setup, int micro_batches, std::int64_t timeout_ms,
                                    const std::function<StageHook(int)> &hook,
                                    const std::function<StageCalls(int)> &calls) {
  const int L = setup.stages();
  StageTraining<T> out;
  out.runs.resize(std::size_t(L));
  out.errors.assign(std::size_t(L), "");
  out.summaries.assign(std::size_t(L), flatmem_cyclic_stages_summary{});
  out.stats.resize(std::size_t(L));
  std::vector<flatmem_comm_t *> comms(std::size_t(L), nullptr);
  if (flatmem_comm_create_local(comms.data(), L, nullptr) != FLATMEM_STATUS_SUCCESS) {
    out.errors[0] = std::string("flatmem_comm_create_local: ") + flatmem_last_error();
    return out;
  }
  std::vector<std::thread> threads;
  for (int j = 0; j < L; ++j)
    threads.emplace_back([&, j] {
      const std::size_t i = std::size_t(j);
      StageOptions o = stage_options(setup, micro_batches, sizeof(T), timeout_ms);
      flatmem_cyclic_stages_t *h = nullptr;
      if (flatmem_cyclic_stages_create(&h, comms[i], &o.options) != FLATMEM_STATUS_SUCCESS) {
        out.errors[i] = std::string("flatmem_cyclic_stages_create: ") + flatmem_last_error();
        return;
      }
      out.errors[i] = train_stage<T>(h, setup, micro_batches, j, out.runs[i], hook ? hook(j) : nullptr,
                                     calls ? calls(j) : StageCalls{});
      flatmem_cyclic_stages_summary_get(h, &out.summaries[i], sizeof(flatmem_cyclic_stages_summary));
      out.stats[i].resize(std::size_t(out.summaries[i].time_steps));
      std::int64_t written = 0;
      flatmem_cyclic_stages_stats(h, 0, std::int64_t(out.stats[i].size()), out.stats[i].data(), sizeof(flatmem_cyclic_stages_time_step_stats), &written);
      out.stats[i].resize(std::size_t(written));
      flatmem_cyclic_stages_destroy(h);
    });
  for (auto &t : threads) t.join();
  for (flatmem_comm_t *c : comms) flatmem_comm_destroy(c);
  return out;
}

template std::string train_stage<float>(flatmem_cyclic_stages_t *, const TrainSetup &, int, int, StageRun<float> &,
                                        const StageHook &, const StageCalls &);
template std::string train_stage<double>(flatmem_cyclic_stages_t *, const TrainSetup &, int, int, StageRun<double> &,
                                         const StageHook &, const StageCalls &);
template StageTraining<float> train_stages_local<float>(const TrainSetup &, int, std::int64_t,
                                                        const std::function<StageHook(int)> &,
                                                        const std::function<StageCalls(int)> &);
template StageTraining<double> train_stages_local<double>(const TrainSetup &, int, std::int64_t,
                                                          const std::function<StageHook(int)> &,
                                                          const std::function<StageCalls(int)> &);

}  // namespace test

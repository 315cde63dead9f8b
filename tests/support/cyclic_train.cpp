#include "support/cyclic_train.hpp"

#include <algorithm>
#include <array>
#include <sstream>

namespace test {

template <typename T>
DLTensor vector_tensor(T *data, std::int64_t *shape) {
  DLTensor t{};
  t.data = data;
  t.device = {kDLCPU, 0};
  t.ndim = 1;
  t.dtype = {kDLFloat, std::uint8_t(8 * sizeof(T)), 1};
  t.shape = shape;
  return t;
}

std::string call_failed(const char *call, flatmem_status status) {
  std::ostringstream s;
  s << call << ": " << flatmem_status_string(status) << ": " << flatmem_last_error();
  return s.str();
}

TrainSetup mlp_setup(int stages, std::int64_t steps, flatmem_cyclic_rule rule) {
  TrainSetup s;
  s.widths = {5};
  for (int j = 0; j < stages; ++j) s.widths.push_back(j + 1 == stages ? 3 : 4 + (j % 3));
  s.steps = steps;
  s.rule = rule;
  s.rows = 3;
  return s;
}

template DLTensor vector_tensor<float>(float *, std::int64_t *);
template DLTensor vector_tensor<double>(double *, std::int64_t *);

namespace {

template <typename T>
struct StepBuffers {
  const TrainSetup &setup;
  std::vector<std::vector<T>> acts;  // acts[j]: input of stage j; acts[L]: prediction
  std::vector<T> target, dprev, dnext;
  explicit StepBuffers(const TrainSetup &s) : setup(s), acts(std::size_t(s.stages()) + 1) {
    for (int j = 0; j <= s.stages(); ++j)
      acts[std::size_t(j)].resize(std::size_t(s.rows) * std::size_t(s.widths[std::size_t(j)]));
    target.resize(acts.back().size());
  }
  void load(std::int64_t step, int rank, int world) {
    const int L = setup.stages();
    task_batch<T>((step * world + rank) * setup.rows, setup.rows, setup.widths[0],
                  setup.widths[std::size_t(L)], acts[0].data(), target.data());
  }
  // Forward of stage j; after the last stage returns the loss (else 0) and
  // leaves dL/dprediction in dnext.
  double forward(const StageMlp<T> &m, int j) {
    m.forward(j, acts[std::size_t(j)].data(), acts[std::size_t(j) + 1].data(), setup.rows);
    if (!m.last(j)) return 0;
    dnext.resize(acts.back().size());
    return mse_loss<T>(acts.back().data(), target.data(), setup.rows,
                       setup.widths.back(), dnext.data());
  }
  // Backward of stage j (dnext holds dL/d output of j) into grad; dnext then
  // holds dL/d output of j - 1.
  void backward(const StageMlp<T> &m, int j, T *grad) {
    dprev.resize(acts[std::size_t(j)].size());
    m.backward(j, acts[std::size_t(j)].data(), acts[std::size_t(j) + 1].data(), dnext.data(),
               j > 0 ? dprev.data() : nullptr, grad, setup.rows);
    dnext.swap(dprev);
  }
};

// Whether `rank` applies the average of step s in step s + 1 (0) or s + 2 (1),
// from the definitions in flatmem/cyclic.h (independent of the library).
int rule_delay(const TrainSetup &setup, int rank, int world, int stage) {
  const std::int64_t period = 2 * setup.stages();
  switch (setup.rule) {
    case FLATMEM_CYCLIC_SYNC: return 0;
    case FLATMEM_CYCLIC_NEWEST: {
      const std::int64_t last = (world - 1) * period / world, mine = rank * period / world;
      // Complete the time step after rank N-1's backward of the stage in step 0;
      // needed at this rank's forward of the stage in step 1.
      const std::int64_t complete = last + (period - 1 - stage) + 1;
      const std::int64_t needed = mine + period + stage;
      return complete <= needed ? 0 : 1;
    }
    default: return 1;
  }
}

// The loop both parameter modes share: `model` computes; update(stage,
// gradient) applies an average; prepare(action) runs before a FORWARD /
// BACKWARD (the relay: fetch the stage into `model`) and returns "" or an error.
// `buffers_per_stage` gradient buffers per stage, used in turn by step: 2
// replicated (a step's gradient is in flight during the next step's backward),
// 1 relayed (its update comes before that backward: the header's claim, which
// the runtime's in-flight check would refuse if it were wrong).
template <typename T, typename Update, typename Prepare>
std::string drive(flatmem_cyclic_t *handle, const TrainSetup &setup, int rank, int world, StageMlp<T> &model,
                  std::vector<double> &losses, int buffers_per_stage, const Update &update,
                  const Prepare &prepare, const ActionHook &hook) {
  const int L = setup.stages();
  StepBuffers<T> buffers(setup);
  std::vector<std::array<std::vector<T>, 2>> grads(static_cast<std::size_t>(L));
  std::vector<std::int64_t> shapes(static_cast<std::size_t>(L));
  for (int j = 0; j < L; ++j) {
    shapes[std::size_t(j)] = std::int64_t(model.param_count(j));
    for (auto &g : grads[std::size_t(j)]) g.resize(model.param_count(j));
  }
  for (;;) {
    flatmem_cyclic_action a{};
    const flatmem_status st = flatmem_cyclic_next(handle, &a, sizeof(flatmem_cyclic_action));
    if (st != FLATMEM_STATUS_SUCCESS) return call_failed("flatmem_cyclic_next", st);
    if (a.kind == FLATMEM_CYCLIC_DONE) return "";
    if (a.update_stage >= 0)
      update(a.update_stage, grads[std::size_t(a.update_stage)][std::size_t(a.update_step % buffers_per_stage)].data());
    if (a.kind == FLATMEM_CYCLIC_FORWARD || a.kind == FLATMEM_CYCLIC_BACKWARD) {
      const std::string error = prepare(a);
      if (!error.empty()) return error;
    }
    if (a.kind == FLATMEM_CYCLIC_FORWARD) {
      if (a.stage == 0) buffers.load(a.step, rank, world);
      const double loss = buffers.forward(model, a.stage);
      if (a.stage == L - 1) losses.push_back(loss);
    } else if (a.kind == FLATMEM_CYCLIC_BACKWARD) {
      std::vector<T> &g = grads[std::size_t(a.stage)][std::size_t(a.step % buffers_per_stage)];
      buffers.backward(model, a.stage, g.data());
      DLTensor t = vector_tensor(g.data(), &shapes[std::size_t(a.stage)]);
      const flatmem_status rs = flatmem_cyclic_reduce(handle, a.stage, &t);
      if (rs != FLATMEM_STATUS_SUCCESS) return call_failed("flatmem_cyclic_reduce", rs);
    }
    if (hook) hook(a);
  }
}

}  // namespace

template <typename T>
std::string train_rank(flatmem_cyclic_t *handle, const TrainSetup &setup, int rank, int world,
                       RankRun<T> &run, const ActionHook &hook) {
  const T lr = T(setup.lr);
  return drive<T>(
      handle, setup, rank, world, run.model, run.losses, 2,
      [&](int stage, const T *grad) { run.model.sgd(stage, grad, lr); },
      [](const flatmem_cyclic_action &) { return std::string(); }, hook);
}

ShardRange shard_of(std::size_t n, int rank, int world) {
  const std::size_t c = (n + std::size_t(world) - 1) / std::size_t(world);
  return {std::min(std::size_t(rank) * c, n), std::min(std::size_t(rank + 1) * c, n)};
}

template <typename T>
RelayRun<T> RelayRun<T>::initial(const TrainSetup &setup, int rank, int world) {
  const StageMlp<T> m = StageMlp<T>::make(setup.widths, setup.seed);
  RelayRun<T> run;
  for (const std::vector<T> &p : m.params) {
    const ShardRange r = shard_of(p.size(), rank, world);
    run.shards.emplace_back(p.begin() + std::ptrdiff_t(r.begin), p.begin() + std::ptrdiff_t(r.end));
  }
  return run;
}

template <typename T>
std::string train_rank_relayed(flatmem_cyclic_t *handle, const TrainSetup &setup, int rank, int world,
                               RelayRun<T> &run, const ActionHook &hook, const RelayCalls &calls) {
  // The working model: stage j's parameters are whatever the relay delivered last.
  StageMlp<T> model = StageMlp<T>::make(setup.widths, setup.seed);
  for (auto &p : model.params) std::fill(p.begin(), p.end(), T(0));
  const int L = setup.stages();
  std::vector<std::int64_t> shard_shapes(static_cast<std::size_t>(L)), full_shapes(static_cast<std::size_t>(L));
  for (int j = 0; j < L; ++j) {
    shard_shapes[std::size_t(j)] = std::int64_t(run.shards[std::size_t(j)].size());
    full_shapes[std::size_t(j)] = std::int64_t(model.param_count(j));
    DLTensor t = vector_tensor(run.shards[std::size_t(j)].data(), &shard_shapes[std::size_t(j)]);
    const flatmem_status st = calls.set_shard ? calls.set_shard(handle, j, &t) : flatmem_cyclic_set_shard(handle, j, &t);
    if (st != FLATMEM_STATUS_SUCCESS) return call_failed("flatmem_cyclic_set_shard", st);
  }
  const T lr = T(setup.lr);
  const auto update = [&](int stage, const T *grad) {
    // The average is valid in this rank's range of the buffer: shard[i] -= lr * grad[begin + i].
    std::vector<T> &shard = run.shards[std::size_t(stage)];
    const ShardRange r = shard_of(model.param_count(stage), rank, world);
    for (std::size_t i = 0; i < shard.size(); ++i) shard[i] -= lr * grad[r.begin + i];
  };
  const auto prepare = [&](const flatmem_cyclic_action &a) {
    DLTensor t = vector_tensor(model.params[std::size_t(a.stage)].data(), &full_shapes[std::size_t(a.stage)]);
    const flatmem_status st = calls.parameters ? calls.parameters(handle, a, &t) : flatmem_cyclic_parameters(handle, &t);
    return st == FLATMEM_STATUS_SUCCESS ? std::string() : call_failed("flatmem_cyclic_parameters", st);
  };
  return drive<T>(handle, setup, rank, world, model, run.losses, 1, update, prepare, hook);
}

template <typename T>
StageMlp<T> assemble(const TrainSetup &setup, const std::vector<RelayRun<T>> &runs) {
  StageMlp<T> m = StageMlp<T>::make(setup.widths, setup.seed);
  for (std::size_t j = 0; j < m.params.size(); ++j) {
    m.params[j].clear();
    for (const RelayRun<T> &r : runs) m.params[j].insert(m.params[j].end(), r.shards[j].begin(), r.shards[j].end());
  }
  return m;
}

template <typename T>
std::vector<RankRun<T>> simulate(const TrainSetup &setup, int world) {
  const int L = setup.stages();
  const StageMlp<T> initial = StageMlp<T>::make(setup.widths, setup.seed);
  std::vector<RankRun<T>> runs(static_cast<std::size_t>(world), RankRun<T>{initial, {}});
  // average[s][j]
  std::vector<std::vector<std::vector<T>>> average;
  const T lr = T(setup.lr);
  const auto apply_due = [&](std::int64_t s) {  // updates before the forwards of step s
    for (int r = 0; r < world; ++r)
      for (int j = 0; j < L; ++j) {
        const std::int64_t u = s - 1 - rule_delay(setup, r, world, j);
        if (u >= 0 && u < setup.steps)
          runs[std::size_t(r)].model.sgd(j, average[std::size_t(u)][std::size_t(j)].data(), lr);
      }
  };
  for (std::int64_t s = 0; s < setup.steps; ++s) {
    apply_due(s);
    std::vector<std::vector<T>> sum(static_cast<std::size_t>(L));
    for (int r = 0; r < world; ++r) {
      StepBuffers<T> b(setup);
      b.load(s, r, world);
      RankRun<T> &run = runs[std::size_t(r)];
      double loss = 0;
      for (int j = 0; j < L; ++j) loss = b.forward(run.model, j);
      run.losses.push_back(loss);
      for (int j = L - 1; j >= 0; --j) {
        std::vector<T> g(run.model.param_count(j));
        b.backward(run.model, j, g.data());
        std::vector<T> &acc = sum[std::size_t(j)];
        if (r == 0) {
          acc = g;
        } else {
          for (std::size_t i = 0; i < g.size(); ++i) acc[i] = g[i] + acc[i];  // the chain's order
        }
      }
    }
    const T scale = T(1.0 / world);
    for (auto &acc : sum)
      for (T &v : acc) v *= scale;
    average.push_back(std::move(sum));
  }
  apply_due(setup.steps);
  apply_due(setup.steps + 1);
  return runs;
}

template <typename T>
StageMlp<T> train_concatenated(const TrainSetup &setup, int world) {
  TrainSetup big = setup;
  big.rows = setup.rows * world;
  StageMlp<T> m = StageMlp<T>::make(setup.widths, setup.seed);
  const int L = setup.stages();
  for (std::int64_t s = 0; s < setup.steps; ++s) {
    StepBuffers<T> b(big);
    b.load(s, 0, 1);  // rows s * world * rows .. : every rank's micro-batch of step s
    for (int j = 0; j < L; ++j) b.forward(m, j);
    for (int j = L - 1; j >= 0; --j) {
      std::vector<T> g(m.param_count(j));
      b.backward(m, j, g.data());
      m.sgd(j, g.data(), T(setup.lr));
    }
  }
  return m;
}

CyclicOptions relayed_options(const TrainSetup &setup, std::size_t element_bytes, std::int64_t timeout_ms) {
  CyclicOptions c = cyclic_options(setup, element_bytes, timeout_ms);
  for (int j = 0; j < setup.stages(); ++j)
    c.parameter_count.push_back(std::int64_t(setup.widths[std::size_t(j) + 1]) * (setup.widths[std::size_t(j)] + 1));
  c.options.parameters = FLATMEM_CYCLIC_PARAMETERS_RELAYED;
  c.options.parameter_count = c.parameter_count.data();
  return c;
}

CyclicOptions cyclic_options(const TrainSetup &setup, std::size_t element_bytes, std::int64_t timeout_ms) {
  CyclicOptions c{};
  flatmem_cyclic_options_init(&c.options, sizeof(flatmem_cyclic_options));
  for (int j = 0; j < setup.stages(); ++j)
    c.activation_bytes.push_back(std::int64_t(setup.rows) * setup.widths[std::size_t(j) + 1] *
                                 std::int64_t(element_bytes));
  c.options.stages = setup.stages();
  c.options.steps = setup.steps;
  c.options.rule = setup.rule;
  c.options.activation_bytes = c.activation_bytes.data();
  c.options.timeout_ms = timeout_ms;
  return c;
}

template std::string train_rank<float>(flatmem_cyclic_t *, const TrainSetup &, int, int, RankRun<float> &, const ActionHook &);
template std::string train_rank<double>(flatmem_cyclic_t *, const TrainSetup &, int, int, RankRun<double> &, const ActionHook &);
template std::string train_rank_relayed<float>(flatmem_cyclic_t *, const TrainSetup &, int, int, RelayRun<float> &, const ActionHook &,
                                              const RelayCalls &);
template std::string train_rank_relayed<double>(flatmem_cyclic_t *, const TrainSetup &, int, int, RelayRun<double> &, const ActionHook &,
                                               const RelayCalls &);
template struct RelayRun<float>;
template struct RelayRun<double>;
template StageMlp<float> assemble<float>(const TrainSetup &, const std::vector<RelayRun<float>> &);
template StageMlp<double> assemble<double>(const TrainSetup &, const std::vector<RelayRun<double>> &);
template std::vector<RankRun<float>> simulate<float>(const TrainSetup &, int);
template std::vector<RankRun<double>> simulate<double>(const TrainSetup &, int);
template StageMlp<float> train_concatenated<float>(const TrainSetup &, int);
template StageMlp<double> train_concatenated<double>(const TrainSetup &, int);

}  // namespace test

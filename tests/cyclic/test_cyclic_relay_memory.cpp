// The device entry points of the ZeRO relay (flatmem_cyclic_set_shard_stream,
// flatmem_cyclic_parameters_stream, kDLCUDA shards and stages) on a HOST
// relayed handle, without a GPU: a kDLCUDA tensor is INVALID_ARGUMENT naming
// options.memory with nothing registered or written, and the run then goes on
// to the replicated DELAY1 result; the _stream variants ignore the stream and
// give bitwise the plain calls' training. The device relay itself:
// tests/cyclic/gpu/test_gpu_cyclic_relay.cpp.
#include <doctest/doctest.h>

#include <cstring>
#include <string>
#include <vector>

#include "cyclic/local_run.hpp"
#include "cyclic/relay_run.hpp"

using namespace test;

namespace {

bool has(const std::string &text, const std::string &part) { return text.find(part) != std::string::npos; }

// Widths 5, 4, 5, 3 (stages of 24, 25, 18 elements); tiny() is relay_run.hpp's.
TrainSetup three_stages(std::int64_t steps) { return mlp_setup(3, steps, FLATMEM_CYCLIC_DELAY1); }

// Not a stream of any device: a host handle must ignore it (never dereference it).
void *const not_a_stream = reinterpret_cast<void *>(std::uintptr_t(0x5eed0));

std::string outcome(flatmem_status st) { return std::string(flatmem_status_string(st)) + ": " + flatmem_last_error(); }

template <typename T>
bool same_bits(const std::vector<T> &a, const std::vector<T> &b) {
  return a.size() == b.size() && (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0);
}

// The relay's results against the replicated DELAY1 run and the simulation of
// its rule (both independent of the relay): the assembled shards and the losses.
template <typename T>
void check_equals_replicated(const TrainSetup &setup, int world, const RelayTraining<T> &relayed) {
  const LocalTraining<T> replicated = train_local<T>(setup, world);
  const std::vector<RankRun<T>> simulated = simulate<T>(setup, world);
  const StageMlp<T> model = assemble(setup, relayed.runs);
  for (int r = 0; r < world; ++r) {
    CAPTURE(r);
    const auto i = std::size_t(r);
    REQUIRE_MESSAGE(replicated.errors[i] == "", replicated.errors[i]);
    CHECK(model.params == replicated.runs[i].model.params);
    CHECK(model.params == simulated[i].model.params);
    CHECK(relayed.runs[i].losses == replicated.runs[i].losses);
    CHECK(relayed.runs[i].losses == simulated[i].losses);
  }
}

// Per rank: what the refused calls answered, and whether anything changed.
struct Refusals {
  std::vector<std::string> shard;       // set_shard, set_shard_stream, per try
  std::vector<std::string> unregistered;  // the flatmem_cyclic_next after a refused stage
  std::vector<std::string> full;        // parameters, parameters_stream, per try
  int full_changed = 0;                 // refusals after which `full` was not what it was
  int served = 0;                       // real parameters calls after the refusals
};

template <typename T>
void check_device_tensors_refused(const TrainSetup &setup, int world) {
  CAPTURE(describe(setup, world));
  CAPTURE(sizeof(T));
  const int L = setup.stages();
  std::vector<Refusals> refusals(static_cast<std::size_t>(world));
  const RelayTraining<T> relayed = train_local_relayed<T>(setup, world, 20000, nullptr, [&](int r) {
    Refusals &out = refusals[std::size_t(r)];
    RelayCalls calls;
    calls.set_shard = [&out, L](flatmem_cyclic_t *h, std::int32_t stage, DLTensor *shard) {
      DLTensor cuda = *shard;  // host memory described as kDLCUDA: refused before it is looked at
      cuda.device = {kDLCUDA, 0};
      out.shard.push_back(outcome(flatmem_cyclic_set_shard(h, stage, &cuda)));
      out.shard.push_back(outcome(flatmem_cyclic_set_shard_stream(h, stage, &cuda, nullptr)));
      out.shard.push_back(outcome(flatmem_cyclic_set_shard_stream(h, stage, &cuda, not_a_stream)));
      // Nothing registered: the first time step still finds this stage without a shard
      // (stage 0: none registered yet; the last stage: all the others are).
      if (stage == 0 || stage == L - 1) {
        flatmem_cyclic_action a{};
        out.unregistered.push_back(outcome(flatmem_cyclic_next(h, &a, sizeof(flatmem_cyclic_action))));
      }
      return flatmem_cyclic_set_shard(h, stage, shard);
    };
    calls.parameters = [&out](flatmem_cyclic_t *h, const flatmem_cyclic_action &, DLTensor *full) {
      const T *p = static_cast<const T *>(full->data);
      const std::vector<T> before(p, p + full->shape[0]);
      DLTensor cuda = *full;
      cuda.device = {kDLCUDA, 0};
      for (int k = 0; k < 3; ++k) {
        const flatmem_status st = k == 0   ? flatmem_cyclic_parameters(h, &cuda)
                                  : k == 1 ? flatmem_cyclic_parameters_stream(h, &cuda, nullptr)
                                           : flatmem_cyclic_parameters_stream(h, &cuda, not_a_stream);
        out.full.push_back(outcome(st));
        if (!same_bits(before, std::vector<T>(p, p + full->shape[0]))) ++out.full_changed;
      }
      ++out.served;
      return flatmem_cyclic_parameters(h, full);  // the action is still unserved
    };
    return calls;
  });
  REQUIRE_MESSAGE(relayed.ok(), relayed.first_error());
  for (int r = 0; r < world; ++r) {
    CAPTURE(r);
    const Refusals &got = refusals[std::size_t(r)];
    REQUIRE(got.shard.size() == std::size_t(3 * L));
    for (const std::string &m : got.shard) {
      CHECK_MESSAGE(has(m, "FLATMEM_STATUS_INVALID_ARGUMENT: shard: device type 2"), m);
      CHECK_MESSAGE(has(m, "options.memory = HOST takes kDLCPU"), m);
    }
    REQUIRE(got.unregistered.size() == (L == 1 ? 1u : 2u));
    CHECK_MESSAGE(has(got.unregistered[0], "FLATMEM_STATUS_INVALID_ARGUMENT: flatmem_cyclic_next: stage 0 has no shard"),
                  got.unregistered[0]);
    CHECK_MESSAGE(has(got.unregistered.back(), "stage " + std::to_string(L - 1) + " has no shard"),
                  got.unregistered.back());
    // Every FORWARD and BACKWARD of the run: 2 L per step.
    CHECK(got.served == 2 * L * int(setup.steps));
    REQUIRE(got.full.size() == std::size_t(3 * got.served));
    for (const std::string &m : got.full) {
      CHECK_MESSAGE(has(m, "FLATMEM_STATUS_INVALID_ARGUMENT: full: device type 2"), m);
      CHECK_MESSAGE(has(m, "options.memory = HOST takes kDLCPU"), m);
    }
    CHECK(got.full_changed == 0);
  }
  check_equals_replicated(setup, world, relayed);
}

}  // namespace

TEST_CASE("cyclic/relay/memory: kDLCUDA shards and stages on a HOST relayed handle are INVALID_ARGUMENT naming "
          "options.memory, nothing registered or written, then the run equals the replicated one") {
  for (int world : {1, 2, 3}) {
    check_device_tensors_refused<double>(three_stages(3), world);
    check_device_tensors_refused<float>(three_stages(3), world);
  }
  check_device_tensors_refused<double>(mlp_setup(1, 2, FLATMEM_CYCLIC_DELAY1), 2);
  check_device_tensors_refused<float>(tiny(3), 4);
}

namespace {

// The relay with set_shard_stream / parameters_stream (`stream` per rank:
// NULL on even ranks, a value that is no stream on odd ones) against the plain
// calls: the same shards, losses and relay statistics, bit for bit.
template <typename T>
void check_stream_variants_equal_plain(const TrainSetup &setup, int world) {
  CAPTURE(describe(setup, world));
  CAPTURE(sizeof(T));
  const RelayTraining<T> plain = train_local_relayed<T>(setup, world);
  REQUIRE_MESSAGE(plain.ok(), plain.first_error());
  std::vector<int> stream_calls(static_cast<std::size_t>(world), 0);
  const RelayTraining<T> streamed = train_local_relayed<T>(setup, world, 20000, nullptr, [&](int r) {
    void *stream = r % 2 == 0 ? nullptr : not_a_stream;
    int &calls_made = stream_calls[std::size_t(r)];
    RelayCalls calls;
    calls.set_shard = [stream, &calls_made](flatmem_cyclic_t *h, std::int32_t stage, DLTensor *shard) {
      ++calls_made;
      return flatmem_cyclic_set_shard_stream(h, stage, shard, stream);
    };
    calls.parameters = [stream, &calls_made](flatmem_cyclic_t *h, const flatmem_cyclic_action &, DLTensor *full) {
      ++calls_made;
      return flatmem_cyclic_parameters_stream(h, full, stream);
    };
    return calls;
  });
  REQUIRE_MESSAGE(streamed.ok(), streamed.first_error());
  for (int r = 0; r < world; ++r) {
    CAPTURE(r);
    const auto i = std::size_t(r);
    CHECK(stream_calls[i] == setup.stages() + 2 * setup.stages() * int(setup.steps));
    REQUIRE(streamed.runs[i].shards.size() == plain.runs[i].shards.size());
    for (std::size_t j = 0; j < plain.runs[i].shards.size(); ++j) {
      CAPTURE(j);
      CHECK(same_bits(streamed.runs[i].shards[j], plain.runs[i].shards[j]));
    }
    CHECK(same_bits(streamed.runs[i].losses, plain.runs[i].losses));
    REQUIRE(streamed.relay_stats[i].size() == plain.relay_stats[i].size());
    for (std::size_t t = 0; t < plain.relay_stats[i].size(); ++t) {
      CAPTURE(t);
      CHECK(streamed.relay_stats[i][t].relay_bytes_sent == plain.relay_stats[i][t].relay_bytes_sent);
      CHECK(streamed.relay_stats[i][t].parameter_bytes_scheduled == plain.relay_stats[i][t].parameter_bytes_scheduled);
    }
    CHECK(streamed.summaries[i].shard_bytes == plain.summaries[i].shard_bytes);
    CHECK(streamed.summaries[i].staging_bytes == plain.summaries[i].staging_bytes);
    CHECK(streamed.summaries[i].relay_bytes_sent == plain.summaries[i].relay_bytes_sent);
  }
  // And both are the replicated training (an independent reference).
  check_equals_replicated(setup, world, streamed);
}

}  // namespace

TEST_CASE("cyclic/relay/memory: set_shard_stream and parameters_stream on a HOST relayed handle give bitwise the "
          "plain calls' training (N = 1..4, fp32 and fp64)") {
  for (int world : {1, 2, 3, 4}) {
    check_stream_variants_equal_plain<double>(three_stages(4), world);
    check_stream_variants_equal_plain<float>(three_stages(4), world);
    check_stream_variants_equal_plain<double>(tiny(3), world);
    check_stream_variants_equal_plain<float>(tiny(3), world);
  }
  // N > 2L (lockstep groups share an offset): the host relay takes these shapes.
  check_stream_variants_equal_plain<double>(mlp_setup(1, 3, FLATMEM_CYCLIC_DELAY1), 3);
}

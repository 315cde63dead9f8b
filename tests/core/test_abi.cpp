// The handle-free part of the C ABI: versions, status names, the per-thread
// last-error text, options initialisation and the create/destroy pair.
#include <doctest/doctest.h>
#include <flatmem/flatmem.h>

#include <cstdio>
#include <cstring>
#include <string>
#include <thread>

#include "support/contrastive.hpp"
#include "support/tensor.hpp"

using namespace flatmem_test;

namespace {

// A call that fails with INVALID_ARGUMENT and a message naming "handle".
flatmem_status failing_call() {
  std::size_t bytes = 0;
  return flatmem_contrastive_forward_workspace_size(nullptr, nullptr, nullptr, &bytes);
}

// A call that succeeds.
flatmem_status succeeding_call() {
  flatmem_contrastive_options o;
  return flatmem_contrastive_options_init(&o, sizeof(flatmem_contrastive_options));
}

}  // namespace

TEST_CASE("core/version/number-matches-header") {
  CHECK(flatmem_version() == FLATMEM_VERSION);
  CHECK(FLATMEM_VERSION == FLATMEM_VERSION_MAJOR * 10000 + FLATMEM_VERSION_MINOR * 100 + FLATMEM_VERSION_PATCH);
}

TEST_CASE("core/version/string-is-major.minor.patch") {
  char expected[64];
  std::snprintf(expected, sizeof expected, "%d.%d.%d", FLATMEM_VERSION_MAJOR, FLATMEM_VERSION_MINOR,
                FLATMEM_VERSION_PATCH);
  REQUIRE(flatmem_version_string() != nullptr);
  CHECK(std::string(flatmem_version_string()) == expected);
  // a static string: the same pointer every time
  CHECK(flatmem_version_string() == flatmem_version_string());
}

TEST_CASE("core/status/values-are-explicit") {
  CHECK(int(FLATMEM_STATUS_SUCCESS) == 0);
  CHECK(int(FLATMEM_STATUS_INVALID_ARGUMENT) == 1);
  CHECK(int(FLATMEM_STATUS_UNSUPPORTED) == 2);
  CHECK(int(FLATMEM_STATUS_OUT_OF_MEMORY) == 3);
  CHECK(int(FLATMEM_STATUS_WORKSPACE_TOO_SMALL) == 4);
  CHECK(int(FLATMEM_STATUS_NON_FINITE) == 5);
  CHECK(int(FLATMEM_STATUS_INTERNAL) == 6);
  CHECK(int(FLATMEM_STATUS_TIMEOUT) == 7);
  CHECK(int(FLATMEM_STATUS_PEER_FAILURE) == 8);
  CHECK(int(FLATMEM_STATUS_COMM_POISONED) == 9);
  CHECK(sizeof(flatmem_status) == 4);
}

TEST_CASE("core/status/string-for-every-status") {
  const struct {
    flatmem_status status;
    const char *name;
  } known[] = {
      {FLATMEM_STATUS_SUCCESS, "FLATMEM_STATUS_SUCCESS"},
      {FLATMEM_STATUS_INVALID_ARGUMENT, "FLATMEM_STATUS_INVALID_ARGUMENT"},
      {FLATMEM_STATUS_UNSUPPORTED, "FLATMEM_STATUS_UNSUPPORTED"},
      {FLATMEM_STATUS_OUT_OF_MEMORY, "FLATMEM_STATUS_OUT_OF_MEMORY"},
      {FLATMEM_STATUS_WORKSPACE_TOO_SMALL, "FLATMEM_STATUS_WORKSPACE_TOO_SMALL"},
      {FLATMEM_STATUS_NON_FINITE, "FLATMEM_STATUS_NON_FINITE"},
      {FLATMEM_STATUS_INTERNAL, "FLATMEM_STATUS_INTERNAL"},
      {FLATMEM_STATUS_TIMEOUT, "FLATMEM_STATUS_TIMEOUT"},
      {FLATMEM_STATUS_PEER_FAILURE, "FLATMEM_STATUS_PEER_FAILURE"},
      {FLATMEM_STATUS_COMM_POISONED, "FLATMEM_STATUS_COMM_POISONED"},
  };
  for (const auto &k : known) {
    CAPTURE(k.name);
    REQUIRE(flatmem_status_string(k.status) != nullptr);
    CHECK(std::string(flatmem_status_string(k.status)) == k.name);
  }
}

TEST_CASE("core/status/string-for-unknown-values") {
  for (int value : {10, 11, 100, -1, 0x7ffffffe, int(FLATMEM_STATUS_MAX)}) {
    CAPTURE(value);
    const char *name = flatmem_status_string(static_cast<flatmem_status>(value));
    REQUIRE(name != nullptr);
    CHECK(std::string(name) == "FLATMEM_STATUS_UNKNOWN");
  }
}

TEST_CASE("core/last-error/empty-before-any-call") {
  // A thread that never called flatmem has no error text.
  std::string seen = "unset";
  std::thread([&] { seen = flatmem_last_error(); }).join();
  CHECK(seen.empty());
}

TEST_CASE("core/last-error/set-on-failure-and-cleared-by-success") {
  REQUIRE(failing_call() == FLATMEM_STATUS_INVALID_ARGUMENT);
  const std::string message = flatmem_last_error();
  CHECK(message.find("handle") != std::string::npos);
  REQUIRE(succeeding_call() == FLATMEM_STATUS_SUCCESS);
  REQUIRE(flatmem_last_error() != nullptr);
  CHECK(std::string(flatmem_last_error()).empty());

  // A successful compute call clears it as well.
  REQUIRE(failing_call() != FLATMEM_STATUS_SUCCESS);
  Handle h = create_handle(make_options(FLATMEM_CONTRASTIVE_SYMMETRIC, 1));
  CHECK(std::string(flatmem_last_error()).empty());
  REQUIRE(failing_call() != FLATMEM_STATUS_SUCCESS);
  HostTensor q = HostTensor::matrix(Dtype::f32, 2, 3);
  std::size_t bytes = 0;
  REQUIRE(flatmem_contrastive_forward_workspace_size(h.get(), q.dl(), q.dl(), &bytes) == FLATMEM_STATUS_SUCCESS);
  CHECK(std::string(flatmem_last_error()).empty());
}

TEST_CASE("core/last-error/is-per-thread") {
  // Thread A fails and keeps its message while thread B succeeds, and B's
  // success neither clears A's text nor sees it.
  REQUIRE(failing_call() == FLATMEM_STATUS_INVALID_ARGUMENT);
  const std::string mine = flatmem_last_error();
  REQUIRE_FALSE(mine.empty());

  std::string other_before = "unset", other_after = "unset", other_failure;
  std::thread([&] {
    other_before = flatmem_last_error();
    (void)succeeding_call();
    other_after = flatmem_last_error();
    flatmem_contrastive_options bad = FLATMEM_CONTRASTIVE_OPTIONS_INIT;
    bad.num_threads = -1;
    flatmem_contrastive_t *h = nullptr;
    (void)flatmem_contrastive_create(&h, &bad);
    other_failure = flatmem_last_error();
  }).join();
  CHECK(other_before.empty());
  CHECK(other_after.empty());
  CHECK(other_failure.find("num_threads") != std::string::npos);
  // this thread's text is unchanged by the other thread's calls
  CHECK(std::string(flatmem_last_error()) == mine);
}

TEST_CASE("core/last-error/concurrent-threads-keep-their-own-text") {
  // Many threads failing with different messages at once: each reads its own.
  constexpr int threads = 8;
  std::string seen[threads];
  std::thread pool[threads];
  for (int t = 0; t < threads; ++t)
    pool[t] = std::thread([t, &seen] {
      for (int round = 0; round < 200; ++round) {
        flatmem_contrastive_options bad = FLATMEM_CONTRASTIVE_OPTIONS_INIT;
        if (t % 2) bad.tile_rows = -1 - t;
        else bad.num_threads = -1 - t;
        flatmem_contrastive_t *h = nullptr;
        (void)flatmem_contrastive_create(&h, &bad);
        std::string text = flatmem_last_error();
        const std::string expected = (t % 2 ? "tile_rows" : "num_threads");
        if (text.find(expected) == std::string::npos || text.find(std::to_string(-1 - t)) == std::string::npos) {
          seen[t] = "round " + std::to_string(round) + ": " + text;
          return;
        }
      }
      seen[t] = "ok";
    });
  for (auto &p : pool) p.join();
  for (int t = 0; t < threads; ++t) {
    CAPTURE(t);
    CHECK(seen[t] == "ok");
  }
}

TEST_CASE("core/options/init-function-equals-init-macro") {
  flatmem_contrastive_options from_macro = FLATMEM_CONTRASTIVE_OPTIONS_INIT;
  flatmem_contrastive_options from_function;
  std::memset(&from_function, 0x5A, sizeof from_function);
  REQUIRE(flatmem_contrastive_options_init(&from_function, sizeof(flatmem_contrastive_options)) == FLATMEM_STATUS_SUCCESS);
  CHECK(from_function.struct_size == sizeof(flatmem_contrastive_options));
  CHECK(from_macro.struct_size == sizeof(flatmem_contrastive_options));
  CHECK(from_function.loss == from_macro.loss);
  CHECK(from_function.num_threads == from_macro.num_threads);
  CHECK(from_function.tile_rows == from_macro.tile_rows);
  CHECK(from_function.tile_cols == from_macro.tile_cols);
  CHECK(from_function.nonfinite == from_macro.nonfinite);
  CHECK(from_function.comm == from_macro.comm);
  CHECK(from_function.logit_cache_bytes == from_macro.logit_cache_bytes);
  // and the defaults are the documented ones
  CHECK(from_macro.loss == FLATMEM_CONTRASTIVE_DEFAULT);
  CHECK(from_macro.num_threads == 0);
  CHECK(from_macro.tile_rows == 0);
  CHECK(from_macro.tile_cols == 0);
  CHECK(from_macro.nonfinite == FLATMEM_NONFINITE_ERROR);
  CHECK(from_macro.comm == nullptr);
  CHECK(from_macro.logit_cache_bytes == 0);
}

TEST_CASE("core/options/init-NULL-is-invalid") {
  CHECK(flatmem_contrastive_options_init(nullptr, sizeof(flatmem_contrastive_options)) == FLATMEM_STATUS_INVALID_ARGUMENT);
  CHECK(std::string(flatmem_last_error()).find("options") != std::string::npos);
}

TEST_CASE("core/handle/create-with-NULL-options-and-destroy") {
  flatmem_contrastive_t *h = nullptr;
  REQUIRE(flatmem_contrastive_create(&h, nullptr) == FLATMEM_STATUS_SUCCESS);
  CHECK(h != nullptr);
  CHECK(flatmem_contrastive_destroy(h) == FLATMEM_STATUS_SUCCESS);
}

TEST_CASE("core/handle/create-NULL-out-is-invalid") {
  flatmem_contrastive_options o = FLATMEM_CONTRASTIVE_OPTIONS_INIT;
  CHECK(flatmem_contrastive_create(nullptr, &o) == FLATMEM_STATUS_INVALID_ARGUMENT);
  CHECK(std::string(flatmem_last_error()).find("out") != std::string::npos);
}

TEST_CASE("core/handle/destroy-NULL-is-success") {
  REQUIRE(failing_call() != FLATMEM_STATUS_SUCCESS);
  CHECK(flatmem_contrastive_destroy(nullptr) == FLATMEM_STATUS_SUCCESS);
  CHECK(std::string(flatmem_last_error()).empty());
}

TEST_CASE("core/handle/many-handles-and-threads") {
  // Handles with 1..4 threads created and destroyed repeatedly (joins its
  // workers without hanging); distinct handles used from distinct threads.
  for (int round = 0; round < 3; ++round)
    for (int threads = 1; threads <= 4; ++threads) {
      Handle h = create_handle(make_options(FLATMEM_CONTRASTIVE_SYMMETRIC, threads));
      CHECK(h != nullptr);
    }
  std::thread workers[3];
  bool ok[3] = {false, false, false};
  for (int t = 0; t < 3; ++t)
    workers[t] = std::thread([t, &ok] {
      const flatmem_contrastive_options o = make_options(FLATMEM_CONTRASTIVE_SYMMETRIC, 2);
      flatmem_contrastive_t *raw = nullptr;
      if (flatmem_contrastive_create(&raw, &o) != FLATMEM_STATUS_SUCCESS) return;
      Handle h(raw);
      HostTensor q = HostTensor::matrix(Dtype::f32, 5 + t, 3);
      for (std::int64_t r = 0; r < q.rows(); ++r)
        for (std::int64_t c = 0; c < 3; ++c) q.set(r, c, 0.1 * double(r - c));
      HostTensor s = HostTensor::scalar(Dtype::f32, 2.0);
      HostTensor loss = HostTensor::scalar(Dtype::f32, 0.0);
      HostTensor row = HostTensor::vector(Dtype::f32, q.rows()), col = HostTensor::vector(Dtype::f32, q.rows());
      bool all = true;
      for (int i = 0; i < 20; ++i)
        all = all && flatmem_contrastive_forward(h.get(), q.dl(), q.dl(), nullptr, s.dl(), loss.dl(), row.dl(),
                                                 col.dl(), nullptr, 0, nullptr) == FLATMEM_STATUS_SUCCESS;
      ok[t] = all;
    });
  for (auto &w : workers) w.join();
  CHECK(ok[0]);
  CHECK(ok[1]);
  CHECK(ok[2]);
}

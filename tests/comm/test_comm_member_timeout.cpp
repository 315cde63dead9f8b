// Regression test (found by tests/fuzz/fuzz_comm_id): a member rank whose coordinator does
// not answer within connect_timeout_ms gets FLATMEM_STATUS_TIMEOUT -- and its process
// survives. The endpoint to the coordinator, still being set up, used to be left open
// when the bootstrap gave up; destroying the UCX worker under it aborted the process
// ("ucp_ep.c: Bug: pending request ... should have been flushed").
// The scenario: rank 0 has made the id (its listener is up) but has not called
// flatmem_comm_create yet, so nobody answers rank 1's hello. It runs in a fork()ed child
// so that an abort fails this test instead of killing the test program.
#include <doctest/doctest.h>
#include <flatmem/flatmem.h>

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>

namespace {

// The child: 0 when every attempt timed out with a message, 1 otherwise (UCX aborting
// the process shows as a signal instead).
int member_attempts() {
  ::setenv("UCX_TLS", "tcp,self", 1);
  ::setenv("UCX_NET_DEVICES", "lo", 1);
  ::setenv("UCX_WARN_UNUSED_ENV_VARS", "n", 1);
  flatmem_comm_unique_id id;
  if (flatmem_comm_unique_id_create("127.0.0.1:0", &id) != FLATMEM_STATUS_SUCCESS) {
    std::fprintf(stderr, "unique_id_create: %s\n", flatmem_last_error());
    return 1;
  }
  for (const std::int64_t connect_timeout_ms : {1, 2, 5, 20, 200}) {
    flatmem_comm_options o = FLATMEM_COMM_OPTIONS_INIT;
    o.connect_timeout_ms = connect_timeout_ms;
    flatmem_comm_t *comm = nullptr;
    const flatmem_status status = flatmem_comm_create(&comm, 1, 2, &id, &o);
    if (status != FLATMEM_STATUS_TIMEOUT || comm != nullptr || std::strlen(flatmem_last_error()) == 0) {
      std::fprintf(stderr, "connect_timeout_ms %lld: %s: %s\n", (long long)connect_timeout_ms,
                   flatmem_status_string(status), flatmem_last_error());
      return 1;
    }
  }
  return 0;
}

}  // namespace

TEST_CASE("comm/ucx/a member whose coordinator never answers times out and survives") {
  const pid_t child = fork();
  REQUIRE(child >= 0);
  if (child == 0) {
    std::fflush(nullptr);
    _exit(member_attempts());
  }
  int status = 0;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  pid_t done = 0;
  while ((done = waitpid(child, &status, WNOHANG)) == 0 && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  if (done == 0) {
    kill(child, SIGKILL);
    waitpid(child, &status, 0);
    FAIL("the member did not finish within 60 s");
  }
  INFO("child wait status " << status << (WIFSIGNALED(status) ? " (killed by a signal: UCX aborted?)" : ""));
  CHECK(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == 0);
}

#include "support/ranks.hpp"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <thread>

namespace test {
namespace {

using Clock = std::chrono::steady_clock;

bool write_all(int fd, const void *data, std::size_t n) {
  const char *p = static_cast<const char *>(data);
  while (n) {
    const ssize_t w = ::write(fd, p, n);
    if (w <= 0) return false;
    p += w;
    n -= std::size_t(w);
  }
  return true;
}

// Reads exactly n bytes within `ms`.
bool read_all(int fd, void *data, std::size_t n, int ms) {
  char *p = static_cast<char *>(data);
  const auto deadline = Clock::now() + std::chrono::milliseconds(ms);
  while (n) {
    pollfd pfd{fd, POLLIN, 0};
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
    if (left <= 0 || ::poll(&pfd, 1, int(left)) <= 0) return false;
    const ssize_t r = ::read(fd, p, n);
    if (r <= 0) return false;
    p += r;
    n -= std::size_t(r);
  }
  return true;
}

[[noreturn]] void child(int rank, int world, const Scenario &scenario, const std::vector<int> &id_pipes,
                        int report_fd, const MakeId &make_id) {
  RankSetup setup{rank, world, {}};
  std::string report;
  if (rank == 0) {
    if (make_id) {
      report = make_id(&setup.id);
    } else if (flatmem_comm_unique_id_create("127.0.0.1:0", &setup.id) != FLATMEM_STATUS_SUCCESS) {
      report = std::string("flatmem_comm_unique_id_create: ") + flatmem_last_error();
    }
    for (int r = 1; r < world; ++r) write_all(id_pipes[std::size_t(2 * r + 1)], &setup.id, sizeof setup.id);
  } else if (!read_all(id_pipes[std::size_t(2 * rank)], &setup.id, sizeof setup.id, 30000)) {
    report = "no unique id from rank 0";
  }
  if (report.empty()) report = scenario(setup);
  write_all(report_fd, report.data(), report.size());
  ::close(report_fd);
  std::_Exit(report.empty() ? 0 : 1);
}

}  // namespace

void use_loopback_ucx(const std::string &ucx_tls) {
  ::setenv("UCX_TLS", ucx_tls.c_str(), 1);
  ::setenv("UCX_NET_DEVICES", "lo", 1);
}

int free_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t length = sizeof a;
  ::bind(fd, reinterpret_cast<sockaddr *>(&a), sizeof a);
  ::getsockname(fd, reinterpret_cast<sockaddr *>(&a), &length);
  ::close(fd);
  return ntohs(a.sin_port);
}

std::vector<RankOutcome> run_ranks(int world, const Scenario &scenario, std::chrono::seconds limit,
                                   const std::string &ucx_tls, const MakeId &make_id) {
  std::vector<int> id_pipes(static_cast<std::size_t>(2 * world), -1);
  for (int r = 1; r < world; ++r) {
    if (::pipe(&id_pipes[std::size_t(2 * r)]) != 0) std::abort();
  }
  std::vector<pid_t> pids(static_cast<std::size_t>(world));
  std::vector<int> report_fds(static_cast<std::size_t>(world));
  const auto start = Clock::now();
  for (int r = 0; r < world; ++r) {
    int report[2];
    if (::pipe(report) != 0) std::abort();
    const pid_t pid = ::fork();
    if (pid == 0) {
      ::close(report[0]);
      use_loopback_ucx(ucx_tls);
      child(r, world, scenario, id_pipes, report[1], make_id);
    }
    ::close(report[1]);
    pids[std::size_t(r)] = pid;
    report_fds[std::size_t(r)] = report[0];
  }
  for (int fd : id_pipes)
    if (fd >= 0) ::close(fd);

  std::vector<RankOutcome> outcomes(static_cast<std::size_t>(world));
  std::vector<bool> finished(static_cast<std::size_t>(world), false);
  const auto deadline = start + limit;
  int left = world;
  while (left > 0) {
    for (int r = 0; r < world; ++r) {
      if (finished[std::size_t(r)]) continue;
      int status = 0;
      if (::waitpid(pids[std::size_t(r)], &status, WNOHANG) != pids[std::size_t(r)]) continue;
      RankOutcome &o = outcomes[std::size_t(r)];
      o.seconds = std::chrono::duration<double>(Clock::now() - start).count();
      if (WIFEXITED(status)) o.exit_code = WEXITSTATUS(status);
      if (WIFSIGNALED(status)) o.signal = WTERMSIG(status);
      finished[std::size_t(r)] = true;
      --left;
    }
    if (left > 0 && Clock::now() > deadline) {
      for (int r = 0; r < world; ++r)
        if (!finished[std::size_t(r)]) {
          outcomes[std::size_t(r)].overran = true;
          ::kill(pids[std::size_t(r)], SIGKILL);
        }
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  for (int r = 0; r < world; ++r) {
    char buffer[4096];
    ssize_t n;
    while ((n = ::read(report_fds[std::size_t(r)], buffer, sizeof buffer)) > 0)
      outcomes[std::size_t(r)].report.append(buffer, std::size_t(n));
    ::close(report_fds[std::size_t(r)]);
  }
  return outcomes;
}

flatmem_status create_comm(const RankSetup &setup, flatmem_comm_t **comm, long timeout_ms,
                           long connect_timeout_ms) {
  flatmem_comm_options options = FLATMEM_COMM_OPTIONS_INIT;
  options.timeout_ms = timeout_ms;
  options.connect_timeout_ms = connect_timeout_ms;
  return flatmem_comm_create(comm, setup.rank, setup.world, &setup.id, &options);
}

std::string failures(const std::vector<RankOutcome> &outcomes) {
  std::string text;
  for (std::size_t r = 0; r < outcomes.size(); ++r) {
    const RankOutcome &o = outcomes[r];
    std::string what;
    if (o.overran) what = "overran the time limit (hang?)";
    else if (o.signal) what = "killed by signal " + std::to_string(o.signal);
    else if (o.exit_code != 0) what = "exit " + std::to_string(o.exit_code) + (o.report.empty() ? "" : ": " + o.report);
    if (!what.empty()) text += (text.empty() ? "" : "; ") + ("rank " + std::to_string(r) + ": " + what);
  }
  return text;
}

std::string failures_besides_killed(const std::vector<RankOutcome> &outcomes, int killed) {
  std::vector<RankOutcome> others = outcomes;
  if (killed < 0 || std::size_t(killed) >= outcomes.size()) return "no rank " + std::to_string(killed);
  const RankOutcome &k = outcomes[std::size_t(killed)];
  if (k.signal != SIGKILL)
    return "rank " + std::to_string(killed) + " was to be killed but ended with exit " +
           std::to_string(k.exit_code) + ", signal " + std::to_string(k.signal) +
           (k.report.empty() ? "" : ": " + k.report);
  others[std::size_t(killed)] = RankOutcome{};
  others[std::size_t(killed)].exit_code = 0;
  std::string text = failures(others);
  for (std::size_t r = 0; r < others.size(); ++r)  // a report with exit 0 is a failure too
    if (others[r].exit_code == 0 && !others[r].report.empty())
      text += (text.empty() ? "" : "; ") + ("rank " + std::to_string(r) + ": " + others[r].report);
  return text;
}

}  // namespace test

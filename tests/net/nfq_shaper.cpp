// nfq_shaper: delay, jitter and loss for the packets of one NFQUEUE queue --
// what netem would do, for kernels built without it (CONFIG_NET_SCH_NETEM
// unset). scripts/test-netns.sh runs it inside its router namespace behind
//   iptables -A FORWARD -j NFQUEUE --queue-num Q
// so every packet between two test "hosts" passes through here once.
//
// Each queued packet is held and accepted at
//   release = max(arrival + delay + U(-jitter, +jitter), release of the flow's previous packet)
// where a flow is (source, destination, protocol, ports): the jitter varies
// the delay between flows and over time, but never reorders the segments of
// one TCP connection (reordering would only add duplicate ACKs and spurious
// retransmissions, which is not the network we want to emulate). A fraction
// `loss` of the packets is dropped on arrival. Random numbers come from a
// seeded splitmix64, so a run can be repeated.
//
// The shaper prints "ready" on stdout once the queue is bound (start the
// iptables rule after that) and, on SIGTERM / SIGINT, accepts what it still
// holds and prints its counts: packets, dropped, and the delay actually
// applied (min / mean / max), so a test can check that it shaped anything.
//
//   nfq_shaper --queue Q [--delay-ms D] [--jitter-ms J] [--loss P] [--seed S]
#include <arpa/inet.h>
#include <linux/netfilter.h>  // NF_ACCEPT, NF_DROP
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <libnetfilter_queue/libnetfilter_queue.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <queue>
#include <string>
#include <unordered_map>
#include <vector>

namespace {

volatile sig_atomic_t stop_requested = 0;
void on_signal(int) { stop_requested = 1; }

struct Options {
  int queue = 0;
  double delay_ms = 0.0, jitter_ms = 0.0, loss = 0.0;
  std::uint64_t seed = 1;
};

[[noreturn]] void usage(const char *why) {
  std::fprintf(stderr, "nfq_shaper: %s\nusage: nfq_shaper --queue Q [--delay-ms D] [--jitter-ms J] "
                       "[--loss P] [--seed S]\n", why);
  std::exit(2);
}

Options parse(int argc, char **argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (i + 1 >= argc) usage(("missing value after " + a).c_str());
    const char *v = argv[++i];
    if (a == "--queue") o.queue = std::atoi(v);
    else if (a == "--delay-ms") o.delay_ms = std::atof(v);
    else if (a == "--jitter-ms") o.jitter_ms = std::atof(v);
    else if (a == "--loss") o.loss = std::atof(v);
    else if (a == "--seed") o.seed = std::strtoull(v, nullptr, 10);
    else usage(("unknown option " + a).c_str());
  }
  if (o.delay_ms < 0 || o.jitter_ms < 0 || o.jitter_ms > o.delay_ms || o.loss < 0 || o.loss >= 1)
    usage("need 0 <= jitter <= delay and 0 <= loss < 1");
  return o;
}

std::int64_t now_ns() {
  timespec t{};
  clock_gettime(CLOCK_MONOTONIC, &t);
  return std::int64_t(t.tv_sec) * 1000000000 + t.tv_nsec;
}

// splitmix64; uniform() in [0, 1).
struct Random {
  std::uint64_t state;
  std::uint64_t next() {
    std::uint64_t z = (state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  double uniform() { return double(next() >> 11) * 0x1.0p-53; }
};

// The flow of an IPv4 packet: addresses, protocol and (TCP/UDP) ports; other
// packets (IPv6, fragments' tails) share one flow per header prefix.
std::uint64_t flow_key(const unsigned char *p, int length) {
  std::uint64_t h = 0xcbf29ce484222325ull;  // FNV-1a over the identifying bytes
  auto mix = [&](const unsigned char *bytes, int n) {
    for (int i = 0; i < n; ++i) h = (h ^ bytes[i]) * 0x100000001b3ull;
  };
  if (length >= 20 && (p[0] >> 4) == 4) {
    const int header = (p[0] & 0x0f) * 4, protocol = p[9];
    mix(p + 9, 1);
    mix(p + 12, 8);
    if ((protocol == IPPROTO_TCP || protocol == IPPROTO_UDP) && length >= header + 4) mix(p + header, 4);
  } else {
    mix(p, std::min(length, 40));
  }
  return h;
}

struct Held {
  std::int64_t release_ns, arrival_ns;
  std::uint64_t order;  // arrival order: equal release times keep it
  std::uint32_t id;
  bool operator>(const Held &o) const {
    return release_ns != o.release_ns ? release_ns > o.release_ns : order > o.order;
  }
};

struct Shaper {
  Options options;
  Random random;
  nfq_q_handle *queue = nullptr;
  std::priority_queue<Held, std::vector<Held>, std::greater<Held>> held;
  std::unordered_map<std::uint64_t, std::int64_t> flow_release;  // last release per flow
  std::uint64_t packets = 0, dropped = 0, delayed = 0, verdict_errors = 0;
  double delay_sum_ms = 0.0, delay_min_ms = 1e30, delay_max_ms = 0.0;  // as applied

  void verdict(std::uint32_t id, int verdict) {
    if (nfq_set_verdict(queue, id, std::uint32_t(verdict), 0, nullptr) < 0) ++verdict_errors;
  }

  void arrive(std::uint32_t id, const unsigned char *payload, int length) {
    ++packets;
    if (options.loss > 0 && random.uniform() < options.loss) {
      ++dropped;
      verdict(id, NF_DROP);
      return;
    }
    const std::int64_t now = now_ns();
    const double delay_ms = options.delay_ms + options.jitter_ms * (2.0 * random.uniform() - 1.0);
    std::int64_t release = now + std::int64_t(delay_ms * 1e6);
    std::int64_t &last = flow_release[flow_key(payload, length)];
    release = std::max(release, last);  // never ahead of the flow's previous packet
    last = release;
    held.push(Held{release, now, packets, id});
  }

  // Accepts every held packet due by `now` (all of them when `all`).
  void release_due(std::int64_t now, bool all) {
    while (!held.empty() && (all || held.top().release_ns <= now)) {
      const Held h = held.top();
      held.pop();
      if (!all) {  // the delay applied (not counting what a shutdown lets go early)
        const double ms = double(now_ns() - h.arrival_ns) * 1e-6;
        ++delayed;
        delay_sum_ms += ms, delay_min_ms = std::min(delay_min_ms, ms), delay_max_ms = std::max(delay_max_ms, ms);
      }
      verdict(h.id, NF_ACCEPT);
    }
  }
};

int on_packet(nfq_q_handle *, nfgenmsg *, nfq_data *data, void *user) {
  auto *shaper = static_cast<Shaper *>(user);
  const nfqnl_msg_packet_hdr *header = nfq_get_msg_packet_hdr(data);
  if (!header) return 0;
  unsigned char *payload = nullptr;
  const int length = nfq_get_payload(data, &payload);
  shaper->arrive(ntohl(header->packet_id), payload, std::max(length, 0));
  return 0;
}

void fail(const char *what) {
  std::fprintf(stderr, "nfq_shaper: %s failed: %s\n", what, std::strerror(errno));
  std::exit(1);
}

}  // namespace

int main(int argc, char **argv) {
  Shaper shaper;
  shaper.options = parse(argc, argv);
  shaper.random.state = shaper.options.seed;
  struct sigaction action {};
  action.sa_handler = on_signal;
  sigaction(SIGTERM, &action, nullptr);
  sigaction(SIGINT, &action, nullptr);

  nfq_handle *handle = nfq_open();
  if (!handle) fail("nfq_open");
  shaper.queue = nfq_create_queue(handle, std::uint16_t(shaper.options.queue), on_packet, &shaper);
  if (!shaper.queue) fail("nfq_create_queue (is another process bound to this queue?)");
  // Only the headers travel to us (the flow key); the kernel keeps the packet.
  if (nfq_set_mode(shaper.queue, NFQNL_COPY_PACKET, 80) < 0) fail("nfq_set_mode");
  // 20 ms of a fast veth is many packets: room for them in the kernel queue and the socket.
  if (nfq_set_queue_maxlen(shaper.queue, 1 << 16) < 0) fail("nfq_set_queue_maxlen");
  nfnl_rcvbufsiz(nfq_nfnlh(handle), 16u << 20);
  const int fd = nfq_fd(handle);
  const int on = 1;
  setsockopt(fd, SOL_NETLINK, NETLINK_NO_ENOBUFS, &on, sizeof on);
  std::printf("ready: queue %d, delay %.1f ms +- %.1f ms (uniform, order kept per flow), loss %.4f\n",
              shaper.options.queue, shaper.options.delay_ms, shaper.options.jitter_ms, shaper.options.loss);
  std::fflush(stdout);

  std::vector<char> buffer(1 << 16);
  while (!stop_requested) {
    const std::int64_t now = now_ns();
    shaper.release_due(now, false);
    timespec timeout{1, 0};  // wake up at the next release, or each second to see a signal
    if (!shaper.held.empty()) {
      const std::int64_t wait = std::max<std::int64_t>(0, shaper.held.top().release_ns - now);
      timeout = {time_t(wait / 1000000000), long(wait % 1000000000)};
    }
    pollfd p{fd, POLLIN, 0};
    const int ready = ppoll(&p, 1, &timeout, nullptr);
    if (ready < 0 && errno != EINTR) fail("ppoll");
    if (ready <= 0) continue;
    for (;;) {  // everything the socket holds now
      const ssize_t n = recv(fd, buffer.data(), buffer.size(), MSG_DONTWAIT);
      if (n < 0) {
        if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR && errno != ENOBUFS) fail("recv");
        break;
      }
      nfq_handle_packet(handle, buffer.data(), int(n));
    }
  }
  shaper.release_due(now_ns(), true);
  const std::uint64_t delayed = shaper.delayed;
  std::printf("nfq_shaper: queue %d: %llu packets, %llu dropped (%.2f%%), delay applied min %.2f / mean %.2f / "
              "max %.2f ms, %llu verdict errors\n",
              shaper.options.queue, (unsigned long long)shaper.packets, (unsigned long long)shaper.dropped,
              shaper.packets ? 100.0 * double(shaper.dropped) / double(shaper.packets) : 0.0,
              delayed ? shaper.delay_min_ms : 0.0, delayed ? shaper.delay_sum_ms / double(delayed) : 0.0,
              shaper.delay_max_ms, (unsigned long long)shaper.verdict_errors);
  nfq_destroy_queue(shaper.queue);
  nfq_close(handle);
  return 0;
}

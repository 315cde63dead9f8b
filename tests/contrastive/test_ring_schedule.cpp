// The ring schedule (src/contrastive/ring/schedule.cpp) on its own, for every
// rank of rings of 1..6 ranks with uneven column counts, through a transport
// that records instead of moving bytes. It checks what the backends rely on:
//  - pairing: exchange k of rank r sends exactly what exchange k of rank r + 1
//    receives (kind, step, bytes, in order). A transport that issues each
//    exchange as one NCCL group is then deadlock-free: every rank issues the
//    same sequence of groups and each group's peers are in their same group;
//  - hazards: no buffer is received into, folded into or written by a step
//    while an exchange that reads or writes it is still in flight; what a step
//    or a fold reads has arrived (its exchange was waited for);
//  - blocks: step t holds owner (r - t) mod n's block with its column offset;
//    the relayed item goes round through the transport even with one rank and
//    relayed_result() is the last one received; every exchange is waited for.
// The values the schedule produces are the CPU ring's (test_ring.cpp etc.).
#include <doctest/doctest.h>

#include <algorithm>
#include <cstdint>
#include <map>
#include <set>
#include <span>
#include <string>
#include <vector>

#include "contrastive/ring/schedule.hpp"

namespace ring = flatmem::contrastive::ring;

namespace {

struct Transfer {
  ring::Message kind;
  int step;
  std::size_t bytes;
  bool operator==(const Transfer &) const = default;
};

struct Posted {
  std::vector<Transfer> sends, receives;
  std::vector<const void *> buffers;  // every buffer it reads or writes
  std::vector<void *> received;       // the receive buffers
  bool waited = false;
};

struct RecordedExchange final : ring::Exchange {
  int index;
  explicit RecordedExchange(int i) : index(i) {}
};

class RecordingTransport final : public ring::Transport {
 public:
  RecordingTransport(int ranks, int rank) : ranks_(ranks), rank_(rank) {}
  int ranks() const override { return ranks_; }
  int rank() const override { return rank_; }

  ring::ExchangePtr exchange(int step, std::span<const ring::Outgoing> sends,
                             std::span<const ring::Incoming> receives) override {
    Posted p;
    for (const ring::Outgoing &o : sends) {
      p.sends.push_back({o.kind, step, o.bytes});
      p.buffers.push_back(o.data);
    }
    for (const ring::Incoming &i : receives) {
      CHECK_MESSAGE(!in_flight(i.data), "rank ", rank_, " step ", step, ": receive into a buffer in flight");
      p.receives.push_back({i.kind, step, i.bytes});
      p.buffers.push_back(i.data);
      p.received.push_back(i.data);
    }
    posted.push_back(p);
    return std::make_unique<RecordedExchange>(int(posted.size()) - 1);
  }

  void wait(ring::ExchangePtr &e) override {
    if (!e) return;
    Posted &p = posted[std::size_t(static_cast<RecordedExchange &>(*e).index)];
    CHECK(!p.waited);
    p.waited = true;
    for (void *b : p.received) arrived.insert(b);
    e.reset();
  }

  bool in_flight(const void *buffer) const {
    for (const Posted &p : posted)
      if (!p.waited && std::find(p.buffers.begin(), p.buffers.end(), buffer) != p.buffers.end())
        return true;
    return false;
  }
  // The last exchange that received into `buffer` has been waited for.
  bool has_arrived(const void *buffer) const {
    for (auto p = posted.rbegin(); p != posted.rend(); ++p)
      if (std::find(p->received.begin(), p->received.end(), buffer) != p->received.end())
        return p->waited;
    return false;
  }

  std::vector<Posted> posted;
  std::set<const void *> arrived;

 private:
  int ranks_, rank_;
};

ring::Layout layout_of(const std::vector<std::int64_t> &cols, int rank) {
  ring::Layout l;
  l.ranks = int(cols.size());
  l.rank = rank;
  for (std::int64_t c : cols) {
    l.rows.push_back(c);
    l.cols.push_back(c);
    l.row_offset.push_back(l.global_rows);
    l.col_offset.push_back(l.global_cols);
    l.global_rows += c;
    l.global_cols += c;
    l.max_cols = std::max(l.max_cols, c);
  }
  return l;
}

// One rank's run: blocks (and optionally a second carried item) plus,
// optionally, a relayed item. Returns the rank's recorded exchanges.
std::vector<Posted> run_rank(const std::vector<std::int64_t> &cols, int rank, bool second,
                             bool relayed) {
  const ring::Layout l = layout_of(cols, rank);
  RecordingTransport transport(l.ranks, rank);
  char own_block[1], own_lse[1], block_transit[2][1], lse_transit[2][1];
  char fresh[1], relay_transit[2][1];
  std::vector<ring::Carried> carried{
      ring::Carried{ring::Message::column_block, own_block, {block_transit[0], block_transit[1]}, 6}};
  if (second)
    carried.push_back(ring::Carried{ring::Message::column_lse, own_lse, {lse_transit[0], lse_transit[1]}, 4});
  int folds = 0;
  std::optional<ring::Relayed> relay;
  if (relayed)
    relay = ring::Relayed{ring::Message::dk_partial, fresh, {relay_transit[0], relay_transit[1]}, 20,
                          [&](void *into, const void *mine, std::int64_t n, bool first) {
                            CHECK(mine == fresh);
                            CHECK(first == (folds == 0));
                            CHECK(n == l.cols[std::size_t(l.block_owner(folds))]);
                            CHECK_MESSAGE(!transport.in_flight(into), "fold into a buffer in flight");
                            // after the first, into holds what arrived from r - 1
                            if (!first) CHECK(transport.has_arrived(into));
                            ++folds;
                          }};
  ring::Schedule schedule(transport, l, carried, relay);
  int steps = 0;
  schedule.run([&](const ring::Step &s) {
    CHECK(s.t == steps);
    CHECK(s.owner == ((rank - s.t) % l.ranks + l.ranks) % l.ranks);
    CHECK(s.cols == cols[std::size_t(s.owner)]);
    CHECK(s.col_offset == l.col_offset[std::size_t(s.owner)]);
    for (std::size_t i = 0; i < carried.size(); ++i) {
      if (s.t == 0) {
        CHECK(s.carried[i] == carried[i].own);
      } else {
        CHECK(s.carried[i] == carried[i].transit[s.t % 2]);
        CHECK(transport.has_arrived(s.carried[i]));
      }
    }
    if (relayed) CHECK_MESSAGE(!transport.in_flight(fresh), "the step writes fresh while it is in flight");
    ++steps;
  });
  CHECK(steps == l.ranks);
  CHECK(folds == (relayed ? l.ranks : 0));
  for (const Posted &p : transport.posted) CHECK(p.waited);
  if (relayed) {
    CHECK(schedule.relayed_result() == relay_transit[l.ranks % 2]);
    CHECK(transport.has_arrived(schedule.relayed_result()));
    // the last transfer this rank receives is its own columns' relayed item
    const Posted &last = transport.posted.back();
    REQUIRE(last.receives.size() == 1);
    CHECK(last.receives[0] == Transfer{ring::Message::dk_partial, l.ranks, std::size_t(20 * cols[std::size_t(rank)])});
  } else {
    CHECK(schedule.relayed_result() == nullptr);
  }
  return transport.posted;
}

}  // namespace

TEST_CASE("contrastive/ring/schedule: exchanges pair up rank to rank, no buffer hazards") {
  const std::vector<std::vector<std::int64_t>> layouts = {
      {5}, {3, 3}, {1, 7}, {4, 1, 6}, {2, 2, 2, 2}, {7, 1, 3, 5, 2}, {1, 1, 9, 1, 1, 4}};
  for (const auto &cols : layouts)
    for (int variant = 0; variant < 4; ++variant) {
      const bool second = variant & 1, relayed = variant & 2;
      const int n = int(cols.size());
      CAPTURE(n);
      CAPTURE(second);
      CAPTURE(relayed);
      std::vector<std::vector<Posted>> all;
      for (int r = 0; r < n; ++r) all.push_back(run_rank(cols, r, second, relayed));
      const std::size_t per_carried = std::size_t(n - 1), per_relay = relayed ? std::size_t(n) : 0;
      for (int r = 0; r < n; ++r) {
        CAPTURE(r);
        const auto &mine = all[std::size_t(r)], &next = all[std::size_t((r + 1) % n)];
        CHECK(mine.size() == per_carried + per_relay);
        REQUIRE(mine.size() == next.size());
        for (std::size_t k = 0; k < mine.size(); ++k) {
          CAPTURE(k);
          CHECK(mine[k].sends == next[k].receives);
          CHECK(!mine[k].sends.empty());
        }
      }
    }
}

// The host ChainIo: host buffers over the communicator's host transport (UCX
// or the in-process group), in the cyclic tag space. See chain_io.hpp.
#include "cyclic/chain_io.hpp"

#include <chrono>
#include <vector>

#include "cyclic/kept.hpp"

namespace flatmem::cyclic {
namespace {

// The chains wait without a deadline of their own (see chain_io.hpp); a day
// is "forever" for the transports' deadline arithmetic.
constexpr comm::Milliseconds no_deadline = std::chrono::hours(24);

class HostChainIo final : public ChainIo {
 public:
  explicit HostChainIo(comm::Communicator &comm) : comm_(comm) {}

  std::int64_t prepare(const Gradient &g, bool scan) override {
    // The caller scanned host gradients at hand-over (it fails there at once).
    (void)g;
    (void)scan;
    return -1;
  }

  void exchange(std::span<const Transfer> transfers) override {
    std::vector<comm::TransferPtr> posted;
    posted.reserve(transfers.size());
    for (const Transfer &t : transfers)
      posted.push_back(t.send ? comm_.send(t.peer, t.data, t.bytes, comm::Space::cyclic, t.tag)
                              : comm_.recv(t.peer, t.data, t.bytes, comm::Space::cyclic, t.tag));
    // In order; a failure poisons the communicator, which cancels the rest.
    for (std::size_t i = 0; i < posted.size(); ++i) comm_.wait_all({posted[i]}, no_deadline, transfers[i].what);
  }

  void receive_add(Gradient &g, int peer, std::uint64_t tag, const std::string &what) override {
    if (scratch_.size() < g.bytes) scratch_.resize(g.bytes);
    const Transfer t{false, peer, scratch_.data(), g.bytes, tag, what};
    exchange({&t, 1});
    comm::add_into(g.type, g.data, scratch_.data(), g.count);
  }

  void average(Gradient &g, std::int64_t n) override { to_average(g.type, g.data, g.count, n); }

  void all_reduce(Gradient &g, std::uint64_t tag, const std::string &what) override {
    comm_.all_reduce_sum_tagged(g.data, g.data, g.count, g.type, no_deadline, what, comm::Space::cyclic, tag);
  }

  void finish(const std::string &) override {}

 private:
  comm::Communicator &comm_;
  std::vector<char> scratch_;
};

}  // namespace

std::unique_ptr<ChainIo> host_chain_io(comm::Communicator &comm) { return std::make_unique<HostChainIo>(comm); }

}  // namespace flatmem::cyclic

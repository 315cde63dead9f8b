#include "comm/local/local_comm.hpp"

#include "core/error.hpp"

namespace flatmem::comm::local {

LocalCommunicator::LocalCommunicator(std::shared_ptr<LocalGroup> group, int rank)
    : group_(std::move(group)), rank_(rank) {}

LocalCommunicator::~LocalCommunicator() { group_->leave(rank_); }

void LocalCommunicator::check_peer(int peer, const char *operation) const {
  if (peer < 0 || peer >= size())
    invalid(operation, ": peer ", peer, " is outside 0 .. ", size() - 1, " (world size ", size(),
            ")");
}

TransferPtr LocalCommunicator::send(int peer, const void *data, std::size_t bytes, Space space,
                                    std::uint64_t tag) {
  check_healthy();
  check_peer(peer, "send");
  return group_->post(rank_, true, peer, data, nullptr, bytes, space, tag);
}

TransferPtr LocalCommunicator::recv(int peer, void *data, std::size_t bytes, Space space,
                                    std::uint64_t tag) {
  check_healthy();
  check_peer(peer, "receive");
  return group_->post(rank_, false, peer, nullptr, data, bytes, space, tag);
}

void LocalCommunicator::wait(const TransferPtr &transfer, Milliseconds timeout,
                             const std::string &what) {
  if (!transfer) invalid(what, ": no transfer to wait for");
  group_->wait(rank_, static_cast<LocalTransfer &>(*transfer), timeout, what);
}

bool LocalCommunicator::test(const TransferPtr &transfer) {
  if (!transfer) invalid("test: no transfer");
  return group_->test(static_cast<const LocalTransfer &>(*transfer));
}

std::vector<std::unique_ptr<Communicator>> create_group(int world_size,
                                                        Milliseconds default_timeout) {
  auto group = std::make_shared<LocalGroup>(world_size, default_timeout);
  std::vector<std::unique_ptr<Communicator>> ranks;
  ranks.reserve(std::size_t(world_size));
  for (int r = 0; r < world_size; ++r)
    ranks.push_back(std::make_unique<LocalCommunicator>(group, r));
  return ranks;
}

}  // namespace flatmem::comm::local

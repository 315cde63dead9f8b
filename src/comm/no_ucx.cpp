// A library built without UCX (FLATMEM_WITH_UCX=OFF or libucx-dev absent):
// the UCX communicator entry points say so.
#include "comm/create.hpp"
#include "core/error.hpp"

namespace flatmem::comm {
namespace {
[[noreturn]] void no_ucx(const char *function) {
  fail(FLATMEM_STATUS_UNSUPPORTED, function,
       ": this flatmem was built without UCX (FLATMEM_WITH_UCX; Debian: libucx-dev); "
       "flatmem_comm_create_local still works");
}
}  // namespace

flatmem_comm_unique_id make_unique_id(const char *) { no_ucx("flatmem_comm_unique_id_create"); }
std::unique_ptr<Communicator> create_ucx(int, int, const flatmem_comm_unique_id &, const Config &) {
  no_ucx("flatmem_comm_create");
}
std::unique_ptr<Communicator> create_ucx_from_env(const Config &) {
  no_ucx("flatmem_comm_create_from_env");
}

}  // namespace flatmem::comm

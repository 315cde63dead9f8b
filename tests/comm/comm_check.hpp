// Helpers for scenarios that run inside rank processes: instead of doctest
// assertions (which belong to the parent), they build the report string.
#pragma once

#include <flatmem/flatmem.h>

#include <sstream>
#include <string>

#define RANK_EXPECT(cond, ...)                                                              \
  do {                                                                                      \
    if (!(cond)) {                                                                          \
      std::ostringstream rank_expect_text;                                                  \
      rank_expect_text << __FILE__ << ":" << __LINE__ << ": " << #cond << " -- " << __VA_ARGS__; \
      return rank_expect_text.str();                                                        \
    }                                                                                       \
  } while (0)

// Expects SUCCESS; otherwise returns the call, the status and the message.
#define RANK_OK(call)                                                                       \
  do {                                                                                      \
    const flatmem_status rank_ok_status = (call);                                           \
    RANK_EXPECT(rank_ok_status == FLATMEM_STATUS_SUCCESS,                                   \
                flatmem_status_string(rank_ok_status) << ": " << flatmem_last_error());     \
  } while (0)

namespace test {

// A compact host DLTensor over `data` of n elements of (code, bits).
inline DLTensor host_tensor(void *data, std::int64_t *shape, DLDataTypeCode code, int bits) {
  DLTensor t{};
  t.data = data;
  t.device = {kDLCPU, 0};
  t.ndim = 1;
  t.dtype = {std::uint8_t(code), std::uint8_t(bits), 1};
  t.shape = shape;
  return t;
}

}  // namespace test

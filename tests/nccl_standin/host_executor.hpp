// The NCCL stand-in's executor on the host, for its CPU tests: buffers are
// host memory, work is done at once (streams and markers are ignored).
#pragma once

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <string>

#include "nccl_standin/standin_engine.hpp"

namespace nccl_standin {

class HostExecutor final : public Executor {
 public:
  Token mark(void *) override { return nullptr; }
  void wait(void *, Token) override {}
  void release(Token) override {}
  void copy(void *dst, const void *src, std::size_t bytes, void *) override { std::memcpy(dst, src, bytes); }
  void *stage(const void *src, std::size_t bytes, void *) override {
    void *staged = std::malloc(bytes);
    if (staged == nullptr) throw std::runtime_error("host executor: out of memory");
    std::memcpy(staged, src, bytes);
    return staged;
  }
  void drop(void *staged, void *) override { std::free(staged); }
  void add(void *dst, const void *src, std::size_t count, ElementType type, void *) override {
    switch (type) {
      case ElementType::f64: return add_as<double>(dst, src, count);
      case ElementType::i32: return add_as<std::int32_t>(dst, src, count);
      default: throw std::runtime_error(std::string("host executor: no sum of ") + element_name(type));
    }
  }

 private:
  template <typename T>
  static void add_as(void *dst, const void *src, std::size_t count) {
    for (std::size_t i = 0; i < count; ++i) static_cast<T *>(dst)[i] += static_cast<const T *>(src)[i];
  }
};

}  // namespace nccl_standin

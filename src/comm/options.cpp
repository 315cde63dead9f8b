#include "comm/options.hpp"

#include <cstdlib>
#include <string>

#include "core/options.hpp"

namespace flatmem::comm {
namespace {

constexpr std::int64_t max_ms = 24LL * 3600 * 1000;

Milliseconds checked(std::int64_t value, const char *name) {
  if (value <= 0 || value > max_ms)
    invalid(name, ": ", value, " ms; expected 1 .. ", max_ms, " (a day), or 0 for the default");
  return Milliseconds(value);
}

// FLATMEM_COMM_TIMEOUT_MS, when set, replaces the built-in default.
Milliseconds environment_timeout(Milliseconds fallback) {
  const char *text = std::getenv("FLATMEM_COMM_TIMEOUT_MS");
  if (text == nullptr || *text == '\0') return fallback;
  char *end = nullptr;
  const long long value = std::strtoll(text, &end, 10);
  if (*end != '\0') invalid("FLATMEM_COMM_TIMEOUT_MS=\"", text, "\": not an integer");
  return checked(value, "FLATMEM_COMM_TIMEOUT_MS");
}

}  // namespace

Config resolve_config(const flatmem_comm_options *options) {
  const auto o = read_options(options, "FLATMEM_COMM_OPTIONS_INIT / flatmem_comm_options_init");
  Config config;
  config.timeout = o.timeout_ms == 0 ? environment_timeout(config.timeout)
                                     : checked(o.timeout_ms, "options.timeout_ms");
  if (o.connect_timeout_ms != 0)
    config.connect_timeout = checked(o.connect_timeout_ms, "options.connect_timeout_ms");
  return config;
}

Milliseconds resolve_timeout(std::int64_t timeout_ms, Milliseconds fallback, const char *name) {
  return timeout_ms == 0 ? fallback : checked(timeout_ms, name);
}

}  // namespace flatmem::comm

// Also: UCX logs connection failures at its ERROR level, which the bootstrap
// meets routinely (ranks dial a coordinator that is not listening yet and
// retry); flatmem reports every failure that matters as a status and a
// message, so UCX's own log is set to "fatal" unless UCX_LOG_LEVEL is given.
//
// UCX installs handlers for SIGSEGV, SIGBUS, SIGILL and SIGFPE when it is
// loaded (UCX_ERROR_SIGNALS). A library must not take over its host process's
// crash handling (Python's faulthandler, a sanitizer, a framework's own), so
// unless the user asked for them through UCX_ERROR_SIGNALS, the handlers that
// were there before UCX loaded are put back when libflatmem loads.
#include <signal.h>
#include <ucs/config/global_opts.h>
#include <ucs/debug/debug.h>

#include <cstdlib>
#include <initializer_list>

namespace {

__attribute__((constructor)) void tame_ucx() {
  if (std::getenv("UCX_LOG_LEVEL") == nullptr) ucs_global_opts_set_value("LOG_LEVEL", "fatal");
  if (std::getenv("UCX_ERROR_SIGNALS") != nullptr) return;
  for (int signum : {SIGSEGV, SIGBUS, SIGILL, SIGFPE}) ucs_debug_disable_signal(signum);
}

}  // namespace

// Error reporting for the C API: a thread-local message plus a status code. Internal code throws
// mxmoe::Error; every extern "C" entry point catches it at the boundary (MXMOE_API_BEGIN/END), so
// nothing escapes as an exception or an abort.
#pragma once

#include <cstdint>
#include <sstream>
#include <stdexcept>
#include <string>

#include "mxmoe/mxmoe.h"

namespace mxmoe {

class Error : public std::runtime_error {
 public:
  Error(mxmoe_status status, const std::string& msg) : std::runtime_error(msg), status_(status) {}
  mxmoe_status status() const { return status_; }

 private:
  mxmoe_status status_;
};

void set_last_error(const std::string& msg);
void clear_last_error();
const char* last_error_cstr();

// Concatenate any streamable pieces into a message.
template <typename... Parts>
std::string cat(const Parts&... parts) {
  std::ostringstream os;
  (os << ... << parts);
  return os.str();
}

template <typename... Parts>
[[noreturn]] void fail(const Parts&... parts) {
  throw Error(MXMOE_ERR_INVALID_ARGUMENT, cat(parts...));
}

template <typename... Parts>
[[noreturn]] void fail_status(mxmoe_status status, const Parts&... parts) {
  throw Error(status, cat(parts...));
}

#define MXMOE_CHECK(cond, ...)              \
  do {                                      \
    if (!(cond)) ::mxmoe::fail(__VA_ARGS__); \
  } while (0)

// The C API's value-returning entry points (workspace sizes): f's value, or -1 with the message in
// mxmoe_last_error() (MXMOE_API_BEGIN/END's counterpart for functions that return a value).
template <typename F>
int64_t api_value(F&& f) noexcept {
  try {
    clear_last_error();
    return f();
  } catch (const Error& e) {
    set_last_error(e.what());
  } catch (const std::exception& e) {
    set_last_error(std::string("internal error: ") + e.what());
  } catch (...) {
    set_last_error("internal error: unknown exception");
  }
  return -1;
}

}  // namespace mxmoe

#define MXMOE_API_BEGIN \
  try {                 \
    ::mxmoe::clear_last_error();
#define MXMOE_API_END                                    \
  return MXMOE_OK;                                       \
  }                                                      \
  catch (const ::mxmoe::Error& e) {                      \
    ::mxmoe::set_last_error(e.what());                   \
    return e.status();                                   \
  }                                                      \
  catch (const std::exception& e) {                      \
    ::mxmoe::set_last_error(std::string("internal error: ") + e.what()); \
    return MXMOE_ERR_INTERNAL;                           \
  }                                                      \
  catch (...) {                                          \
    ::mxmoe::set_last_error("internal error: unknown exception"); \
    return MXMOE_ERR_INTERNAL;                           \
  }

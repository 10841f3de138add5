#include "common/error.hpp"

namespace mxmoe {
namespace {
thread_local std::string g_last_error;
}
void set_last_error(const std::string& msg) { g_last_error = msg; }
void clear_last_error() { g_last_error.clear(); }
const char* last_error_cstr() { return g_last_error.c_str(); }
}  // namespace mxmoe

extern "C" const char* mxmoe_last_error(void) { return mxmoe::last_error_cstr(); }

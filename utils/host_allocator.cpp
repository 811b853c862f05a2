// configure_host_allocator: glibc's mallopt with M_MMAP_MAX 0 and the largest M_TRIM_THRESHOLD, unless the user set
// malloc's tuning in the environment.
#include "utils/host_allocator.h"

#include <climits>
#include <cstdlib>
#include <string_view>

#ifdef __GLIBC__
#include <malloc.h>
#endif

// A sanitizer's runtime brings its own allocator, which glibc's mallopt does not tune (ThreadSanitizer's even lets
// mallopt answer 1 for glibc's unused heap).
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define BRIDGE_SANITIZER_ALLOCATOR 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer) || __has_feature(memory_sanitizer)
#define BRIDGE_SANITIZER_ALLOCATOR 1
#endif
#endif

namespace bridge::utils {

std::string user_malloc_setting() {
  for (const char* name : {"MALLOC_MMAP_MAX_", "MALLOC_TRIM_THRESHOLD_", "MALLOC_MMAP_THRESHOLD_", "MALLOC_TOP_PAD_"}) {
    if (std::getenv(name) != nullptr) return name;
  }
  const char* tunables = std::getenv("GLIBC_TUNABLES");
  if (tunables != nullptr && std::string_view(tunables).find("glibc.malloc.") != std::string_view::npos) {
    return "GLIBC_TUNABLES";
  }
  return "";
}

HostAllocatorSettings configure_host_allocator() {
  HostAllocatorSettings settings;
  const std::string user = user_malloc_setting();
  if (!user.empty()) {
    settings.detail = "left as the environment sets it (" + user + ")";
    return settings;
  }
#if defined(BRIDGE_SANITIZER_ALLOCATOR)
  settings.detail = "not applied: a sanitizer's allocator replaces glibc's malloc in this build";
#elif defined(__GLIBC__)
  // mallopt answers 1 when it took the value; a malloc that replaces glibc's (a sanitizer's) answers otherwise.
  // M_TRIM_THRESHOLD is an int: INT_MAX keeps up to 2 GiB of free heap top, far beyond a step's transient blocks.
  if (mallopt(M_MMAP_MAX, 0) == 1 && mallopt(M_TRIM_THRESHOLD, INT_MAX) == 1) {
    settings.applied = true;
    settings.detail = "glibc malloc keeps freed blocks (M_MMAP_MAX 0, M_TRIM_THRESHOLD 2 GiB)";
  } else {
    settings.detail = "not applied: this process's malloc does not take glibc's mallopt settings";
  }
#else
  settings.detail = "not applied: malloc is not glibc's";
#endif
  return settings;
}

}  // namespace bridge::utils

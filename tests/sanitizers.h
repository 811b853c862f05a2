// Whether this test binary runs under AddressSanitizer (GCC says so with __SANITIZE_ADDRESS__, clang with
// __has_feature): its quarantine keeps freed blocks resident and never hands their addresses out again soon, which
// tests of memory growth and of address reuse must allow for.
#pragma once

namespace bridge::testing {

#if defined(__SANITIZE_ADDRESS__)
inline constexpr bool kAddressSanitizer = true;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
inline constexpr bool kAddressSanitizer = true;
#else
inline constexpr bool kAddressSanitizer = false;
#endif
#else
inline constexpr bool kAddressSanitizer = false;
#endif

}  // namespace bridge::testing

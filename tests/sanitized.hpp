// Whether this test binary is built with AddressSanitizer (tools/sanitize.sh asan): TESSEL_TEST_ASAN for the
// preprocessor, kSanitized for code.
//
// The sanitized suite runs every test case the release suite runs. Where a case's cost is the same code repeated
// over more or bigger inputs, it takes a named subset of those inputs under the sanitizer: every code path still
// runs under ASan and UBSan, only the repetitions are fewer. The release run (`meson test -C build`, also in
// tools/test.sh) always takes the whole set. docs/reliability.md lists the cases that do this and why.
#pragma once

#if defined(__SANITIZE_ADDRESS__)
#define TESSEL_TEST_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define TESSEL_TEST_ASAN 1
#endif
#endif

namespace tessel::test {

#if defined(TESSEL_TEST_ASAN)
inline constexpr bool kSanitized = true;
#else
inline constexpr bool kSanitized = false;
#endif

}  // namespace tessel::test

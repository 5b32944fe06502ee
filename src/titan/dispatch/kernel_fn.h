// A kernel's function as the registry's tables hold it (dispatch/registry.h, device_ops.h): a
// plain function pointer with the name its calls have in a profile, so that every kernel call --
// whatever module makes it -- is timed in this one place while a profile is recorded
// (core/profile.h), and costs one predictable branch otherwise. It has the pointer's size and
// layout (a kernel plugin's tables are unchanged), converts from a function or a captureless
// lambda, and compares with null as the pointer does.
#pragma once

#include <algorithm>
#include <concepts>
#include <cstddef>
#include <utility>

#include "titan/core/profile.h"

namespace titan {

// A string literal as a template argument: a kernel function's name in profiles.
template <size_t N>
struct KernelLabel {
  char text[N];
  constexpr KernelLabel(const char (&s)[N]) { std::copy_n(s, N, text); }  // NOLINT: implicit
};

template <typename Pointer, KernelLabel Label>
class KernelFn;

template <typename R, typename... Args, KernelLabel Label>
class KernelFn<R (*)(Args...), Label> {
 public:
  using Pointer = R (*)(Args...);

  constexpr KernelFn() = default;
  // Implicit, as a pointer's: from null, a function (an overloaded one's name too), a captureless
  // lambda.
  constexpr KernelFn(std::nullptr_t) {}      // NOLINT
  constexpr KernelFn(Pointer f) : fn_(f) {}  // NOLINT
  template <std::convertible_to<Pointer> F>
  constexpr KernelFn(F f) : fn_(f) {}  // NOLINT

  R operator()(Args... args) const {
    if (profile_recording()) [[unlikely]]
      return call_recorded(std::forward<Args>(args)...);
    return fn_(std::forward<Args>(args)...);
  }
  constexpr Pointer get() const { return fn_; }
  constexpr explicit operator bool() const { return fn_ != nullptr; }
  friend constexpr bool operator==(const KernelFn& k, std::nullptr_t) { return k.fn_ == nullptr; }

 private:
  [[gnu::noinline]] R call_recorded(Args... args) const {
    const ProfileSpan span(Label.text, SpanKind::kernel);
    return fn_(std::forward<Args>(args)...);
  }

  Pointer fn_ = nullptr;
};

}  // namespace titan

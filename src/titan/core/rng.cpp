#include "titan/core/rng.h"

#include <cmath>

namespace titan {
namespace {

uint64_t splitmix64(uint64_t& x) {
  uint64_t z = (x += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

uint64_t rotl(uint64_t x, int k) {
  return (x << k) | (x >> (64 - k));
}

}  // namespace

uint64_t fnv1a_hash(std::string_view text) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (unsigned char c : text) h = (h ^ c) * 0x100000001b3ull;
  return h;
}

uint64_t mix64(uint64_t x) {
  return splitmix64(x);
}

Rng::Rng(uint64_t seed) {
  for (uint64_t& s : state_) s = splitmix64(seed);
}

Rng::Rng(uint64_t seed, std::string_view stream_name) : Rng(seed ^ fnv1a_hash(stream_name)) {}

uint64_t Rng::next_u64() {
  const uint64_t result = rotl(state_[1] * 5, 7) * 9;
  const uint64_t t = state_[1] << 17;
  state_[2] ^= state_[0];
  state_[3] ^= state_[1];
  state_[1] ^= state_[2];
  state_[0] ^= state_[3];
  state_[2] ^= t;
  state_[3] = rotl(state_[3], 45);
  return result;
}

double Rng::uniform() {
  return static_cast<double>(next_u64() >> 11) * 0x1.0p-53;
}

void Rng::fill_normal(float* out, int64_t n, float mean, float std) {
  for (int64_t i = 0; i < n; i += 2) {
    const double u1 = 1.0 - uniform(), u2 = uniform();  // u1 in (0, 1]: log is finite
    const double radius = std::sqrt(-2.0 * std::log(u1));
    out[i] = static_cast<float>(mean + std * radius * std::cos(2.0 * M_PI * u2));
    if (i + 1 < n) out[i + 1] = static_cast<float>(mean + std * radius * std::sin(2.0 * M_PI * u2));
  }
}

}  // namespace titan

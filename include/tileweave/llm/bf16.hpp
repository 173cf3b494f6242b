// bfloat16 bit conversions on the host (header-only, C++17, so tests, tools and .cu host code can share them).
#pragma once

#include <cstdint>
#include <cstring>

namespace tw {

inline float bf16_to_float(uint16_t b) {
  const uint32_t u = uint32_t{b} << 16;
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

// Round to nearest, ties to even (what torch's .to(torch.bfloat16) and __float2bfloat16 do). NaN stays a quiet NaN
// (the carry below would otherwise turn some NaN payloads into infinity).
inline uint16_t float_to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40u);
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

// f rounded to the nearest bf16 value, kept as a float.
inline float round_bf16(float f) { return bf16_to_float(float_to_bf16(f)); }

}  // namespace tw

#include "tileweave/model/presets.hpp"

namespace tw {

namespace {
std::string join(const std::vector<std::string>& v) {
  std::string s;
  for (const auto& x : v) s += (s.empty() ? "" : ", ") + x;
  return s;
}
}  // namespace

// L2 sizes as the drivers report them (H200: 60 MiB measured on the lent machine, DESIGN.md §3).
GpuPreset gpu_preset(const std::string& name) {
  if (name == "h200") return {name, int64_t{60} << 20, 132, 4.68};
  if (name == "h100") return {name, int64_t{50} << 20, 132, 3.13};
  if (name == "a100") return {name, int64_t{40} << 20, 108, 1.90};
  throw InvalidArgument("unknown GPU preset '" + name + "' (known: " + join(gpu_preset_names()) + ")");
}
std::vector<std::string> gpu_preset_names() { return {"h100", "h200", "a100"}; }

FfnShape model_preset(const std::string& name, int64_t m) {
  if (m <= 0) throw InvalidArgument("M (tokens) must be positive, got " + std::to_string(m));
  if (m > (int64_t{1} << 24)) throw InvalidArgument("M (tokens) " + std::to_string(m) + " is absurd");
  if (name == "llama3-8b") return {m, 4096, 14336, true};
  if (name == "llama3-70b") return {m, 8192, 28672, true};
  if (name == "chain") return {m, 4096, 14336, false};
  throw InvalidArgument("unknown model preset '" + name + "' (known: " + join(model_preset_names()) + ")");
}
std::vector<std::string> model_preset_names() { return {"llama3-8b", "llama3-70b", "chain"}; }

}  // namespace tw

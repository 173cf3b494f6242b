// The explorer's JSON API, independent of HTTP so that it reads as a list of small functions:
// each route takes the request body and returns the answer, built from the C++ graph, orders,
// cache model and bounds. Errors are exceptions: ApiError carries the HTTP status and a message
// that names the bad value (and the limit it broke, where there is one).
#pragma once

#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>

namespace tw::gui {

struct ApiError : std::runtime_error {
  int status;
  ApiError(int http_status, const std::string& message) : std::runtime_error(message), status(http_status) {}
};

// Limits that keep one request well under a second on a laptop core; named in the errors.
struct Limits {
  int64_t max_dim = int64_t{1} << 20;            // M, N, K
  int max_tiles = 4096;                          // tiles of the whole graph (drawn and re-simulated per click)
  int64_t max_blocks = 262144;                   // cache-model blocks of all tensors (residency panels)
  int64_t max_cache_bytes = int64_t{1} << 40;
  int64_t max_line_bytes = 65536;
  int max_in_flight = 1024;
  int max_compare_orders = 16;
  int max_exact_search_tiles = 16;               // exact search above this takes too long for a click
  double exact_search_seconds = 3.0;
  double heuristic_search_seconds = 2.0;
};

// route: "meta", "layout", "simulate", "order", "compare", "export". Throws ApiError.
nlohmann::json handle_api(const std::string& route, const nlohmann::json& body, const Limits& limits = {});

}  // namespace tw::gui

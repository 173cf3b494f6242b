// The explorer's page files (web/*.html, *.js, *.css), compiled into the binary by embed_web.cmake.
#pragma once

#include <string_view>
#include <vector>

struct WebAsset {
  std::string_view path;  // relative to web/, e.g. "index.html"
  std::string_view text;
};
const std::vector<WebAsset>& embedded_web_assets();

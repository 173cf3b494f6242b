// `tileweave gui`: serves the explorer page and its JSON API (gui_api.cpp) over HTTP.
#include "gui.hpp"

#include <httplib.h>

#include <CLI/CLI.hpp>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <memory>
#include <sstream>

#include "gui_api.hpp"
#include "gui_web.hpp"

namespace {

using nlohmann::json;

struct GuiOptions {
  std::string host = "127.0.0.1";
  int port = 8765;
  std::string web_dir;  // empty: the page compiled into the binary
};

const char* content_type(const std::string& path) {
  if (path.ends_with(".html")) return "text/html; charset=utf-8";
  if (path.ends_with(".js")) return "text/javascript; charset=utf-8";
  if (path.ends_with(".css")) return "text/css; charset=utf-8";
  return "application/octet-stream";
}

// The page: from --web-dir when given (edit and reload, no rebuild), else the embedded copy.
bool find_page_file(const GuiOptions& opt, const std::string& path, std::string& text) {
  if (path.find("..") != std::string::npos) return false;
  if (!opt.web_dir.empty()) {
    std::ifstream in(std::filesystem::path(opt.web_dir) / path, std::ios::binary);
    if (!in) return false;
    std::ostringstream ss;
    ss << in.rdbuf();
    text = ss.str();
    return true;
  }
  for (const WebAsset& a : embedded_web_assets())
    if (a.path == path) {
      text = a.text;
      return true;
    }
  return false;
}

void send_json(httplib::Response& res, int status, const json& body) {
  res.status = status;
  res.set_header("Cache-Control", "no-store");
  res.set_content(body.dump(), "application/json");
}

void serve(const GuiOptions& opt) {
  if (!opt.web_dir.empty() && !std::filesystem::exists(std::filesystem::path(opt.web_dir) / "index.html"))
    throw CLI::ValidationError("--web-dir", "'" + opt.web_dir + "' has no index.html");
  httplib::Server server;
  server.set_payload_max_length(1 << 20);  // an order of the largest allowed graph is ~30 KB

  server.Get("/api/meta", [](const httplib::Request&, httplib::Response& res) {
    send_json(res, 200, tw::gui::handle_api("meta", json::object()));
  });
  server.Post(R"(/api/(\w+))", [](const httplib::Request& req, httplib::Response& res) {
    const std::string route = req.matches[1];
    try {
      const json body = json::parse(req.body);
      send_json(res, 200, tw::gui::handle_api(route, body));
    } catch (const tw::gui::ApiError& e) {
      send_json(res, e.status, {{"error", e.what()}});
    } catch (const json::parse_error& e) {
      send_json(res, 400, {{"error", std::string("malformed JSON request: ") + e.what()}});
    } catch (const json::exception& e) {
      send_json(res, 400, {{"error", std::string("bad JSON request: ") + e.what()}});
    } catch (const std::exception& e) {
      std::cerr << "tileweave gui: /api/" << route << " failed: " << e.what() << "\n";
      send_json(res, 500, {{"error", std::string("internal error: ") + e.what()}});
    }
  });
  server.Get(R"(/(.*))", [opt](const httplib::Request& req, httplib::Response& res) {
    std::string path = req.matches[1];
    if (path.empty()) path = "index.html";
    std::string text;
    if (!find_page_file(opt, path, text)) {
      res.status = 404;
      res.set_content("not found: /" + path + "\n", "text/plain");
      return;
    }
    res.set_header("Cache-Control", "no-store");
    res.set_content(text, content_type(path));
  });

  int port = opt.port;
  if (port == 0) {
    port = server.bind_to_any_port(opt.host);
  } else if (!server.bind_to_port(opt.host, port)) {
    port = -1;
  }
  if (port < 0)
    throw CLI::ValidationError("--port", "cannot listen on " + opt.host + ":" + std::to_string(opt.port) +
                                            " (in use? --port 0 picks a free one)");
  // Tests and scripts read this line to find the port (with --port 0).
  std::printf("tileweave gui: serving on http://%s:%d/\n", opt.host.c_str(), port);
  std::fflush(stdout);
  server.listen_after_bind();
}

}  // namespace

void register_gui_command(CLI::App& app) {
  auto opt = std::make_shared<GuiOptions>();
  CLI::App* gui = app.add_subcommand("gui", "Serve the browser explorer (build orders by clicking tiles, compare them)");
  gui->add_option("--host", opt->host, "Address to listen on (loopback unless you mean to share it)")
      ->capture_default_str();
  gui->add_option("--port", opt->port, "TCP port; 0 picks a free one")->check(CLI::Range(0, 65535))->capture_default_str();
  gui->add_option("--web-dir", opt->web_dir, "Serve the page from this folder (e.g. web/) instead of the built-in copy");
  gui->callback([opt] { serve(*opt); });
}

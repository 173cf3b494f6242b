// `tileweave gui`: the browser explorer. A small HTTP server on 127.0.0.1 serves the page (web/,
// compiled into the binary) and a JSON API backed by the C++ tile graph, orders and cache model;
// the page draws, the server computes — there is no second model in JavaScript.
#pragma once

namespace CLI {
class App;
}

// Adds the `gui` subcommand (options: --host, --port, --web-dir, --open-limit...) to the CLI.
void register_gui_command(CLI::App& app);

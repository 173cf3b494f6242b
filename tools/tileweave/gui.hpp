// `tileweave gui`: the browser explorer. A small HTTP server on 127.0.0.1 serves the page (web/,
// compiled into the binary) and a JSON API backed by the C++ tile graph, orders and cache model;
// the page draws, the server computes — there is no second model in JavaScript.
#pragma once

namespace CLI {
class App;
}

// Adds the `gui` subcommand (--host, default 127.0.0.1; --port, 0 = any free one; --web-dir) to the CLI.
void register_gui_command(CLI::App& app);

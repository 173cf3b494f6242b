// `tileweave`: the tile-traffic model on the command line. With no arguments it prints the main
// report (every named order vs the bounds for the Llama-3-8B FFN on the H200 preset).
// Bad input: one line on stderr naming the value, exit code 2.
#include <CLI/CLI.hpp>
#include <cstdio>
#include <exception>

#include "cli_commands.hpp"
#include "gui.hpp"
#include "tileweave/graph/tile_graph.hpp"

int main(int argc, char** argv) {
  CLI::App app{"tileweave: tile graphs, orders and the DRAM traffic they cause"};
  app.require_subcommand(0, 1);
  tw::cli::register_model_commands(app);
  tw::cli::register_step_command(app);
  tw::cli::register_graph_command(app);
  tw::cli::register_validate_command(app);
  tw::cli::register_plan_command(app);
  register_gui_command(app);
  try {
    app.parse(argc, argv);
    if (app.get_subcommands().empty()) return tw::cli::run_main_report();
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    std::fprintf(stderr, "tileweave: error: %s\n", e.what());
    return 2;
  } catch (const tw::InvalidArgument& e) {
    std::fprintf(stderr, "tileweave: error: %s\n", e.what());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "tileweave: internal error: %s\n", e.what());
    return 1;
  }
  return 0;
}

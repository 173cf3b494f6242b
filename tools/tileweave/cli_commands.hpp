// The `tileweave` subcommands (sim, search, orders, bounds) and the no-argument main job.
#pragma once

namespace CLI {
class App;
}

namespace tw::cli {

void register_model_commands(CLI::App& app);
void register_step_command(CLI::App& app);  // `tileweave step` (cli_step.cpp)
void register_graph_command(CLI::App& app);  // `tileweave graph` (cli_graph.cpp)
void register_validate_command(CLI::App& app);  // `tileweave validate` (cli_validate.cpp)
void register_plan_command(CLI::App& app);  // `tileweave plan` (cli_plan.cpp)
// The report printed with no arguments: every named order vs the bounds for the Llama-3-8B FFN at a
// decode and a prefill size on the H200 preset.
int run_main_report();

}  // namespace tw::cli

//! `countersign`: the command an agent's MCP configuration launches, and the commands that launch
//! or query the desk. The gateway (`countersign mcp`) and the desk arrive with their own work;
//! today the binary sets up logging and answers `--help` and `--version`.

use clap::Parser;

/// A human countersignature on every mutating action an AI agent takes through MCP.
#[derive(Debug, Parser)]
#[command(name = "countersign", version, about, long_about = None)]
struct Cli {}

fn main() {
    countersign::logging::init();
    let _cli = Cli::parse();
    eprintln!("countersign: the gateway and the desk are not built yet; see README.md.");
    std::process::exit(2);
}

//! `lease-test-worker`: the scripted reference worker and its side-effect ledger, the programs
//! the whole-system tests and the takeover benchmark drive. Test support, not an operator tool:
//! it is a workspace binary that `cargo install lease-cli` does not install.
//!
//! It takes the same store flags as `lease` (`--store`, `--namespace`, `--ttl-ms`, …), so a
//! script that drove `lease worker` or `lease ledger` changes only the program name.

use std::process::ExitCode;

use clap::{Parser, Subcommand};
use lease_cli::{run_id, Failure, StoreArgs};

mod approval;
mod ledger;
mod pool;
mod worker;

#[derive(Parser)]
#[command(
    name = "lease-test-worker",
    version,
    about = "Test support: the reference worker and ledger the whole-system tests drive"
)]
struct Cli {
    #[command(flatten)]
    store: StoreArgs,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Show the reference worker's side-effect ledger for a run.
    Ledger {
        /// The run id.
        run: String,
        /// Print JSON instead of lines.
        #[arg(long)]
        json: bool,
    },
    /// The reference worker: claims a run, heartbeats it, and executes steps sent on stdin,
    /// printing one JSON event per line.
    Worker(worker::WorkerArgs),
    /// A library `Worker` serving kind `approval`: each run waits for an `approval` signal,
    /// then for a `shipped` one, printing each token and payload as JSON events.
    Approval(approval::ApprovalArgs),
}

async fn dispatch(cli: Cli) -> Result<u8, Failure> {
    let config = cli.store.config()?;
    match cli.command {
        Command::Ledger { run, json } => ledger::show(&config, &run_id(&run)?, json).await,
        Command::Worker(args) => worker::run(&config, args).await,
        Command::Approval(args) => approval::run(&config, args).await,
    }
    .map(|()| 0)
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    lease_cli::main_with("lease-test-worker", dispatch(cli))
}

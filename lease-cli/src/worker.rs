//! `lease worker`: the reference worker (in progress).

use distribution::Config;

use crate::Failure;

/// Arguments of `lease worker`.
#[derive(clap::Args)]
pub(crate) struct WorkerArgs {}

pub(crate) async fn run(_config: &Config, _args: WorkerArgs) -> Result<(), Failure> {
    Err(crate::usage("lease worker is not built yet"))
}

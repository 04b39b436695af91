//! The `arbiter` command line: one binary, one subcommand per job.

use clap::{Parser, Subcommand};

/// Coordinated leader election for Kubernetes.
#[derive(Parser, Debug)]
#[command(name = "arbiter", version, about, long_about = None)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Subcommand, Debug)]
pub enum Command {
    /// Print the CustomResourceDefinition YAML (what `crds/` holds), for `kubectl apply -f -`.
    Crd,
}

/// Runs the parsed command line.
pub fn run(cli: Cli) -> anyhow::Result<()> {
    match cli.command {
        Command::Crd => {
            print!("{}", crate::api::crd_yaml()?);
            Ok(())
        }
    }
}

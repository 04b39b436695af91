//! The `arbiter` command line: one binary, one subcommand per job.

use clap::{Parser, Subcommand};

/// Coordinated leader election for Kubernetes.
#[derive(Parser, Debug)]
#[command(name = "arbiter", version, about, long_about = None)]
pub struct Cli {
    /// Log format.
    #[arg(long, global = true, default_value = "text", value_parser = ["text", "json"])]
    pub log_format: String,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Subcommand, Debug)]
pub enum Command {
    /// Print the CustomResourceDefinition YAML (what `crds/` holds), for `kubectl apply -f -`.
    Crd,
    /// Run the arbiter: elect a holder per lease, hand leases over, report status.
    Operator(Box<crate::operator::Settings>),
    /// Run CMD only while this candidate holds the lease: `arbiter run [flags] -- CMD [ARGS...]`.
    Run(Box<crate::agent::Settings>),
    /// Show the leases arbiter manages: holder, term, versions, candidates, state.
    Status(crate::status::Settings),
    /// A planned switchover: ask the operator to hand LEASE over to a candidate (or the best
    /// other one), wait, and print the new holder, term and leaderless gap.
    Handover(crate::handover::Settings),
    /// Internal: started by `arbiter run` to stop CMD's process group at a deadline the agent
    /// keeps extending, or at once if the agent dies (see `agent::watchdog`).
    #[command(hide = true)]
    Guard {
        /// The agent's pid.
        #[arg(long)]
        parent: i32,
        /// The first deadline, CLOCK_BOOTTIME nanoseconds.
        #[arg(long)]
        until: u64,
        #[arg(long)]
        kill_grace_ms: u64,
        /// A kill later than this after the deadline is reported (exit code 3).
        #[arg(long)]
        margin_ms: u64,
    },
}

/// Runs the parsed command line; returns the process exit code.
pub async fn run(cli: Cli) -> anyhow::Result<i32> {
    init_logging(&cli.log_format);
    match cli.command {
        Command::Crd => {
            print!("{}", crate::api::crd_yaml()?);
            Ok(0)
        }
        Command::Operator(settings) => crate::operator::run(*settings).await.map(|()| 0),
        Command::Run(settings) => crate::agent::run(*settings).await,
        Command::Status(settings) => crate::status::run(settings).await,
        Command::Handover(settings) => crate::handover::run(settings).await,
        // Inside an async runtime the guard could die of its own parent-death signal (see
        // `agent::guard`): main runs it before any runtime starts.
        Command::Guard { .. } => {
            anyhow::bail!("`arbiter guard` must run before any async runtime starts (see main)")
        }
    }
}

/// Logs to stderr; `RUST_LOG` filters (default `info`).
fn init_logging(format: &str) {
    use tracing_subscriber::EnvFilter;
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    if format == "json" {
        builder.json().init();
    } else {
        builder.init();
    }
}

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
}

/// Runs the parsed command line.
pub async fn run(cli: Cli) -> anyhow::Result<()> {
    init_logging(&cli.log_format);
    match cli.command {
        Command::Crd => {
            print!("{}", crate::api::crd_yaml()?);
            Ok(())
        }
        Command::Operator(settings) => crate::operator::run(*settings).await,
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

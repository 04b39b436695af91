use clap::Parser;

#[tokio::main]
async fn main() -> std::process::ExitCode {
    let cli = arbiter::cli::Cli::parse();
    match arbiter::cli::run(cli).await {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(err) => {
            tracing::error!("{err:#}");
            eprintln!("error: {err:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

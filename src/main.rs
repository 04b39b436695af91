use clap::Parser;

#[tokio::main]
async fn main() -> std::process::ExitCode {
    let cli = arbiter::cli::Cli::parse();
    match arbiter::cli::run(cli).await {
        Ok(code) => std::process::ExitCode::from(code.clamp(0, 255) as u8),
        Err(err) => {
            tracing::error!("{err:#}");
            eprintln!("error: {err:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

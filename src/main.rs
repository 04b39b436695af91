use clap::Parser;

fn main() -> std::process::ExitCode {
    let cli = arbiter::cli::Cli::parse();
    // The guard runs without an async runtime: it must stay one thread, so that its blocked
    // SIGTERM (the parent-death signal) cannot land on another thread and kill it unheard.
    if let arbiter::cli::Command::Guard { pgid, parent } = cli.command {
        return exit(arbiter::agent::guard(pgid, parent).map(|()| 0));
    }
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(rt) => rt,
        Err(err) => return exit(Err(anyhow::anyhow!("starting the async runtime: {err}"))),
    };
    exit(runtime.block_on(arbiter::cli::run(cli)))
}

fn exit(result: anyhow::Result<i32>) -> std::process::ExitCode {
    match result {
        Ok(code) => std::process::ExitCode::from(code.clamp(0, 255) as u8),
        Err(err) => {
            tracing::error!("{err:#}");
            eprintln!("error: {err:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

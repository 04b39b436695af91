use clap::Parser;

fn main() -> std::process::ExitCode {
    let cli = arbiter::cli::Cli::parse();
    // The guard runs without an async runtime: it must stay one thread, so that its blocked
    // SIGTERM (the parent-death signal) cannot land on another thread and kill it unheard.
    if let arbiter::cli::Command::Guard {
        parent,
        until,
        kill_grace_ms,
        margin_ms,
    } = cli.command
    {
        let grace = std::time::Duration::from_millis(kill_grace_ms);
        let margin = std::time::Duration::from_millis(margin_ms);
        return exit(arbiter::agent::watchdog::run(parent, until, grace, margin));
    }
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(rt) => rt,
        Err(err) => return exit(Err(anyhow::anyhow!("starting the async runtime: {err}"))),
    };
    exit(runtime.block_on(arbiter::cli::run(cli)))
}

/// The exit code: the command's own, 2 for a flag error, 1 for any other error. An error is
/// printed once, as `error: ...` on stderr.
fn exit(result: anyhow::Result<i32>) -> std::process::ExitCode {
    match result {
        Ok(code) => std::process::ExitCode::from(code.clamp(0, 255) as u8),
        Err(err) => {
            eprintln!("error: {err:#}");
            if err.downcast_ref::<arbiter::flags::Usage>().is_some() {
                std::process::ExitCode::from(2)
            } else {
                std::process::ExitCode::FAILURE
            }
        }
    }
}

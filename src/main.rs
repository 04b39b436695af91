use clap::Parser;

fn main() -> std::process::ExitCode {
    let cli = arbiter::cli::Cli::parse();
    match arbiter::cli::run(cli) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("error: {err:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

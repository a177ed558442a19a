//! The `scorch` binary: parse the command line, set up logging, run the command.

use std::process::ExitCode;

use clap::Parser;
use scorch::{
    cli::{self, docs, Cli, Command},
    cmd::{check, query, record, run},
};
use tracing_subscriber::EnvFilter;

fn main() -> ExitCode {
    scorch::sys::allocator::tune_allocator();
    scorch::sys::fs::raise_open_file_limit();
    let cli = Cli::parse();
    let filter = EnvFilter::try_from_default_env()
        .or_else(|_| EnvFilter::try_new(&cli.log_level))
        .unwrap_or_else(|_| EnvFilter::new("info"));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_target(false)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();

    match cli.command {
        Command::Record(args) => {
            let args = args.resolve();
            // Bad arguments and missing privileges are reported before a runtime or any BPF
            // exists.
            if let Err(err) = record::preflight(&args) {
                eprintln!("scorch: {err}");
                return ExitCode::from(2);
            }
            let Some(runtime) = runtime(&mut tokio::runtime::Builder::new_current_thread()) else {
                return ExitCode::FAILURE;
            };
            match runtime.block_on(record::record(&args)) {
                Ok(summary) => {
                    println!("{summary}");
                    ExitCode::SUCCESS
                }
                Err(err) => {
                    eprintln!("scorch: {err}");
                    ExitCode::FAILURE
                }
            }
        }
        Command::Run(args) => {
            let config = match cli::config::resolve(&args) {
                Ok(config) => config,
                Err(err) => {
                    eprintln!("scorch: {err}");
                    return ExitCode::from(2);
                }
            };
            // Privileges and the store are checked before a runtime or any BPF exists.
            let store = match run::preflight(&config) {
                Ok(store) => store,
                Err(err) => {
                    eprintln!("scorch: {err}");
                    return ExitCode::from(2);
                }
            };
            // The HTTP server and the pod watch run on two workers of their own; store reads
            // go to their blocking pool.
            let mut builder = tokio::runtime::Builder::new_multi_thread();
            builder.worker_threads(2).max_blocking_threads(4);
            let Some(services) = runtime(&mut builder) else {
                return ExitCode::FAILURE;
            };
            // The window loop runs on this thread, with its own event driver: the unwinder's
            // ring buffer, the timers and the signals wake it directly. On the shared
            // runtime a worker woke first and then woke this thread, for every new process.
            let Some(window_loop) = runtime(&mut tokio::runtime::Builder::new_current_thread())
            else {
                return ExitCode::FAILURE;
            };
            match window_loop.block_on(run::run(config, store, services.handle().clone())) {
                Ok(()) => ExitCode::SUCCESS,
                Err(err) => {
                    eprintln!("scorch: {err}");
                    ExitCode::FAILURE
                }
            }
        }
        Command::Query(args) => match args.resolve().and_then(|config| query::query(&config)) {
            Ok(summary) => {
                eprintln!("{summary}");
                ExitCode::SUCCESS
            }
            Err(err) => {
                eprintln!("scorch: {err}");
                ExitCode::FAILURE
            }
        },
        Command::Completions { shell } => {
            docs::write_completions(shell, &mut std::io::stdout());
            ExitCode::SUCCESS
        }
        Command::Man { dir } => match docs::write_man_pages(&dir) {
            Ok(()) => ExitCode::SUCCESS,
            Err(err) => {
                eprintln!("scorch: {err}");
                ExitCode::FAILURE
            }
        },
        Command::Check => {
            let items = check::run_checks();
            for item in &items {
                println!("{item}");
            }
            if check::can_profile(&items) {
                ExitCode::SUCCESS
            } else {
                ExitCode::FAILURE
            }
        }
    }
}

/// Builds the runtime `builder` describes, saying why when it cannot.
fn runtime(builder: &mut tokio::runtime::Builder) -> Option<tokio::runtime::Runtime> {
    match builder.enable_all().build() {
        Ok(runtime) => Some(runtime),
        Err(err) => {
            eprintln!("scorch: starting the runtime: {err}");
            None
        }
    }
}

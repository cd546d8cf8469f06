//! A terminal chat over a cohort group: `chat CONFIG.toml` joins the group the config file
//! describes and chats on standard input and output; `chat setup DIR N [BASE_PORT]` writes
//! keys and configs for `N` members on loopback. See `examples/README.md`.

mod session;
mod setup;
mod stdio;

use cohort::group::{Group, GroupConfig};
use std::path::Path;
use std::process::ExitCode;

const USAGE: &str = "usage: chat CONFIG.toml | chat setup DIR N [BASE_PORT]";

#[tokio::main]
async fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let result = match args.iter().map(String::as_str).collect::<Vec<_>>()[..] {
        ["setup", dir, n, ref rest @ ..] if rest.len() <= 1 => run_setup(dir, n, rest.first()),
        [config] if config != "setup" && !config.starts_with('-') => chat(config).await,
        _ => Err(USAGE.to_string()),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("chat: {e}");
            ExitCode::from(2)
        }
    }
}

fn run_setup(dir: &str, n: &str, base: Option<&&str>) -> Result<(), String> {
    let n: usize = n.parse().map_err(|_| format!("N: not a number: {n}"))?;
    let base: u16 = match base {
        Some(b) => b
            .parse()
            .map_err(|_| format!("BASE_PORT: not a port: {b}"))?,
        None => 7101,
    };
    let paths = setup::write(Path::new(dir), n, base).map_err(|e| format!("{dir}: {e}"))?;
    for p in paths {
        println!("{p}");
    }
    Ok(())
}

async fn chat(config: &str) -> Result<(), String> {
    let config = GroupConfig::load(Path::new(config)).map_err(|e| e.to_string())?;
    let (group, events) = Group::start(config).map_err(|e| e.to_string())?;
    let (input, output, written) = stdio::stdio();
    let result = session::run(group, events, input, output).await;
    // The loop dropped `output`: wait until its last lines are on standard output.
    let _ = written.await;
    result.map_err(|e| e.to_string())
}

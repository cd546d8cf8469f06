//! A replicated key-value store over a cohort group: `kv CONFIG.toml` joins the group the
//! config file describes and reads `put KEY VALUE`, `del KEY`, `get KEY`, `dump` on standard
//! input. What it relies on and what it does not: `examples/kv/README.md`.

mod node;
#[path = "../chat/stdio.rs"]
mod stdio;
mod store;

use cohort::group::{Group, GroupConfig};
use std::path::Path;
use std::process::ExitCode;
use std::sync::{Arc, Mutex};

#[tokio::main]
async fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [config] = &args[..] else {
        eprintln!("usage: kv CONFIG.toml");
        return ExitCode::from(2);
    };
    match serve(Path::new(config)).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("kv: {e}");
            ExitCode::from(2)
        }
    }
}

async fn serve(path: &Path) -> Result<(), String> {
    let mut config = GroupConfig::load(path).map_err(|e| e.to_string())?;
    let replica = Arc::new(Mutex::new(store::Replica::new()));
    node::with_state_transfer(&mut config, &replica);
    let (group, events) = Group::start(config).map_err(|e| e.to_string())?;
    let (input, output, written) = stdio::stdio();
    let result = node::run(group, events, replica, input, output).await;
    // The loop dropped `output`: wait until its last lines are on standard output.
    let _ = written.await;
    result.map_err(|e| e.to_string())
}

//! `cohort gears ...`

use crate::{bench, UsageError};
use clap::{Args, Subcommand};
use cohort_crypto::CryptoProvider;
use cohort_gears::{plain::plain_mac, GearId, ALL_GEARS};
use std::io::Read;
use std::path::PathBuf;
use std::time::Duration;

#[derive(Subcommand)]
pub enum GearsCommand {
    /// Every gear with its wire id, tag length, forgery bound and status.
    List {
        /// Print JSON instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Print the lowercase hex tag of FILE's bytes (standard input if absent or `-`).
    Tag(TagArgs),
    /// Measure every gear on this machine.
    Bench(bench::BenchArgs),
}

#[derive(Args)]
#[command(group(clap::ArgGroup::new("key").required(true).args(["key_hex", "key_file"])))]
pub struct TagArgs {
    /// Gear name, as `cohort gears list` prints it.
    #[arg(long)]
    gear: String,
    /// Key in hex (visible to other users in the process list; see --key-file).
    #[arg(long)]
    key_hex: Option<String>,
    /// File holding the key in hex (surrounding whitespace ignored).
    #[arg(long)]
    key_file: Option<PathBuf>,
    /// Nonce in hex (UMAC: 1 to 16 bytes; GMAC and AEADs: 12 bytes; ifg and partial: the
    /// sequence number, up to 8 bytes).
    #[arg(long)]
    nonce_hex: Option<String>,
    /// Input file; standard input when absent or `-`.
    file: Option<PathBuf>,
}

pub fn run(command: GearsCommand) -> Result<(), UsageError> {
    match command {
        GearsCommand::List { json } => {
            list(json);
            Ok(())
        }
        GearsCommand::Tag(args) => tag(&args),
        GearsCommand::Bench(args) => bench::run(&args),
    }
}

fn list(json: bool) {
    if json {
        let rows: Vec<_> = ALL_GEARS
            .iter()
            .map(|g| {
                serde_json::json!({
                    "id": g.id.to_u8(),
                    "name": g.name,
                    "kind": format!("{:?}", g.kind).to_lowercase(),
                    "key_bytes": g.key_len,
                    "tag_bits": g.tag_len * 8,
                    "forgery_bits": g.forgery_bits,
                    "covered_forgery_bits": g.covered_forgery_bits,
                    "integrity_limit": g.integrity_limit,
                    "usage_limit": g.usage_limit,
                    "status": g.status.to_string(),
                    "bound": g.bound_derivation,
                })
            })
            .collect();
        println!("{}", serde_json::Value::Array(rows));
        return;
    }
    println!(
        "{:<4} {:<24} {:<5} {:>8} {:>13} {:>12}  note",
        "id", "name", "kind", "tag bits", "forgery bits", "status"
    );
    for g in ALL_GEARS {
        let note = match (g.partial_l, g.kind) {
            (Some(_), _) => format!(
                "1 word escapes w.p. {:.4}; covered data {} bits",
                g.escape_probability(1).unwrap_or(1.0),
                g.covered_forgery_bits
            ),
            (None, cohort_gears::GearKind::Aead) => "encrypts the body".to_string(),
            _ => String::new(),
        };
        println!(
            "0x{:02x} {:<24} {:<5} {:>8} {:>13.3} {:>12}  {}",
            g.id.to_u8(),
            g.name,
            format!("{:?}", g.kind).to_lowercase(),
            g.tag_len * 8,
            g.forgery_bits,
            g.status.to_string(),
            note
        );
    }
}

fn decode_hex(what: &str, s: &str) -> Result<Vec<u8>, UsageError> {
    hex::decode(s.trim()).map_err(|e| UsageError(format!("--{what}: not valid hex ({e})")))
}

fn tag(args: &TagArgs) -> Result<(), UsageError> {
    let gear = GearId::from_name(&args.gear).ok_or_else(|| {
        UsageError(format!(
            "unknown gear '{}' (see `cohort gears list`)",
            args.gear
        ))
    })?;
    let key = match (&args.key_hex, &args.key_file) {
        (Some(hex), _) => decode_hex("key-hex", hex)?,
        (None, Some(path)) => {
            let text = std::fs::read_to_string(path)
                .map_err(|e| UsageError(format!("cannot read {}: {e}", path.display())))?;
            decode_hex("key-file", &text)?
        }
        (None, None) => return Err(UsageError("give --key-hex or --key-file".into())),
    };
    let nonce = match &args.nonce_hex {
        Some(n) => decode_hex("nonce-hex", n)?,
        None => Vec::new(),
    };
    let mut message = Vec::new();
    match &args.file {
        Some(path) if path.as_os_str() != "-" => {
            message = std::fs::read(path)
                .map_err(|e| UsageError(format!("cannot read {}: {e}", path.display())))?;
        }
        _ => {
            std::io::stdin()
                .read_to_end(&mut message)
                .map_err(|e| UsageError(format!("cannot read standard input: {e}")))?;
        }
    }
    let provider = CryptoProvider::default_provider();
    let tag = plain_mac(&provider, gear, &key, &nonce, &message)
        .map_err(|e| UsageError(e.to_string()))?;
    println!("{}", hex::encode(tag));
    Ok(())
}

/// UMAC against Nettle's (issue 18): the goal, cohort's rate over Nettle's, at least this.
const NETTLE_GOAL: f64 = 1.25;

/// Where `cohort gears bench --goals` looks for the Nettle benchmark that
/// scripts/peers/umac-nettle.sh builds: `$COHORT_NETTLE_BENCH`, else `target/peers/` next to
/// this binary's `target/<profile>/` directory.
fn nettle_bench_path() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("COHORT_NETTLE_BENCH") {
        return Some(PathBuf::from(p));
    }
    let exe = std::env::current_exe().ok()?;
    Some(exe.parent()?.parent()?.join("peers/umac_nettle_bench"))
}

/// The Nettle part of `cohort gears bench --goals`: runs the C benchmark of Nettle's umac32
/// and umac64 (a separate program, so cohort links no C and needs no `unsafe`) right after
/// cohort's own measurements in this run, with the same time budget, and prints the ratios.
/// When the benchmark is not built, says so and how to get it. `rate(gear, size)` gives
/// cohort's bytes per second measured in this run.
pub fn nettle_goals(rate: &dyn Fn(GearId, usize) -> Option<f64>, budget: Duration) {
    println!(
        "umac against Nettle (NH path {}), ratios in this run:",
        cohort_gears::umac::NhPath::default_path().name()
    );
    let Some(path) = nettle_bench_path().filter(|p| p.is_file()) else {
        println!(
            "  not measured: no Nettle benchmark built (looked for {}); run \
             scripts/peers/umac-nettle.sh, which installs nettle-dev and builds it, or set \
             COHORT_NETTLE_BENCH",
            nettle_bench_path().map_or("-".into(), |p| p.display().to_string())
        );
        return;
    };
    let output = std::process::Command::new(&path)
        .arg(budget.as_millis().to_string())
        .args(["8192", "65536"])
        .output();
    let text = match output {
        Ok(o) if o.status.success() => String::from_utf8_lossy(&o.stdout).into_owned(),
        Ok(o) => {
            println!(
                "  not measured: {} exited with {}",
                path.display(),
                o.status
            );
            return;
        }
        Err(e) => {
            println!("  not measured: cannot run {}: {e}", path.display());
            return;
        }
    };
    for line in text.lines() {
        // "nettle umac32 8192 <bytes per second>"
        let f: Vec<&str> = line.split_whitespace().collect();
        let (Some(alg), Some(size), Some(theirs)) = (
            f.get(1),
            f.get(2).and_then(|s| s.parse::<usize>().ok()),
            f.get(3).and_then(|s| s.parse::<f64>().ok()),
        ) else {
            continue;
        };
        let gear = match *alg {
            "umac32" => GearId::Umac32,
            "umac64" => GearId::Umac64,
            _ => continue,
        };
        let Some(ours) = rate(gear, size) else {
            continue;
        };
        let ratio = ours / theirs;
        let verdict = if ratio >= NETTLE_GOAL {
            "met"
        } else {
            "NOT met"
        };
        println!(
            "  {:<8} {size:>6} B  {:>8.1} vs {:>8.1} MB/s  {ratio:>5.2}x  (goal >= {NETTLE_GOAL}x)  {verdict}",
            gear.name(),
            ours / 1e6,
            theirs / 1e6
        );
    }
}

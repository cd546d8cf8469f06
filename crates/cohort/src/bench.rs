//! `cohort gears bench`: every gear timed in this process, with ratios to hmac-sha256
//! measured in the same run (ACSA Figure 4 for this machine with `--svg`).

use crate::UsageError;
use clap::Args;
use cohort_crypto::CryptoProvider;
use cohort_gears::{GearId, GearKey, GearKind, ALL_GEARS};
use std::hint::black_box;
use std::io::{IsTerminal, Write};
use std::path::PathBuf;
use std::time::{Duration, Instant};

/// Bytes of each measured packet treated as header (matters only to partial MACs).
const HEADER: usize = 16;

#[derive(Args)]
pub struct BenchArgs {
    /// Packet sizes in bytes, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "64,1500,8192,65536")]
    sizes: Vec<usize>,
    /// Print a JSON array instead of a table.
    #[arg(long)]
    json: bool,
    /// Also draw forgery bound against speed (ACSA Figure 4) as SVG to this path.
    #[arg(long)]
    svg: Option<PathBuf>,
    /// Time spent per measurement, in milliseconds.
    #[arg(long, default_value_t = 60)]
    millis: u64,
    /// Only these gears (comma-separated names); all by default.
    #[arg(long, value_delimiter = ',')]
    gears: Vec<String>,
    /// Check the project's speed goals instead: ratios to hmac-sha256 in this run.
    #[arg(long, conflicts_with_all = ["json", "svg", "gears", "sizes"])]
    goals: bool,
}

/// The project's speed goals: (gear, packet size, minimum ratio to hmac-sha256).
const GOALS: &[(GearId, usize, f64)] = &[
    (GearId::Umac32, 8192, 15.0),
    (GearId::Partial64, 65_536, 150.0),
    (GearId::Partial64, 8192, 40.0),
    (GearId::Aes128Gcm, 1500, 5.0),
    (GearId::Aes128Gcm, 8192, 5.0),
];

fn goals(budget: Duration) {
    let gears = [
        GearId::HmacSha256,
        GearId::Umac32,
        GearId::Umac64,
        GearId::Partial64,
        GearId::Aes128Gcm,
        GearId::IfgExperimental,
    ];
    let points = measure_all(&gears, &[1500, 8192, 65_536], budget);
    let rate = |g: GearId, size: usize| {
        points
            .iter()
            .find(|p| p.gear == g && p.size == size)
            .map(|p| p.bytes_per_sec)
    };
    println!("speed goals, as ratios to hmac-sha256 measured in this run:");
    for &(gear, size, want) in GOALS {
        let (Some(r), Some(base)) = (rate(gear, size), rate(GearId::HmacSha256, size)) else {
            continue;
        };
        let ratio = r / base;
        let verdict = if ratio >= want { "met" } else { "NOT met" };
        println!(
            "  {:<12} {size:>6} B  {ratio:>8.1}x  (goal >= {want}x)  {verdict}",
            gear.name()
        );
    }
    println!("bit scattering's cost (ACSA open question 1), ifg against umac-32:");
    for size in [1500, 8192, 65_536] {
        if let (Some(i), Some(u)) = (
            rate(GearId::IfgExperimental, size),
            rate(GearId::Umac32, size),
        ) {
            println!(
                "  {size:>6} B  ifg runs at {:.2}x the speed of umac-32",
                i / u
            );
        }
    }
    crate::gears_cmd::nettle_goals(&rate, budget);
}

/// One measurement.
#[derive(Clone, Debug)]
pub struct Point {
    pub gear: GearId,
    pub size: usize,
    pub bytes_per_sec: f64,
}

pub fn run(args: &BenchArgs) -> Result<(), UsageError> {
    for &size in &args.sizes {
        if !(HEADER..=cohort_gears::MAX_PACKET_LEN).contains(&size) {
            return Err(UsageError(format!(
                "--sizes: {size} is outside {HEADER}..={}",
                cohort_gears::MAX_PACKET_LEN
            )));
        }
    }
    if args.goals {
        goals(Duration::from_millis(args.millis));
        return Ok(());
    }
    let mut gears: Vec<GearId> = Vec::new();
    for name in &args.gears {
        gears.push(GearId::from_name(name).ok_or_else(|| {
            UsageError(format!(
                "--gears: unknown gear '{name}' (see `cohort gears list`)"
            ))
        })?);
    }
    if gears.is_empty() {
        gears = ALL_GEARS.iter().map(|g| g.id).collect();
    }
    if !gears.contains(&GearId::HmacSha256) {
        gears.insert(0, GearId::HmacSha256); // the baseline for every ratio
    }
    let points = measure_all(&gears, &args.sizes, Duration::from_millis(args.millis));
    let mhz = cpu_mhz();
    if args.json {
        print_json(&points, mhz);
    } else {
        print_table(&points, mhz);
    }
    if let Some(path) = &args.svg {
        let svg = figure4(&points);
        std::fs::write(path, svg)
            .map_err(|e| UsageError(format!("cannot write {}: {e}", path.display())))?;
        eprintln!("wrote {}", path.display());
    }
    Ok(())
}

pub fn measure_all(gears: &[GearId], sizes: &[usize], budget: Duration) -> Vec<Point> {
    let provider = CryptoProvider::default_provider();
    let total = gears.len() * sizes.len();
    let tty = std::io::stderr().is_terminal();
    let mut points = Vec::with_capacity(total);
    for (gi, &gear) in gears.iter().enumerate() {
        // A fixed secret: the bench measures speed, not secrecy.
        let Ok(key) = GearKey::derive(&provider, &[0x42; 32], gear) else {
            continue;
        };
        for (si, &size) in sizes.iter().enumerate() {
            let n = gi * sizes.len() + si + 1;
            let line = format!("[{n:>3}/{total}] {:<24} {size:>6} B", gear.name());
            if tty {
                eprint!("\r{line}");
                let _ = std::io::stderr().flush();
            } else if si == 0 {
                eprintln!("[{n:>3}/{total}] {}", gear.name());
            }
            let bytes_per_sec = measure(&key, size, budget);
            points.push(Point {
                gear,
                size,
                bytes_per_sec,
            });
        }
    }
    if tty {
        eprintln!("\r{:60}", "");
    }
    points
}

/// Bytes per second tagging (or sealing) `size`-byte packets: the best of five timed runs.
fn measure(key: &GearKey, size: usize, budget: Duration) -> f64 {
    let mut data = vec![0xa5u8; size];
    let mut tag = vec![0u8; key.info().tag_len];
    let mut seq = 0u64;
    let mut once = |data: &mut Vec<u8>| {
        seq += 1;
        if key.info().kind == GearKind::Aead {
            let (aad, body) = data.split_at_mut(HEADER);
            let _ = black_box(key.seal(seq, aad, body));
        } else {
            let _ = key.tag(seq, black_box(data.as_slice()), HEADER, &mut tag);
            black_box(&tag);
        }
    };
    // Find an iteration count that takes about a fifth of the budget.
    let mut iters = 1u64;
    loop {
        let start = Instant::now();
        for _ in 0..iters {
            once(&mut data);
        }
        if start.elapsed() >= budget / 5 || iters >= 1 << 30 {
            break;
        }
        iters *= 2;
    }
    let mut best = Duration::MAX;
    for _ in 0..5 {
        let start = Instant::now();
        for _ in 0..iters {
            once(&mut data);
        }
        best = best.min(start.elapsed());
    }
    (size as f64 * iters as f64) / best.as_secs_f64().max(1e-12)
}

fn baseline(points: &[Point], size: usize) -> Option<f64> {
    points
        .iter()
        .find(|p| p.gear == GearId::HmacSha256 && p.size == size)
        .map(|p| p.bytes_per_sec)
}

/// The clock rate /proc/cpuinfo reports (the first core's, at the time of reading), for an
/// approximate cycles-per-byte column.
fn cpu_mhz() -> Option<f64> {
    let info = std::fs::read_to_string("/proc/cpuinfo").ok()?;
    info.lines()
        .find(|l| l.starts_with("cpu MHz"))
        .and_then(|l| l.split(':').nth(1))
        .and_then(|v| v.trim().parse().ok())
}

fn print_table(points: &[Point], mhz: Option<f64>) {
    match mhz {
        Some(m) => println!("cycles/byte assume {m:.0} MHz, the clock /proc/cpuinfo reports"),
        None => println!("cycles/byte unavailable (no clock rate in /proc/cpuinfo)"),
    }
    println!(
        "{:<24} {:>6} {:>12} {:>11} {:>12} {:>9}",
        "gear", "bytes", "MB/s", "cycles/B", "x hmac", "forgery"
    );
    for p in points {
        let cpb = mhz.map(|m| m * 1e6 / p.bytes_per_sec);
        let ratio = baseline(points, p.size).map(|b| p.bytes_per_sec / b);
        println!(
            "{:<24} {:>6} {:>12.1} {:>11} {:>12} {:>9.2}",
            p.gear.name(),
            p.size,
            p.bytes_per_sec / 1e6,
            cpb.map_or("-".into(), |c| format!("{c:.3}")),
            ratio.map_or("-".into(), |r| format!("{r:.2}")),
            p.gear.info().forgery_bits,
        );
    }
}

fn print_json(points: &[Point], mhz: Option<f64>) {
    let rows: Vec<_> = points
        .iter()
        .map(|p| {
            serde_json::json!({
                "gear": p.gear.name(),
                "size": p.size,
                "bytes_per_sec": p.bytes_per_sec,
                "cycles_per_byte": mhz.map(|m| m * 1e6 / p.bytes_per_sec),
                "ratio_to_hmac_sha256": baseline(points, p.size).map(|b| p.bytes_per_sec / b),
                "forgery_bits": p.gear.info().forgery_bits,
            })
        })
        .collect();
    println!("{}", serde_json::Value::Array(rows));
}

/// ACSA Figure 4 for this machine: forgery bound (bits, up) against speed (log scale,
/// right), one point per gear at the packet size closest to 8 KiB.
pub fn figure4(points: &[Point]) -> String {
    let target = 8192usize;
    let size = points
        .iter()
        .map(|p| p.size)
        .min_by_key(|&s| s.abs_diff(target))
        .unwrap_or(target);
    // The null gear has no tag to compute; its "speed" would stretch the axis meaninglessly.
    let chosen: Vec<&Point> = points
        .iter()
        .filter(|p| p.size == size && p.gear.info().status != cohort_gears::GearStatus::Danger)
        .collect();
    let (w, h, left, right, top, bottom) = (900.0, 560.0, 80.0, 40.0, 40.0, 70.0);
    let speeds: Vec<f64> = chosen
        .iter()
        .map(|p| p.bytes_per_sec.max(1.0).log10())
        .collect();
    let lo = speeds.iter().cloned().fold(f64::INFINITY, f64::min).floor();
    let hi = speeds
        .iter()
        .cloned()
        .fold(f64::NEG_INFINITY, f64::max)
        .ceil()
        .max(lo + 1.0);
    let x = |v: f64| left + (v - lo) / (hi - lo) * (w - left - right);
    let y = |bits: f64| top + (1.0 - bits / 130.0) * (h - top - bottom);
    let mut svg = format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{w}\" height=\"{h}\" \
         font-family=\"sans-serif\" font-size=\"12\">\n\
         <rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n\
         <text x=\"{}\" y=\"22\" text-anchor=\"middle\" font-size=\"15\">Strength against speed \
         on this machine ({size}-byte packets; ACSA Figure 4)</text>\n",
        w / 2.0
    );
    svg += &format!(
        "<line x1=\"{left}\" y1=\"{}\" x2=\"{}\" y2=\"{}\" stroke=\"black\"/>\n\
         <line x1=\"{left}\" y1=\"{top}\" x2=\"{left}\" y2=\"{}\" stroke=\"black\"/>\n",
        h - bottom,
        w - right,
        h - bottom,
        h - bottom
    );
    let mut decade = lo;
    while decade <= hi + 1e-9 {
        let px = x(decade);
        svg += &format!(
            "<line x1=\"{px}\" y1=\"{}\" x2=\"{px}\" y2=\"{}\" stroke=\"#ccc\"/>\
             <text x=\"{px}\" y=\"{}\" text-anchor=\"middle\">{}</text>\n",
            top,
            h - bottom,
            h - bottom + 18.0,
            human_rate(10f64.powf(decade))
        );
        decade += 1.0;
    }
    for bits in (0..=128).step_by(16) {
        let py = y(f64::from(bits));
        svg += &format!(
            "<line x1=\"{left}\" y1=\"{py}\" x2=\"{}\" y2=\"{py}\" stroke=\"#eee\"/>\
             <text x=\"{}\" y=\"{}\" text-anchor=\"end\">{bits}</text>\n",
            w - right,
            left - 6.0,
            py + 4.0
        );
    }
    svg += &format!(
        "<text x=\"{}\" y=\"{}\" text-anchor=\"middle\">tagging speed (bytes/s, log scale)</text>\n\
         <text x=\"18\" y=\"{}\" transform=\"rotate(-90 18 {})\" text-anchor=\"middle\">\
         forgery bound (bits; -log2 P[forgery per attempt])</text>\n",
        (left + w - right) / 2.0,
        h - 20.0,
        h / 2.0,
        h / 2.0
    );
    for (p, s) in chosen.iter().zip(&speeds) {
        let info = p.gear.info();
        let color = match (info.status, info.kind, info.partial_l.is_some()) {
            (cohort_gears::GearStatus::Experimental, _, _) => "#d62728",
            (cohort_gears::GearStatus::Danger, _, _) => "#7f7f7f",
            (_, GearKind::Aead, _) => "#2ca02c",
            (_, _, true) => "#ff7f0e",
            _ => "#1f77b4",
        };
        let (px, py) = (x(*s), y(info.forgery_bits));
        svg += &format!(
            "<circle cx=\"{px:.1}\" cy=\"{py:.1}\" r=\"4\" fill=\"{color}\"/>\
             <text x=\"{:.1}\" y=\"{:.1}\" font-size=\"10\">{}</text>\n",
            px + 6.0,
            py - 4.0,
            p.gear.name()
        );
    }
    svg += "</svg>\n";
    svg
}

fn human_rate(bytes_per_sec: f64) -> String {
    if bytes_per_sec >= 1e9 {
        format!("{:.0} GB/s", bytes_per_sec / 1e9)
    } else if bytes_per_sec >= 1e6 {
        format!("{:.0} MB/s", bytes_per_sec / 1e6)
    } else {
        format!("{:.0} kB/s", bytes_per_sec / 1e3)
    }
}

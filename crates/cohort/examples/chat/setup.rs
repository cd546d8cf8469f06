//! `chat setup DIR N [BASE_PORT]`: keys and config files for `N` members of one group on
//! loopback, so that the chat and kv examples run with one command each. Owns only file
//! writing; the files are the `cohort group run` format (`crates/cohort/src/group/config.rs`).

use cohort_channel::identity::Identity;
use cohort_crypto::CryptoProvider;
use std::fs;
use std::io;
use std::path::Path;

/// Writes `m<i>.key` and `m<i>.toml` for `i` in `0..n` into `dir` (created if missing):
/// member `i` listens on `127.0.0.1:<base_port + i>`, knows every other member as a peer
/// and trusts all of them. Returns the config files' paths.
pub fn write(dir: &Path, n: usize, base_port: u16) -> io::Result<Vec<String>> {
    if n == 0 || n > 64 || usize::from(base_port) + n > 65_536 {
        return Err(io::Error::other(
            "N must be 1 to 64, and the ports must fit",
        ));
    }
    fs::create_dir_all(dir)?;
    let provider = CryptoProvider::default_provider();
    let mut ids = Vec::new();
    for i in 0..n {
        let identity = Identity::generate(&provider)
            .map_err(|e| io::Error::other(format!("cannot generate a key: {e}")))?;
        write_private(
            &dir.join(format!("m{i}.key")),
            identity.to_file_text().as_bytes(),
        )?;
        ids.push(format!("{:?}", identity.public().to_string()));
    }
    let port = |i: usize| usize::from(base_port) + i;
    let mut paths = Vec::new();
    for i in 0..n {
        let peers: Vec<String> = (0..n)
            .filter(|j| *j != i)
            .map(|j| format!("\"127.0.0.1:{}\"", port(j)))
            .collect();
        let text = format!(
            "identity = \"m{i}.key\"\ngroup = \"example\"\nlisten = \"127.0.0.1:{}\"\n\
             peers = [{}]\ntrust = [{}]\n",
            port(i),
            peers.join(", "),
            ids.join(", ")
        );
        let path = dir.join(format!("m{i}.toml"));
        fs::write(&path, text)?;
        paths.push(path.display().to_string());
    }
    Ok(paths)
}

/// Creates `path` readable by its owner only (a key file).
fn write_private(path: &Path, bytes: &[u8]) -> io::Result<()> {
    let mut options = fs::OpenOptions::new();
    options.write(true).create(true).truncate(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        options.mode(0o600);
    }
    io::Write::write_all(&mut options.open(path)?, bytes)
}

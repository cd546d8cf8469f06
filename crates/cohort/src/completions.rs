//! `cohort completions SHELL` and `cohort man`: shell completion scripts and roff man pages,
//! generated from the same clap definition that parses the command line, so they cannot
//! drift from it.
//!
//! ```text
//!   Cli (clap derive) ──CommandFactory──▶ clap::Command ─┬─ clap_complete ─▶ stdout (script)
//!                                                        └─ clap_mangen ───▶ stdout (roff)
//!                                                                          or DIR/cohort*.1
//! ```

use crate::UsageError;
use clap::Args;
use clap_complete::Shell;
use std::io::Write;
use std::path::PathBuf;

/// `cohort completions`.
#[derive(Args)]
pub struct CompletionsArgs {
    /// The shell: bash, elvish, fish, powershell or zsh.
    shell: Shell,
}

/// `cohort man`.
#[derive(Args)]
pub struct ManArgs {
    /// Write one page per command (cohort.1, cohort-group-run.1, ...) into this directory
    /// instead of printing the top-level page.
    #[arg(long)]
    dir: Option<PathBuf>,
}

/// Prints the completion script for `args.shell`.
pub fn completions(args: &CompletionsArgs, mut cmd: clap::Command) -> Result<(), UsageError> {
    let name = cmd.get_name().to_string();
    let mut out = Vec::new();
    clap_complete::generate(args.shell, &mut cmd, name, &mut out);
    write_stdout(&out)
}

/// Prints the top-level man page, or writes every page into `args.dir`.
pub fn man(args: &ManArgs, cmd: clap::Command) -> Result<(), UsageError> {
    if let Some(dir) = &args.dir {
        std::fs::create_dir_all(dir)
            .map_err(|e| UsageError(format!("cannot create {}: {e}", dir.display())))?;
        return clap_mangen::generate_to(cmd, dir).map_err(|e| {
            UsageError(format!(
                "cannot write man pages into {}: {e}",
                dir.display()
            ))
        });
    }
    let mut out = Vec::new();
    clap_mangen::Man::new(cmd)
        .render(&mut out)
        .map_err(|e| UsageError(format!("cannot render the man page: {e}")))?;
    write_stdout(&out)
}

/// Writes `bytes` to stdout; a closed pipe (`| head`) is not an error.
fn write_stdout(bytes: &[u8]) -> Result<(), UsageError> {
    let mut stdout = std::io::stdout().lock();
    match stdout.write_all(bytes).and_then(|()| stdout.flush()) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(()),
        Err(e) => Err(UsageError(format!("cannot write to standard output: {e}"))),
    }
}

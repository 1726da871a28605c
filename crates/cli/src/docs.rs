//! `hoardfs completions SHELL` and `hoardfs man DIR`: shell completion scripts and man
//! pages generated from the command-line definitions, so they never disagree with
//! `--help`. Packaging runs both (dist/deb.sh).

use crate::error::CliResult;
use std::io::Write;
use std::path::{Path, PathBuf};

use clap::Args;

/// Options of `hoardfs completions`.
#[derive(Args, Debug)]
#[command(after_help = "Examples:
  hoardfs completions bash > /etc/bash_completion.d/hoardfs
  hoardfs completions zsh > /usr/local/share/zsh/site-functions/_hoardfs
  hoardfs completions fish > /etc/fish/completions/hoardfs.fish")]
pub struct CompletionsArgs {
    /// The shell to complete for.
    #[arg(value_enum)]
    pub shell: clap_complete::Shell,
}

/// Options of `hoardfs man`.
#[derive(Args, Debug)]
#[command(after_help = "Example: hoardfs man /usr/local/share/man/man1 && man hoardfs-mount")]
pub struct ManArgs {
    /// Directory to write hoardfs.1 and hoardfs-COMMAND.1 into (created if missing).
    pub dir: PathBuf,
}

/// Prints the completion script for `a.shell` to stdout.
pub fn completions(a: CompletionsArgs, mut cmd: clap::Command) -> CliResult<()> {
    let mut script = Vec::new();
    clap_complete::generate(a.shell, &mut cmd, "hoardfs", &mut script);
    match std::io::stdout().write_all(&script) {
        Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => Err(format!("stdout: {e}").into()),
        _ => Ok(()),
    }
}

/// Writes one man page per command and subcommand into `a.dir`.
pub fn man(a: ManArgs, cmd: clap::Command) -> CliResult<()> {
    std::fs::create_dir_all(&a.dir).map_err(|e| format!("{}: {e}", a.dir.display()))?;
    let mut cmd = cmd.disable_help_subcommand(true);
    cmd.build();
    let n = write_pages(&cmd, &a.dir)
        .map_err(|e| format!("cannot write man pages to {}: {e}", a.dir.display()))?;
    println!("wrote {n} man pages to {}", a.dir.display());
    Ok(())
}

/// Writes the page of `cmd` and of its subcommands; returns how many.
fn write_pages(cmd: &clap::Command, dir: &Path) -> std::io::Result<usize> {
    let mut n = 1;
    for sub in cmd.get_subcommands().filter(|s| !s.is_hide_set()) {
        n += write_pages(sub, dir)?;
    }
    // clap_mangen would fill the text after the options into paragraphs, which mangles
    // examples: it goes in an EXAMPLES section, line by line.
    let extra = cmd.get_after_help().map(|h| h.to_string());
    let man = clap_mangen::Man::new(cmd.clone().after_help(None::<&'static str>));
    let mut page = Vec::new();
    man.render(&mut page)?;
    if let Some(text) = extra {
        page.extend_from_slice(b".SH EXAMPLES\n.nf\n");
        for line in text.lines() {
            page.extend_from_slice(roff_line(line).as_bytes());
            page.push(b'\n');
        }
        page.extend_from_slice(b".fi\n");
    }
    std::fs::write(dir.join(man.get_filename()), page)?;
    Ok(n)
}

/// `line` as literal roff text: backslashes and hyphens escaped, no control character
/// at the start.
fn roff_line(line: &str) -> String {
    let t = line.replace('\\', "\\e").replace('-', "\\-");
    if t.starts_with(['.', '\'']) {
        format!("\\&{t}")
    } else {
        t
    }
}

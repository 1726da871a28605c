//! `hoardfs token add|list|revoke`: a server's named client credentials, kept hashed in
//! its state directory (see `hoardfs_server::credentials`).

use crate::error::CliResult;
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::PathBuf;

use clap::{Args, Subcommand};
use hoardfs_server::credentials::{Rights, admin};

/// Where the server keeps its state.
#[derive(Args, Debug, Clone)]
pub struct StateArgs {
    /// The server's state directory (as given to `hoardfs serve --state-dir`). Default:
    /// /var/lib/hoardfs as root, else $XDG_STATE_HOME/hoardfs or ~/.local/state/hoardfs.
    #[arg(long, value_name = "DIR")]
    pub state_dir: Option<PathBuf>,
}

impl StateArgs {
    fn dir(&self) -> PathBuf {
        self.state_dir
            .clone()
            .unwrap_or_else(hoardfs_tls::default_state_dir)
    }
}

/// `hoardfs token …`.
#[derive(Subcommand, Debug)]
pub enum TokenCommand {
    /// Create a credential for one client and print it (shown once; the server keeps only
    /// its hash). Give it to the client as `mount --token-file FILE`.
    Add {
        /// A name for the client (letters, digits, '_' and '-'), used in logs and to revoke.
        name: String,
        /// Write the token to this new file (mode 0600) instead of printing it.
        #[arg(long, value_name = "FILE")]
        output: Option<PathBuf>,
        /// Every request made with this credential is this user (and group; default: the
        /// user's primary group on the server), whatever the client claims: a laptop, a
        /// service, one person's credential. Its supplementary groups are the user's on
        /// the server.
        #[arg(long, value_name = "UID[:GID]", conflicts_with_all = ["uids", "gids"])]
        user: Option<String>,
        /// Claims of uids outside this range become the anonymous uid (a client that
        /// hosts a range of users; root squash applies as well).
        #[arg(long, value_name = "FIRST-LAST")]
        uids: Option<String>,
        /// Claims of gids (and supplementary groups) outside this range become the
        /// anonymous gid (dropped). Default with --uids: the same range.
        #[arg(long, value_name = "FIRST-LAST")]
        gids: Option<String>,
        /// The credential may only read: every request that changes something is refused
        /// (EROFS), and its clients mount read-only.
        #[arg(long)]
        read_only: bool,
        #[command(flatten)]
        state: StateArgs,
    },
    /// List the credentials the server accepts.
    List {
        #[command(flatten)]
        state: StateArgs,
    },
    /// Revoke a credential: new connections with it are refused and a running server
    /// closes its open ones within a second.
    Revoke {
        /// The name given to `token add`.
        name: String,
        #[command(flatten)]
        state: StateArgs,
    },
}

/// Runs a `token` subcommand.
pub fn run(cmd: TokenCommand) -> CliResult<()> {
    match cmd {
        TokenCommand::Add {
            name,
            output,
            user,
            uids,
            gids,
            read_only,
            state,
        } => {
            let words: Vec<String> = [
                user.map(|u| format!("user={u}")),
                uids.map(|u| format!("uids={u}")),
                gids.map(|g| format!("gids={g}")),
                read_only.then(|| "ro".to_owned()),
            ]
            .into_iter()
            .flatten()
            .collect();
            let rights = Rights::parse(words.iter().map(String::as_str))?;
            if let hoardfs_proto::Restrict::User(c) = &rights.restrict
                && c.uid == 0
            {
                eprintln!(
                    "hoardfs: warning: a credential for uid 0 acts as root only on a server \
                     started with --squash none; otherwise as the anonymous user"
                );
            }
            // The output file first: a token nobody can see must not be added.
            let file = match &output {
                Some(p) => Some(
                    std::fs::OpenOptions::new()
                        .write(true)
                        .create_new(true)
                        .mode(0o600)
                        .open(p)
                        .map_err(|e| format!("cannot create {}: {e}", p.display()))?,
                ),
                None => None,
            };
            let token = match admin::add(&state.dir(), &name, &rights) {
                Ok(t) => t,
                Err(e) => {
                    if let Some(p) = &output {
                        let _ = std::fs::remove_file(p);
                    }
                    return Err(e.into());
                }
            };
            match (file, output) {
                (Some(mut f), Some(p)) => {
                    writeln!(f, "{token}").map_err(|e| format!("{}: {e}", p.display()))?;
                    eprintln!("hoardfs: token for {name} written to {}", p.display());
                }
                _ => println!("{token}"),
            }
            Ok(())
        }
        TokenCommand::List { state } => {
            let list = admin::list(&state.dir())?;
            if list.is_empty() {
                println!("no named tokens in {}", state.dir().display());
            }
            for t in list {
                let rights = if t.rights.is_empty() {
                    "any user (claims mapped by --squash), read-write".to_owned()
                } else {
                    t.rights.join(" ")
                };
                println!("{}\tadded {}\t{rights}", t.name, utc(t.created));
            }
            Ok(())
        }
        TokenCommand::Revoke { name, state } => {
            admin::revoke(&state.dir(), &name)?;
            eprintln!("hoardfs: revoked {name}");
            Ok(())
        }
    }
}

/// `YYYY-MM-DD HH:MM UTC` for seconds since the Unix epoch.
fn utc(secs: u64) -> String {
    let t = secs as libc::time_t;
    // SAFETY: gmtime_r writes into our local struct; `t` is a plain integer.
    let tm = unsafe {
        let mut tm: libc::tm = std::mem::zeroed();
        if libc::gmtime_r(&t, &mut tm).is_null() {
            return format!("{secs} s after 1970");
        }
        tm
    };
    format!(
        "{:04}-{:02}-{:02} {:02}:{:02} UTC",
        tm.tm_year + 1900,
        tm.tm_mon + 1,
        tm.tm_mday,
        tm.tm_hour,
        tm.tm_min
    )
}

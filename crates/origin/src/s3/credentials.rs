//! Where S3 credentials and the region come from: the standard AWS chain as far as files
//! and the environment go (as the AWS CLI reads them). SSO, web identity and instance
//! metadata are not supported; doc/CONFIGURATION.md says so.
//!
//! Credentials: `AWS_ACCESS_KEY_ID` + `AWS_SECRET_ACCESS_KEY` (+ `AWS_SESSION_TOKEN`),
//! else the profile `AWS_PROFILE` (default `default`) in `AWS_SHARED_CREDENTIALS_FILE`
//! (default `~/.aws/credentials`), else in `AWS_CONFIG_FILE` (default `~/.aws/config`,
//! section `[profile NAME]` or `[default]`). Region: the flag, `AWS_REGION`,
//! `AWS_DEFAULT_REGION`, the profile's `region` in the config file, else `us-east-1`.

use std::collections::HashMap;
use std::path::PathBuf;

use rusty_s3::Credentials;

/// Reads environment variables (a function so tests need not touch the process's).
pub type Env<'a> = &'a dyn Fn(&str) -> Option<String>;

/// The process environment.
pub fn process_env(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.is_empty())
}

/// Where the credentials came from (for the mount's log line; never the secret).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CredentialSource {
    /// Environment variables.
    Environment,
    /// A profile in a shared file.
    Profile {
        /// Profile name.
        name: String,
        /// File it was found in.
        file: PathBuf,
    },
    /// None found: requests are unsigned (public buckets only).
    Anonymous,
}

impl std::fmt::Display for CredentialSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            CredentialSource::Environment => write!(f, "environment (AWS_ACCESS_KEY_ID)"),
            CredentialSource::Profile { name, file } => {
                write!(f, "profile {name:?} in {}", file.display())
            }
            CredentialSource::Anonymous => write!(f, "none (unsigned requests)"),
        }
    }
}

/// Finds credentials by the chain above. A profile that was asked for by name
/// (`AWS_PROFILE`) but has no keys is an error, not a silent fall-back to anonymous.
pub fn credentials(env: Env<'_>) -> Result<(Option<Credentials>, CredentialSource), String> {
    if let (Some(k), Some(s)) = (env("AWS_ACCESS_KEY_ID"), env("AWS_SECRET_ACCESS_KEY")) {
        let c = match env("AWS_SESSION_TOKEN") {
            Some(t) => Credentials::new_with_token(k, s, t),
            None => Credentials::new(k, s),
        };
        return Ok((Some(c), CredentialSource::Environment));
    }
    let named = env("AWS_PROFILE");
    let profile = named.clone().unwrap_or_else(|| "default".into());
    for (file, section) in [
        (credentials_file(env), profile.clone()),
        (config_file(env), config_section(&profile)),
    ] {
        let Some(file) = file else { continue };
        let Ok(text) = std::fs::read_to_string(&file) else {
            continue;
        };
        let sections = parse_ini(&text);
        let Some(kv) = sections.get(&section) else {
            continue;
        };
        if let (Some(k), Some(s)) = (kv.get("aws_access_key_id"), kv.get("aws_secret_access_key")) {
            let c = match kv.get("aws_session_token") {
                Some(t) => Credentials::new_with_token(k.clone(), s.clone(), t.clone()),
                None => Credentials::new(k.clone(), s.clone()),
            };
            return Ok((
                Some(c),
                CredentialSource::Profile {
                    name: profile,
                    file,
                },
            ));
        }
    }
    if named.is_some() {
        return Err(format!(
            "AWS_PROFILE={profile:?}, but no aws_access_key_id/aws_secret_access_key for it in \
             the credentials or config file"
        ));
    }
    Ok((None, CredentialSource::Anonymous))
}

/// The region by the chain above (`flag` first).
pub fn region(flag: Option<&str>, env: Env<'_>) -> String {
    if let Some(r) = flag.filter(|r| !r.is_empty()) {
        return r.to_string();
    }
    if let Some(r) = env("AWS_REGION").or_else(|| env("AWS_DEFAULT_REGION")) {
        return r;
    }
    let profile = env("AWS_PROFILE").unwrap_or_else(|| "default".into());
    if let Some(text) = config_file(env).and_then(|f| std::fs::read_to_string(f).ok())
        && let Some(r) = parse_ini(&text)
            .get(&config_section(&profile))
            .and_then(|kv| kv.get("region"))
    {
        return r.clone();
    }
    "us-east-1".into()
}

/// The endpoint: the flag, `AWS_ENDPOINT_URL_S3`, `AWS_ENDPOINT_URL`, else AWS's.
pub fn endpoint(flag: Option<&str>, region: &str, env: Env<'_>) -> String {
    flag.map(str::to_string)
        .or_else(|| env("AWS_ENDPOINT_URL_S3"))
        .or_else(|| env("AWS_ENDPOINT_URL"))
        .unwrap_or_else(|| format!("https://s3.{region}.amazonaws.com"))
}

fn home(env: Env<'_>) -> Option<PathBuf> {
    env("HOME").map(PathBuf::from)
}

fn credentials_file(env: Env<'_>) -> Option<PathBuf> {
    env("AWS_SHARED_CREDENTIALS_FILE")
        .map(PathBuf::from)
        .or_else(|| home(env).map(|h| h.join(".aws/credentials")))
}

fn config_file(env: Env<'_>) -> Option<PathBuf> {
    env("AWS_CONFIG_FILE")
        .map(PathBuf::from)
        .or_else(|| home(env).map(|h| h.join(".aws/config")))
}

fn config_section(profile: &str) -> String {
    if profile == "default" {
        "default".into()
    } else {
        format!("profile {profile}")
    }
}

/// Sections of an INI file: `[name]` → lowercase keys → values. Comments (`#`, `;`) and
/// lines that are not `key = value` are ignored; nested (indented) values are skipped.
fn parse_ini(text: &str) -> HashMap<String, HashMap<String, String>> {
    let mut out: HashMap<String, HashMap<String, String>> = HashMap::new();
    let mut current: Option<String> = None;
    for line in text.lines() {
        if line.starts_with([' ', '\t']) {
            continue;
        }
        let line = line.trim();
        if line.is_empty() || line.starts_with(['#', ';']) {
            continue;
        }
        if let Some(name) = line.strip_prefix('[').and_then(|l| l.strip_suffix(']')) {
            let name = name.split_whitespace().collect::<Vec<_>>().join(" ");
            out.entry(name.clone()).or_default();
            current = Some(name);
            continue;
        }
        if let (Some(sec), Some((k, v))) = (&current, line.split_once('=')) {
            out.entry(sec.clone())
                .or_default()
                .insert(k.trim().to_ascii_lowercase(), v.trim().to_string());
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env_of(vars: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let m: HashMap<String, String> = vars
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        move |k| m.get(k).cloned()
    }

    #[test]
    fn environment_keys_come_first() {
        let e = env_of(&[("AWS_ACCESS_KEY_ID", "AK"), ("AWS_SECRET_ACCESS_KEY", "SK")]);
        let (c, src) = credentials(&e).unwrap();
        assert_eq!(c.unwrap().key(), "AK");
        assert_eq!(src, CredentialSource::Environment);
    }

    #[test]
    fn profiles_are_read_from_both_files() {
        let d = tempfile::tempdir().unwrap();
        let creds = d.path().join("credentials");
        let config = d.path().join("config");
        std::fs::write(
            &creds,
            "# c\n[default]\naws_access_key_id = DEF\naws_secret_access_key=DS\n\n[other]\n\
             aws_access_key_id=O\naws_secret_access_key = OS\naws_session_token = T\n",
        )
        .unwrap();
        std::fs::write(
            &config,
            "[profile cfgonly]\nregion = eu-west-3\naws_access_key_id=C\naws_secret_access_key=CS\n\
             s3 =\n  addressing_style = path\n",
        )
        .unwrap();
        let base = [
            ("AWS_SHARED_CREDENTIALS_FILE", creds.to_str().unwrap()),
            ("AWS_CONFIG_FILE", config.to_str().unwrap()),
        ];
        let (c, _) = credentials(&env_of(&base)).unwrap();
        assert_eq!(c.unwrap().key(), "DEF");
        let mut v = base.to_vec();
        v.push(("AWS_PROFILE", "other"));
        let (c, src) = credentials(&env_of(&v)).unwrap();
        let c = c.unwrap();
        assert_eq!((c.key(), c.secret(), c.token()), ("O", "OS", Some("T")));
        assert!(matches!(src, CredentialSource::Profile { ref name, .. } if name == "other"));
        let mut v = base.to_vec();
        v.push(("AWS_PROFILE", "cfgonly"));
        let (c, _) = credentials(&env_of(&v)).unwrap();
        assert_eq!(c.unwrap().key(), "C");
        assert_eq!(region(None, &env_of(&v)), "eu-west-3");
        assert_eq!(region(Some("r1"), &env_of(&v)), "r1");
        let mut v = base.to_vec();
        v.push(("AWS_PROFILE", "missing"));
        assert!(credentials(&env_of(&v)).unwrap_err().contains("missing"));
    }

    #[test]
    fn no_credentials_means_unsigned() {
        let (c, src) = credentials(&env_of(&[("HOME", "/nonexistent")])).unwrap();
        assert!(c.is_none());
        assert_eq!(src, CredentialSource::Anonymous);
        assert_eq!(region(None, &env_of(&[])), "us-east-1");
        assert_eq!(
            endpoint(None, "eu-west-1", &env_of(&[])),
            "https://s3.eu-west-1.amazonaws.com"
        );
        assert_eq!(
            endpoint(None, "x", &env_of(&[("AWS_ENDPOINT_URL", "http://e")])),
            "http://e"
        );
    }
}

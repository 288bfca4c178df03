//! Who may act: operators' credentials (kept as SHA-256 digests, compared in constant time),
//! sessions with their CSRF token, and the limit on wrong credentials per client address.

use std::collections::HashMap;
use std::net::IpAddr;
use std::path::Path;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

/// The environment variable holding a shared token.
pub(crate) const TOKEN_ENV: &str = "EVENTCTL_CONSOLE_TOKEN";

/// The shortest secret accepted: anything shorter is guessable.
const MIN_SECRET: usize = 16;

/// Wrong logins allowed per client address per window before it is refused.
const MAX_FAILURES: u32 = 5;
const FAILURE_WINDOW: Duration = Duration::from_secs(60);

/// How long a login lasts.
const SESSION_TTL: Duration = Duration::from_secs(8 * 3600);
/// Sessions kept at most; the oldest go first.
const MAX_SESSIONS: usize = 10_000;

/// Operators' credentials, as digests.
#[derive(Debug, Default)]
pub(crate) struct Credentials {
    /// `(user, digest of the secret)` from the auth file.
    users: Vec<(String, [u8; 32])>,
    /// The shared token's digest, from the environment: any user name is taken with it.
    shared: Option<[u8; 32]>,
}

fn digest(secret: &str) -> [u8; 32] {
    Sha256::digest(secret.as_bytes()).into()
}

impl Credentials {
    /// Reads the auth file (lines `user:secret`, `#` comments) and the shared token.
    pub(crate) fn load(file: Option<&Path>, shared: Option<String>) -> anyhow::Result<Self> {
        let mut credentials = Credentials::default();
        if let Some(path) = file {
            let text = std::fs::read_to_string(path)
                .with_context(|| format!("cannot read the auth file {}", path.display()))?;
            for (n, line) in text.lines().enumerate() {
                let line = line.trim();
                if line.is_empty() || line.starts_with('#') {
                    continue;
                }
                let Some((user, secret)) = line.split_once(':') else {
                    bail!("{} line {}: expected `user:secret`", path.display(), n + 1);
                };
                let user = user.trim();
                if user.is_empty() || secret.chars().count() < MIN_SECRET {
                    bail!(
                        "{} line {}: the user is empty or the secret is shorter than {MIN_SECRET} characters",
                        path.display(),
                        n + 1
                    );
                }
                credentials.users.push((user.to_owned(), digest(secret)));
            }
            if credentials.users.is_empty() {
                bail!("the auth file {} names no user", path.display());
            }
        }
        if let Some(token) = shared.filter(|t| !t.is_empty()) {
            if token.chars().count() < MIN_SECRET {
                bail!(
                    "{TOKEN_ENV} is shorter than {MIN_SECRET} characters: use a long random token"
                );
            }
            credentials.shared = Some(digest(&token));
        }
        Ok(credentials)
    }

    /// Whether anyone can log in.
    pub(crate) fn any(&self) -> bool {
        self.shared.is_some() || !self.users.is_empty()
    }

    /// The name to record for `user` with `secret`, when they match.
    pub(crate) fn check(&self, user: &str, secret: &str) -> Option<String> {
        let user = user.trim();
        if user.is_empty() || user.len() > 64 {
            return None;
        }
        let given = digest(secret);
        // Every entry is compared, so the time does not tell which user exists.
        let mut found = None;
        for (name, expected) in &self.users {
            let same: bool = expected.ct_eq(&given).into();
            if same && name == user {
                found = Some(name.clone());
            }
        }
        if let Some(expected) = &self.shared {
            let same: bool = expected.ct_eq(&given).into();
            if same && found.is_none() {
                found = Some(user.to_owned());
            }
        }
        found
    }
}

/// A random identifier: 32 bytes from the operating system, as hex.
pub(crate) fn random_id() -> anyhow::Result<String> {
    let mut bytes = [0_u8; 32];
    getrandom::fill(&mut bytes).map_err(|e| anyhow::anyhow!("no random numbers: {e}"))?;
    Ok(bytes.iter().map(|b| format!("{b:02x}")).collect())
}

/// A logged-in operator.
#[derive(Debug, Clone)]
pub(crate) struct Session {
    pub(crate) user: String,
    pub(crate) csrf: String,
    expires: Instant,
}

impl Session {
    /// Whether `token` is this session's CSRF token.
    pub(crate) fn csrf_matches(&self, token: &str) -> bool {
        self.csrf.as_bytes().ct_eq(token.as_bytes()).into()
    }
}

/// Sessions by id, and wrong logins per address.
#[derive(Debug, Default)]
pub(crate) struct Gate {
    sessions: Mutex<HashMap<String, Session>>,
    failures: Mutex<HashMap<IpAddr, (Instant, u32)>>,
}

impl Gate {
    /// Starts a session for `user`: returns its id (the cookie).
    pub(crate) fn open(&self, user: String) -> anyhow::Result<String> {
        let id = random_id()?;
        let session = Session {
            user,
            csrf: random_id()?,
            expires: Instant::now() + SESSION_TTL,
        };
        let mut sessions = self.sessions.lock().unwrap_or_else(|p| p.into_inner());
        let now = Instant::now();
        sessions.retain(|_, s| s.expires > now);
        if sessions.len() >= MAX_SESSIONS
            && let Some(oldest) = sessions
                .iter()
                .min_by_key(|(_, s)| s.expires)
                .map(|(k, _)| k.clone())
        {
            sessions.remove(&oldest);
        }
        sessions.insert(id.clone(), session);
        Ok(id)
    }

    /// The live session with id `id`.
    pub(crate) fn session(&self, id: &str) -> Option<Session> {
        let sessions = self.sessions.lock().unwrap_or_else(|p| p.into_inner());
        sessions
            .get(id)
            .filter(|s| s.expires > Instant::now())
            .cloned()
    }

    /// Ends the session `id`.
    pub(crate) fn close(&self, id: &str) {
        let mut sessions = self.sessions.lock().unwrap_or_else(|p| p.into_inner());
        sessions.remove(id);
    }

    /// Whether `client` has used up its wrong logins for now.
    pub(crate) fn locked_out(&self, client: IpAddr) -> bool {
        let failures = self.failures.lock().unwrap_or_else(|p| p.into_inner());
        matches!(failures.get(&client), Some((since, n)) if *n >= MAX_FAILURES && since.elapsed() < FAILURE_WINDOW)
    }

    /// Counts a wrong login from `client`.
    pub(crate) fn failed(&self, client: IpAddr) {
        let mut failures = self.failures.lock().unwrap_or_else(|p| p.into_inner());
        if failures.len() > 100_000 {
            failures.retain(|_, (since, _)| since.elapsed() < FAILURE_WINDOW);
        }
        let entry = failures.entry(client).or_insert((Instant::now(), 0));
        if entry.0.elapsed() >= FAILURE_WINDOW {
            *entry = (Instant::now(), 0);
        }
        entry.1 += 1;
    }

    /// Forgets `client`'s wrong logins after a right one.
    pub(crate) fn succeeded(&self, client: IpAddr) {
        let mut failures = self.failures.lock().unwrap_or_else(|p| p.into_inner());
        failures.remove(&client);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secrets_match_only_their_user_and_short_ones_are_refused() {
        let dir = std::env::temp_dir().join(format!("eventctl-auth-{}", std::process::id()));
        std::fs::create_dir_all(&dir).ok();
        let file = dir.join("users");
        std::fs::write(
            &file,
            "# operators\nalice:correct-horse-battery\nbob:another-long-secret\n",
        )
        .ok();
        let c = Credentials::load(Some(&file), None).expect("valid file");
        assert_eq!(
            c.check("alice", "correct-horse-battery").as_deref(),
            Some("alice")
        );
        assert_eq!(c.check("bob", "correct-horse-battery"), None);
        assert_eq!(c.check("alice", "wrong"), None);
        std::fs::write(&file, "carol:short\n").ok();
        let e = Credentials::load(Some(&file), None).expect_err("short secret");
        assert!(e.to_string().contains("shorter than 16"), "{e}");
        let e = Credentials::load(None, Some("tiny".into())).expect_err("short token");
        assert!(e.to_string().contains(TOKEN_ENV), "{e}");
        let c = Credentials::load(None, Some("a-shared-token-of-length".into())).expect("token");
        assert_eq!(
            c.check("dave", "a-shared-token-of-length").as_deref(),
            Some("dave")
        );
        assert_eq!(c.check("", "a-shared-token-of-length"), None);
        std::fs::remove_dir_all(&dir).ok();
    }

    #[test]
    fn a_client_is_locked_out_after_five_wrong_logins() {
        let gate = Gate::default();
        let client: IpAddr = [127, 0, 0, 1].into();
        for _ in 0..MAX_FAILURES {
            assert!(!gate.locked_out(client));
            gate.failed(client);
        }
        assert!(gate.locked_out(client));
        assert!(!gate.locked_out([127, 0, 0, 2].into()));
    }
}

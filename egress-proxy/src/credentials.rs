//! Credentials the proxy attaches to inspected requests, and the placeholders the sandbox holds
//! instead of them.
//!
//! A [`Secret`] never prints: its `Debug` is redacted and it has no `Display`. Only
//! [`Credential::header_value`] (used when a request is forwarded upstream, as the whole value of
//! the credential's header) reads it; a placeholder is never swapped in place. Placeholders (`sgph_` and 32 random hex characters) are fresh per execution,
//! so a placeholder seen in one execution means nothing in another.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, PoisonError, RwLock};

use rand::RngCore;

/// Prefix of every placeholder.
pub const PLACEHOLDER_PREFIX: &str = "sgph_";
/// Prefix of the environment variable holding a credential's placeholder.
pub const PLACEHOLDER_ENV_PREFIX: &str = "SANDGATE_CREDENTIAL_";

/// A credential's value. Cheap to clone; never printed.
#[derive(Clone)]
pub struct Secret(Arc<str>);

impl Secret {
    pub fn new(value: impl Into<Arc<str>>) -> Secret {
        Secret(value.into())
    }

    /// The value, for the places that must send it upstream (and for tests looking for leaks).
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Secret(<redacted>)")
    }
}

/// One credential from the gateway's config: its name, the header it goes in, and the format of
/// that header's value (`{value}` replaced by the secret, e.g. `Bearer {value}`).
#[derive(Debug, Clone)]
pub struct Credential {
    pub name: String,
    /// Lower-case header name.
    pub header: String,
    pub format: String,
    pub value: Secret,
}

impl Credential {
    /// The header value sent upstream.
    pub(crate) fn header_value(&self) -> String {
        self.format.replace("{value}", self.value.expose())
    }
}

/// The gateway's credentials by name. Clones share one set, which a reload replaces as a whole
/// (the values read again); an execution takes the credentials current when its inspection is
/// prepared and keeps them for its life.
#[derive(Clone, Default)]
pub struct CredentialSet(Arc<RwLock<Arc<BTreeMap<String, Credential>>>>);

impl CredentialSet {
    pub fn new(credentials: BTreeMap<String, Credential>) -> CredentialSet {
        CredentialSet(Arc::new(RwLock::new(Arc::new(credentials))))
    }

    /// The current credential of that name.
    pub fn get(&self, name: &str) -> Option<Credential> {
        self.current().get(name).cloned()
    }

    /// Replaces every credential at once (executions that already started keep theirs).
    pub fn replace(&self, credentials: BTreeMap<String, Credential>) {
        *self.0.write().unwrap_or_else(PoisonError::into_inner) = Arc::new(credentials);
    }

    fn current(&self) -> Arc<BTreeMap<String, Credential>> {
        Arc::clone(&self.0.read().unwrap_or_else(PoisonError::into_inner))
    }
}

/// Names only: the values never print.
impl std::fmt::Debug for CredentialSet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_set().entries(self.current().keys()).finish()
    }
}

/// The credentials one execution's grant names, each with its placeholder.
#[derive(Debug, Clone, Default)]
pub struct ExecutionCredentials {
    entries: Vec<(Credential, String)>,
}

impl ExecutionCredentials {
    /// Gives each credential a fresh random placeholder.
    pub fn new(credentials: Vec<Credential>) -> ExecutionCredentials {
        ExecutionCredentials::carrying(credentials, &ExecutionCredentials::default())
    }

    /// Gives each credential the placeholder `carried` has for its name (a restored sandbox
    /// holds those), else a fresh random one.
    pub fn carrying(
        credentials: Vec<Credential>,
        carried: &ExecutionCredentials,
    ) -> ExecutionCredentials {
        let mut rng = rand::thread_rng();
        let entries = credentials
            .into_iter()
            .map(|credential| {
                let kept = carried
                    .entries
                    .iter()
                    .find(|(old, _)| old.name == credential.name)
                    .map(|(_, placeholder)| placeholder.clone());
                let placeholder = kept.unwrap_or_else(|| {
                    let mut bytes = [0u8; 16];
                    rng.fill_bytes(&mut bytes);
                    format!("{PLACEHOLDER_PREFIX}{}", hex::encode(bytes))
                });
                (credential, placeholder)
            })
            .collect();
        ExecutionCredentials { entries }
    }

    /// `SANDGATE_CREDENTIAL_<NAME>=<placeholder>` for each credential: the only trace of a
    /// credential the sandbox gets.
    pub fn env(&self) -> Vec<(String, String)> {
        self.entries
            .iter()
            .map(|(credential, placeholder)| {
                (placeholder_env_name(&credential.name), placeholder.clone())
            })
            .collect()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    pub(crate) fn get(&self, name: &str) -> Option<&Credential> {
        self.entries
            .iter()
            .find(|(credential, _)| credential.name == name)
            .map(|(credential, _)| credential)
    }

    /// Names of the credentials whose placeholder occurs in `text`.
    pub(crate) fn placeholders_in(&self, text: &[u8]) -> BTreeSet<String> {
        self.entries
            .iter()
            .filter(|(_, placeholder)| contains(text, placeholder.as_bytes()))
            .map(|(credential, _)| credential.name.clone())
            .collect()
    }

    /// Names of the credentials whose placeholder a request's head carries where no
    /// placeholder may be (issue 21 item 6): anywhere in the target (path or query), in any
    /// header but the credential's own, or in its own header when `granted` does not name it.
    /// The credential's own header is then replaced whole by its configured value, so a
    /// placeholder is never swapped in place and an upstream that reflects the target or
    /// another header never sees (or hands back) a value.
    pub(crate) fn misdirected<'a>(
        &self,
        target: &[u8],
        headers: impl IntoIterator<Item = (&'a str, &'a [u8])>,
        granted: &[String],
    ) -> BTreeSet<String> {
        let mut found = self.placeholders_in(target);
        for (name, value) in headers {
            for credential in self.placeholders_in(value) {
                let own = self.get(&credential).is_some_and(|c| c.header == name)
                    && granted.contains(&credential);
                if !own {
                    found.insert(credential);
                }
            }
        }
        found
    }
}

/// Length of every placeholder: the prefix and 32 hex digits.
pub(crate) const PLACEHOLDER_LEN: usize = PLACEHOLDER_PREFIX.len() + 32;

/// `SANDGATE_CREDENTIAL_` and the name in upper case, anything but letters and digits as `_`.
pub fn placeholder_env_name(name: &str) -> String {
    let upper: String = name
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() {
                c.to_ascii_uppercase()
            } else {
                '_'
            }
        })
        .collect();
    format!("{PLACEHOLDER_ENV_PREFIX}{upper}")
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    !needle.is_empty()
        && haystack
            .windows(needle.len())
            .any(|window| window == needle)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn github() -> Credential {
        Credential {
            name: "github".into(),
            header: "authorization".into(),
            format: "Bearer {value}".into(),
            value: Secret::new("ghp_canary"),
        }
    }

    #[test]
    fn placeholders_are_random_per_execution_and_never_the_value() {
        let one = ExecutionCredentials::new(vec![github()]);
        let two = ExecutionCredentials::new(vec![github()]);
        let (name, placeholder) = one.env().remove(0);
        assert_eq!(name, "SANDGATE_CREDENTIAL_GITHUB");
        assert!(placeholder.starts_with("sgph_") && placeholder.len() == 37);
        assert_ne!(placeholder, two.env()[0].1);
        assert!(!format!("{one:?}").contains("ghp_canary"));
    }

    #[test]
    fn a_restored_sandbox_keeps_its_placeholders_for_the_credentials_still_granted() {
        let other = Credential {
            name: "other".into(),
            ..github()
        };
        let before = ExecutionCredentials::new(vec![github()]);
        let after = ExecutionCredentials::carrying(vec![github(), other], &before);
        let env = after.env();
        assert_eq!(env[0], before.env()[0]);
        assert_eq!(env[1].0, "SANDGATE_CREDENTIAL_OTHER");
        assert_ne!(env[1].1, env[0].1);
        let dropped = ExecutionCredentials::carrying(Vec::new(), &before);
        assert!(dropped.is_empty());
    }

    #[test]
    fn a_placeholder_is_only_allowed_in_its_granted_credentials_own_header() {
        let creds = ExecutionCredentials::new(vec![github()]);
        let placeholder = creds.env()[0].1.clone();
        let text = format!("token {placeholder}");
        let github = || vec!["github".to_owned()];
        assert_eq!(
            creds.placeholders_in(text.as_bytes()),
            BTreeSet::from(["github".to_owned()])
        );
        let own = [("authorization", text.as_bytes())];
        assert!(creds.misdirected(b"/repos/x", own, &github()).is_empty());
        // Not granted for this request, or anywhere else: misdirected.
        assert_eq!(
            creds.misdirected(b"/repos/x", own, &[]),
            BTreeSet::from(["github".to_owned()])
        );
        let other = [("x-token", text.as_bytes())];
        assert_eq!(
            creds.misdirected(b"/", other, &github()),
            BTreeSet::from(["github".to_owned()])
        );
        let in_query = format!("/repos/x?token={placeholder}");
        assert_eq!(
            creds.misdirected(in_query.as_bytes(), own, &github()),
            BTreeSet::from(["github".to_owned()])
        );
        assert_eq!(github_credential().header_value(), "Bearer ghp_canary");
        assert_eq!(
            placeholder_env_name("my-api.key"),
            "SANDGATE_CREDENTIAL_MY_API_KEY"
        );
    }

    fn github_credential() -> Credential {
        github()
    }
}

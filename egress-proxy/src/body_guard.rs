//! The guard on a plain-HTTP request body of an execution that holds credential placeholders.
//! Its own module: it reads the execution's [`Inspection`] (`config`), which holds the
//! credentials (`credentials`), so neither of those two needs the other's types both ways.

use std::sync::Arc;

use crate::config::Inspection;
use crate::credentials::PLACEHOLDER_LEN;

/// Searches a plain-HTTP request body that passes in pieces for the execution's placeholders
/// (no credential is ever attached outside an inspected tunnel, so any is misdirected). It
/// holds back the last bytes that could begin a placeholder, so one split across reads is found
/// before any of it is sent.
#[derive(Debug)]
pub(crate) struct BodyGuard {
    credentials: Arc<Inspection>,
    held: Vec<u8>,
}

impl BodyGuard {
    /// A guard when the execution holds placeholders; `None` otherwise.
    pub(crate) fn for_execution(inspection: Option<&Arc<Inspection>>) -> Option<BodyGuard> {
        let inspection = inspection.filter(|i| !i.credentials.is_empty())?;
        Some(BodyGuard {
            credentials: Arc::clone(inspection),
            held: Vec::new(),
        })
    }

    /// Takes the next body bytes: what may be sent now, or the names of the credentials whose
    /// placeholders the body carries.
    pub(crate) fn pass(&mut self, bytes: &[u8]) -> Result<Vec<u8>, Vec<String>> {
        self.held.extend_from_slice(bytes);
        let found = self.credentials.credentials.placeholders_in(&self.held);
        if !found.is_empty() {
            return Err(found.into_iter().collect());
        }
        let keep = self.held.len().min(PLACEHOLDER_LEN - 1);
        let tail = self.held.split_off(self.held.len() - keep);
        Ok(std::mem::replace(&mut self.held, tail))
    }

    /// The bytes still held, once the body has ended.
    pub(crate) fn finish(&mut self) -> Vec<u8> {
        std::mem::take(&mut self.held)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::credentials::{Credential, ExecutionCredentials, Secret};

    fn github() -> Credential {
        Credential {
            name: "github".into(),
            header: "authorization".into(),
            format: "Bearer {value}".into(),
            value: Secret::new("ghp_canary"),
        }
    }

    #[test]
    fn a_body_guard_finds_a_placeholder_split_across_reads_before_sending_any_of_it() {
        let inspection = Arc::new(Inspection {
            ca: Arc::new(crate::ca::ExecutionCa::new("ex_guard").unwrap()),
            credentials: ExecutionCredentials::new(vec![github()]),
        });
        let placeholder = inspection.credentials.env()[0].1.clone();
        let mut guard = BodyGuard::for_execution(Some(&inspection)).unwrap();
        let body = format!("{}token={placeholder}&x=1", "a".repeat(100));
        let (first, second) = body.as_bytes().split_at(120);
        let sent = guard.pass(first).unwrap();
        assert!(sent.len() <= 120 - (PLACEHOLDER_LEN - 1), "{}", sent.len());
        assert!(!String::from_utf8_lossy(&sent).contains("sgph_"));
        assert_eq!(guard.pass(second), Err(vec!["github".to_owned()]));

        // A clean body passes whole, in order.
        let mut clean = BodyGuard::for_execution(Some(&inspection)).unwrap();
        let mut out = clean.pass(b"hello ").unwrap();
        out.extend(clean.pass(b"sgph_not-a-placeholder world").unwrap());
        out.extend(clean.finish());
        assert_eq!(out, b"hello sgph_not-a-placeholder world");
        let none = Arc::new(Inspection {
            ca: Arc::new(crate::ca::ExecutionCa::new("ex_none").unwrap()),
            credentials: ExecutionCredentials::default(),
        });
        assert!(BodyGuard::for_execution(Some(&none)).is_none());
    }
}

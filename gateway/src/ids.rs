//! Identifiers and timestamps shared by every module.

use chrono::{DateTime, SubsecRound, Utc};

/// A new identifier `<prefix>_<uuid v7, simple form>`: unique, and sortable by creation time.
pub fn new(prefix: &str) -> String {
    format!("{prefix}_{}", uuid::Uuid::now_v7().simple())
}

/// The current time at PostgreSQL's precision, so values round-trip exactly (the audit chain
/// hashes them).
pub fn now_micros() -> DateTime<Utc> {
    Utc::now().trunc_subsecs(6)
}

/// An identifier type: the text as stored and sent (`#[serde(transparent)]`, `sqlx`
/// transparent over `text`), so a newtype changes no wire format, no column and no audit hash;
/// it only keeps one kind of id from being passed where another is meant.
macro_rules! id_type {
    ($(#[$doc:meta])* $name:ident) => {
        $(#[$doc])*
        #[derive(
            Debug, Clone, Default, PartialEq, Eq, Hash, PartialOrd, Ord,
            serde::Serialize, serde::Deserialize, sqlx::Type,
        )]
        #[serde(transparent)]
        #[sqlx(transparent)]
        pub struct $name(String);

        impl $name {
            pub fn as_str(&self) -> &str {
                &self.0
            }

            pub fn into_string(self) -> String {
                self.0
            }
        }

        impl std::fmt::Display for $name {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(&self.0)
            }
        }

        impl std::ops::Deref for $name {
            type Target = str;

            fn deref(&self) -> &str {
                &self.0
            }
        }

        impl AsRef<str> for $name {
            fn as_ref(&self) -> &str {
                &self.0
            }
        }

        impl std::borrow::Borrow<str> for $name {
            fn borrow(&self) -> &str {
                &self.0
            }
        }

        impl From<String> for $name {
            fn from(id: String) -> Self {
                $name(id)
            }
        }

        impl From<&str> for $name {
            fn from(id: &str) -> Self {
                $name(id.to_owned())
            }
        }

        impl From<$name> for String {
            fn from(id: $name) -> String {
                id.0
            }
        }

        impl PartialEq<str> for $name {
            fn eq(&self, other: &str) -> bool {
                self.0 == other
            }
        }

        impl PartialEq<&str> for $name {
            fn eq(&self, other: &&str) -> bool {
                self.0 == *other
            }
        }

        impl PartialEq<String> for $name {
            fn eq(&self, other: &String) -> bool {
                &self.0 == other
            }
        }
    };
}

id_type!(
    /// An execution's id (`ex_...`).
    ExecutionId
);
id_type!(
    /// A session's id (`ss_...`).
    SessionId
);
id_type!(
    /// An approval's id (`ap_...`).
    ApprovalId
);
id_type!(
    /// An API key's id (`key_...`), never its secret.
    KeyId
);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_id_is_its_text_on_the_wire() {
        let id = ApprovalId::from("ap_1");
        assert_eq!(serde_json::to_string(&id).unwrap(), r#""ap_1""#);
        let back: ApprovalId = serde_json::from_str(r#""ap_1""#).unwrap();
        assert_eq!(back, id);
        assert_eq!(id.to_string(), "ap_1");
        assert_eq!(id, "ap_1");
    }
}

//! The closed sets as the store keeps them: a text column decodes into the enum or fails with
//! [`UnknownText`], so no row with a value outside the set ever reaches the code as a value
//! (the `sqlx` feature; clients leave it off). The gateway counts and logs each such failure in
//! one place (`audit::unknown_value`).

/// Which closed set a stored text did not belong to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum TextSet {
    ExecutionStatus,
    SessionStatus,
    ClosedReason,
    ApprovalStatus,
    Role,
    ProposalStatus,
    ProposalOrigin,
    /// `executions.start` ([`crate::SandboxStart`]).
    ExecutionStart,
    /// `sessions.start` ([`crate::SandboxStart`]).
    SessionStart,
    /// `session_turns.kind` (the gateway's own set: relayed requests are not on the wire).
    TurnKind,
    /// `session_turns.error_code` (the gateway's own set).
    TurnErrorCode,
}

impl TextSet {
    pub const ALL: [TextSet; 11] = [
        TextSet::ExecutionStatus,
        TextSet::SessionStatus,
        TextSet::ClosedReason,
        TextSet::ApprovalStatus,
        TextSet::Role,
        TextSet::ProposalStatus,
        TextSet::ProposalOrigin,
        TextSet::ExecutionStart,
        TextSet::SessionStart,
        TextSet::TurnKind,
        TextSet::TurnErrorCode,
    ];
}

/// A stored text that names no value of its set (a newer version wrote it, or a hand edit).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("stored value {text:?} is not a known {set:?}")]
pub struct UnknownText {
    pub set: TextSet,
    pub text: String,
}

/// `sqlx` `Type`, `Decode` and `Encode` (PostgreSQL `text`) for a closed set with `as_str` and
/// `parse`: encoded as its text, decoded through `parse`, an unknown text an [`UnknownText`] of
/// the set named like the type. `stored_text!(Wrapper(Inner))` does the same for a one-field
/// wrapper, so one closed set kept in two columns is counted per column. Exported for the
/// gateway's own sets (those not on the wire); their [`TextSet`] is declared here all the same.
#[cfg(feature = "sqlx")]
#[doc(hidden)]
#[macro_export]
macro_rules! stored_text {
    ($name:ident) => {
        $crate::stored_text!(@impl $name, $name, |text| $name::parse(text), |value: &$name| value.as_str());
    };
    ($name:ident($inner:ty)) => {
        $crate::stored_text!(
            @impl $name,
            $name,
            |text| <$inner>::parse(text).map($name),
            |value: &$name| value.0.as_str()
        );
    };
    (@impl $name:ident, $set:ident, $parse:expr, $text:expr) => {
        impl sqlx::Type<sqlx::Postgres> for $name {
            fn type_info() -> sqlx::postgres::PgTypeInfo {
                <&str as sqlx::Type<sqlx::Postgres>>::type_info()
            }

            fn compatible(ty: &sqlx::postgres::PgTypeInfo) -> bool {
                <&str as sqlx::Type<sqlx::Postgres>>::compatible(ty)
            }
        }

        impl<'r> sqlx::Decode<'r, sqlx::Postgres> for $name {
            fn decode(
                value: sqlx::postgres::PgValueRef<'r>,
            ) -> Result<Self, sqlx::error::BoxDynError> {
                let text = <&str as sqlx::Decode<sqlx::Postgres>>::decode(value)?;
                let parse: fn(&str) -> Option<$name> = $parse;
                parse(text).ok_or_else(|| {
                    Box::new($crate::UnknownText {
                        set: $crate::TextSet::$set,
                        text: text.to_owned(),
                    }) as sqlx::error::BoxDynError
                })
            }
        }

        impl sqlx::Encode<'_, sqlx::Postgres> for $name {
            fn encode_by_ref(
                &self,
                buf: &mut sqlx::postgres::PgArgumentBuffer,
            ) -> Result<sqlx::encode::IsNull, sqlx::error::BoxDynError> {
                let text: fn(&$name) -> &'static str = $text;
                <&str as sqlx::Encode<sqlx::Postgres>>::encode_by_ref(&text(self), buf)
            }
        }
    };
}

/// `executions.start` as stored: a [`crate::SandboxStart`] counted under its own column.
#[cfg(feature = "sqlx")]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ExecutionStart(pub crate::SandboxStart);

/// `sessions.start` as stored: a [`crate::SandboxStart`] counted under its own column.
#[cfg(feature = "sqlx")]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SessionStart(pub crate::SandboxStart);

#[cfg(feature = "sqlx")]
stored_text!(ExecutionStatus);
#[cfg(feature = "sqlx")]
stored_text!(SessionStatus);
#[cfg(feature = "sqlx")]
stored_text!(ClosedReason);
#[cfg(feature = "sqlx")]
stored_text!(ApprovalStatus);
#[cfg(feature = "sqlx")]
stored_text!(Role);
#[cfg(feature = "sqlx")]
stored_text!(ProposalStatus);
#[cfg(feature = "sqlx")]
stored_text!(ProposalOrigin);
#[cfg(feature = "sqlx")]
stored_text!(ExecutionStart(crate::SandboxStart));
#[cfg(feature = "sqlx")]
stored_text!(SessionStart(crate::SandboxStart));

#[cfg(feature = "sqlx")]
use crate::{
    ApprovalStatus, ClosedReason, ExecutionStatus, ProposalOrigin, ProposalStatus, Role,
    SessionStatus,
};

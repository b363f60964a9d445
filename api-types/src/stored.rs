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
}

impl TextSet {
    pub const ALL: [TextSet; 7] = [
        TextSet::ExecutionStatus,
        TextSet::SessionStatus,
        TextSet::ClosedReason,
        TextSet::ApprovalStatus,
        TextSet::Role,
        TextSet::ProposalStatus,
        TextSet::ProposalOrigin,
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
/// `parse`: encoded as its text, decoded through `parse`, an unknown text an [`UnknownText`].
#[cfg(feature = "sqlx")]
macro_rules! stored_text {
    ($name:ident) => {
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
                $name::parse(text).ok_or_else(|| {
                    Box::new($crate::stored::UnknownText {
                        set: $crate::stored::TextSet::$name,
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
                <&str as sqlx::Encode<sqlx::Postgres>>::encode_by_ref(&self.as_str(), buf)
            }
        }
    };
}

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
use crate::{
    ApprovalStatus, ClosedReason, ExecutionStatus, ProposalOrigin, ProposalStatus, Role,
    SessionStatus,
};

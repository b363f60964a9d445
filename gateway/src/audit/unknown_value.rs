//! One rule for a stored text outside its closed set (a status, a closing reason, a role that
//! this version does not know: written by a newer version, or by hand). The row does not decode
//! (`api_types::UnknownText`), so no caller ever sees it as some other value: fail closed (the
//! API answers 500 `internal`, a background scan skips its round). The failure is logged here,
//! once, and counted in `sandgate_store_unknown_values_total{column}`.

use api_types::UnknownText;

/// The stored value a failed decode was about, if that is why it failed.
pub fn unknown_text(err: &sqlx::Error) -> Option<&UnknownText> {
    let sqlx::Error::ColumnDecode { source, .. } = err else {
        return None;
    };
    source.downcast_ref::<UnknownText>()
}

pub use crate::metrics::stored_column as column;

/// Logs and counts `unknown` (called once per failed decode, where it becomes an
/// [`super::AuditError`]).
pub fn note(unknown: &UnknownText) {
    tracing::error!(
        column = column(unknown.set),
        value = %unknown.text,
        "the store holds a value this version does not know; the row is not read"
    );
    crate::metrics::store_unknown_value(unknown.set);
}

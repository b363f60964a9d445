//! Errors as one line of text, for logs and for answers that carry a cause. It sits below
//! every other module (it imports none), so the audit store, the egress seams, the use cases
//! and the command-line client share one definition.

/// An error and its sources on one line: `outer: inner: innermost`.
pub fn error_chain(err: &dyn std::error::Error) -> String {
    let mut text = err.to_string();
    let mut source = err.source();
    while let Some(inner) = source {
        text.push_str(": ");
        text.push_str(&inner.to_string());
        source = inner.source();
    }
    text
}

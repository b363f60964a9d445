//! A python session cell's rich results as its record keeps them: the runner's MIME bundles
//! (`sandbox_protocol::RichResults`) under E2B's `Result` field names (`text`, `html`, `png`,
//! ...; see `api_types::CellResult`), bounded by the execution's `output_bytes`, counted
//! apart from stdout and stderr. Values are kept whole or left out (a cut PNG is no PNG), in
//! order: results in the order the cell displayed them, within one `text` first, images last;
//! anything left out sets `truncated`, as does the runner's own limit
//! (`sandbox_protocol::MAX_RESULTS_BYTES`). MIME types E2B has no field for are not kept.

use base64::Engine as _;

use sandbox_protocol::{RichResult, RichResults};

use crate::session_wire::{CellResult, CellResults};

/// The MIME types kept, in the order they are given room.
const KEPT: [&str; 10] = [
    "text/plain",
    "text/html",
    "text/markdown",
    "application/json",
    "text/latex",
    "image/svg+xml",
    "image/png",
    "image/jpeg",
    "application/pdf",
    "application/javascript",
];

/// The runner's results, within `budget` bytes of values.
pub fn cell_results(rich: RichResults, budget: u64) -> CellResults {
    let mut left = budget;
    let mut truncated = rich.truncated;
    let results = rich
        .results
        .into_iter()
        .filter_map(|result| kept(result, &mut left, &mut truncated))
        .collect();
    CellResults { results, truncated }
}

fn kept(result: RichResult, left: &mut u64, truncated: &mut bool) -> Option<CellResult> {
    let mut cell = CellResult {
        is_main_result: result.main,
        ..CellResult::default()
    };
    let mut any = false;
    for mime in KEPT {
        let Some(value) = result.data.get(mime).and_then(|b64| decoded(b64)) else {
            continue;
        };
        let size = value.len() as u64;
        if size > *left {
            *truncated = true;
            continue;
        }
        if set(&mut cell, mime, value) {
            *left -= size;
            any = true;
        }
    }
    (any || cell.is_main_result).then_some(cell)
}

fn decoded(b64: &str) -> Option<String> {
    let bytes = base64::engine::general_purpose::STANDARD.decode(b64).ok()?;
    Some(String::from_utf8_lossy(&bytes).into_owned())
}

/// Puts `value` in `mime`'s field; false when it is not a value of that type.
fn set(cell: &mut CellResult, mime: &str, value: String) -> bool {
    let field = match mime {
        "text/plain" => {
            cell.text = Some(unquoted(value));
            return true;
        }
        "application/json" => {
            cell.json = serde_json::from_str(&value).ok();
            return cell.json.is_some();
        }
        "text/html" => &mut cell.html,
        "text/markdown" => &mut cell.markdown,
        "text/latex" => &mut cell.latex,
        "image/svg+xml" => &mut cell.svg,
        "image/png" => &mut cell.png,
        "image/jpeg" => &mut cell.jpeg,
        "application/pdf" => &mut cell.pdf,
        "application/javascript" => &mut cell.javascript,
        _ => return false,
    };
    *field = Some(value);
    true
}

/// E2B's `text` of a string: its repr without the surrounding quotes.
fn unquoted(text: String) -> String {
    let quoted = text.len() >= 2
        && ((text.starts_with('\'') && text.ends_with('\''))
            || (text.starts_with('"') && text.ends_with('"')));
    if quoted {
        text[1..text.len() - 1].to_owned()
    } else {
        text
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn b64(text: &str) -> String {
        base64::engine::general_purpose::STANDARD.encode(text)
    }

    #[test]
    fn values_are_kept_whole_within_the_budget_text_first() {
        let rich = RichResults {
            results: vec![
                RichResult {
                    main: false,
                    data: [
                        ("image/png".to_owned(), b64("iVBORw0KGgo=")),
                        ("text/plain".to_owned(), b64("<Figure>")),
                    ]
                    .into(),
                },
                RichResult {
                    main: true,
                    data: [
                        ("text/plain".to_owned(), b64("'abc'")),
                        ("application/json".to_owned(), b64("{\"a\":1}")),
                        ("x/unknown".to_owned(), b64("dropped")),
                    ]
                    .into(),
                },
            ],
            truncated: false,
        };
        let all = cell_results(rich.clone(), 1_000);
        assert!(!all.truncated);
        assert_eq!(all.results[0].png.as_deref(), Some("iVBORw0KGgo="));
        assert_eq!(all.results[1].text.as_deref(), Some("abc"));
        assert_eq!(all.results[1].json, Some(serde_json::json!({"a": 1})));
        // 8 bytes of text, then the PNG (12) does not fit in 20 - 8.
        let cut = cell_results(rich, 19);
        assert!(cut.truncated);
        assert_eq!(cut.results[0].text.as_deref(), Some("<Figure>"));
        assert_eq!(cut.results[0].png, None);
        assert_eq!(cut.results[1].text.as_deref(), Some("abc"));
    }
}

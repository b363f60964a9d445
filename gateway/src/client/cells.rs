//! When a line typed at `sandgate repl` is a whole cell and when it needs more lines, the way
//! Python's and bash's own prompts decide it: an open bracket, string or trailing backslash
//! always continues; a block opener (Python `:`, bash `then`/`do`/`{`...) continues until an
//! empty line. Only a heuristic: the interpreter in the sandbox has the last word (a cell sent
//! too early is a syntax error there, and the session goes on).

/// Languages the repl knows how to split into cells; anything else is one line per cell.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dialect {
    Python,
    Bash,
    Other,
}

impl Dialect {
    pub fn of(language: &str) -> Dialect {
        match language {
            "python" => Dialect::Python,
            "bash" => Dialect::Bash,
            _ => Dialect::Other,
        }
    }
}

/// Whether the cell typed so far (lines joined by `\n`) needs more lines.
pub fn needs_more(dialect: Dialect, cell: &str) -> bool {
    if dialect == Dialect::Other {
        return false;
    }
    let last = cell.lines().next_back().unwrap_or_default();
    if cell.ends_with('\n') || last.trim().is_empty() && cell.contains('\n') {
        // An empty line ends a block (it is how the cell was ended).
        return open_nesting(dialect, cell);
    }
    if open_nesting(dialect, cell) || last.ends_with('\\') {
        return true;
    }
    // Inside a block once any line opened one: only an empty line ends it.
    cell.lines()
        .any(|line| opens_block(dialect, line.trim_end()))
}

fn opens_block(dialect: Dialect, line: &str) -> bool {
    match dialect {
        Dialect::Python => {
            let code = line.split('#').next().unwrap_or_default().trim_end();
            code.ends_with(':')
        }
        Dialect::Bash => {
            let words: Vec<&str> = line.split_whitespace().collect();
            let last = words.last().copied().unwrap_or_default();
            let opener = matches!(
                words.first().copied(),
                Some("if" | "for" | "while" | "until" | "case")
            );
            let closed = ["done", "fi", "esac"]
                .iter()
                .any(|word| words.contains(word));
            matches!(
                last,
                "then" | "do" | "else" | "{" | "|" | "&&" | "||" | "in"
            ) || (opener && !closed)
        }
        Dialect::Other => false,
    }
}

/// An unclosed bracket or string (Python triple quotes included) anywhere in the cell.
fn open_nesting(dialect: Dialect, cell: &str) -> bool {
    let mut depth: i64 = 0;
    let mut quote: Option<&str> = None;
    let mut rest = cell;
    while let Some(ch) = rest.chars().next() {
        let width = ch.len_utf8();
        if let Some(open) = quote {
            if ch == '\\' && (open != "'" || dialect == Dialect::Python) {
                let mut escaped = rest.chars();
                escaped.next();
                escaped.next();
                rest = escaped.as_str();
                continue;
            }
            if rest.starts_with(open) {
                rest = &rest[open.len()..];
                quote = None;
                continue;
            }
            if ch == '\n' && open.len() == 1 && dialect == Dialect::Python {
                quote = None;
            }
            rest = &rest[width..];
            continue;
        }
        match ch {
            '#' if dialect == Dialect::Python || starts_word(cell, rest) => {
                rest = rest.find('\n').map_or("", |end| &rest[end..]);
                continue;
            }
            '"' | '\'' => {
                let triple = if ch == '"' { "\"\"\"" } else { "'''" };
                let open = if dialect == Dialect::Python && rest.starts_with(triple) {
                    triple
                } else if ch == '"' {
                    "\""
                } else {
                    "'"
                };
                quote = Some(open);
                rest = &rest[open.len()..];
                continue;
            }
            '(' | '[' | '{' => depth += 1,
            ')' | ']' | '}' => depth -= 1,
            _ => {}
        }
        rest = &rest[width..];
    }
    depth > 0 || quote.is_some()
}

/// Whether the character at `rest` (inside `cell`) starts a word (a bash comment must).
fn starts_word(cell: &str, rest: &str) -> bool {
    let at = cell.len() - rest.len();
    cell[..at]
        .chars()
        .last()
        .is_none_or(|before| before.is_whitespace() || before == ';')
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lines_needed(dialect: Dialect, typed: &[&str]) -> Vec<bool> {
        (1..=typed.len())
            .map(|n| needs_more(dialect, &typed[..n].join("\n")))
            .collect()
    }

    #[test]
    fn python_blocks_continue_until_an_empty_line() {
        let typed = ["def f(a):", "    return a * 2", ""];
        assert_eq!(lines_needed(Dialect::Python, &typed), [true, true, false]);
        assert!(!needs_more(Dialect::Python, "x = 41"));
        assert!(!needs_more(Dialect::Python, "x + 1  # not a block:"));
        assert!(!needs_more(Dialect::Python, "d = {'a': 1}"));
        assert!(needs_more(Dialect::Python, "d = {'a':"));
        assert!(needs_more(Dialect::Python, "s = \"\"\"one"));
        assert!(!needs_more(Dialect::Python, "s = \"\"\"one\ntwo\"\"\""));
        assert!(!needs_more(Dialect::Python, "d = {\n  'a': 1,\n}"));
        assert!(needs_more(Dialect::Python, "x = 1 + \\"));
        assert!(!needs_more(Dialect::Python, "print('(')"));
        assert!(!needs_more(Dialect::Python, "print(\"it's\")"));
    }

    #[test]
    fn bash_continues_open_constructs() {
        assert!(!needs_more(Dialect::Bash, "cd /tmp; export A=1"));
        assert!(!needs_more(Dialect::Bash, "echo it's # don't"));
        assert!(!needs_more(Dialect::Bash, "for i in 1 2; do echo $i; done"));
        assert!(!needs_more(Dialect::Bash, "echo a#b"));
        let typed = ["for i in 1 2", "do echo $i", "done", ""];
        assert_eq!(
            lines_needed(Dialect::Bash, &typed),
            [true, true, true, false]
        );
        assert!(needs_more(Dialect::Bash, "f() {"));
        assert!(needs_more(Dialect::Bash, "echo 'open"));
        assert!(!needs_more(Dialect::Other, "anything {"));
    }
}

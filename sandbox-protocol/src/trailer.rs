//! The exit trailer, `\0sandgate-exit:<nonce>:<code>[:<report>]\n`: written last on stderr by
//! the init ([`exit_trailer`]), taken out of the stream by the gateway ([`ExitTrailer`]). The
//! optional report is an [`InitReport`] as compact JSON (which holds no newline and no NUL),
//! at most [`MAX_REPORT_BYTES`]; it is left out when it has nothing to say.

use serde::{Deserialize, Serialize};

/// Starts the trailer. The program cannot forge a whole one: the nonce reaches only the init,
/// on stdin, and the init makes itself non-dumpable first, so the program cannot read it.
pub const EXIT_TRAILER_PREFIX: &[u8] = b"\0sandgate-exit:";

/// The longest code a trailer carries (0..=255).
const TRAILER_DIGITS: usize = 3;
/// The longest report a trailer carries, in bytes of JSON.
pub const MAX_REPORT_BYTES: usize = 96 * 1024;
/// Most special files a report lists (the init stops listing there).
pub const MAX_SPECIAL_FILES: usize = 64;

/// What the init saw that the gateway cannot see from the host.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct InitReport {
    /// Paths (relative to `/output`) of what the program left there that is neither a regular
    /// file, nor a directory, nor a symlink: FIFOs, sockets, devices. gVisor keeps those in the
    /// sandbox's own memory, so they never reach the host's output area.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub special_files: Vec<String>,
}

impl InitReport {
    fn is_empty(&self) -> bool {
        self.special_files.is_empty()
    }
}

/// The trailer for `nonce`, `code` and `report`. A report that would not fit
/// [`MAX_REPORT_BYTES`] loses its last entries until it does.
pub fn exit_trailer(nonce: &str, code: u8, report: &InitReport) -> Vec<u8> {
    let mut trailer = EXIT_TRAILER_PREFIX.to_vec();
    trailer.extend_from_slice(format!("{nonce}:{code}").as_bytes());
    let mut report = report.clone();
    report.special_files.truncate(MAX_SPECIAL_FILES);
    while !report.is_empty() {
        match serde_json::to_vec(&report) {
            Ok(json) if json.len() <= MAX_REPORT_BYTES => {
                trailer.push(b':');
                trailer.extend_from_slice(&json);
                break;
            }
            _ => {
                report.special_files.pop();
            }
        }
    }
    trailer.push(b'\n');
    trailer
}

/// Takes the exit trailer out of the stderr stream. Only a trailer with this run's nonce
/// counts. Bytes that might begin the trailer (from a NUL on) are held back until they cannot,
/// so it never reaches the record or the event stream, and ordinary stderr (which holds no
/// NUL) is passed on at once.
#[derive(Debug)]
pub struct ExitTrailer {
    prefix: Vec<u8>,
    held: Vec<u8>,
    code: Option<u8>,
    report: InitReport,
}

impl ExitTrailer {
    pub fn new(nonce: &str) -> ExitTrailer {
        let mut prefix = EXIT_TRAILER_PREFIX.to_vec();
        prefix.extend_from_slice(nonce.as_bytes());
        prefix.push(b':');
        ExitTrailer {
            prefix,
            held: Vec::new(),
            code: None,
            report: InitReport::default(),
        }
    }

    /// The code, once the trailer came.
    pub fn code(&self) -> Option<u8> {
        self.code
    }

    /// The report the trailer carried (empty before it came, or if it carried none).
    pub fn report(&self) -> &InitReport {
        &self.report
    }

    /// Feeds a stderr chunk; returns what may be passed on.
    pub fn feed(&mut self, chunk: &[u8]) -> Vec<u8> {
        if self.code.is_some() {
            // After the trailer the init is gone: nothing that follows is the program's.
            return Vec::new();
        }
        self.held.extend_from_slice(chunk);
        let mut last_nul = None;
        let mut from = 0;
        while let Some(offset) = self.held[from..].iter().position(|byte| *byte == 0) {
            let start = from + offset;
            if let Some((code, report)) = complete_trailer(&self.prefix, &self.held[start..]) {
                self.code = Some(code);
                self.report = report;
                let released = self.held[..start].to_vec();
                self.held.clear();
                return released;
            }
            last_nul = Some(start);
            from = start + 1;
        }
        match last_nul {
            Some(start) if could_begin_trailer(&self.prefix, &self.held[start..]) => {
                let tail = self.held.split_off(start);
                std::mem::replace(&mut self.held, tail)
            }
            _ => std::mem::take(&mut self.held),
        }
    }

    /// The end of the stream: what was held back, and the code if the trailer came.
    pub fn finish(&mut self) -> (Vec<u8>, Option<u8>) {
        (std::mem::take(&mut self.held), self.code)
    }
}

fn complete_trailer(prefix: &[u8], bytes: &[u8]) -> Option<(u8, InitReport)> {
    let rest = bytes.strip_prefix(prefix)?;
    let end = rest.iter().position(|byte| *byte == b'\n')?;
    let line = &rest[..end];
    let (digits, report) = match line.iter().position(|byte| *byte == b':') {
        Some(colon) => (&line[..colon], Some(&line[colon + 1..])),
        None => (line, None),
    };
    if digits.is_empty() || digits.len() > TRAILER_DIGITS {
        return None;
    }
    let code = std::str::from_utf8(digits).ok()?.parse().ok()?;
    let report = match report {
        None => InitReport::default(),
        Some(json) if json.len() <= MAX_REPORT_BYTES => serde_json::from_slice(json).ok()?,
        Some(_) => return None,
    };
    Some((code, report))
}

fn could_begin_trailer(prefix: &[u8], bytes: &[u8]) -> bool {
    if bytes.len() <= prefix.len() {
        return prefix.starts_with(bytes);
    }
    let Some(rest) = bytes.strip_prefix(prefix) else {
        return false;
    };
    let digits = rest.iter().take_while(|byte| byte.is_ascii_digit()).count();
    match rest.get(digits) {
        None => digits <= TRAILER_DIGITS,
        Some(b':') => {
            (1..=TRAILER_DIGITS).contains(&digits)
                && rest.len() - digits - 1 <= MAX_REPORT_BYTES
                && !rest[digits + 1..].contains(&b'\n')
        }
        Some(_) => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const NONCE: &str = "n0nce";

    fn through(chunks: &[&[u8]]) -> (Vec<u8>, Option<u8>) {
        let mut trailer = ExitTrailer::new(NONCE);
        let mut out = Vec::new();
        for chunk in chunks {
            out.extend(trailer.feed(chunk));
        }
        let (rest, code) = trailer.finish();
        out.extend(rest);
        (out, code)
    }

    #[test]
    fn what_the_init_writes_the_gateway_takes_out() {
        let mut stream = b"warn\n".to_vec();
        stream.extend(exit_trailer(NONCE, 137, &InitReport::default()));
        assert_eq!(through(&[&stream]), (b"warn\n".to_vec(), Some(137)));
    }

    #[test]
    fn a_report_rides_the_trailer_wherever_the_chunks_split() {
        let report = InitReport {
            special_files: vec!["fifo".into(), "dir/sock:et \"x\"\n".into()],
        };
        let mut stream = b"warn\n".to_vec();
        stream.extend(exit_trailer(NONCE, 3, &report));
        for split in 0..stream.len() {
            let (before, after) = stream.split_at(split);
            let mut trailer = ExitTrailer::new(NONCE);
            let mut out = trailer.feed(before);
            out.extend(trailer.feed(after));
            let (rest, code) = trailer.finish();
            out.extend(rest);
            assert_eq!((out, code), (b"warn\n".to_vec(), Some(3)), "{split}");
            assert_eq!(trailer.report(), &report, "{split}");
        }
    }

    #[test]
    fn a_report_is_bounded() {
        let report = InitReport {
            special_files: (0..1000).map(|i| format!("{i:0>4000}")).collect(),
        };
        let trailer = exit_trailer(NONCE, 0, &report);
        assert!(trailer.len() <= MAX_REPORT_BYTES + 64, "{}", trailer.len());
        let mut scanner = ExitTrailer::new(NONCE);
        assert!(scanner.feed(&trailer).is_empty());
        assert_eq!(scanner.finish().1, Some(0));
        assert!(!scanner.report().special_files.is_empty());
        assert!(scanner.report().special_files.len() < MAX_SPECIAL_FILES);
    }

    #[test]
    fn exit_trailer_is_taken_out_wherever_the_chunks_split() {
        let stream = b"warn\n\0sandgate-exit:n0nce:137\n";
        for split in 0..stream.len() {
            let (before, after) = stream.split_at(split);
            assert_eq!(
                through(&[before, after]),
                (b"warn\n".to_vec(), Some(137)),
                "{split}"
            );
        }
        let bytes: Vec<&[u8]> = stream.chunks(1).collect();
        assert_eq!(through(&bytes), (b"warn\n".to_vec(), Some(137)));
    }

    #[test]
    fn stderr_without_a_trailer_passes_through_and_says_so() {
        assert_eq!(through(&[b"a\0b\n", b"c"]), (b"a\0b\nc".to_vec(), None));
        assert_eq!(
            through(&[b"x\0sandgate-ex"]),
            (b"x\0sandgate-ex".to_vec(), None)
        );
        assert_eq!(
            through(&[b"\0sandgate-exit:n0nce:1234\n"]),
            (b"\0sandgate-exit:n0nce:1234\n".to_vec(), None)
        );
        // A trailer with another nonce (a forgery by the program) is ordinary stderr.
        let forged: &[u8] = b"\0sandgate-exit:guess:0\n\0sandgate-exit:0\n";
        assert_eq!(through(&[forged]), (forged.to_vec(), None));
        // Ordinary text is released at once, not held back.
        let mut trailer = ExitTrailer::new(NONCE);
        assert_eq!(trailer.feed(b"line\n"), b"line\n");
        // A NUL in the program's own output before the real trailer is kept.
        assert_eq!(
            through(&[b"\0\0data", b"\0sandgate-exit:n0nce:0\n"]),
            (b"\0\0data".to_vec(), Some(0))
        );
    }
}

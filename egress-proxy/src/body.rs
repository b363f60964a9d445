//! Where the body of a plain HTTP request ends, so that exactly one request goes upstream.
//!
//! The proxy relays request bodies as raw bytes and stops at the end of the body: bytes after
//! it (a pipelined second request) are never sent. A `Content-Length` body ends after that many
//! bytes; a chunked body is followed through its chunk sizes, the last chunk and the trailer
//! section, strictly (CRLF line ends only, bounded lines, hex sizes that fit in 64 bits), since a
//! lenient reading that the upstream does not share is how requests are smuggled.

use crate::head::BodyFraming;

/// Longest chunk-size line (size and extensions) or trailer line.
const MAX_LINE: usize = 4096;
/// Most bytes of trailer section.
const MAX_TRAILERS: usize = 16 * 1024;

/// The chunked body was malformed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("malformed chunked body: {0}")]
pub struct FramingError(pub &'static str);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// Reading the hex size of a chunk (`digits` so far).
    Size {
        size: u64,
        digits: usize,
        line: usize,
    },
    /// In a chunk extension, until CR.
    Extension {
        size: u64,
        line: usize,
    },
    /// Seen CR after the size line.
    SizeLf {
        size: u64,
    },
    Data {
        left: u64,
    },
    DataCr,
    DataLf,
    /// At the start of a trailer line (or the final empty line).
    TrailerStart {
        total: usize,
    },
    TrailerLine {
        total: usize,
        line: usize,
    },
    TrailerLf {
        total: usize,
    },
    FinalLf,
    Done,
}

/// Follows one request body through the bytes the client sends.
#[derive(Debug, Clone)]
pub struct BodyFramer {
    state: State,
    chunked: bool,
}

impl BodyFramer {
    pub fn new(framing: BodyFraming) -> BodyFramer {
        let state = match framing {
            BodyFraming::None | BodyFraming::Length(0) => State::Done,
            BodyFraming::Length(n) => State::Data { left: n },
            BodyFraming::Chunked => State::Size {
                size: 0,
                digits: 0,
                line: 0,
            },
        };
        BodyFramer {
            state,
            chunked: framing == BodyFraming::Chunked,
        }
    }

    /// Whether the body has ended.
    pub fn is_done(&self) -> bool {
        self.state == State::Done
    }

    /// How many of `bytes` (the next bytes from the client) belong to the body.
    pub fn advance(&mut self, bytes: &[u8]) -> Result<usize, FramingError> {
        let mut used = 0;
        while used < bytes.len() && !self.is_done() {
            if let State::Data { left } = self.state {
                let take = usize::try_from(left)
                    .unwrap_or(usize::MAX)
                    .min(bytes.len() - used);
                used += take;
                let left = left - take as u64;
                self.state = if left > 0 {
                    State::Data { left }
                } else if self.chunked {
                    State::DataCr
                } else {
                    State::Done
                };
                continue;
            }
            self.state = step(self.state, bytes[used])?;
            used += 1;
        }
        Ok(used)
    }
}

fn step(state: State, byte: u8) -> Result<State, FramingError> {
    let bad = |why| Err(FramingError(why));
    Ok(match state {
        State::Size { size, digits, line } => {
            if line >= MAX_LINE {
                return bad("chunk size line too long");
            }
            match byte {
                b'\r' if digits > 0 => State::SizeLf { size },
                b';' if digits > 0 => State::Extension {
                    size,
                    line: line + 1,
                },
                _ => {
                    let Some(digit) = (byte as char).to_digit(16) else {
                        return bad("chunk size is not hex");
                    };
                    if digits >= 16 {
                        return bad("chunk size does not fit in 64 bits");
                    }
                    State::Size {
                        size: size << 4 | u64::from(digit),
                        digits: digits + 1,
                        line: line + 1,
                    }
                }
            }
        }
        State::Extension { size, line } => match byte {
            _ if line >= MAX_LINE => return bad("chunk extension too long"),
            b'\r' => State::SizeLf { size },
            b'\n' => return bad("bare LF in chunk size line"),
            b'\t' | b' '..=b'~' => State::Extension {
                size,
                line: line + 1,
            },
            _ => return bad("control character in chunk extension"),
        },
        State::SizeLf { size } => match (byte, size) {
            (b'\n', 0) => State::TrailerStart { total: 0 },
            (b'\n', size) => State::Data { left: size },
            _ => return bad("CR without LF after chunk size"),
        },
        State::DataCr => match byte {
            b'\r' => State::DataLf,
            _ => return bad("chunk data longer than its size"),
        },
        State::DataLf => match byte {
            b'\n' => State::Size {
                size: 0,
                digits: 0,
                line: 0,
            },
            _ => return bad("CR without LF after chunk data"),
        },
        State::TrailerStart { total } => match byte {
            b'\r' => State::FinalLf,
            _ => trailer_byte(total, 0, byte)?,
        },
        State::TrailerLine { total, line } => match byte {
            b'\r' => State::TrailerLf { total },
            _ => trailer_byte(total, line, byte)?,
        },
        State::TrailerLf { total } => match byte {
            b'\n' => State::TrailerStart { total },
            _ => return bad("CR without LF in trailers"),
        },
        State::FinalLf => match byte {
            b'\n' => State::Done,
            _ => return bad("CR without LF at the end of the body"),
        },
        State::Data { .. } | State::Done => state,
    })
}

fn trailer_byte(total: usize, line: usize, byte: u8) -> Result<State, FramingError> {
    if total >= MAX_TRAILERS || line >= MAX_LINE {
        return Err(FramingError("trailers too long"));
    }
    match byte {
        b'\t' | b' '..=b'~' | 0x80..=0xff => Ok(State::TrailerLine {
            total: total + 1,
            line: line + 1,
        }),
        _ => Err(FramingError("control character in trailers")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn body_len(framing: BodyFraming, bytes: &[u8]) -> Result<(usize, bool), FramingError> {
        let mut framer = BodyFramer::new(framing);
        let used = framer.advance(bytes)?;
        Ok((used, framer.is_done()))
    }

    #[test]
    fn lengths() {
        assert_eq!(
            body_len(BodyFraming::None, b"GET / HTTP/1.1"),
            Ok((0, true))
        );
        assert_eq!(body_len(BodyFraming::Length(3), b"abcGET"), Ok((3, true)));
        assert_eq!(body_len(BodyFraming::Length(10), b"abc"), Ok((3, false)));
    }

    #[test]
    fn chunked_bodies_end_exactly() {
        let body =
            b"5\r\nhello\r\n1a;name=\"v\"\r\nabcdefghijklmnopqrstuvwxyz\r\n0\r\nX-T: 1\r\n\r\n";
        let mut bytes = body.to_vec();
        bytes.extend_from_slice(b"GET http://evil.example/ HTTP/1.1\r\n\r\n");
        assert_eq!(
            body_len(BodyFraming::Chunked, &bytes),
            Ok((body.len(), true))
        );
        assert_eq!(body_len(BodyFraming::Chunked, b"0\r\n\r\nX"), Ok((5, true)));
        assert_eq!(
            body_len(BodyFraming::Chunked, b"000\r\n\r\n"),
            Ok((7, true))
        );
        assert_eq!(body_len(BodyFraming::Chunked, b"5\r\nhel"), Ok((6, false)));
    }

    #[test]
    fn lenient_chunked_forms_are_refused() {
        for bad in [
            &b"5\nhello\r\n0\r\n\r\n"[..],
            b"5\r\nhello\n0\r\n\r\n",
            b"5\r\nhelloX\r\n0\r\n\r\n",
            b" 5\r\nhello\r\n0\r\n\r\n",
            b"5 \r\nhello\r\n0\r\n\r\n",
            b"+5\r\nhello\r\n",
            b"\r\n",
            b";x\r\n",
            b"0x5\r\nhello\r\n",
            b"11111111111111111\r\n",
            b"0\r\n\n",
            b"0\r\nX: 1\n\r\n",
            b"0\r\nX: \x01\r\n\r\n",
            b"5;a\nb\r\n",
        ] {
            assert!(
                body_len(BodyFraming::Chunked, bad).is_err(),
                "{:?}",
                String::from_utf8_lossy(bad)
            );
        }
        let long = format!("5;{}\r\n", "a".repeat(MAX_LINE));
        assert!(body_len(BodyFraming::Chunked, long.as_bytes()).is_err());
    }

    proptest! {
        /// Feeding the bytes in any pieces gives the same answer as feeding them at once.
        #[test]
        fn pieces_agree(chunks in proptest::collection::vec(proptest::collection::vec(any::<u8>(), 1..40), 0..6),
                        tail in proptest::collection::vec(any::<u8>(), 0..20), cut in 0usize..400) {
            let mut bytes = Vec::new();
            for chunk in &chunks {
                bytes.extend_from_slice(format!("{:x}\r\n", chunk.len()).as_bytes());
                bytes.extend_from_slice(chunk);
                bytes.extend_from_slice(b"\r\n");
            }
            bytes.extend_from_slice(b"0\r\n\r\n");
            let body = bytes.len();
            bytes.extend_from_slice(&tail);
            let whole = body_len(BodyFraming::Chunked, &bytes);
            prop_assert_eq!(whole, Ok((body, true)));
            let cut = cut.min(bytes.len());
            let mut framer = BodyFramer::new(BodyFraming::Chunked);
            let first = framer.advance(&bytes[..cut]).unwrap();
            let second = framer.advance(&bytes[first..]).unwrap();
            prop_assert_eq!((first + second, framer.is_done()), (body, true));
        }

        /// Arbitrary bytes never panic and never claim more than they were given.
        #[test]
        fn arbitrary_bytes(bytes in proptest::collection::vec(any::<u8>(), 0..200)) {
            if let Ok((used, _)) = body_len(BodyFraming::Chunked, &bytes) {
                prop_assert!(used <= bytes.len());
            }
        }
    }
}

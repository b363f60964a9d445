//! Reading the server name (SNI) from a TLS ClientHello, without terminating TLS.
//!
//! After `CONNECT host:443` the first bytes the sandbox sends must be one TLS handshake record
//! holding a whole ClientHello with exactly one `host_name` in one SNI extension. Anything else
//! is refused rather than guessed at: not a handshake record, a hello split across records, a
//! truncated or over-long field, a repeated extension, several names, a name of another type, or
//! a name with characters no host name has. The parser reads only; it never allocates more than
//! the name it returns.

/// Largest TLS record payload (2^14), and so the largest hello this parser accepts.
pub const MAX_RECORD_PAYLOAD: usize = 1 << 14;
/// Record header: type, version, length.
pub const RECORD_HEADER_LEN: usize = 5;
const HANDSHAKE_RECORD: u8 = 22;
const CLIENT_HELLO: u8 = 1;
const SERVER_NAME_EXTENSION: u16 = 0;
const HOST_NAME_TYPE: u8 = 0;
const MAX_NAME_LEN: usize = 253;

/// What the ClientHello says about the server name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClientHello {
    /// The single `host_name`, as sent (not yet canonicalised); `None`: no SNI extension.
    pub sni: Option<String>,
}

/// Why the first bytes are not an acceptable ClientHello.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum HelloError {
    #[error("more bytes are needed")]
    Incomplete,
    #[error("the first bytes are not a TLS handshake record")]
    NotHandshake,
    #[error("the TLS record is larger than 16384 bytes")]
    RecordTooLarge,
    #[error("the first handshake message is not a ClientHello")]
    NotClientHello,
    #[error("the ClientHello is split across TLS records")]
    SplitAcrossRecords,
    #[error("the ClientHello is malformed: {0}")]
    Malformed(&'static str),
    #[error("the ClientHello repeats an extension")]
    DuplicateExtension,
    #[error("the SNI extension does not hold exactly one name")]
    NameCount,
    #[error("the SNI extension holds a name that is not a host_name")]
    NotHostName,
    #[error("the SNI host_name is not a valid host name")]
    BadName,
}

/// How many bytes the first record takes, once its header is in `buf` (`None`: not yet).
pub fn record_len(buf: &[u8]) -> Result<Option<usize>, HelloError> {
    if buf.first().is_some_and(|&b| b != HANDSHAKE_RECORD) {
        return Err(HelloError::NotHandshake);
    }
    if buf.len() < RECORD_HEADER_LEN {
        return Ok(None);
    }
    if buf[1] != 3 {
        return Err(HelloError::NotHandshake);
    }
    let len = usize::from(u16::from_be_bytes([buf[3], buf[4]]));
    if len > MAX_RECORD_PAYLOAD {
        return Err(HelloError::RecordTooLarge);
    }
    Ok(Some(RECORD_HEADER_LEN + len))
}

/// Parses the ClientHello at the start of `buf` (bytes after the first record are ignored).
pub fn parse_client_hello(buf: &[u8]) -> Result<ClientHello, HelloError> {
    let total = record_len(buf)?.ok_or(HelloError::Incomplete)?;
    let record = buf
        .get(RECORD_HEADER_LEN..total)
        .ok_or(HelloError::Incomplete)?;
    let mut handshake = Reader::new(record);
    if handshake.u8()? != CLIENT_HELLO {
        return Err(HelloError::NotClientHello);
    }
    if handshake.remaining() < 3 {
        return Err(HelloError::SplitAcrossRecords);
    }
    let len = handshake.u24()?;
    if len > handshake.remaining() {
        return Err(HelloError::SplitAcrossRecords);
    }
    if len < handshake.remaining() {
        return Err(HelloError::Malformed(
            "bytes after the ClientHello in its record",
        ));
    }
    parse_body(handshake)
}

fn parse_body(mut hello: Reader<'_>) -> Result<ClientHello, HelloError> {
    let _legacy_version = hello.u16()?;
    hello.take(32)?;
    let session_id = hello.u8_vec()?;
    if session_id.remaining() > 32 {
        return Err(HelloError::Malformed("session id longer than 32 bytes"));
    }
    let suites = hello.u16_vec()?;
    if suites.remaining() < 2 || suites.remaining() % 2 != 0 {
        return Err(HelloError::Malformed("cipher suite list"));
    }
    if hello.u8_vec()?.remaining() == 0 {
        return Err(HelloError::Malformed("empty compression method list"));
    }
    if hello.remaining() == 0 {
        return Ok(ClientHello { sni: None });
    }
    let mut extensions = hello.u16_vec()?;
    if hello.remaining() != 0 {
        return Err(HelloError::Malformed("bytes after the extensions"));
    }
    parse_extensions(&mut extensions)
}

fn parse_extensions(extensions: &mut Reader<'_>) -> Result<ClientHello, HelloError> {
    let mut seen: Vec<u16> = Vec::new();
    let mut sni = None;
    while extensions.remaining() > 0 {
        let kind = extensions.u16()?;
        let data = extensions.u16_vec()?;
        if seen.contains(&kind) {
            return Err(HelloError::DuplicateExtension);
        }
        seen.push(kind);
        if kind == SERVER_NAME_EXTENSION {
            sni = Some(parse_server_name(data)?);
        }
    }
    Ok(ClientHello { sni })
}

fn parse_server_name(mut data: Reader<'_>) -> Result<String, HelloError> {
    let mut list = data.u16_vec()?;
    if data.remaining() != 0 {
        return Err(HelloError::Malformed("bytes after the server name list"));
    }
    let mut name = None;
    while list.remaining() > 0 {
        let name_type = list.u8()?;
        let entry = list.u16_vec()?;
        if name_type != HOST_NAME_TYPE {
            return Err(HelloError::NotHostName);
        }
        if name.replace(entry.rest()).is_some() {
            return Err(HelloError::NameCount);
        }
    }
    let name = name.ok_or(HelloError::NameCount)?;
    let valid = !name.is_empty()
        && name.len() <= MAX_NAME_LEN
        && name
            .iter()
            .all(|&b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'-' | b'_'));
    if !valid {
        return Err(HelloError::BadName);
    }
    String::from_utf8(name.to_vec()).map_err(|_| HelloError::BadName)
}

/// A bounds-checked cursor: every read past the end is `Malformed`, never a panic.
struct Reader<'a> {
    buf: &'a [u8],
}

impl<'a> Reader<'a> {
    fn new(buf: &'a [u8]) -> Reader<'a> {
        Reader { buf }
    }

    fn remaining(&self) -> usize {
        self.buf.len()
    }

    fn rest(&self) -> &'a [u8] {
        self.buf
    }

    fn take(&mut self, n: usize) -> Result<&'a [u8], HelloError> {
        if n > self.buf.len() {
            return Err(HelloError::Malformed("a length runs past its container"));
        }
        let (head, tail) = self.buf.split_at(n);
        self.buf = tail;
        Ok(head)
    }

    fn u8(&mut self) -> Result<u8, HelloError> {
        Ok(self.take(1)?[0])
    }

    fn u16(&mut self) -> Result<u16, HelloError> {
        let b = self.take(2)?;
        Ok(u16::from_be_bytes([b[0], b[1]]))
    }

    fn u24(&mut self) -> Result<usize, HelloError> {
        let b = self.take(3)?;
        Ok(usize::from(b[0]) << 16 | usize::from(b[1]) << 8 | usize::from(b[2]))
    }

    fn u8_vec(&mut self) -> Result<Reader<'a>, HelloError> {
        let len = usize::from(self.u8()?);
        Ok(Reader::new(self.take(len)?))
    }

    fn u16_vec(&mut self) -> Result<Reader<'a>, HelloError> {
        let len = usize::from(self.u16()?);
        Ok(Reader::new(self.take(len)?))
    }
}

#[cfg(test)]
#[path = "../tests/support/hello.rs"]
mod hello;

#[cfg(test)]
mod tests {
    use super::hello::*;
    use super::*;
    use proptest::prelude::*;

    fn sni(buf: &[u8]) -> Result<Option<String>, HelloError> {
        parse_client_hello(buf).map(|hello| hello.sni)
    }

    #[test]
    fn reads_the_one_host_name() {
        assert_eq!(
            sni(&client_hello(Some("pypi.org"))),
            Ok(Some("pypi.org".into()))
        );
        assert_eq!(
            sni(&client_hello(Some("PyPI.org"))),
            Ok(Some("PyPI.org".into()))
        );
        assert_eq!(sni(&client_hello(None)), Ok(None));
        // Bytes after the first record (the client's next flight) are not looked at.
        let mut two = client_hello(Some("a.example"));
        two.extend_from_slice(&[23, 3, 3, 0, 1, 0]);
        assert_eq!(sni(&two), Ok(Some("a.example".into())));
    }

    #[test]
    fn refuses_everything_else() {
        let ok = client_hello(Some("pypi.org"));
        assert_eq!(
            sni(b"GET / HTTP/1.1\r\n\r\n"),
            Err(HelloError::NotHandshake)
        );
        assert_eq!(
            sni(b"SSH-2.0-OpenSSH_9.6\r\n"),
            Err(HelloError::NotHandshake)
        );
        assert_eq!(sni(&[22, 2, 0, 0, 1, 0]), Err(HelloError::NotHandshake));
        assert_eq!(
            sni(&[22, 3, 1, 0x40, 0x01]),
            Err(HelloError::RecordTooLarge)
        );
        assert_eq!(sni(&ok[..ok.len() - 1]), Err(HelloError::Incomplete));
        assert_eq!(sni(&ok[..3]), Err(HelloError::Incomplete));
        assert_eq!(
            sni(&split_into_two_records(&ok, 40)),
            Err(HelloError::SplitAcrossRecords)
        );
        assert_eq!(
            sni(&client_hello_with(
                &[(0, b"a.example"), (0, b"b.example")],
                1
            )),
            Err(HelloError::NameCount)
        );
        assert_eq!(sni(&client_hello_with(&[], 1)), Err(HelloError::NameCount));
        assert_eq!(
            sni(&client_hello_with(&[(0, b"a.example")], 2)),
            Err(HelloError::DuplicateExtension)
        );
        assert_eq!(
            sni(&client_hello_with(&[(1, b"a.example")], 1)),
            Err(HelloError::NotHostName)
        );
        for bad in [
            &b""[..],
            b"a example",
            b"a\0.example",
            b"a\r\n.example",
            "ü.example".as_bytes(),
        ] {
            assert_eq!(
                sni(&client_hello_with(&[(0, bad)], 1)),
                Err(HelloError::BadName),
                "{bad:?}"
            );
        }
        let mut not_hello = ok.clone();
        not_hello[5] = 2;
        assert_eq!(sni(&not_hello), Err(HelloError::NotClientHello));
    }

    proptest! {
        /// Any host-name-shaped SNI is read back exactly.
        #[test]
        fn round_trip(name in "[a-zA-Z0-9_-]{1,20}(\\.[a-zA-Z0-9_-]{1,20}){0,5}") {
            prop_assert_eq!(sni(&client_hello(Some(&name))), Ok(Some(name)));
        }

        /// A truncated hello is never accepted: it is incomplete, or refused.
        #[test]
        fn truncation_never_parses(cut in 0usize..300) {
            let hello = client_hello(Some("pypi.org"));
            let cut = cut.min(hello.len() - 1);
            prop_assert!(sni(&hello[..cut]).is_err());
        }

        /// A hello split across records at any point is refused.
        #[test]
        fn any_split_is_refused(at in 1usize..200) {
            let hello = client_hello(Some("pypi.org"));
            let at = at.min(hello.len() - 6);
            prop_assert_eq!(sni(&split_into_two_records(&hello, at)), Err(HelloError::SplitAcrossRecords));
        }

        /// Changing any byte never panics, and never yields a name other than the one sent unless
        /// the changed byte is inside that name.
        #[test]
        fn mutations_never_confuse(index in 0usize..400, value: u8) {
            let original = client_hello(Some("pypi.org"));
            let start = original.windows(8).position(|w| w == b"pypi.org").unwrap();
            let mut hello = original.clone();
            let index = index % hello.len();
            hello[index] = value;
            if let Ok(Some(name)) = sni(&hello) {
                prop_assert!(name == "pypi.org" || (start..start + 8).contains(&index), "{}", name);
            }
        }

        /// Arbitrary bytes never panic the parser.
        #[test]
        fn arbitrary_bytes(bytes in proptest::collection::vec(any::<u8>(), 0..600)) {
            let _ = sni(&bytes);
            let mut framed = vec![22, 3, 1];
            framed.extend_from_slice(&(bytes.len() as u16).to_be_bytes());
            framed.extend_from_slice(&bytes);
            let _ = sni(&framed);
        }
    }
}

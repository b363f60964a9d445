//! A tiny TLS ClientHello builder for tests: real-looking hellos (TLS 1.3 style, the extensions a
//! browser sends) and the malformed variants the SNI check must refuse. Shared by the crate's unit
//! tests (`#[path]`) and the integration tests.

#![allow(dead_code)]

/// One entry of the server_name list: (name_type, name bytes).
pub type ServerName<'a> = (u8, &'a [u8]);

/// A ClientHello in one record, with an SNI extension for `sni` when given.
pub fn client_hello(sni: Option<&str>) -> Vec<u8> {
    match sni {
        Some(name) => client_hello_with(&[(0, name.as_bytes())], 1),
        None => client_hello_with(&[], 0),
    }
}

/// A ClientHello in one record whose SNI extension lists `names`, repeated `sni_extensions` times
/// (0: no SNI extension at all).
pub fn client_hello_with(names: &[ServerName<'_>], sni_extensions: usize) -> Vec<u8> {
    let mut extensions = Vec::new();
    for _ in 0..sni_extensions {
        let mut list = Vec::new();
        for (name_type, name) in names {
            list.push(*name_type);
            list.extend_from_slice(&(name.len() as u16).to_be_bytes());
            list.extend_from_slice(name);
        }
        extension(&mut extensions, 0, &with_u16_len(&list));
    }
    // supported_groups: x25519, secp256r1
    extension(
        &mut extensions,
        10,
        &with_u16_len(&[0x00, 0x1d, 0x00, 0x17]),
    );
    // signature_algorithms
    extension(
        &mut extensions,
        13,
        &with_u16_len(&[0x04, 0x03, 0x08, 0x04, 0x04, 0x01]),
    );
    // ALPN: http/1.1
    extension(
        &mut extensions,
        16,
        &with_u16_len(&[8, b'h', b't', b't', b'p', b'/', b'1', b'.', b'1']),
    );
    // supported_versions: TLS 1.3, 1.2
    extension(&mut extensions, 43, &[4, 0x03, 0x04, 0x03, 0x03]);
    // key_share: x25519 with a 32-byte key
    let mut share = vec![0x00, 0x1d, 0x00, 0x20];
    share.extend((0..32u8).map(|i| i.wrapping_mul(7)));
    extension(&mut extensions, 51, &with_u16_len(&share));

    let mut body = vec![0x03, 0x03];
    body.extend((0..32u8).map(|i| i.wrapping_mul(13)));
    body.push(32);
    body.extend((0..32u8).map(|i| i.wrapping_mul(3)));
    body.extend_from_slice(&with_u16_len(&[
        0x13, 0x01, 0x13, 0x02, 0x13, 0x03, 0xc0, 0x2f,
    ]));
    body.extend_from_slice(&[1, 0]);
    body.extend_from_slice(&with_u16_len(&extensions));

    let mut handshake = vec![1];
    handshake.extend_from_slice(&(body.len() as u32).to_be_bytes()[1..]);
    handshake.extend_from_slice(&body);
    record(&handshake)
}

/// Re-frames a one-record hello as two records, the first carrying `first` bytes of the handshake.
pub fn split_into_two_records(hello: &[u8], first: usize) -> Vec<u8> {
    let handshake = &hello[5..];
    let mut out = record(&handshake[..first]);
    out.extend_from_slice(&record(&handshake[first..]));
    out
}

fn record(payload: &[u8]) -> Vec<u8> {
    let mut out = vec![22, 0x03, 0x01];
    out.extend_from_slice(&(payload.len() as u16).to_be_bytes());
    out.extend_from_slice(payload);
    out
}

fn extension(out: &mut Vec<u8>, kind: u16, data: &[u8]) {
    out.extend_from_slice(&kind.to_be_bytes());
    out.extend_from_slice(&(data.len() as u16).to_be_bytes());
    out.extend_from_slice(data);
}

fn with_u16_len(data: &[u8]) -> Vec<u8> {
    let mut out = (data.len() as u16).to_be_bytes().to_vec();
    out.extend_from_slice(data);
    out
}

//! Hostile bytes for a TLS listener before any handshake completes: noise
//! instead of a ClientHello, a real ClientHello (made by rustls) cut at
//! every byte or with a byte changed, TLS records whose headers lie
//! (lengths past the record limit, unknown content types, application
//! data first), and other protocols spoken to it (clear-text native
//! Hello, HTTP). After a completed handshake a TLS door gets the native
//! messages of [`crate::hostile`], through [`super::Door::fixed_shots`].

use super::{noise, random_bytes, raw_shots, scrambled, Shot};
use rustls::pki_types::ServerName;
use rustls::{ClientConfig, ClientConnection, RootCertStore};
use std::sync::Arc;

/// The first flight of a real TLS client (its ClientHello record), as
/// rustls makes it for `localhost`.
pub fn client_hello() -> Vec<u8> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let hello = ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .ok()
        .map(|b| {
            b.with_root_certificates(RootCertStore::empty())
                .with_no_client_auth()
        })
        .and_then(|config| {
            let name = ServerName::try_from("localhost").ok()?;
            let mut conn = ClientConnection::new(Arc::new(config), name).ok()?;
            let mut out = Vec::new();
            while conn.wants_write() {
                conn.write_tls(&mut out).ok()?;
            }
            Some(out)
        });
    // A fixed minimal record if rustls cannot make one (it always can).
    hello.unwrap_or_else(|| vec![0x16, 3, 1, 0, 4, 1, 0, 0, 0])
}

/// A TLS record: content type, version, length, then `body`.
fn record(content_type: u8, version: [u8; 2], len: u16, body: &[u8]) -> Vec<u8> {
    let mut r = vec![content_type, version[0], version[1]];
    r.extend_from_slice(&len.to_be_bytes());
    r.extend_from_slice(body);
    r
}

/// The pre-handshake attacks, in groups: lying records and other
/// protocols; the ClientHello cut at every byte; the ClientHello with
/// each byte flipped; noise of several sizes.
pub fn handshake_shots() -> Vec<Vec<Shot>> {
    let hello = client_hello();
    let mut records = vec![
        Shot::raw(
            "record longer than 2^14+2048",
            record(0x16, [3, 3], 0xffff, &[1; 64]),
        ),
        Shot::raw("record of length 0", record(0x16, [3, 3], 0, &[])),
        Shot::raw(
            "record of unknown type 0x63",
            record(0x63, [3, 3], 4, &[0; 4]),
        ),
        Shot::raw(
            "application data before the handshake",
            record(0x17, [3, 3], 32, &[7; 32]),
        ),
        Shot::raw(
            "alert before the handshake",
            record(0x15, [3, 3], 2, &[2, 40]),
        ),
        Shot::raw("change cipher spec first", record(0x14, [3, 3], 1, &[1])),
        Shot::raw("record version 9.9", record(0x16, [9, 9], 4, &[1, 0, 0, 0])),
        Shot::raw(
            "handshake message longer than its record",
            record(0x16, [3, 1], 8, &[1, 0xff, 0xff, 0xff, 3, 3, 0, 0]),
        ),
        Shot::raw(
            "SSLv2 ClientHello",
            vec![
                0x80, 0x2e, 0x01, 0x00, 0x02, 0x00, 0x15, 0x00, 0x00, 0x00, 0x10,
            ],
        ),
        Shot::raw(
            "HTTP request",
            b"GET / HTTP/1.1\r\nHost: x\r\n\r\n".to_vec(),
        ),
        Shot::raw("clear-text native Hello", {
            let body = wire::encode_hello(&wire::Limits::default());
            let mut h = wire::Header::new(wire::Kind::Hello);
            h.desc_len = body.len() as u32;
            let mut b = h.encode().to_vec();
            b.extend_from_slice(&body);
            b
        }),
        Shot::raw("ClientHello twice", [hello.clone(), hello.clone()].concat()),
        Shot::raw("ClientHello then noise", {
            let mut b = hello.clone();
            b.extend((0..512u32).map(|i| (i.wrapping_mul(2_654_435_761) >> 24) as u8));
            b
        }),
    ];
    // 1000 empty handshake records: work for the agent, nothing to do.
    records.push(Shot::raw(
        "1000 empty handshake records",
        (0..1000)
            .flat_map(|_| record(0x16, [3, 3], 0, &[]))
            .collect(),
    ));
    let cut = (1..hello.len())
        .map(|k| Shot::raw(format!("ClientHello cut at byte {k}"), hello[..k].to_vec()))
        .collect();
    let flipped = (0..hello.len())
        .map(|i| {
            let mut b = hello.clone();
            b[i] ^= 0xff;
            Shot::raw(format!("ClientHello byte {i} ^0xff"), b)
        })
        .collect();
    let noise = noise(
        0x715,
        &[],
        &[1, 5, 64, 517, 4096, 20_000],
        "random bytes instead of a ClientHello",
    );
    vec![records, cut, flipped, raw_shots(noise)]
}

/// A random pre-handshake attack: noise, the ClientHello cut at a random
/// byte, or with random bytes changed.
pub fn random_shot(rng: &mut fastrand::Rng) -> Shot {
    // Made once per thread: the bytes are the same each time.
    thread_local! {
        static HELLO: Vec<u8> = client_hello();
    }
    HELLO.with(|hello| match rng.u8(..3) {
        0 => Shot::raw(
            "random bytes instead of a ClientHello",
            random_bytes(rng, 1024),
        ),
        1 => Shot::raw(
            "ClientHello cut at random",
            hello[..rng.usize(1..hello.len().max(2))].to_vec(),
        ),
        _ => Shot::raw(
            "ClientHello with random bytes changed",
            scrambled(rng, hello, 0),
        ),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_client_hello_is_a_handshake_record_of_its_own_length() {
        let h = client_hello();
        assert_eq!(h[0], 0x16, "a handshake record");
        let len = u16::from_be_bytes([h[3], h[4]]) as usize;
        assert_eq!(h.len(), 5 + len);
        assert_eq!(h[5], 1, "a ClientHello");
    }
}

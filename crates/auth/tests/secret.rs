//! DHHC-1 secrets: parsing, errors, Debug redaction, and the key
//! transformation against answers computed independently (OpenSSL's
//! `openssl mac HMAC` and Python's hmac, following Linux
//! `nvme_auth_transform_key` and `nvme_auth_augmented_challenge`).

use pollux_auth::{augmented_challenge, response, DhchapKey, HashId, Role, Secret, SecretError};

const HOSTNQN: &str = "nqn.2014-08.org.nvmexpress:uuid:00000000-0000-0000-0000-000000000001";
const SUBNQN: &str = "nqn.2024-01.io.pollux:kat";
/// bytes 0..32, hash 01, with its CRC.
const KEY01: &str = "DHHC-1:01:AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh+KfiaR:";

fn hex(s: &str) -> Vec<u8> {
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).expect("hex"))
        .collect()
}

#[test]
fn parses_and_round_trips() {
    let k = DhchapKey::parse(KEY01).expect("parse");
    assert_eq!(k.transform_hash(), Some(HashId::Sha256));
    assert_eq!(k.key().expose(), (0u8..32).collect::<Vec<_>>().as_slice());
    assert_eq!(&*k.to_dhhc1(), KEY01);
    // Without the trailing ':' and with a newline, as in a key file.
    let k2 = DhchapKey::parse(&format!("{}\n", KEY01.trim_end_matches(':'))).expect("parse");
    assert_eq!(k, k2);
    for (len, h) in [(48usize, "02"), (64, "03"), (32, "00")] {
        let raw: Vec<u8> = (0..len as u8).collect();
        let text = DhchapKey::from_raw(
            Secret::new(raw.clone()),
            HashId::from_u8(h[1..].parse().expect("n")),
        )
        .to_dhhc1();
        assert!(text.starts_with(&format!("DHHC-1:{h}:")));
        let back = DhchapKey::parse(&text).expect("reparse");
        assert_eq!(back.key().expose(), raw.as_slice());
    }
}

type Check = fn(&SecretError) -> bool;

#[test]
fn refuses_bad_secrets() {
    let cases: &[(&str, Check)] = &[
        (
            "DHHC-2:01:AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh+KfiaR:",
            |e| matches!(e, SecretError::BadPrefix),
        ),
        ("AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh+KfiaR", |e| {
            matches!(e, SecretError::BadPrefix)
        }),
        (
            "DHHC-1:04:AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh+KfiaR:",
            |e| matches!(e, SecretError::BadHashId),
        ),
        (
            "DHHC-1:1:AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh+KfiaR:",
            |e| matches!(e, SecretError::BadHashId),
        ),
        // One bit of the key changed: the CRC no longer matches.
        (
            "DHHC-1:01:AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh+KfiaS:",
            |e| matches!(e, SecretError::BadCrc | SecretError::BadBase64),
        ),
        (
            "DHHC-1:01:AQECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh+KfiaR:",
            |e| matches!(e, SecretError::BadCrc),
        ),
        // 16-byte key.
        ("DHHC-1:00:AAECAwQFBgcICQoLDA0ODwAAAAA=:", |e| {
            matches!(e, SecretError::BadLength(16))
        }),
        ("DHHC-1:00:not*base64:", |e| {
            matches!(e, SecretError::BadBase64)
        }),
        ("DHHC-1:00:", |e| matches!(e, SecretError::BadLength(_))),
    ];
    for (text, ok) in cases {
        let e = DhchapKey::parse(text).expect_err(text);
        assert!(ok(&e), "{text}: {e:?}");
    }
}

#[test]
fn key_file() {
    let dir = std::env::temp_dir().join(format!("pollux-auth-key-{}", std::process::id()));
    std::fs::write(&dir, format!("{KEY01}\n")).expect("write");
    let k = DhchapKey::from_file(&dir).expect("read");
    assert_eq!(k, DhchapKey::parse(KEY01).expect("parse"));
    std::fs::remove_file(&dir).expect("rm");
    let e = DhchapKey::from_file(&dir).expect_err("gone");
    assert!(e.to_string().contains(&dir.display().to_string()), "{e}");
}

#[test]
fn debug_never_prints_the_key() {
    let k = DhchapKey::parse(KEY01).expect("parse");
    let s = format!("{k:?} {:?}", k.key());
    assert!(!s.contains("AAECAwQF"), "{s}");
    assert!(!s.contains("[0, 1, 2"), "{s}");
    assert!(s.contains("redacted"), "{s}");
}

#[test]
fn transform_known_answers() {
    let raw = Secret::new((0u8..32).collect());
    for (h, want) in [
        (HashId::Sha256, "6C7B81CB2A746F74454B1D7140F3153B51CA99459FCEF7A86A17F27695B87CD8"),
        (
            HashId::Sha384,
            "C482300B17213CD9B9CFAECB3BE7E824561882F715CFF290F089BCF62772ECC7B1601A415724A7F4E0999B78079A558E",
        ),
        (
            HashId::Sha512,
            "5F233F233263EFC7342E477170607B1A36DBBCE203872202311382FB13479A60AF958176F5101A338A53D05C8C75A398DF3A99111FC9FCD23FDD838DF30D33D1",
        ),
    ] {
        let k = DhchapKey::from_raw(raw.clone(), Some(h));
        assert_eq!(k.transform(HOSTNQN).expose(), hex(want).as_slice(), "{h:?}");
    }
    // 00: the key as is.
    let k = DhchapKey::from_raw(raw.clone(), None);
    assert_eq!(k.transform(HOSTNQN), raw);
}

#[test]
fn response_known_answers() {
    let key = Secret::new(hex(
        "6C7B81CB2A746F74454B1D7140F3153B51CA99459FCEF7A86A17F27695B87CD8",
    ));
    let c = vec![0xAAu8; 32];
    let ks = Secret::new(vec![0x5A; 256]);
    let h = HashId::Sha256;
    let ca = augmented_challenge(h, Some(&ks), &c);
    assert_eq!(
        ca.expose(),
        hex("fb6efdce48b2568fb7d9b928d2080dce542fcc1b7d2b15a3c16e2f65426969e6").as_slice()
    );
    let c_plain = augmented_challenge(h, None, &c);
    let r = response(
        h,
        &key,
        &c_plain,
        0x0102_0304,
        7,
        Role::Host,
        HOSTNQN,
        SUBNQN,
    );
    assert_eq!(
        r.expose(),
        hex("f7459a35056af4c79fdef093ca8d9eb7a9b15ccb7bc846036459a1830c5feb07").as_slice()
    );
    let r = response(h, &key, &ca, 0x0102_0304, 7, Role::Host, HOSTNQN, SUBNQN);
    assert_eq!(
        r.expose(),
        hex("29ff975d58669ad9208c29e44a2cee651ef31bf95c6959c99b9ac82788e2b4a9").as_slice()
    );
    let r = response(
        h,
        &key,
        &ca,
        0x0102_0304,
        7,
        Role::Controller,
        SUBNQN,
        HOSTNQN,
    );
    assert_eq!(
        r.expose(),
        hex("ec51a1ec2b06dcea166b754acba8a567a8febc3947abc8598649b5e0dd728e11").as_slice()
    );
}

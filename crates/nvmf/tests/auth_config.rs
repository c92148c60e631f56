//! DH-HMAC-CHAP's configuration: the keyring's rules (SPDK's
//! `keyring_file`) and hosts' key names, refused naming the culprit.
use std::os::unix::fs::PermissionsExt;
use std::path::PathBuf;

use pollux_nvmf::{ConfigError, TargetConfig};

/// A file `name` in a fresh directory of this test, with `text` and
/// `mode`.
fn file(name: &str, text: &str, mode: u32) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("pollux-auth-config-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let p = dir.join(name);
    std::fs::write(&p, text).unwrap();
    std::fs::set_permissions(&p, std::fs::Permissions::from_mode(mode)).unwrap();
    p
}

fn config(keyring: &str, host_params: &str) -> Result<TargetConfig, ConfigError> {
    TargetConfig::from_json(&format!(
        r#"{{"subsystems": [
  {{"subsystem": "keyring", "config": [{keyring}]}},
  {{"subsystem": "bdev", "config": [
    {{"method": "bdev_malloc_create", "params": {{"name": "Malloc0", "num_blocks": 2048, "block_size": 512}}}}]}},
  {{"subsystem": "nvmf", "config": [
    {{"method": "nvmf_create_subsystem", "params": {{"nqn": "nqn.2016-06.io.spdk:cnode1"}}}},
    {{"method": "nvmf_subsystem_add_host", "params": {{"nqn": "nqn.2016-06.io.spdk:cnode1", "host": "nqn.2014-08.org.nvmexpress:uuid:1"{host_params}}}}}]}}
]}}"#
    ))
}

fn add_key(name: &str, path: &std::path::Path) -> String {
    format!(
        r#"{{"method": "keyring_file_add_key", "params": {{"name": "{name}", "path": "{}"}}}}"#,
        path.display()
    )
}

fn refused(keyring: &str, host_params: &str) -> String {
    match config(keyring, host_params) {
        Err(e) => e.to_string(),
        Ok(_) => panic!("accepted: {keyring} {host_params}"),
    }
}

#[test]
fn key_files_are_refused_naming_the_key_and_why() {
    let missing = std::env::temp_dir().join("pollux-no-such-key-file");
    let e = refused(&add_key("key0", &missing), "");
    assert!(
        e.contains("key0") && e.contains("pollux-no-such-key-file") && e.contains("cannot stat"),
        "{e}"
    );
    // Readable by others (SPDK's keyring_file refuses mode & 077).
    let open = file("open.key", "DHHC-1:00:x:\n", 0o644);
    let e = refused(&add_key("key1", &open), "");
    assert!(
        e.contains("key1") && e.contains("0644") && e.contains("chmod 0600"),
        "{e}"
    );
    let group = file("group.key", "DHHC-1:00:x:\n", 0o640);
    let e = refused(&add_key("key1", &group), "");
    assert!(e.contains("0640"), "{e}");
    // A relative path.
    let e = refused(
        r#"{"method": "keyring_file_add_key", "params": {"name": "k", "path": "k.key"}}"#,
        "",
    );
    assert!(e.contains("absolute"), "{e}");
    // Not a DHHC-1 secret; the message never quotes the file.
    let bad = file("bad.key", "not-a-secret-XYZZY\n", 0o600);
    let e = refused(&add_key("key2", &bad), "");
    assert!(e.contains("key2") && e.contains("DHHC-1"), "{e}");
    assert!(!e.contains("XYZZY"), "{e}");
}

#[test]
fn host_keys_must_be_in_the_keyring() {
    let e = refused("", r#", "dhchap_key": "nokey""#);
    assert!(
        e.contains("dhchap_key") && e.contains("no key 'nokey'") && e.contains("keyring"),
        "{e}"
    );
    let e = refused("", r#", "psk": "x""#);
    assert!(e.contains("psk"), "{e}");
}

#[test]
fn digests_and_dh_groups_take_spdks_names() {
    let base = |set: &str| {
        TargetConfig::from_json(&format!(
            r#"{{"subsystems": [{{"subsystem": "nvmf", "config": [
            {{"method": "nvmf_set_config", "params": {set}}}]}}]}}"#
        ))
    };
    let c = base(r#"{"dhchap_digests": ["sha384"], "dhchap_dhgroups": ["null", "ffdhe8192"]}"#)
        .unwrap();
    assert_eq!(
        pollux_nvmf::mask_to_names(&pollux_nvmf::DIGESTS, c.auth.digests),
        ["sha384"]
    );
    assert_eq!(
        pollux_nvmf::mask_to_names(&pollux_nvmf::DHGROUPS, c.auth.dhgroups),
        ["null", "ffdhe8192"]
    );
    let e = base(r#"{"dhchap_digests": ["md5"]}"#)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("dhchap_digests") && e.contains("'md5'") && e.contains("sha256"),
        "{e}"
    );
    let e = base(r#"{"dhchap_dhgroups": "null"}"#)
        .unwrap_err()
        .to_string();
    assert!(e.contains("dhchap_dhgroups") && e.contains("array"), "{e}");
    // The DH worker pool (pollux's own).
    let c = base(
        r#"{"dhchap_dh_threads": 2, "dhchap_dh_queue_per_host": 4, "dhchap_dh_queue_max": 16}"#,
    )
    .unwrap();
    assert_eq!(
        (
            c.auth.dh_threads,
            c.auth.dh_queue_per_host,
            c.auth.dh_queue_max
        ),
        (2, 4, 16)
    );
    let e = base(r#"{"dhchap_dh_threads": 0}"#).unwrap_err().to_string();
    assert!(e.contains("dhchap_dh_threads"), "{e}");
    // The defaults: everything, one DH thread.
    let c = base("{}").unwrap();
    assert_eq!(c.auth, pollux_nvmf::AuthOptions::default());
    assert_eq!(c.auth.dh_threads, 1);
}

/// A configuration with keys reads, starts, and its `save_config`
/// (keyring, then nvmf) reads back to the same hosts' keys and options.
#[test]
fn keys_read_start_and_save_back() {
    // A valid DHHC-1 secret (32 bytes 0..31 and their CRC-32).
    let k = file(
        "good.key",
        "DHHC-1:00:AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh+KfiaR:\n",
        0o600,
    );
    let keyring = format!("{}, {}", add_key("key0", &k), add_key("ckey0", &k));
    let c = config(
        &keyring,
        r#", "dhchap_key": "key0", "dhchap_ctrlr_key": "ckey0""#,
    )
    .unwrap();
    let s = &c.subsystems[0];
    assert_eq!(s.host_keys.len(), 1);
    assert_eq!(s.host_keys[0].key, "key0");
    assert_eq!(s.host_keys[0].ctrlr_key.as_deref(), Some("ckey0"));
    assert_eq!(c.keyring.keys.len(), 2);
    // The key's Debug shows its name and path only.
    let dbg = format!("{:?}", c.keyring);
    assert!(dbg.contains("key0") && !dbg.contains("AAECAw"), "{dbg}");
    let mut c = c;
    c.auth.digests = pollux_nvmf::names_to_mask(&pollux_nvmf::DIGESTS, ["sha512"]).unwrap();
    c.auth.dh_queue_per_host = 7;
    let t = pollux_nvmf::Target::start(c, &[0], Default::default()).unwrap();
    let saved = serde_json::json!({"subsystems": [
        {"subsystem": "keyring", "config": t.save_config_keyring()},
        {"subsystem": "bdev", "config": [
            {"method": "bdev_malloc_create", "params": {"name": "Malloc0", "num_blocks": 2048, "block_size": 512}}]},
        {"subsystem": "nvmf", "config": t.save_config_nvmf()},
    ]});
    let text = saved.to_string();
    assert!(!text.contains("AAECAw"), "{text}");
    let back = TargetConfig::from_json(&text).unwrap();
    assert_eq!(back.subsystems[0].host_keys, t_host_keys());
    assert_eq!(
        pollux_nvmf::mask_to_names(&pollux_nvmf::DIGESTS, back.auth.digests),
        ["sha512"]
    );
    assert_eq!(back.auth.dh_queue_per_host, 7);
    // (Only what differs from the default: SPDK refuses unknown names.)
    assert!(!text.contains("dhchap_dh_threads"), "{text}");
}

fn t_host_keys() -> Vec<pollux_nvmf::HostKeys> {
    vec![pollux_nvmf::HostKeys {
        host: "nqn.2014-08.org.nvmexpress:uuid:1".into(),
        key: "key0".into(),
        ctrlr_key: Some("ckey0".into()),
    }]
}

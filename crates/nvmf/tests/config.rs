//! SPDK-shaped JSON configuration: what is read, what is refused (named).
use pollux_nvmf::{ConfigError, ParamError, TargetConfig};

const GOOD: &str = r#"{"subsystems": [
  {"subsystem": "accel", "config": []},
  {"subsystem": "bdev", "config": [
    {"method": "bdev_malloc_create", "params": {"name": "Malloc0", "num_blocks": 2048, "block_size": 512}},
    {"method": "bdev_null_create", "params": {"name": "Null0", "num_blocks": 2048, "block_size": 4096}}]},
  {"subsystem": "nvmf", "config": [
    {"method": "nvmf_set_max_subsystems", "params": {"max_subsystems": 1024}},
    {"method": "nvmf_create_transport", "params": {"trtype": "TCP", "max_queue_depth": 64, "in_capsule_data_size": 8192, "max_io_size": 65536, "io_unit_size": 8192, "zcopy": true}},
    {"method": "nvmf_create_subsystem", "params": {"nqn": "nqn.2016-06.io.spdk:cnode1", "serial_number": "SPDK001", "model_number": "pollux model", "allow_any_host": false}},
    {"method": "nvmf_subsystem_add_ns", "params": {"nqn": "nqn.2016-06.io.spdk:cnode1", "namespace": {"bdev_name": "Null0", "nsid": 2}}},
    {"method": "nvmf_subsystem_add_ns", "params": {"nqn": "nqn.2016-06.io.spdk:cnode1", "namespace": {"bdev_name": "Malloc0", "nsid": 1}}},
    {"method": "nvmf_subsystem_add_host", "params": {"nqn": "nqn.2016-06.io.spdk:cnode1", "host": "nqn.2014-08.org.nvmexpress:uuid:1"}},
    {"method": "nvmf_subsystem_add_listener", "params": {"nqn": "nqn.2016-06.io.spdk:cnode1",
      "listen_address": {"trtype": "TCP", "adrfam": "IPv4", "traddr": "127.0.0.1", "trsvcid": "0"}}}]}
]}"#;

#[test]
fn spdk_configuration_is_read() {
    let c = TargetConfig::from_json(GOOD).unwrap();
    assert_eq!(c.transport.max_queue_depth, 64);
    assert_eq!(c.transport.in_capsule_data_size, 8192);
    assert_eq!(c.transport.max_io_size, 65536);
    // SPDK's `zcopy` (zero-copy with the bdev) is read and ignored, named.
    assert!(c.warnings.iter().any(|w| w.contains("'zcopy' ignored")));
    assert_eq!(c.bdevs.len(), 2);
    let s = &c.subsystems[0];
    assert_eq!(s.serial.as_deref(), Some("SPDK001"));
    assert_eq!(s.model.as_deref(), Some("pollux model"));
    assert!(!s.allow_any_host);
    assert_eq!(s.hosts, ["nqn.2014-08.org.nvmexpress:uuid:1"]);
    assert_eq!(s.listeners, ["127.0.0.1:0".parse().unwrap()]);
    // The data buffer pool: SPDK's names and default count, its unit.
    assert_eq!(c.transport.io_unit_size, 8192);
    assert_eq!(c.transport.num_shared_buffers, 511);
    assert_eq!(c.transport.pool_bytes(), 511 * 8192);
    // It starts, listening on a real port.
    let t = pollux_nvmf::Target::start(c, &[0], Default::default()).unwrap();
    assert_ne!(t.listen_addrs()[0].port(), 0);
}

fn refused(from: &str, to: &str) -> String {
    assert!(GOOD.contains(from), "{from}");
    match TargetConfig::from_json(&GOOD.replace(from, to)) {
        Err(e) => e.to_string(),
        Ok(_) => panic!("accepted with {to}"),
    }
}

#[test]
fn bad_configurations_name_the_culprit() {
    let e = refused("nvmf_subsystem_add_host", "nvmf_subsystem_add_hots");
    assert!(e.contains("nvmf_subsystem_add_hots"), "{e}");
    let e = refused("\"max_queue_depth\": 64", "\"max_queue_dept\": 64");
    assert!(
        e.contains("max_queue_dept") && e.contains("nvmf_create_transport"),
        "{e}"
    );
    let e = refused("\"max_queue_depth\": 64", "\"max_queue_depth\": 1");
    assert!(e.contains("max_queue_depth"), "{e}");
    let e = refused("\"trtype\": \"TCP\", \"max", "\"trtype\": \"RDMA\", \"max");
    assert!(e.contains("trtype") && e.contains("RDMA"), "{e}");
    let e = refused("\"bdev_name\": \"Null0\"", "\"bdev_name\": \"Nope\"");
    assert!(e.contains("Nope"), "{e}");
    let e = refused("\"nsid\": 2", "\"nsid\": 1");
    assert!(e.contains("NSID 1 twice"), "{e}");
    // A gap is fine (save_config of a live-made subsystem has them).
    let c = TargetConfig::from_json(&GOOD.replace("\"nsid\": 2", "\"nsid\": 7")).unwrap();
    let ids: Vec<u32> = c
        .namespaces(&c.subsystems[0])
        .iter()
        .map(|(id, _)| *id)
        .collect();
    assert_eq!(ids, [1, 7]);
    let e = refused("\"traddr\": \"127.0.0.1\"", "\"traddr\": \"localhost\"");
    assert!(e.contains("traddr") && e.contains("localhost"), "{e}");
    let e = refused("\"host\": \"nqn.2014", "\"host\": \"\\u0001nqn.2014");
    assert!(e.contains("host NQN"), "{e}");
    assert!(matches!(
        TargetConfig::from_json(&GOOD.replace(
            "Malloc0\", \"num_blocks\": 2048, \"block_size\": 512",
            "Malloc0\", \"num_blocks\": 2048, \"block_size\": 513"
        )),
        Err(ConfigError::Bdev(_))
    ));
}

/// The nvmf methods' parameters are read by the one reader of every
/// configuration (`pollux_bdev::params`): a bad value is refused naming
/// the method, the key (`object.key` inside `namespace` and
/// `listen_address`), what was expected and what was found, in the words
/// a bdev method's bad value gets.
#[test]
fn bad_values_are_named_by_the_shared_reader() {
    for (from, to, key, want) in [
        (
            "\"max_queue_depth\": 64",
            "\"max_queue_depth\": \"64\"",
            "max_queue_depth",
            "nvmf_create_transport: parameter 'max_queue_depth': expected an integer in 2..=4096, got \"64\"",
        ),
        (
            "\"allow_any_host\": false",
            "\"allow_any_host\": \"no\"",
            "allow_any_host",
            "nvmf_create_subsystem: parameter 'allow_any_host': expected true or false, got \"no\"",
        ),
        (
            "\"nsid\": 2",
            "\"nsid\": 0",
            "namespace.nsid",
            "nvmf_subsystem_add_ns: parameter 'namespace.nsid': expected an integer in 1..=1024, got 0",
        ),
        (
            "\"traddr\": \"127.0.0.1\"",
            "\"traddr\": 127",
            "listen_address.traddr",
            "nvmf_subsystem_add_listener: parameter 'listen_address.traddr': expected a string, got 127",
        ),
        (
            "\"trsvcid\": \"0\"",
            "\"trsvcid\": true",
            "listen_address.trsvcid",
            "nvmf_subsystem_add_listener: parameter 'listen_address.trsvcid': expected a port number (a string or an integer), got true",
        ),
    ] {
        let e = TargetConfig::from_json(&GOOD.replace(from, to))
            .err()
            .unwrap_or_else(|| panic!("accepted with {to}"));
        match &e {
            ConfigError::Param(ParamError::Bad { param, .. }) => assert_eq!(param, key),
            other => panic!("{to}: {other:?}"),
        }
        assert_eq!(e.to_string(), format!("JSON configuration: {want}"));
    }
    // Unknown and missing keys, inside an object too.
    let e = refused("\"host\": \"nqn", "\"hots\": \"nqn");
    assert_eq!(
        e,
        "JSON configuration: nvmf_subsystem_add_host: unknown parameter 'hots' (known: nqn, host, tgt_name, psk, dhchap_key, dhchap_ctrlr_key)"
    );
    let e = refused("\"bdev_name\": \"Null0\"", "\"bdev\": \"Null0\"");
    assert!(
        e.starts_with("JSON configuration: nvmf_subsystem_add_ns: unknown parameter 'namespace.bdev' (known: bdev_name, nsid"),
        "{e}"
    );
    let e = refused("\"bdev_name\": \"Null0\", ", "");
    assert_eq!(
        e,
        "JSON configuration: nvmf_subsystem_add_ns: missing required parameter 'namespace.bdev_name'"
    );
    // A bdev method's bad value, in the same words.
    let e = refused(
        "\"Null0\", \"num_blocks\": 2048",
        "\"Null0\", \"num_blocks\": \"2048\"",
    );
    assert_eq!(
        e,
        "JSON configuration: bdev_null_create: parameter 'num_blocks': expected a non-negative integer, got \"2048\""
    );
}

/// `bdev_nvme_attach_controller`: `from_json` (no NVMe transport) refuses
/// it naming the controller; `from_json_with` hands each entry to the
/// caller's function and serves the bdevs it returns (`<name>n<nsid>`).
#[test]
fn nvme_attach_goes_to_the_callers_function() {
    let with_attach = GOOD.replace(
        r#"{"method": "bdev_null_create", "params": {"name": "Null0", "num_blocks": 2048, "block_size": 4096}}"#,
        r#"{"method": "bdev_nvme_attach_controller", "params": {"name": "Nvme7", "trtype": "soft", "backend": "ram"}}"#,
    )
    .replace("\"bdev_name\": \"Null0\"", "\"bdev_name\": \"Nvme7n1\"");
    assert_ne!(with_attach, GOOD);
    let e = TargetConfig::from_json(&with_attach)
        .unwrap_err()
        .to_string();
    assert!(e.contains("Nvme7"), "{e}");
    let mut seen = Vec::new();
    let c: TargetConfig =
        TargetConfig::from_json_with(&with_attach, &mut |a: &pollux_bdev::config::NvmeAttach| {
            seen.push((a.name.clone(), a.trtype.clone(), a.params.len()));
            pollux_bdev::Bdev::ram(&a.bdev_name(1), 512, 64)
                .map(|b| vec![b])
                .map_err(|e| e.to_string())
        })
        .unwrap();
    assert_eq!(seen, [("Nvme7".to_string(), "soft".to_string(), 1)]);
    assert!(c.bdevs.iter().any(|b| b.name() == "Nvme7n1"));
    // A failing attach function is named with the controller.
    let e =
        TargetConfig::from_json_with(&with_attach, &mut |_: &pollux_bdev::config::NvmeAttach| {
            Err::<Vec<_>, _>("no such device".to_string())
        })
        .unwrap_err()
        .to_string();
    assert!(e.contains("Nvme7") && e.contains("no such device"), "{e}");
}

/// The handshake timeouts (pollux-specific `nvmf_create_transport`
/// parameters): 10 s each by default, read in milliseconds, 0 and more
/// than an hour refused naming the parameter.
#[test]
fn handshake_timeouts_are_read_and_bounded() {
    use std::time::Duration;
    let c = TargetConfig::from_json(GOOD).unwrap();
    assert_eq!(c.transport.icreq_timeout, Duration::from_secs(10));
    assert_eq!(c.transport.connect_timeout, Duration::from_secs(10));
    let with = |v: &str| GOOD.replace("\"zcopy\": true", &format!("\"zcopy\": true, {v}"));
    let c = TargetConfig::from_json(&with(
        "\"icreq_timeout_ms\": 250, \"connect_timeout_ms\": 3000",
    ))
    .unwrap();
    assert_eq!(c.transport.icreq_timeout, Duration::from_millis(250));
    assert_eq!(c.transport.connect_timeout, Duration::from_secs(3));
    for (p, v) in [
        ("icreq_timeout_ms", "0"),
        ("connect_timeout_ms", "0"),
        ("icreq_timeout_ms", "3600001"),
        ("connect_timeout_ms", "\"10\""),
    ] {
        let e = TargetConfig::from_json(&with(&format!("\"{p}\": {v}")))
            .err()
            .unwrap_or_else(|| panic!("{p} {v} accepted"))
            .to_string();
        assert!(e.contains(p) && e.contains("nvmf_create_transport"), "{e}");
    }
    // Built in code: validate() names the option.
    let mut o = pollux_nvmf::TransportOptions {
        connect_timeout: Duration::ZERO,
        ..Default::default()
    };
    let e = o.validate().unwrap_err().to_string();
    assert!(e.contains("connect_timeout_ms"), "{e}");
    o.connect_timeout = Duration::from_secs(3601);
    assert!(o.validate().is_err());
}

/// `send_iov` (pollux-specific `nvmf_create_transport` parameter): 512 by
/// default, 1..=512 accepted, anything else refused naming it.
#[test]
fn send_iov_is_read_and_bounded() {
    let c = TargetConfig::from_json(GOOD).unwrap();
    assert_eq!(c.transport.send_iov, pollux_nvmf::MAX_SEND_IOV);
    let with = |v: &str| GOOD.replace("\"zcopy\": true", &format!("\"zcopy\": true, {v}"));
    let c = TargetConfig::from_json(&with("\"send_iov\": 64")).unwrap();
    assert_eq!(c.transport.send_iov, 64);
    for v in ["0", "513", "\"64\""] {
        let e = TargetConfig::from_json(&with(&format!("\"send_iov\": {v}")))
            .err()
            .unwrap_or_else(|| panic!("send_iov {v} accepted"))
            .to_string();
        assert!(
            e.contains("send_iov") && e.contains("nvmf_create_transport"),
            "{e}"
        );
    }
    let o = pollux_nvmf::TransportOptions {
        send_iov: 0,
        ..Default::default()
    };
    let e = o.validate().unwrap_err().to_string();
    assert!(e.contains("send_iov"), "{e}");
}

/// `busy_poll_us` (pollux-specific): off (0) by default, 0..=1000000
/// accepted, anything else refused naming it.
#[test]
fn busy_poll_us_is_read_and_bounded() {
    let c = TargetConfig::from_json(GOOD).unwrap();
    assert_eq!(c.transport.busy_poll_us, 0);
    let with = |v: &str| GOOD.replace("\"zcopy\": true", &format!("\"zcopy\": true, {v}"));
    let c = TargetConfig::from_json(&with("\"busy_poll_us\": 50")).unwrap();
    assert_eq!(c.transport.busy_poll_us, 50);
    for v in ["-1", "1000001", "\"50\""] {
        let e = TargetConfig::from_json(&with(&format!("\"busy_poll_us\": {v}")))
            .err()
            .unwrap_or_else(|| panic!("busy_poll_us {v} accepted"))
            .to_string();
        assert!(e.contains("busy_poll_us"), "{e}");
    }
    let o = pollux_nvmf::TransportOptions {
        busy_poll_us: 1_000_001,
        ..Default::default()
    };
    let e = o.validate().unwrap_err().to_string();
    assert!(e.contains("busy_poll_us"), "{e}");
}

/// The data buffer pool (SPDK's `num_shared_buffers`, `io_unit_size`,
/// `buf_cache_size`, UINT32_MAX meaning "pick one"), `data_timeout_ms` and
/// `max_unbound_connections` (pollux-specific): read, and refused naming
/// the parameter when out of bounds.
#[test]
fn pool_data_timeout_and_unbound_budget_are_read_and_bounded() {
    use std::time::Duration;
    let d = pollux_nvmf::TransportOptions::default();
    assert_eq!(d.pool_bytes(), 511 * (128 << 10));
    assert_eq!(d.data_timeout, Duration::from_secs(30));
    let with = |v: &str| GOOD.replace("\"zcopy\": true", &format!("\"zcopy\": true, {v}"));
    let c = TargetConfig::from_json(&with(
        "\"num_shared_buffers\": 64, \"buf_cache_size\": 4294967295, \"data_timeout_ms\": 500, \"max_unbound_connections\": 16",
    ))
    .unwrap();
    let t = &c.transport;
    assert_eq!(t.pool_bytes(), 64 * 8192);
    assert_eq!(t.buf_cache_size, None);
    assert_eq!(t.data_timeout, Duration::from_millis(500));
    assert_eq!(t.max_unbound_connections, 16);
    let c = TargetConfig::from_json(&with("\"buf_cache_size\": 32")).unwrap();
    assert_eq!(c.transport.buf_cache_size, Some(32));
    for (p, v) in [
        // 4 x 8 KiB cannot hold one 64 KiB transfer.
        ("num_shared_buffers", "4"),
        ("num_shared_buffers", "0"),
        ("io_unit_size", "1000"),
        ("buf_cache_size", "1000"),
        ("data_timeout_ms", "0"),
        ("max_unbound_connections", "0"),
    ] {
        let e = TargetConfig::from_json(&with(&format!("\"{p}\": {v}")))
            .err()
            .unwrap_or_else(|| panic!("{p} {v} accepted"))
            .to_string();
        assert!(e.contains(p), "{p} {v}: {e}");
    }
}

/// A subsystem's NQN and its hosts' are NQNs: "nqn." and at most 223
/// bytes, checked when the configuration is read (before, "cnode1" was
/// served and a host "myhost" listed).
#[test]
fn nqns_are_checked_when_read() {
    let e = GOOD.replace("nqn.2016-06.io.spdk:cnode1", "cnode1");
    let e = match TargetConfig::from_json(&e) {
        Err(e) => e.to_string(),
        Ok(_) => panic!("cnode1 accepted"),
    };
    assert!(
        e.contains("subsystem 'cnode1'") && e.contains("starts with \"nqn.\""),
        "{e}"
    );
    let e = refused("nqn.2014-08.org.nvmexpress:uuid:1", "myhost");
    assert!(
        e.contains("host NQN \"myhost\"") && e.contains("nqn."),
        "{e}"
    );
    let long = format!("nqn.2016-06.io.spdk:{}", "x".repeat(204));
    let e = match TargetConfig::from_json(&GOOD.replace("nqn.2016-06.io.spdk:cnode1", &long)) {
        Err(e) => e.to_string(),
        Ok(_) => panic!("224 bytes accepted"),
    };
    assert!(e.contains("224 bytes, longer than 223"), "{e}");
}

/// SPDK's client sends `c2h_success: true` and `zcopy: false` with every
/// `nvmf_create_transport`: nothing is ignored at those values, so no
/// warning (a value pollux would not honour still gets one).
#[test]
fn spdks_default_transport_flags_are_not_warned_about() {
    let doc = |p: &str| {
        format!(
            r#"{{"subsystems": [{{"subsystem": "nvmf", "config": [
              {{"method": "nvmf_create_transport", "params": {{"trtype": "TCP", {p}}}}}]}}]}}"#
        )
    };
    let c = TargetConfig::from_json(&doc(r#""c2h_success": true, "zcopy": false"#)).unwrap();
    assert!(c.warnings.is_empty(), "{:?}", c.warnings);
    assert!(c.transport_created);
    let c = TargetConfig::from_json(&doc(r#""c2h_success": false"#)).unwrap();
    assert!(c
        .warnings
        .iter()
        .any(|w| w.contains("'c2h_success' ignored")));
}

/// `uring_zcopy_threshold` (io_uring zero-copy sends): off unless given,
/// read in bytes, refused (named) beyond 1 GiB or when not a count.
#[test]
fn uring_zcopy_threshold_is_read_and_bad_values_refused() {
    let c = TargetConfig::from_json(GOOD).unwrap();
    assert_eq!(c.transport.uring_zcopy_threshold, 0, "off by default");
    let at = "\"max_queue_depth\": 64";
    let c = TargetConfig::from_json(&GOOD.replace(
        at,
        "\"max_queue_depth\": 64, \"sock_impl\": \"uring\", \"uring_zcopy_threshold\": 65536",
    ))
    .unwrap();
    assert_eq!(c.transport.uring_zcopy_threshold, 65536);
    for bad in ["-1", "1073741825", "\"64k\""] {
        let e = refused(
            at,
            &format!("\"max_queue_depth\": 64, \"uring_zcopy_threshold\": {bad}"),
        );
        assert!(
            e.contains("uring_zcopy_threshold") && e.contains("nvmf_create_transport"),
            "{bad}: {e}"
        );
    }
    // Set directly, the bound is checked too.
    let mut c = TargetConfig::from_json(GOOD).unwrap();
    c.transport.uring_zcopy_threshold = u32::MAX;
    let e = c.validate().unwrap_err().to_string();
    assert!(e.contains("uring_zcopy_threshold"), "{e}");
}

/// `uring_registered_buffers` (the io_uring threads' registered data
/// buffers): off unless given, read in bytes with
/// `uring_zcopy_threshold`, refused naming the key below 1 MiB, above
/// 1 GiB, when not a count, and without `uring_zcopy_threshold` (only
/// zero-copy sends use them).
#[test]
fn uring_registered_buffers_is_read_and_bad_values_refused() {
    let c = TargetConfig::from_json(GOOD).unwrap();
    assert_eq!(c.transport.uring_registered_buffers, 0, "off by default");
    let at = "\"max_queue_depth\": 64";
    let with = |v: &str| {
        format!(
            "\"max_queue_depth\": 64, \"sock_impl\": \"uring\", \"uring_zcopy_threshold\": 65536, \"uring_registered_buffers\": {v}"
        )
    };
    for ok in [1 << 20, 64 << 20, 1 << 30] {
        let c = TargetConfig::from_json(&GOOD.replace(at, &with(&ok.to_string()))).unwrap();
        assert_eq!(c.transport.uring_registered_buffers, ok);
    }
    for (bad, why) in [
        ("1048575", "1 MiB..=1 GiB"),
        ("4096", "1 MiB..=1 GiB"),
        ("1073741825", "0..=1073741824"),
        ("-1", "nvmf_create_transport"),
        ("\"64MiB\"", "nvmf_create_transport"),
    ] {
        let e = refused(at, &with(bad));
        assert!(
            e.contains("uring_registered_buffers") && e.contains(why),
            "{bad}: {e}"
        );
    }
    // Without uring_zcopy_threshold: refused, saying it needs it.
    let e = refused(
        at,
        "\"max_queue_depth\": 64, \"sock_impl\": \"uring\", \"uring_registered_buffers\": 1048576",
    );
    assert!(
        e.contains("uring_registered_buffers") && e.contains("set uring_zcopy_threshold too"),
        "{e}"
    );
    // Set directly, the bounds are checked too.
    let mut c = TargetConfig::from_json(GOOD).unwrap();
    c.transport.uring_zcopy_threshold = 65536;
    c.transport.uring_registered_buffers = (1 << 30) + 1;
    let e = c.validate().unwrap_err().to_string();
    assert!(
        e.contains("uring_registered_buffers") && e.contains("1 MiB..=1 GiB"),
        "{e}"
    );
    c.transport.uring_registered_buffers = 1 << 20;
    c.validate().unwrap();
    c.transport.uring_zcopy_threshold = 0;
    let e = c.validate().unwrap_err().to_string();
    assert!(
        e.contains("uring_registered_buffers") && e.contains("uring_zcopy_threshold"),
        "{e}"
    );
}

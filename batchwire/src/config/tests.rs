use super::*;

#[test]
fn peer_specs_parse() {
    let p: PeerSpec = "b=127.0.0.1:7002".parse().unwrap();
    assert_eq!(p.name, "b");
    assert_eq!(p.addr.port(), 7002);
    assert!("b127.0.0.1:7002".parse::<PeerSpec>().is_err());
    assert!("b=nowhere".parse::<PeerSpec>().is_err());
}

#[test]
fn validation_names_the_bad_field() {
    let c = NodeConfig::new("a", "127.0.0.1:0".parse().unwrap(), "s");
    c.validate().unwrap();
    let e = c.clone().mailbox_bytes(0).validate().unwrap_err();
    assert!(e.to_string().contains("mailbox_bytes"), "{e}");
    let e = c
        .heartbeat_interval(Duration::from_secs(5))
        .validate()
        .unwrap_err();
    assert!(e.to_string().contains("peer_timeout"), "{e}");
    let c = NodeConfig::new("a", "127.0.0.1:0".parse().unwrap(), "");
    assert!(c.validate().is_err());
    let c = NodeConfig::new("a", "127.0.0.1:0".parse().unwrap(), "s");
    c.clone().max_payload(1 << 30).validate().unwrap();
    let e = c.clone().max_payload(usize::MAX).validate().unwrap_err();
    assert!(e.to_string().contains("max_payload"), "{e}");
    let e = c.fragment_bytes(2 << 20).validate().unwrap_err();
    assert!(e.to_string().contains("fragment_bytes"), "{e}");
}

/// The operator typos of the security v2 issue: each was accepted and then spun a CPU
/// (354,554 ACK frames in 3 s) or aborted the node on an allocation.
#[test]
fn out_of_range_settings_are_refused_with_key_value_and_range() {
    let c = || {
        NodeConfig::new("a", "127.0.0.1:0".parse().unwrap(), "s")
            .peer_timeout(Duration::from_secs(3))
    };
    let cases: [(NodeConfig, &str); 9] = [
        (
            c().heartbeat_interval(Duration::ZERO),
            "heartbeat_interval_ms = 0 is out of range: allowed 1 ..= 60000",
        ),
        (
            c().read_bytes(1 << 40),
            "read_bytes = 1099511627776 is out of range: allowed 1 ..= 16777216",
        ),
        (
            c().events_capacity(1_000_000_000_000),
            "events_capacity = 1000000000000 is out of range: allowed 1 ..= 1048576",
        ),
        (c().max_peers(0), "max_peers = 0 is out of range"),
        (
            c().write_check(Duration::from_secs(3600)),
            "write_check_ms = 3600000 is out of range",
        ),
        (
            c().reconnect(Duration::from_secs(2), Duration::from_secs(1)),
            "reconnect_max_ms = 1000 must be at least reconnect_min_ms = 2000",
        ),
        (
            c().reassembly_bytes(1024),
            "reassembly_bytes = 1024 is out of range: allowed max_payload",
        ),
        // Named as the file names them, in its unit.
        (
            c().bundler_max_delay(Duration::from_micros(10_000_500)),
            "bundler_max_delay_us = 10000500 is out of range: allowed 0 ..= 10000000",
        ),
        (
            c().ack_every(0, 1 << 10, Duration::from_millis(1)),
            "ack_every_messages = 0 is out of range",
        ),
    ];
    for (cfg, want) in cases {
        let e = cfg.validate().unwrap_err().to_string();
        assert!(e.contains(want), "{e:?} does not say {want:?}");
    }
    // The defaults, and the edges of each range, are taken.
    c().validate().unwrap();
    c().heartbeat_interval(Duration::from_millis(1))
        .read_bytes(16 << 20)
        .events_capacity(1 << 20)
        .validate()
        .unwrap();
}

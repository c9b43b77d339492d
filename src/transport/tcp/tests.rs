use super::*;

#[test]
fn a_partial_settings_document_keeps_the_defaults() {
    let s: TcpSettings = serde_json::from_str(
        r#"{"rank": 1, "world_size": 3, "master_addr": "node01:29400", "secret": "s3cret",
            "bind": "0.0.0.0:29400", "heartbeat_interval": "250ms", "connect_timeout": 120}"#,
    )
    .unwrap();
    let mut expected = TcpSettings::new(1, 3, "node01:29400");
    expected.secret = Some(b"s3cret".to_vec());
    expected.bind = Some("0.0.0.0:29400".parse().unwrap());
    expected.heartbeat_interval = Duration::from_millis(250);
    expected.connect_timeout = Duration::from_secs(120);
    assert_eq!(s, expected);
    let least = r#"{"rank": 0, "world_size": 2, "master_addr": "127.0.0.1:29500""#;
    let only: TcpSettings = serde_json::from_str(&format!("{least}}}")).unwrap();
    assert_eq!(only, TcpSettings::new(0, 2, "127.0.0.1:29500"));
    only.validate().unwrap();
    // Which process this is, is never guessed.
    let err =
        serde_json::from_str::<TcpSettings>(r#"{"master_addr": "10.0.0.1:29500"}"#).unwrap_err();
    assert!(err.to_string().contains("missing field `rank`"), "{err}");
    let err = serde_json::from_str::<TcpSettings>(&format!(r#"{least}, "heartbeat": "1s"}}"#))
        .unwrap_err();
    assert!(
        err.to_string().contains("unknown field `heartbeat`"),
        "{err}"
    );
    let none: TcpSettings = serde_json::from_str(&format!(r#"{least}, "secret": ""}}"#)).unwrap();
    assert_eq!(none.secret, None);
}

#[test]
fn rank_0_binds_an_address_alone_on_the_master_address_port() {
    let at = |bind: &str| bind_addr(bind, "node01:29400");
    assert_eq!(at("0.0.0.0").unwrap(), "0.0.0.0:29400".parse().unwrap());
    assert_eq!(at("[::]").unwrap(), "[::]:29400".parse().unwrap());
    assert_eq!(
        at("127.0.0.1:5000").unwrap(),
        "127.0.0.1:5000".parse().unwrap()
    );
    let err = at("http://0.0.0.0:1").unwrap_err().to_string();
    assert!(
        err.contains("SUPERSTEP_BIND") && err.contains("drop the scheme"),
        "{err}"
    );
}

#[test]
fn settings_name_an_address_that_is_not_host_and_port() {
    let err = TcpSettings::new(1, 2, "node01:0").validate().unwrap_err();
    assert!(
        err.to_string().contains("port 0, outside 1..=65535"),
        "{err}"
    );
    // Rank 0 may listen on a port the system chooses.
    TcpSettings::new(0, 2, "127.0.0.1:0").validate().unwrap();
}

#[test]
fn a_connection_joins_two_hosts_when_its_ends_differ_and_are_not_both_loopback() {
    let ip = |s: &str| s.parse::<std::net::IpAddr>().unwrap();
    assert!(another_host(ip("10.0.0.1"), ip("10.0.0.2")));
    assert!(another_host(ip("fd00::1"), ip("fd00::2")));
    assert!(
        !another_host(ip("10.0.0.1"), ip("10.0.0.1")),
        "one interface"
    );
    assert!(!another_host(ip("127.0.0.1"), ip("127.0.0.2")), "loopback");
    assert!(!another_host(ip("::1"), ip("127.0.0.1")), "loopback");
    assert!(
        !another_host(ip("::ffff:10.0.0.1"), ip("10.0.0.1")),
        "IPv4 mapped into IPv6"
    );
}

#[test]
fn no_new_process_comes_without_restarts_left_or_under_srun_and_mpirun_without_reconnects() {
    use super::no_new_process as none;
    let left_none = none(Some(0), Some("superstep"), true).unwrap();
    assert!(left_none.contains("no restarts left"), "{left_none}");
    assert!(none(Some(2), Some("superstep"), false).is_none());
    let srun = none(None, Some("Slurm"), false).unwrap();
    assert!(srun.contains("srun starts no task"), "{srun}");
    assert!(none(None, Some("Open MPI"), false).is_some());
    // A lost process that lives may reconnect; torchrun and Kubernetes start new ones.
    assert!(none(None, Some("Slurm"), true).is_none());
    assert!(none(None, Some("torchrun"), false).is_none());
    assert!(none(None, Some("Kubernetes"), false).is_none());
    assert!(none(None, None, false).is_none());
}

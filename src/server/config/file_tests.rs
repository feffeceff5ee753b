use super::*;

fn args(text: &str) -> Vec<String> {
    parse(text).unwrap().args
}

fn refused(text: &str) -> String {
    parse(text).unwrap_err().0
}

#[test]
fn keys_become_the_flags_of_the_same_meaning() {
    let a = args(
        "name: m1\n\
         data-dir: /var/lib/etcd\n\
         heartbeat-interval: 100\n\
         quota-backend-bytes: -1\n\
         initial-cluster: m1=http://10.0.0.1:2380\n\
         force-new-cluster: false\n\
         log-outputs: [stderr]\n\
         cipher-suites: [TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256, TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384]\n\
         experimental-watch-progress-notify-interval: 5000000000\n\
         experimental-snapshot-catch-up-entries: 7000\n",
    );
    assert_eq!(
        a,
        [
            "--name=m1",
            "--data-dir=/var/lib/etcd",
            "--heartbeat-interval=100",
            "--quota-backend-bytes=-1",
            "--initial-cluster=m1=http://10.0.0.1:2380",
            "--force-new-cluster=false",
            "--log-outputs=stderr",
            "--cipher-suites=TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256,TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384",
            "--experimental-watch-progress-notify-interval=5s",
            "--experimental-snapshot-catchup-entries=7000",
        ]
    );
}

#[test]
fn transport_security_sections_set_the_client_and_peer_flags() {
    let a = args(
        "client-transport-security:\n  cert-file: /c.crt\n  key-file: /c.key\n  \
         client-cert-auth: true\n  trusted-ca-file: /ca.crt\n  auto-tls: false\n\
         peer-transport-security:\n  cert-file: /p.crt\n  client-cert-auth: yes\n  \
         allowed-cn: [etcd-peer]\n",
    );
    assert_eq!(
        a,
        [
            "--cert-file=/c.crt",
            "--key-file=/c.key",
            "--client-cert-auth=true",
            "--trusted-ca-file=/ca.crt",
            "--auto-tls=false",
            "--peer-cert-file=/p.crt",
            "--peer-client-cert-auth=true",
            "--peer-cert-allowed-cn=etcd-peer",
        ]
    );
    assert!(refused("peer-transport-security:\n  allowed-cn: [a, b]\n").contains("one value"));
}

#[test]
fn wrong_types_get_gos_json_message() {
    let cases = [
        (
            "heartbeat-interval: \"100\"\n",
            "cannot unmarshal string into Go struct field configYAML.heartbeat-interval of type uint",
        ),
        (
            "heartbeat-interval: -1\n",
            "cannot unmarshal number -1 into Go struct field configYAML.heartbeat-interval of type uint",
        ),
        (
            "auto-compaction-retention: 1\n",
            "cannot unmarshal number into Go struct field configYAML.auto-compaction-retention of type string",
        ),
        (
            "experimental-watch-progress-notify-interval: 5s\n",
            "cannot unmarshal string into Go struct field \
             configYAML.experimental-watch-progress-notify-interval of type time.Duration",
        ),
        (
            "client-transport-security:\n  client-cert-auth: \"x\"\n",
            "cannot unmarshal string into Go struct field \
             securityConfig.client-transport-security.client-cert-auth of type bool",
        ),
        (
            "log-outputs: stderr\n",
            "cannot unmarshal string into Go struct field configYAML.log-outputs of type []string",
        ),
        (
            "max-concurrent-streams: 5000000000\n",
            "cannot unmarshal number 5000000000 into Go struct field \
             configYAML.max-concurrent-streams of type uint32",
        ),
    ];
    for (text, want) in cases {
        let got = refused(text);
        assert_eq!(
            got,
            format!("error unmarshaling JSON: while decoding JSON: json: {want}"),
            "{text}"
        );
    }
    assert!(refused("- a\n- b\n").contains("cannot unmarshal array into Go value"));
    assert!(refused("name: [a\n").starts_with("error converting YAML to JSON: yaml:"));
}

#[test]
fn empty_values_keep_the_defaults_and_etcds_sample_file_is_taken() {
    // etcd's etcd.conf.yml.sample, as shipped: empty keys, discovery and proxy left unset.
    let sample = "name: 'default'\ndata-dir:\nwal-dir:\nsnapshot-count: 10000\n\
        heartbeat-interval: 100\nelection-timeout: 1000\nquota-backend-bytes: 0\n\
        listen-peer-urls: http://localhost:2380\nlisten-client-urls: http://localhost:2379\n\
        max-wals: 5\ncors:\ninitial-advertise-peer-urls: http://localhost:2380\n\
        advertise-client-urls: http://localhost:2379\ndiscovery:\n\
        discovery-fallback: 'proxy'\ndiscovery-proxy:\ndiscovery-srv:\ninitial-cluster:\n\
        initial-cluster-token: 'etcd-cluster'\ninitial-cluster-state: 'new'\n\
        strict-reconfig-check: false\nenable-pprof: true\nproxy: 'off'\n\
        proxy-failure-wait: 5000\nclient-transport-security:\n  cert-file:\n  key-file:\n  \
        client-cert-auth: false\n  trusted-ca-file:\n  auto-tls: false\n\
        peer-transport-security:\n  cert-file:\n  key-file:\n  client-cert-auth: false\n  \
        trusted-ca-file:\n  auto-tls: false\n  allowed-cn:\n  allowed-hostname:\n\
        self-signed-cert-validity: 1\nlog-level: debug\nlogger: zap\nlog-outputs: [stderr]\n\
        force-new-cluster: false\nauto-compaction-mode: periodic\n\
        auto-compaction-retention: \"1\"\n";
    let f = parse(sample).unwrap();
    assert!(f.unknown.is_empty(), "{:?}", f.unknown);
    assert!(!f.args.iter().any(|a| a.starts_with("--data-dir")));
    assert!(f.args.contains(&"--enable-pprof=true".to_string()));
    let m = command()
        .mut_args(|a| a.env(None))
        .try_get_matches_from(std::iter::once("kvd".to_string()).chain(f.args))
        .unwrap();
    use clap::FromArgMatches;
    let cfg = crate::server::config::Flags::from_arg_matches(&m)
        .unwrap()
        .validate()
        .unwrap();
    assert_eq!(cfg.snapshot_count, 10000);
    assert_eq!(cfg.log.level, "debug");
    assert!(cfg.auto_compaction.is_some());
}

#[test]
fn what_kvd_cannot_do_is_refused_and_unknown_keys_are_reported() {
    assert!(refused("discovery: https://discovery.example/abc\n").contains("--discovery"));
    assert!(refused("discovery-srv: example.com\n").contains("--discovery-srv"));
    assert!(refused("proxy: on\n").contains("--proxy"));
    assert!(
        refused("client-transport-security:\n  client-cert-file: /c.crt\n")
            .contains("client-transport-security.client-cert-file")
    );
    let f = parse(
        "name: a\nnot-a-key: 1\nworker-threads: 2\nclient-crl-file: /crl.pem\n\
         peer-transport-security:\n  crl-file: /p.pem\n",
    )
    .unwrap();
    assert_eq!(f.unknown, ["not-a-key", "peer-transport-security.crl-file"]);
    assert_eq!(
        f.args,
        [
            "--name=a",
            "--worker-threads=2",
            "--client-crl-file=/crl.pem"
        ]
    );
}

#[test]
fn log_output_is_read_only_without_log_outputs() {
    assert_eq!(args("log-output: [stdout]\n"), ["--log-outputs=stdout"]);
    assert_eq!(
        args("log-output: [stdout]\nlog-outputs: [stderr]\n"),
        ["--log-outputs=stderr"]
    );
}

#[test]
fn durations_are_nanoseconds_written_as_go_durations() {
    assert_eq!(go_duration(0), "0s");
    assert_eq!(go_duration(100_000_000), "100ms");
    assert_eq!(go_duration(1_500_000), "1500us");
    assert_eq!(go_duration(7), "7ns");
    assert_eq!(go_duration(-3_000_000_000), "-3s");
}

#[test]
fn every_key_with_a_flag_names_a_flag_kvd_has_or_refuses_on_purpose() {
    // A key whose flag kvd lacks must be one etcd acts on (refused when set) or inert; a
    // typo in the table would silently refuse a key kvd supports.
    let flags = kvd_flags();
    let refused_on_purpose = [
        "listen-client-http-urls",
        "discovery",
        "discovery-srv",
        "discovery-srv-name",
        "discovery-proxy",
        "discovery-config",
        "proxy",
        "client-cert-file",
        "client-key-file",
        "client-cert-allowed-cn",
        "client-cert-allowed-hostname",
        "client-skip-client-san-verification",
        "peer-client-cert-file",
        "peer-client-key-file",
        "peer-skip-client-san-verification",
    ];
    let mut all: Vec<&Key> = KEYS.iter().collect();
    all.extend(CLIENT_TLS.iter().chain(PEER_TLS).chain(SOCKET));
    for key in all {
        if matches!(key.ty, Ty::Inert | Ty::Section(..)) {
            continue;
        }
        let flag = key.flag.unwrap_or(key.name);
        assert!(
            flags.iter().any(|f| f == flag) || refused_on_purpose.contains(&flag),
            "{} sets --{flag}, which kvd does not have",
            key.name
        );
    }
}

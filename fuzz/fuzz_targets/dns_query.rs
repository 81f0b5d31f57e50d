//! The DNS query path: any bytes → parse → answer → encode. Must never
//! panic, and a UDP answer must never be larger than the query allows.
#![no_main]

use std::sync::OnceLock;

use libfuzzer_sys::fuzz_target;
use portal_dns::records::{EndpointInfo, Records, ServiceInfo, SliceInfo};
use portal_dns::{answer, Outcome, Settings, Transport};

fn records() -> &'static Records {
    static RECORDS: OnceLock<Records> = OnceLock::new();
    RECORDS.get_or_init(|| {
        let mut records = Records::new("cluster.local");
        let web = ("default".to_owned(), "web".to_owned());
        records.set_service(
            &web,
            Some(ServiceInfo {
                cluster_ips: vec!["10.96.0.20".parse().unwrap()],
                external_name: None,
                ports: vec![portal_dns::records::Port {
                    name: "http".into(),
                    protocol: "tcp".into(),
                    port: 80,
                }],
            }),
        );
        let db = ("default".to_owned(), "db".to_owned());
        records.set_service(&db, Some(ServiceInfo::default()));
        let endpoints = (1..=60)
            .map(|i| EndpointInfo {
                addresses: vec![format!("10.244.1.{i}").parse().unwrap()],
                hostname: (i % 2 == 0).then(|| format!("db-{i}")),
                ready: true,
            })
            .collect();
        records.set_slice(
            "default",
            "db-1",
            Some(SliceInfo {
                service: "db".into(),
                endpoints,
                ports: vec![],
            }),
        );
        records
    })
}

fuzz_target!(|data: &[u8]| {
    let settings = Settings { ttl: 5, upstream: data.first() == Some(&0) };
    if let Outcome::Reply(bytes, _) = answer(records(), data, Transport::Udp, settings) {
        assert!(bytes.len() <= 4096);
    }
    let _ = answer(records(), data, Transport::Tcp, settings);
});

//! Answers to real queries, encoded and decoded with hickory.

use super::*;
use crate::records::{EndpointInfo, ServiceInfo, SliceInfo};
use hickory_proto::op::Query;
use hickory_proto::op::{Edns, Message};
use hickory_proto::rr::{Name, RecordType};

const SETTINGS: Settings = Settings {
    ttl: 5,
    upstream: false,
};

fn query(name: &str, record_type: RecordType, edns: Option<u16>) -> Vec<u8> {
    let mut message = Message::new();
    message
        .set_id(4242)
        .set_recursion_desired(true)
        .add_query(Query::query(Name::from_ascii(name).unwrap(), record_type));
    if let Some(payload) = edns {
        let mut edns = Edns::new();
        edns.set_max_payload(payload);
        message.set_edns(edns);
    }
    message.to_vec().unwrap()
}

fn reply(outcome: Outcome) -> Message {
    match outcome {
        Outcome::Reply(bytes, _) => Message::from_vec(&bytes).unwrap(),
        other => panic!("{other:?}"),
    }
}

fn records() -> Records {
    let mut records = Records::new("cluster.local");
    let key = ("default".to_owned(), "web".to_owned());
    records.set_service(
        &key,
        Some(ServiceInfo {
            cluster_ips: vec!["10.96.0.20".parse().unwrap()],
            ..ServiceInfo::default()
        }),
    );
    let big = ("default".to_owned(), "big".to_owned());
    records.set_service(&big, Some(ServiceInfo::default()));
    let endpoints = (1..=100)
        .map(|i| EndpointInfo {
            addresses: vec![format!("10.244.2.{i}").parse().unwrap()],
            hostname: None,
            ready: true,
        })
        .collect();
    let slice = SliceInfo {
        service: "big".into(),
        endpoints,
        ports: vec![],
    };
    records.set_slice("default", "big-1", Some(slice));
    records
}

#[test]
fn answers_keep_the_id_and_the_question_as_asked() {
    let records = records();
    let asked = "Web.DEFAULT.svc.cluster.local.";
    let message = reply(answer(
        &records,
        &query(asked, RecordType::A, None),
        Transport::Udp,
        SETTINGS,
    ));
    assert_eq!(message.id(), 4242);
    assert!(message.authoritative());
    assert!(!message.recursion_available());
    assert_eq!(message.queries()[0].name().to_string(), asked);
    assert_eq!(message.answers().len(), 1);
    assert_eq!(message.answers()[0].name().to_string(), asked);
    assert_eq!(message.answers()[0].ttl(), 5);
}

#[test]
fn udp_answers_never_exceed_what_the_query_allows() {
    let records = records();
    let name = "big.default.svc.cluster.local.";
    for (edns, limit) in [
        (None, 512),
        (Some(1232), 1232),
        (Some(100), 512),
        (Some(4096), 1232),
    ] {
        let outcome = answer(
            &records,
            &query(name, RecordType::A, edns),
            Transport::Udp,
            SETTINGS,
        );
        let Outcome::Reply(bytes, _) = outcome else {
            panic!("no reply");
        };
        assert!(bytes.len() <= limit, "{} > {limit}", bytes.len());
        let message = Message::from_vec(&bytes).unwrap();
        assert!(message.truncated());
        assert!(message.answers().is_empty());
    }
    let tcp = reply(answer(
        &records,
        &query(name, RecordType::A, None),
        Transport::Tcp,
        SETTINGS,
    ));
    assert!(!tcp.truncated());
    assert_eq!(tcp.answers().len(), 100);
}

#[test]
fn strangers_are_refused_or_forwarded() {
    let records = records();
    let q = query("example.com.", RecordType::A, None);
    let message = reply(answer(&records, &q, Transport::Udp, SETTINGS));
    assert_eq!(message.response_code(), ResponseCode::Refused);
    assert!(message.answers().is_empty());
    let forwarding = Settings {
        upstream: true,
        ..SETTINGS
    };
    assert!(matches!(
        answer(&records, &q, Transport::Udp, forwarding),
        Outcome::Forward(_)
    ));
    // A reverse name Portal does not know is not its business either,
    // nor are the parents of those it knows.
    for name in [
        "9.9.9.9.in-addr.arpa.",
        "96.10.in-addr.arpa.",
        "in-addr.arpa.",
        "local.",
    ] {
        let q = query(name, RecordType::PTR, None);
        let message = reply(answer(&records, &q, Transport::Udp, SETTINGS));
        assert_eq!(message.response_code(), ResponseCode::Refused, "{name}");
    }
}

#[test]
fn garbage_gets_formerr_or_silence() {
    let records = records();
    let mut bad = query("web.default.svc.cluster.local.", RecordType::A, None);
    bad.truncate(14);
    let Outcome::Reply(bytes, summary) = answer(&records, &bad, Transport::Udp, SETTINGS) else {
        panic!("no FORMERR");
    };
    assert_eq!(summary.rcode, "FORMERR");
    assert_eq!(&bytes[..2], &bad[..2]);
    assert_eq!(
        answer(&records, &[1, 2, 3], Transport::Udp, SETTINGS),
        Outcome::Drop
    );
}

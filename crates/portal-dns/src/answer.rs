//! One query in, one answer out: parse, look up, encode. Pure, so it is
//! unit-tested and fuzzed without sockets.
//!
//! Authoritative for the cluster domain and for the reverse names of the
//! addresses it knows; everything else goes upstream when there is one and
//! is REFUSED otherwise (never an open resolver). A UDP answer never exceeds
//! what the query allows (512 bytes, or its EDNS0 payload size): larger ones
//! are sent truncated, so the client retries over TCP.

use std::net::IpAddr;

use hickory_proto::op::{Edns, Message, MessageType, OpCode, ResponseCode};
use hickory_proto::rr::rdata::{A, AAAA, CNAME, NS, PTR, SOA, SRV, TXT};
use hickory_proto::rr::{DNSClass, Name, RData, Record, RecordType};

use crate::records::{Data, Lookup, Records};

/// The schema version of the Kubernetes DNS specification followed.
pub const SCHEMA_VERSION: &str = "1.1.0";
/// The EDNS0 payload size Portal offers (the DNS flag day 2020 value).
pub const EDNS_PAYLOAD: u16 = 1232;
/// A plain DNS UDP message.
const PLAIN_UDP: usize = 512;

/// How an answer travels back.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Transport {
    Udp,
    Tcp,
}

/// What to do with a query.
#[derive(Debug, PartialEq, Eq)]
pub enum Outcome {
    Reply(Vec<u8>, Summary),
    /// Not ours: relay to the upstream resolver.
    Forward(Summary),
    /// Ours, but a CNAME to a name only the upstream resolver knows.
    Chase(Chase),
    /// Not even a DNS query: say nothing.
    Drop,
}

/// A CNAME to follow through the upstream resolver: the answer so far, and
/// what to ask for.
#[derive(Debug, PartialEq, Eq)]
pub struct Chase {
    /// The encoded answer holding the CNAME.
    pub partial: Vec<u8>,
    pub target: Name,
    pub query_type: RecordType,
    pub transport: Transport,
    pub client_payload: usize,
    pub summary: Summary,
}

impl Chase {
    /// The query for the CNAME's target.
    pub fn query(&self) -> Option<Vec<u8>> {
        let mut message = Message::new();
        message
            .set_id(u16::from_be_bytes([self.partial[0], self.partial[1]]))
            .set_recursion_desired(true)
            .add_query(hickory_proto::op::Query::query(
                self.target.clone(),
                self.query_type,
            ));
        let mut edns = Edns::new();
        edns.set_max_payload(EDNS_PAYLOAD);
        message.set_edns(edns);
        message.to_vec().ok()
    }

    /// The answer so far plus the upstream's records for the target.
    pub fn complete(&self, upstream_reply: &[u8]) -> Option<Vec<u8>> {
        let mut response = Message::from_vec(&self.partial).ok()?;
        let reply = Message::from_vec(upstream_reply).ok()?;
        for record in reply.answers() {
            response.add_answer(record.clone());
        }
        let rcode = reply.response_code();
        match finish(
            response,
            rcode,
            self.summary.query_type,
            self.transport,
            self.client_payload,
        ) {
            Outcome::Reply(bytes, _) => Some(bytes),
            _ => None,
        }
    }
}

/// What the metrics record of a query.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Summary {
    pub query_type: &'static str,
    pub rcode: &'static str,
}

/// Answering settings.
#[derive(Clone, Copy, Debug)]
pub struct Settings {
    pub ttl: u32,
    /// Whether non-cluster names may be forwarded.
    pub upstream: bool,
}

fn type_label(query_type: RecordType) -> &'static str {
    match query_type {
        RecordType::A => "A",
        RecordType::AAAA => "AAAA",
        RecordType::SRV => "SRV",
        RecordType::PTR => "PTR",
        RecordType::CNAME => "CNAME",
        RecordType::TXT => "TXT",
        RecordType::SOA => "SOA",
        RecordType::NS => "NS",
        RecordType::ANY => "ANY",
        _ => "other",
    }
}

fn rcode_label(rcode: ResponseCode) -> &'static str {
    match rcode {
        ResponseCode::NoError => "NOERROR",
        ResponseCode::NXDomain => "NXDOMAIN",
        ResponseCode::Refused => "REFUSED",
        ResponseCode::FormErr => "FORMERR",
        ResponseCode::ServFail => "SERVFAIL",
        ResponseCode::NotImp => "NOTIMP",
        ResponseCode::BADVERS => "BADVERS",
        _ => "other",
    }
}

/// A FORMERR header for bytes that start like a query but do not parse.
fn format_error(query: &[u8]) -> Outcome {
    if query.len() < 12 || query[2] & 0x80 != 0 {
        return Outcome::Drop;
    }
    let mut reply = vec![0; 12];
    reply[..2].copy_from_slice(&query[..2]);
    // QR, the query's opcode and RD; RCODE 1.
    reply[2] = 0x80 | (query[2] & 0x79);
    reply[3] = 0x01;
    let summary = Summary {
        query_type: "other",
        rcode: "FORMERR",
    };
    Outcome::Reply(reply, summary)
}

/// An address record's data, when `wanted` asks for its type.
fn address(data: &Data, wanted: impl Fn(RecordType) -> bool) -> Option<RData> {
    match data {
        Data::Address(IpAddr::V4(v4)) if wanted(RecordType::A) => Some(RData::A(A(*v4))),
        Data::Address(IpAddr::V6(v6)) if wanted(RecordType::AAAA) => Some(RData::AAAA(AAAA(*v6))),
        _ => None,
    }
}

/// Names Portal builds are lower-case ASCII already: no IDNA pass needed.
fn name(text: &str) -> Option<Name> {
    Name::from_ascii(text).ok()
}

/// Answers one query.
pub fn answer(
    records: &Records,
    query: &[u8],
    transport: Transport,
    settings: Settings,
) -> Outcome {
    let Ok(request) = Message::from_vec(query) else {
        return format_error(query);
    };
    if request.message_type() != MessageType::Query {
        return Outcome::Drop;
    }
    let mut response = Message::new();
    response
        .set_id(request.id())
        .set_message_type(MessageType::Response)
        .set_op_code(request.op_code())
        .set_recursion_desired(request.recursion_desired())
        .set_recursion_available(settings.upstream);
    let client_payload = match request.extensions() {
        Some(edns) => {
            let mut ours = Edns::new();
            ours.set_max_payload(EDNS_PAYLOAD);
            response.set_edns(ours);
            // Never more than we advertise: larger datagrams fragment, and
            // fragments are often dropped; truncation makes the client
            // retry over TCP instead.
            usize::from(edns.max_payload()).clamp(PLAIN_UDP, usize::from(EDNS_PAYLOAD))
        }
        None => PLAIN_UDP,
    };
    let Some(question) = request.queries().first().cloned() else {
        return finish(
            response,
            ResponseCode::FormErr,
            "other",
            transport,
            client_payload,
        );
    };
    let query_type = question.query_type();
    let label = type_label(query_type);
    response.add_query(question.clone());
    if request.queries().len() != 1 {
        return finish(
            response,
            ResponseCode::FormErr,
            label,
            transport,
            client_payload,
        );
    }
    if request.op_code() != OpCode::Query {
        return finish(
            response,
            ResponseCode::NotImp,
            label,
            transport,
            client_payload,
        );
    }
    if request
        .extensions()
        .as_ref()
        .is_some_and(|e| e.version() > 0)
    {
        return finish(
            response,
            ResponseCode::BADVERS,
            label,
            transport,
            client_payload,
        );
    }
    let asked = question.name();
    let lower = asked.to_lowercase().to_ascii();
    let lower = if lower.ends_with('.') {
        lower
    } else {
        lower + "."
    };
    let domain = records.domain();
    let in_zone = lower == domain
        || lower
            .strip_suffix(domain)
            .is_some_and(|head| head.ends_with('.'));
    // Reverse names are ours only where we hold records (not their
    // parents: `in-addr.arpa.` is not ours to answer).
    let known_reverse = !in_zone
        && (lower.ends_with(".in-addr.arpa.") || lower.ends_with(".ip6.arpa."))
        && matches!(records.lookup(&lower), Lookup::Found(_));
    let in_class = matches!(question.query_class(), DNSClass::IN | DNSClass::ANY);
    if !(in_zone || known_reverse) || !in_class {
        if settings.upstream && in_class {
            return Outcome::Forward(Summary {
                query_type: label,
                rcode: "forwarded",
            });
        }
        return finish(
            response,
            ResponseCode::Refused,
            label,
            transport,
            client_payload,
        );
    }
    response.set_authoritative(true);
    let ttl = settings.ttl;
    let apex = name(domain).unwrap_or_else(Name::root);
    let soa = || {
        let mname = name(&format!("ns.dns.{domain}")).unwrap_or_else(Name::root);
        let rname = name(&format!("hostmaster.{domain}")).unwrap_or_else(Name::root);
        let soa = SOA::new(mname, rname, records.serial(), 7200, 1800, 86400, ttl);
        Record::from_rdata(apex.clone(), ttl, RData::SOA(soa))
    };
    let wants = |t: RecordType| query_type == t || query_type == RecordType::ANY;

    if lower == format!("dns-version.{domain}") {
        if wants(RecordType::TXT) {
            let txt = TXT::new(vec![SCHEMA_VERSION.to_owned()]);
            response.add_answer(Record::from_rdata(asked.clone(), ttl, RData::TXT(txt)));
        } else {
            response.add_name_server(soa());
        }
        return finish(
            response,
            ResponseCode::NoError,
            label,
            transport,
            client_payload,
        );
    }
    if lower == domain && (wants(RecordType::SOA) || wants(RecordType::NS)) {
        if wants(RecordType::SOA) {
            response.add_answer(soa());
        }
        if wants(RecordType::NS) {
            let ns = name(&format!("ns.dns.{domain}")).unwrap_or_else(Name::root);
            response.add_answer(Record::from_rdata(apex.clone(), ttl, RData::NS(NS(ns))));
        }
        return finish(
            response,
            ResponseCode::NoError,
            label,
            transport,
            client_payload,
        );
    }
    let found = match records.lookup(&lower) {
        Lookup::Found(found) => found,
        Lookup::Empty => {
            response.add_name_server(soa());
            return finish(
                response,
                ResponseCode::NoError,
                label,
                transport,
                client_payload,
            );
        }
        Lookup::Missing => {
            response.add_name_server(soa());
            return finish(
                response,
                ResponseCode::NXDomain,
                label,
                transport,
                client_payload,
            );
        }
    };
    let mut additional_targets: Vec<&str> = Vec::new();
    for data in &found {
        let rdata = match data {
            Data::Address(_) => match address(data, wants) {
                Some(rdata) => rdata,
                None => continue,
            },
            // A CNAME answers every type (the resolver follows it).
            Data::Cname(target) => match name(target) {
                Some(target) => RData::CNAME(CNAME(target)),
                None => continue,
            },
            Data::Ptr(target) if wants(RecordType::PTR) => match name(target) {
                Some(target) => RData::PTR(PTR(target)),
                None => continue,
            },
            Data::Srv { port, target } if wants(RecordType::SRV) => match name(target) {
                Some(target_name) => {
                    additional_targets.push(target);
                    RData::SRV(SRV::new(0, 100, *port, target_name))
                }
                None => continue,
            },
            _ => continue,
        };
        response.add_answer(Record::from_rdata(asked.clone(), ttl, rdata));
    }
    // An ExternalName's CNAME is followed, as stub resolvers will not do
    // it themselves: from the index when the target is in the cluster
    // domain, else through the upstream resolver when there is one.
    let cname = found.iter().find_map(|d| match d {
        Data::Cname(target) => Some(target.as_str()),
        _ => None,
    });
    if let Some(target) = cname.filter(|_| query_type != RecordType::CNAME) {
        let in_cluster = target
            .strip_suffix(domain)
            .is_some_and(|h| h.ends_with('.'));
        if in_cluster {
            if let (Lookup::Found(data), Some(target_name)) = (records.lookup(target), name(target))
            {
                for rdata in data.into_iter().filter_map(|d| address(d, wants)) {
                    response.add_answer(Record::from_rdata(target_name.clone(), ttl, rdata));
                }
            }
        } else if settings.upstream {
            if let (Ok(partial), Some(target_name)) = (response.to_vec(), name(target)) {
                return Outcome::Chase(Chase {
                    partial,
                    target: target_name,
                    query_type,
                    transport,
                    client_payload,
                    summary: Summary {
                        query_type: label,
                        rcode: "NOERROR",
                    },
                });
            }
        }
    }
    if response.answers().is_empty() {
        // The name exists, not with this type: NODATA.
        response.add_name_server(soa());
    }
    additional_targets.sort_unstable();
    additional_targets.dedup();
    for target in additional_targets {
        let (Lookup::Found(data), Some(target_name)) = (records.lookup(target), name(target))
        else {
            continue;
        };
        for rdata in data.into_iter().filter_map(|d| address(d, |_| true)) {
            response.add_additional(Record::from_rdata(target_name.clone(), ttl, rdata));
        }
    }
    finish(
        response,
        ResponseCode::NoError,
        label,
        transport,
        client_payload,
    )
}

/// Encodes the response, truncated when UDP cannot carry it.
fn finish(
    mut response: Message,
    rcode: ResponseCode,
    query_type: &'static str,
    transport: Transport,
    client_payload: usize,
) -> Outcome {
    response.set_response_code(rcode);
    let summary = Summary {
        query_type,
        rcode: rcode_label(rcode),
    };
    let Ok(bytes) = response.to_vec() else {
        return Outcome::Drop;
    };
    if transport == Transport::Tcp || bytes.len() <= client_payload {
        return Outcome::Reply(bytes, summary);
    }
    // Additional records are optional (RFC 2181 §9): drop them before
    // truncating the answer itself.
    if !response.additionals().is_empty() {
        let _ = response.take_additionals();
        if let Ok(bytes) = response.to_vec() {
            if bytes.len() <= client_payload {
                return Outcome::Reply(bytes, summary);
            }
        }
    }
    // Too large for UDP: the question alone, TC set; the client asks again
    // over TCP.
    let mut truncated = Message::new();
    truncated
        .set_id(response.id())
        .set_message_type(MessageType::Response)
        .set_op_code(response.op_code())
        .set_authoritative(response.authoritative())
        .set_recursion_desired(response.recursion_desired())
        .set_recursion_available(response.recursion_available())
        .set_truncated(true)
        .set_response_code(rcode)
        .add_queries(response.queries().to_vec());
    if let Some(edns) = response.extensions().clone() {
        truncated.set_edns(edns);
    }
    match truncated.to_vec() {
        Ok(bytes) => Outcome::Reply(bytes, summary),
        Err(_) => Outcome::Drop,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::records::{EndpointInfo, ServiceInfo, SliceInfo};
    use hickory_proto::op::Query;

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
        let Outcome::Reply(bytes, summary) = answer(&records, &bad, Transport::Udp, SETTINGS)
        else {
            panic!("no FORMERR");
        };
        assert_eq!(summary.rcode, "FORMERR");
        assert_eq!(&bytes[..2], &bad[..2]);
        assert_eq!(
            answer(&records, &[1, 2, 3], Transport::Udp, SETTINGS),
            Outcome::Drop
        );
    }
}

//! The records of an answer from the index: the `dns-version` TXT, the
//! apex SOA and NS, addresses, SRV (with their targets' addresses as
//! additional records), PTR, and CNAMEs of ExternalName Services, followed
//! in the cluster domain or handed to the upstream resolver to chase;
//! NXDOMAIN and NODATA with the zone's SOA.

use std::net::IpAddr;

use hickory_proto::op::{Query, ResponseCode};
use hickory_proto::rr::rdata::{A, AAAA, CNAME, NS, PTR, SOA, SRV, TXT};
use hickory_proto::rr::{Name, RData, Record, RecordType};

use super::{Chase, Draft, Outcome, Settings, Summary, SCHEMA_VERSION};
use crate::records::{Data, Lookup, Records};

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

/// Answers a question in this zone; `lower` is its name, lower-cased.
pub(super) fn answer(
    records: &Records,
    mut draft: Draft,
    question: &Query,
    lower: &str,
    settings: Settings,
) -> Outcome {
    let asked = question.name();
    let query_type = question.query_type();
    let domain = records.domain();
    let ttl = settings.ttl;
    let apex = name(domain).unwrap_or_else(Name::root);
    let soa = || {
        let mname = name(&format!("ns.dns.{domain}")).unwrap_or_else(Name::root);
        let rname = name(&format!("hostmaster.{domain}")).unwrap_or_else(Name::root);
        let soa = SOA::new(mname, rname, records.serial(), 7200, 1800, 86400, ttl);
        Record::from_rdata(apex.clone(), ttl, RData::SOA(soa))
    };
    let wants = |t: RecordType| query_type == t || query_type == RecordType::ANY;
    let response = &mut draft.response;

    if lower == format!("dns-version.{domain}") {
        if wants(RecordType::TXT) {
            let txt = TXT::new(vec![SCHEMA_VERSION.to_owned()]);
            response.add_answer(Record::from_rdata(asked.clone(), ttl, RData::TXT(txt)));
        } else {
            response.add_name_server(soa());
        }
        return draft.finish(ResponseCode::NoError);
    }
    if lower == domain && (wants(RecordType::SOA) || wants(RecordType::NS)) {
        if wants(RecordType::SOA) {
            response.add_answer(soa());
        }
        if wants(RecordType::NS) {
            let ns = name(&format!("ns.dns.{domain}")).unwrap_or_else(Name::root);
            response.add_answer(Record::from_rdata(apex.clone(), ttl, RData::NS(NS(ns))));
        }
        return draft.finish(ResponseCode::NoError);
    }
    let found = match records.lookup(lower) {
        Lookup::Found(found) => found,
        Lookup::Empty => {
            response.add_name_server(soa());
            return draft.finish(ResponseCode::NoError);
        }
        Lookup::Missing => {
            response.add_name_server(soa());
            return draft.finish(ResponseCode::NXDomain);
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
                    transport: draft.transport,
                    client_payload: draft.client_payload,
                    summary: Summary {
                        query_type: draft.label,
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
    draft.finish(ResponseCode::NoError)
}

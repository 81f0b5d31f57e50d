//! One query in, one answer out. Pure, so it is unit-tested and fuzzed
//! without sockets. In stages, as hickory's server is: the request is
//! checked ([`request`]), routed to this zone, upstream or nowhere
//! ([`zone`]), answered from the index ([`build`]), and encoded, truncated
//! to what UDP may carry ([`encode`]).
//!
//! Authoritative for the cluster domain and for the reverse names of the
//! addresses it knows; everything else goes upstream when there is one and
//! is REFUSED otherwise (never an open resolver). A UDP answer never exceeds
//! what the query allows (512 bytes, or its EDNS0 payload size): larger ones
//! are sent truncated, so the client retries over TCP.

mod build;
mod encode;
mod request;
#[cfg(test)]
mod tests;
mod zone;

use hickory_proto::op::{Edns, Message, ResponseCode};
use hickory_proto::rr::{Name, RecordType};

use crate::records::Records;

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
        let draft = Draft {
            response,
            label: self.summary.query_type,
            transport: self.transport,
            client_payload: self.client_payload,
        };
        match draft.finish(reply.response_code()) {
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

/// A response being made, and how it will travel.
#[derive(Debug)]
struct Draft {
    response: Message,
    /// The query type, for metrics.
    label: &'static str,
    transport: Transport,
    /// The largest UDP answer the client takes.
    client_payload: usize,
}

impl Draft {
    fn finish(self, rcode: ResponseCode) -> Outcome {
        encode::finish(
            self.response,
            rcode,
            self.label,
            self.transport,
            self.client_payload,
        )
    }
}

/// Answers one query.
pub fn answer(
    records: &Records,
    query: &[u8],
    transport: Transport,
    settings: Settings,
) -> Outcome {
    let (mut draft, question) = match request::check(query, transport, settings) {
        Ok(checked) => checked,
        Err(outcome) => return *outcome,
    };
    match zone::route(records, &question) {
        zone::Route::Ours(name) => {
            draft.response.set_authoritative(true);
            build::answer(records, draft, &question, &name, settings)
        }
        zone::Route::Elsewhere if settings.upstream && zone::in_class(&question) => {
            Outcome::Forward(Summary {
                query_type: draft.label,
                rcode: "forwarded",
            })
        }
        zone::Route::Elsewhere => draft.finish(ResponseCode::Refused),
    }
}

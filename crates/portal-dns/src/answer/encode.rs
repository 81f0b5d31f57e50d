//! Encoding: the response code, the wire bytes, and truncation when UDP
//! cannot carry the answer (additional records first, then everything but
//! the question, with TC set); the FORMERR header for bytes that do not
//! parse; the metric labels.

use hickory_proto::op::{Message, MessageType, ResponseCode};
use hickory_proto::rr::RecordType;

use super::{Outcome, Summary, Transport};

pub(super) fn type_label(query_type: RecordType) -> &'static str {
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
pub(super) fn format_error(query: &[u8]) -> Outcome {
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

/// Encodes the response, truncated when UDP cannot carry it.
pub(super) fn finish(
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

//! The request: does it parse, is it a standard query with one question,
//! which EDNS version and payload size; the response header follows it.

use hickory_proto::op::{Edns, Message, MessageType, OpCode, Query, ResponseCode};

use super::{encode, Draft, Outcome, Settings, Transport, EDNS_PAYLOAD, PLAIN_UDP};

/// The response started and the one question; or the outcome already (a
/// format error, not implemented, a bad version, nothing at all).
pub(super) fn check(
    query: &[u8],
    transport: Transport,
    settings: Settings,
) -> Result<(Draft, Query), Box<Outcome>> {
    let Ok(request) = Message::from_vec(query) else {
        return Err(Box::new(encode::format_error(query)));
    };
    if request.message_type() != MessageType::Query {
        return Err(Box::new(Outcome::Drop));
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
    let mut draft = Draft {
        response,
        label: "other",
        transport,
        client_payload,
    };
    let Some(question) = request.queries().first().cloned() else {
        return Err(Box::new(draft.finish(ResponseCode::FormErr)));
    };
    draft.label = encode::type_label(question.query_type());
    draft.response.add_query(question.clone());
    if request.queries().len() != 1 {
        return Err(Box::new(draft.finish(ResponseCode::FormErr)));
    }
    if request.op_code() != OpCode::Query {
        return Err(Box::new(draft.finish(ResponseCode::NotImp)));
    }
    if request
        .extensions()
        .as_ref()
        .is_some_and(|e| e.version() > 0)
    {
        return Err(Box::new(draft.finish(ResponseCode::BADVERS)));
    }
    Ok((draft, question))
}

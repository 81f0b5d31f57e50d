//! Byte layout of stored records. Hand-rolled and tiny: a record is read on
//! every get and watch replay, and corrupt bytes must become an error, never
//! a panic.

use bytes::Bytes;

use crate::{Error, Event, EventKind, KeyValue, Result};

/// Encodes a current value: `create_revision | mod_revision | value`.
pub(super) fn encode_value(create_revision: u64, mod_revision: u64, value: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(16 + value.len());
    out.extend_from_slice(&create_revision.to_le_bytes());
    out.extend_from_slice(&mod_revision.to_le_bytes());
    out.extend_from_slice(value);
    out
}

pub(super) fn decode_value(key: &str, bytes: &[u8]) -> Result<KeyValue> {
    let mut reader = Reader(bytes);
    let create_revision = reader.u64()?;
    let mod_revision = reader.u64()?;
    Ok(KeyValue {
        key: key.to_owned(),
        value: Bytes::copy_from_slice(reader.0),
        create_revision,
        mod_revision,
    })
}

/// Encodes a history entry: the event with the value before it, so a replayed
/// watch can tell what changed (label selector transitions need `prev`).
pub(super) fn encode_event(event: &Event) -> Vec<u8> {
    let prev_len = event.prev.as_ref().map_or(0, |p| p.value.len() + 16);
    let mut out = Vec::with_capacity(32 + event.kv.key.len() + event.kv.value.len() + prev_len);
    out.push(match event.kind {
        EventKind::Put => 0,
        EventKind::Delete => 1,
    });
    put_bytes(&mut out, event.kv.key.as_bytes());
    out.extend_from_slice(&event.kv.create_revision.to_le_bytes());
    put_bytes(&mut out, &event.kv.value);
    match &event.prev {
        None => out.push(0),
        Some(prev) => {
            out.push(1);
            out.extend_from_slice(&prev.create_revision.to_le_bytes());
            out.extend_from_slice(&prev.mod_revision.to_le_bytes());
            put_bytes(&mut out, &prev.value);
        }
    }
    out
}

pub(super) fn decode_event(revision: u64, bytes: &[u8]) -> Result<Event> {
    let mut reader = Reader(bytes);
    let kind = match reader.u8()? {
        0 => EventKind::Put,
        1 => EventKind::Delete,
        other => return Err(Error::Corrupt(format!("unknown event kind {other}"))),
    };
    let key = String::from_utf8(reader.bytes()?.to_vec())
        .map_err(|_| Error::Corrupt("history key is not UTF-8".into()))?;
    let create_revision = reader.u64()?;
    let value = Bytes::copy_from_slice(reader.bytes()?);
    let prev = match reader.u8()? {
        0 => None,
        _ => {
            let create_revision = reader.u64()?;
            let mod_revision = reader.u64()?;
            let value = Bytes::copy_from_slice(reader.bytes()?);
            Some(KeyValue {
                key: key.clone(),
                value,
                create_revision,
                mod_revision,
            })
        }
    };
    Ok(Event {
        kind,
        kv: KeyValue {
            key,
            value,
            create_revision,
            mod_revision: revision,
        },
        prev,
    })
}

fn put_bytes(out: &mut Vec<u8>, bytes: &[u8]) {
    // Values are bounded far below 4 GiB by the API server's body limit.
    let len = u32::try_from(bytes.len()).unwrap_or(u32::MAX);
    out.extend_from_slice(&len.to_le_bytes());
    out.extend_from_slice(bytes);
}

struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8]> {
        if self.0.len() < n {
            return Err(Error::Corrupt(format!(
                "record truncated: need {n} bytes, have {}",
                self.0.len()
            )));
        }
        let (head, tail) = self.0.split_at(n);
        self.0 = tail;
        Ok(head)
    }

    fn u8(&mut self) -> Result<u8> {
        Ok(self.take(1)?[0])
    }

    fn u64(&mut self) -> Result<u64> {
        let mut buf = [0u8; 8];
        buf.copy_from_slice(self.take(8)?);
        Ok(u64::from_le_bytes(buf))
    }

    fn bytes(&mut self) -> Result<&'a [u8]> {
        let mut buf = [0u8; 4];
        buf.copy_from_slice(self.take(4)?);
        self.take(u32::from_le_bytes(buf) as usize)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kv(key: &str, value: &str, create: u64, modified: u64) -> KeyValue {
        KeyValue {
            key: key.into(),
            value: Bytes::from(value.to_owned()),
            create_revision: create,
            mod_revision: modified,
        }
    }

    #[test]
    fn event_round_trips() {
        let event = Event {
            kind: EventKind::Put,
            kv: kv("/a", "new", 3, 9),
            prev: Some(kv("/a", "old", 3, 5)),
        };
        assert_eq!(decode_event(9, &encode_event(&event)).unwrap(), event);
        let created = Event {
            kind: EventKind::Put,
            kv: kv("/b", "x", 4, 4),
            prev: None,
        };
        assert_eq!(decode_event(4, &encode_event(&created)).unwrap(), created);
    }

    #[test]
    fn truncated_records_are_errors() {
        let event = Event {
            kind: EventKind::Delete,
            kv: kv("/a", "", 1, 2),
            prev: Some(kv("/a", "v", 1, 1)),
        };
        let bytes = encode_event(&event);
        for cut in 0..bytes.len() {
            assert!(decode_event(2, &bytes[..cut]).is_err(), "cut at {cut}");
        }
        assert!(decode_value("/a", &[1, 2, 3]).is_err());
    }
}

//! The plan as one nftables table, `ip portal_policy`, replaced whole in
//! one transaction. Its forward chain lets established flows through
//! first (a policy change never cuts a connection it allowed), then sends
//! packets from an egress-isolated pod and to an ingress-isolated pod to
//! that pod's chain: a rule per allowed peer and protocol, and a drop at
//! the end (a dropped connection times out, as in Kubernetes). Traffic the
//! node itself sends or receives never reaches the forward hook, so it is
//! always allowed, as Kubernetes requires.

use std::collections::BTreeMap;
use std::fmt::Write;
use std::net::Ipv4Addr;

use super::model::{Allow, Isolated, Protocol};
use super::ranges::Ranges;

pub const TABLE: &str = "portal_policy";

fn chain(direction: &str, ip: Ipv4Addr) -> String {
    format!("{direction}_{}", ip.to_string().replace('.', "_"))
}

fn addresses(ranges: &Ranges<u32>) -> String {
    let items: Vec<String> = ranges
        .iter()
        .map(|&(low, high)| {
            if low == high {
                Ipv4Addr::from(low).to_string()
            } else {
                format!("{}-{}", Ipv4Addr::from(low), Ipv4Addr::from(high))
            }
        })
        .collect();
    format!("{{ {} }}", items.join(", "))
}

fn ports(ranges: &Ranges<u16>) -> String {
    let items: Vec<String> = ranges
        .iter()
        .map(|&(low, high)| {
            if low == high {
                low.to_string()
            } else {
                format!("{low}-{high}")
            }
        })
        .collect();
    format!("{{ {} }}", items.join(", "))
}

/// nft takes comments up to 128 bytes, in double quotes.
fn comment(text: &str) -> String {
    let clean: String = text.chars().filter(|c| *c != '"' && *c != '\\').collect();
    let mut end = clean.len().min(120);
    while !clean.is_char_boundary(end) {
        end -= 1;
    }
    format!("comment \"{}\"", &clean[..end])
}

/// One allow as rules: the peer match (`saddr` in, `daddr` out), then one
/// rule per protocol, or one with no port match for "every port".
fn allow_rules(out: &mut String, allow: &Allow, field: &str, verdict: &str) {
    let peers = allow
        .peers
        .as_ref()
        .map(|p| format!("ip {field} {} ", addresses(p)))
        .unwrap_or_default();
    let note = comment(&allow.policy);
    let Some(by_protocol) = &allow.ports else {
        let _ = writeln!(out, "\t\t{peers}{verdict} {note}");
        return;
    };
    for (protocol, ranges) in by_protocol {
        let port_match = match ranges {
            Some(ranges) if !ranges.is_empty() => format!(" th dport {}", ports(ranges)),
            Some(_) => continue,
            None => String::new(),
        };
        let _ = writeln!(
            out,
            "\t\t{peers}meta l4proto {}{port_match} {verdict} {note}",
            Protocol::nft(*protocol)
        );
    }
}

fn vmap(out: &mut String, field: &str, entries: &BTreeMap<Ipv4Addr, String>) {
    if entries.is_empty() {
        return;
    }
    let items: Vec<String> = entries
        .iter()
        .map(|(ip, chain)| format!("{ip} : jump {chain}"))
        .collect();
    let _ = writeln!(out, "\t\tip {field} vmap {{ {} }}", items.join(", "));
}

/// The table's text for `nft -f`: delete and make again, atomically.
pub fn render(plan: &[Isolated]) -> String {
    let mut out = format!("table ip {TABLE}\ndelete table ip {TABLE}\ntable ip {TABLE} {{\n");
    let egress: BTreeMap<Ipv4Addr, String> = plan
        .iter()
        .filter(|p| p.egress.is_some())
        .map(|p| (p.ip, chain("out", p.ip)))
        .collect();
    let ingress: BTreeMap<Ipv4Addr, String> = plan
        .iter()
        .filter(|p| p.ingress.is_some())
        .map(|p| (p.ip, chain("in", p.ip)))
        .collect();
    out.push_str(
        "\tchain forward {\n\t\ttype filter hook forward priority filter; policy accept;\n",
    );
    out.push_str("\t\tct state established,related accept\n");
    // Egress first: a packet between two isolated pods passes both.
    vmap(&mut out, "saddr", &egress);
    vmap(&mut out, "daddr", &ingress);
    out.push_str("\t}\n");
    for pod in plan {
        if let Some(allows) = &pod.egress {
            let _ = writeln!(out, "\tchain {} {{", chain("out", pod.ip));
            // A pod reaches itself whatever its policies (hairpin through a Service).
            let _ = writeln!(out, "\t\tip daddr {} return", pod.ip);
            for allow in allows {
                allow_rules(&mut out, allow, "daddr", "return");
            }
            let _ = writeln!(
                out,
                "\t\tdrop {}",
                comment(&format!("{}: egress not allowed", pod.pod))
            );
            out.push_str("\t}\n");
        }
        if let Some(allows) = &pod.ingress {
            let _ = writeln!(out, "\tchain {} {{", chain("in", pod.ip));
            let _ = writeln!(out, "\t\tip saddr {} accept", pod.ip);
            for allow in allows {
                allow_rules(&mut out, allow, "saddr", "accept");
            }
            let _ = writeln!(
                out,
                "\t\tdrop {}",
                comment(&format!("{}: ingress not allowed", pod.pod))
            );
            out.push_str("\t}\n");
        }
    }
    out.push_str("}\n");
    out
}

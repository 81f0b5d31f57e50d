//! The plan as an nftables table per family, `ip portal_policy` and `ip6
//! portal_policy`, replaced whole in one transaction. A table's forward
//! chain lets established flows through first (a policy change never cuts
//! a connection it allowed), then sends packets from an egress-isolated
//! pod and to an ingress-isolated pod to that pod's chain: a rule per
//! allowed peer (of the table's family) and protocol, and a drop at the
//! end (a dropped connection times out, as in Kubernetes). A pod isolated
//! in IPv4 is isolated in IPv6 as well: a peer of the other family is no
//! way around a policy. Traffic the node itself sends or receives never
//! reaches the forward hook, so it is always allowed, as Kubernetes
//! requires.

use std::collections::BTreeMap;
use std::fmt::Write;
use std::net::{IpAddr, Ipv4Addr};

use super::model::{Allow, Isolated, Protocol};
use super::ranges::{ip_of, split, Ranges};
use portal_api::cidr::IpFamily;

pub const TABLE: &str = "portal_policy";

/// A family's table and address match: `ip`, `ip6`.
fn nft(family: IpFamily) -> &'static str {
    match family {
        IpFamily::Ipv4 => "ip",
        IpFamily::Ipv6 => "ip6",
    }
}

/// The pod's address of `family`.
fn own(family: IpFamily, pod: &Isolated) -> Option<IpAddr> {
    match family {
        IpFamily::Ipv4 => Some(IpAddr::V4(pod.ip)),
        IpFamily::Ipv6 => pod.ip6.map(IpAddr::V6),
    }
}

/// The part of `ranges` of `family`.
fn part(family: IpFamily, ranges: &Ranges<u128>) -> Ranges<u128> {
    let (v4, v6) = split(ranges);
    match family {
        IpFamily::Ipv4 => v4,
        IpFamily::Ipv6 => v6,
    }
}

/// A pod's chain, named by its IPv4 address in both tables.
fn chain(direction: &str, ip: Ipv4Addr) -> String {
    format!("{direction}_{}", ip.to_string().replace('.', "_"))
}

fn addresses(ranges: &Ranges<u128>) -> String {
    let items: Vec<String> = ranges
        .iter()
        .map(|&(low, high)| {
            if low == high {
                ip_of(low).to_string()
            } else {
                format!("{}-{}", ip_of(low), ip_of(high))
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

/// One allow as rules of `family`: the peer match (`saddr` in, `daddr`
/// out), then one rule per protocol, or one with no port match for "every
/// port". Peers none of which is of the family allow nothing here.
fn allow_rules(out: &mut String, family: IpFamily, allow: &Allow, field: &str, verdict: &str) {
    let peers = match &allow.peers {
        None => String::new(),
        Some(peers) => {
            let mine = part(family, peers);
            if mine.is_empty() {
                return;
            }
            format!("{} {field} {} ", nft(family), addresses(&mine))
        }
    };
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

fn vmap(out: &mut String, family: IpFamily, field: &str, entries: &BTreeMap<IpAddr, String>) {
    if entries.is_empty() {
        return;
    }
    let items: Vec<String> = entries
        .iter()
        .map(|(ip, chain)| format!("{ip} : jump {chain}"))
        .collect();
    let _ = writeln!(
        out,
        "\t\t{} {field} vmap {{ {} }}",
        nft(family),
        items.join(", ")
    );
}

/// The tables' text for `nft -f`: each deleted and made again, atomically
/// (IPv6's when `ipv6`: this node's pods have IPv6 addresses).
pub fn render(plan: &[Isolated], ipv6: bool) -> String {
    let mut out = String::new();
    render_table(&mut out, IpFamily::Ipv4, plan);
    if ipv6 {
        render_table(&mut out, IpFamily::Ipv6, plan);
    }
    out
}

fn render_table(out: &mut String, family: IpFamily, plan: &[Isolated]) {
    let table = format!("{} {TABLE}", nft(family));
    let _ = write!(
        out,
        "table {table}\ndelete table {table}\ntable {table} {{\n"
    );
    let dispatch = |isolated: fn(&Isolated) -> bool, direction: &str| -> BTreeMap<IpAddr, String> {
        plan.iter()
            .filter(|p| isolated(p))
            .filter_map(|p| Some((own(family, p)?, chain(direction, p.ip))))
            .collect()
    };
    let egress = dispatch(|p| p.egress.is_some(), "out");
    let ingress = dispatch(|p| p.ingress.is_some(), "in");
    out.push_str(
        "\tchain forward {\n\t\ttype filter hook forward priority filter; policy accept;\n",
    );
    out.push_str("\t\tct state established,related accept\n");
    // Egress first: a packet between two isolated pods passes both.
    vmap(out, family, "saddr", &egress);
    vmap(out, family, "daddr", &ingress);
    out.push_str("\t}\n");
    let ip = nft(family);
    for pod in plan {
        let Some(own) = own(family, pod) else {
            continue;
        };
        if let Some(allows) = &pod.egress {
            let _ = writeln!(out, "\tchain {} {{", chain("out", pod.ip));
            // A pod reaches itself whatever its policies (hairpin through a Service).
            let _ = writeln!(out, "\t\t{ip} daddr {own} return");
            for allow in allows {
                allow_rules(out, family, allow, "daddr", "return");
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
            let _ = writeln!(out, "\t\t{ip} saddr {own} accept");
            for allow in allows {
                allow_rules(out, family, allow, "saddr", "accept");
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
}

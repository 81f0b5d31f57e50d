//! A packet tracer for unit tests (after kube-proxy's nftables tests):
//! walks a packet through the rules the backend has applied and says where
//! it can go.

use std::collections::{BTreeSet, HashMap};
use std::net::{IpAddr, SocketAddr};

use super::rules::{
    Rule, ServiceRules, CLUSTER_IPS, EXTERNAL_IPS, LOAD_BALANCER_IPS, NODE_PORTS,
    NO_ENDPOINT_NODE_PORTS, NO_ENDPOINT_SERVICES,
};
use crate::model::Protocol;

#[derive(Clone, Copy, Debug)]
pub(crate) struct Packet {
    pub src: IpAddr,
    pub dst: IpAddr,
    pub protocol: Protocol,
    pub port: u16,
    /// `dst` is an address of this node (`fib daddr type local`).
    pub local: bool,
    /// `src` is an address of this node (`fib saddr type local`).
    pub from_node: bool,
    /// Sent by a pod of this node (arrives on the pod bridge).
    pub from_pod: bool,
}

#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Outcome {
    /// DNAT to one of `endpoints` (chosen at random), masqueraded or not.
    Dnat {
        endpoints: BTreeSet<SocketAddr>,
        masquerade: bool,
    },
    /// Refused: the Service has no ready endpoints.
    Reject,
    /// Dropped: a Local traffic policy and no endpoint on this node.
    Drop,
    /// Not a Service address: the packet goes on unchanged.
    Untouched,
}

pub(crate) fn trace<'a>(
    applied: impl Iterator<Item = &'a ServiceRules>,
    packet: Packet,
) -> Outcome {
    let mut elements: HashMap<(&str, String), &str> = HashMap::new();
    let mut chains: HashMap<&str, &[Rule]> = HashMap::new();
    let mut hairpin = BTreeSet::new();
    for rules in applied {
        for ((map, key), verdict) in &rules.elements {
            elements.insert((map, key.clone()), verdict);
        }
        for (name, chain) in &rules.chains {
            chains.insert(name, chain);
        }
        hairpin.extend(rules.hairpin.iter().copied());
    }
    let proto = packet.protocol.as_str();
    let by_address = format!("{} . {proto} . {}", packet.dst, packet.port);
    let by_port = format!("{proto} . {}", packet.port);
    let mut lookups = vec![
        (CLUSTER_IPS, &by_address),
        (EXTERNAL_IPS, &by_address),
        (LOAD_BALANCER_IPS, &by_address),
    ];
    if packet.local {
        lookups.push((NODE_PORTS, &by_port));
    }
    let Some(verdict) = lookups
        .iter()
        .find_map(|(map, key)| elements.get(&(*map, (*key).clone())))
    else {
        let rejected = elements.contains_key(&(NO_ENDPOINT_SERVICES, by_address.clone()))
            || (packet.local && elements.contains_key(&(NO_ENDPOINT_NODE_PORTS, by_port)));
        return if rejected {
            Outcome::Reject
        } else {
            Outcome::Untouched
        };
    };
    let Some(mut chain) = verdict.strip_prefix("goto ") else {
        return Outcome::Drop;
    };
    let (mut endpoints, mut masquerade) = (BTreeSet::new(), false);
    'walk: loop {
        for rule in chains.get(chain).copied().unwrap_or_default() {
            let rule = match rule {
                Rule::FromNode(_) if !packet.from_node => continue,
                Rule::FromPods(_) if !packet.from_pod => continue,
                Rule::FromNode(inner) | Rule::FromPods(inner) => inner.as_ref(),
                rule => rule,
            };
            match rule {
                Rule::MarkForMasquerade => masquerade = true,
                Rule::Goto(next) => {
                    chain = next;
                    continue 'walk;
                }
                Rule::Drop => return Outcome::Drop,
                // Affinity sets start empty.
                Rule::Sticky { .. } | Rule::FromNode(_) | Rule::FromPods(_) => {}
                Rule::Pick { of, to, .. } => {
                    endpoints.insert(*to);
                    if *of == 1 {
                        break 'walk;
                    }
                }
            }
        }
        break;
    }
    // Hairpin: a pod reaching itself through its Service.
    masquerade |= endpoints
        .iter()
        .any(|e| e.ip() == packet.src && hairpin.contains(&e.ip()));
    Outcome::Dnat {
        endpoints,
        masquerade,
    }
}

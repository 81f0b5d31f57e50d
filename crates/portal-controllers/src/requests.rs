//! What a pod asks of a node and what a node offers: CPU, memory and a
//! pod slot, counted as Kubernetes' `NodeResourcesFit` counts them. A
//! pod's request is the larger of its app containers' sum and its largest
//! init container (they run one at a time, before the others), plus its
//! overhead; a container without a request asks its limit (the API's
//! defaulting of `requests` from `limits`).

use k8s_openapi::api::core::v1::{Container, Node, Pod, ResourceRequirements};
use portal_api::quantity;

/// What a container without a CPU request counts for in scoring.
const DEFAULT_MILLI_CPU: i64 = 100;
/// What a container without a memory request counts for in scoring.
const DEFAULT_MEMORY: i64 = 200 << 20;

/// Amounts of the resources the scheduler counts.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Resources {
    pub milli_cpu: i64,
    pub memory: i64,
    pub pods: i64,
}

impl std::ops::Add for Resources {
    type Output = Resources;

    fn add(self, other: Resources) -> Resources {
        Resources {
            milli_cpu: self.milli_cpu.saturating_add(other.milli_cpu),
            memory: self.memory.saturating_add(other.memory),
            pods: self.pods.saturating_add(other.pods),
        }
    }
}

impl Resources {
    fn max(self, other: Resources) -> Resources {
        Resources {
            milli_cpu: self.milli_cpu.max(other.milli_cpu),
            memory: self.memory.max(other.memory),
            pods: self.pods.max(other.pods),
        }
    }

    /// What `pod` asks of its node (one pod slot included).
    pub fn of_pod(pod: &Pod) -> Resources {
        let Some(spec) = &pod.spec else {
            return Resources {
                pods: 1,
                ..Resources::default()
            };
        };
        let apps = spec
            .containers
            .iter()
            .map(of_container)
            .fold(Resources::default(), |a, b| a + b);
        let inits = spec
            .init_containers
            .iter()
            .flatten()
            .map(of_container)
            .fold(Resources::default(), Resources::max);
        let overhead = spec.overhead.as_ref().map_or(Resources::default(), |o| {
            amounts(|name| o.get(name).map(|q| q.0.as_str()))
        });
        apps.max(inits)
            + overhead
            + Resources {
                pods: 1,
                ..Resources::default()
            }
    }

    /// What `pod` counts for when nodes are scored: as [`Resources::of_pod`]
    /// but a container that asks no CPU or memory counts 100m and 200Mi,
    /// as upstream's scoring does, so pods without requests still spread.
    pub fn scoring(pod: &Pod) -> Resources {
        let Some(spec) = &pod.spec else {
            return Resources::default();
        };
        let non_zero = |container: &Container| {
            let asked = of_container(container);
            Resources {
                milli_cpu: if asked.milli_cpu == 0 {
                    DEFAULT_MILLI_CPU
                } else {
                    asked.milli_cpu
                },
                memory: if asked.memory == 0 {
                    DEFAULT_MEMORY
                } else {
                    asked.memory
                },
                pods: 0,
            }
        };
        let apps = spec
            .containers
            .iter()
            .map(non_zero)
            .fold(Resources::default(), |a, b| a + b);
        let inits = spec
            .init_containers
            .iter()
            .flatten()
            .map(non_zero)
            .fold(Resources::default(), Resources::max);
        apps.max(inits)
    }

    /// What `node` offers (`status.allocatable`); none when it says nothing.
    pub fn allocatable(node: &Node) -> Option<Resources> {
        let allocatable = node.status.as_ref()?.allocatable.as_ref()?;
        let get = |name: &str| allocatable.get(name).map(|q| q.0.as_str());
        let mut offered = amounts(get);
        offered.pods = get("pods").and_then(|p| p.parse().ok()).unwrap_or(i64::MAX);
        if get("cpu").is_none() {
            offered.milli_cpu = i64::MAX;
        }
        if get("memory").is_none() {
            offered.memory = i64::MAX;
        }
        Some(offered)
    }

    /// Kubernetes' reasons why `asked` does not fit beside `used` in
    /// `offered` (empty: it fits). CPU and memory count only when asked.
    pub fn insufficient(asked: Resources, used: Resources, offered: Resources) -> Vec<String> {
        let mut reasons = Vec::new();
        if used.pods.saturating_add(1) > offered.pods {
            reasons.push("Too many pods".to_owned());
        }
        if asked.milli_cpu > 0 && asked.milli_cpu > offered.milli_cpu.saturating_sub(used.milli_cpu)
        {
            reasons.push("Insufficient cpu".to_owned());
        }
        if asked.memory > 0 && asked.memory > offered.memory.saturating_sub(used.memory) {
            reasons.push("Insufficient memory".to_owned());
        }
        reasons
    }
}

fn amounts<'a>(get: impl Fn(&str) -> Option<&'a str>) -> Resources {
    Resources {
        milli_cpu: get("cpu").and_then(quantity::millicores).unwrap_or(0),
        memory: get("memory").and_then(quantity::bytes).unwrap_or(0),
        pods: 0,
    }
}

fn of_container(container: &Container) -> Resources {
    let Some(ResourceRequirements {
        requests, limits, ..
    }) = &container.resources
    else {
        return Resources::default();
    };
    amounts(|name| {
        requests
            .as_ref()
            .and_then(|r| r.get(name))
            .or_else(|| limits.as_ref().and_then(|l| l.get(name)))
            .map(|q| q.0.as_str())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(spec: serde_json::Value) -> Pod {
        serde_json::from_value(serde_json::json!({"metadata": {"name": "p"}, "spec": spec}))
            .unwrap_or_default()
    }

    #[test]
    fn a_pod_asks_the_larger_of_its_apps_and_its_largest_init_container() {
        let p = pod(serde_json::json!({
            "initContainers": [{"name": "i", "resources": {"requests": {"cpu": "2", "memory": "10Mi"}}}],
            "containers": [
                {"name": "a", "resources": {"requests": {"cpu": "500m"}, "limits": {"memory": "64Mi"}}},
                {"name": "b", "resources": {"requests": {"cpu": "250m", "memory": "64Mi"}}},
            ],
            "overhead": {"cpu": "10m"},
        }));
        assert_eq!(
            Resources::of_pod(&p),
            Resources {
                milli_cpu: 2010,
                memory: 128 << 20,
                pods: 1
            }
        );
    }

    #[test]
    fn reasons_are_kubernetes_words() {
        let offered = Resources {
            milli_cpu: 2000,
            memory: 1 << 30,
            pods: 2,
        };
        let used = Resources {
            milli_cpu: 1500,
            memory: 1 << 29,
            pods: 1,
        };
        let asked = Resources {
            milli_cpu: 600,
            memory: 1,
            pods: 1,
        };
        assert_eq!(
            Resources::insufficient(asked, used, offered),
            ["Insufficient cpu"]
        );
        let full = Resources { pods: 2, ..used };
        assert_eq!(
            Resources::insufficient(
                Resources {
                    milli_cpu: 600,
                    memory: 1 << 30,
                    pods: 1
                },
                full,
                offered
            ),
            ["Too many pods", "Insufficient cpu", "Insufficient memory"]
        );
        assert!(Resources::insufficient(
            Resources {
                pods: 1,
                ..Resources::default()
            },
            used,
            offered
        )
        .is_empty());
    }
}

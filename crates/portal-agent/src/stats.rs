//! Resource usage of the node, its pods and their containers, read from
//! cgroups as the kubelet's cAdvisor reads them: cumulative CPU time and the
//! memory working set (usage less inactive file pages: what the kernel
//! cannot easily take back, the figure `kubectl top` and evictions use).
//! Sampled every [`PERIOD`]; CPU as a rate between the last two samples.
//!
//! Served on the agent API as the kubelet serves it: the summary API
//! (`/stats/summary`) and `/metrics/resource` (Prometheus text), from
//! which the API server answers `metrics.k8s.io` (`kubectl top`, the
//! HorizontalPodAutoscaler) and which metrics-server could scrape too.

use std::collections::HashMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use parking_lot::Mutex;
use serde_json::{json, Value};

use crate::mountinfo::read_mountinfo;
use crate::runtime::{Runtime, State};

/// How often usage is read.
pub const PERIOD: Duration = Duration::from_secs(5);

/// `/proc/stat` counts in USER_HZ, 100 on every Linux architecture.
const NANOS_PER_TICK: u64 = 10_000_000;

/// One reading of a cgroup (or the node).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Reading {
    /// CPU time used since it began, in nanoseconds.
    pub cpu_ns: u64,
    pub memory_usage: u64,
    pub working_set: u64,
}

/// The last reading, when it was taken, and the CPU rate since the one
/// before.
#[derive(Clone, Debug)]
struct Series {
    at: SystemTime,
    taken: Instant,
    reading: Reading,
    /// CPU used per second, in billionths of a core; `None` until two
    /// readings.
    nano_cores: Option<u64>,
}

impl Series {
    fn first(reading: Reading, at: SystemTime, taken: Instant) -> Self {
        Series {
            at,
            taken,
            reading,
            nano_cores: None,
        }
    }

    fn next(&self, reading: Reading, at: SystemTime, taken: Instant) -> Self {
        let elapsed = taken.duration_since(self.taken).as_nanos();
        // A counter that went back is a new cgroup under the same name.
        let nano_cores = (elapsed > 0 && reading.cpu_ns >= self.reading.cpu_ns).then(|| {
            let used = u128::from(reading.cpu_ns - self.reading.cpu_ns);
            u64::try_from(used * 1_000_000_000 / elapsed).unwrap_or(u64::MAX)
        });
        Series {
            at,
            taken,
            reading,
            nano_cores,
        }
    }

    fn cpu_json(&self) -> Value {
        let mut cpu =
            json!({"time": rfc3339(self.at), "usageCoreNanoSeconds": self.reading.cpu_ns});
        if let Some(rate) = self.nano_cores {
            cpu["usageNanoCores"] = json!(rate);
        }
        cpu
    }

    fn memory_json(&self) -> Value {
        json!({
            "time": rfc3339(self.at),
            "usageBytes": self.reading.memory_usage,
            "workingSetBytes": self.reading.working_set,
        })
    }
}

#[derive(Clone, Debug)]
struct ContainerUsage {
    pod_uid: String,
    name: String,
    started_at: String,
    series: Series,
}

#[derive(Clone, Debug)]
struct PodUsage {
    namespace: String,
    name: String,
    series: Series,
}

#[derive(Debug, Default)]
struct Snapshot {
    node: Option<Series>,
    /// By pod UID.
    pods: HashMap<String, PodUsage>,
    /// By container id.
    containers: HashMap<String, ContainerUsage>,
}

/// Where a controller's files are.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Controller {
    root: PathBuf,
    v2: bool,
}

/// The hierarchies usage is read from.
#[derive(Clone, Debug, Default)]
struct Hierarchies {
    cpu: Option<Controller>,
    memory: Option<Controller>,
}

impl Hierarchies {
    /// As mounted for this process: v1 `cpuacct` and `memory` where they
    /// are, else the v2 hierarchy.
    fn discover() -> Self {
        let mounts = read_mountinfo(Path::new("/proc/self/mountinfo")).unwrap_or_default();
        let v1 = |controller: &str| {
            mounts
                .iter()
                .find(|m| {
                    m.fstype == "cgroup" && m.super_options.split(',').any(|o| o == controller)
                })
                .map(|m| Controller {
                    root: PathBuf::from(&m.point),
                    v2: false,
                })
        };
        let v2 = mounts
            .iter()
            .find(|m| m.fstype == "cgroup2")
            .map(|m| Controller {
                root: PathBuf::from(&m.point),
                v2: true,
            });
        Hierarchies {
            cpu: v1("cpuacct").or_else(|| v2.clone()),
            memory: v1("memory").or(v2),
        }
    }

    /// A cgroup's usage (`cgroup` absolute, as in every hierarchy).
    fn read(&self, cgroup: &str) -> Option<Reading> {
        let relative = cgroup.trim_start_matches('/');
        let cpu = self.cpu.as_ref()?;
        let cpu_dir = cpu.root.join(relative);
        let cpu_ns = if cpu.v2 {
            stat_value(&cpu_dir.join("cpu.stat"), "usage_usec")?.saturating_mul(1000)
        } else {
            read_number(&cpu_dir.join("cpuacct.usage"))?
        };
        let memory = self.memory.as_ref()?;
        let memory_dir = memory.root.join(relative);
        let (usage, inactive) = if memory.v2 {
            (
                read_number(&memory_dir.join("memory.current"))?,
                stat_value(&memory_dir.join("memory.stat"), "inactive_file").unwrap_or(0),
            )
        } else {
            (
                read_number(&memory_dir.join("memory.usage_in_bytes"))?,
                stat_value(&memory_dir.join("memory.stat"), "total_inactive_file").unwrap_or(0),
            )
        };
        Some(Reading {
            cpu_ns,
            memory_usage: usage,
            working_set: usage.saturating_sub(inactive),
        })
    }
}

fn read_number(path: &Path) -> Option<u64> {
    std::fs::read_to_string(path).ok()?.trim().parse().ok()
}

/// `key value` lines (`cpu.stat`, `memory.stat`).
fn stat_value(path: &Path, key: &str) -> Option<u64> {
    parse_stat(&std::fs::read_to_string(path).ok()?, key)
}

fn parse_stat(text: &str, key: &str) -> Option<u64> {
    text.lines().find_map(|line| {
        let (k, v) = line.split_once(' ')?;
        (k == key).then(|| v.trim().parse().ok())?
    })
}

/// The node's CPU (`/proc/stat`, every CPU's busy time) and memory
/// (`/proc/meminfo`: used, and used less inactive file pages).
fn node_reading(proc_stat: &str, meminfo: &str) -> Option<Reading> {
    let cpu: Vec<u64> = proc_stat
        .lines()
        .find(|l| l.starts_with("cpu "))?
        .split_whitespace()
        .skip(1)
        .map(|v| v.parse().unwrap_or(0))
        .collect();
    // user nice system idle iowait irq softirq steal: all but idle, iowait.
    let busy: u64 = [0, 1, 2, 5, 6, 7].iter().filter_map(|i| cpu.get(*i)).sum();
    let kib = |key: &str| {
        meminfo.lines().find_map(|line| {
            let rest = line.strip_prefix(key)?.strip_prefix(':')?;
            rest.trim()
                .trim_end_matches("kB")
                .trim()
                .parse::<u64>()
                .ok()
        })
    };
    let usage = kib("MemTotal")?.saturating_sub(kib("MemFree")?) * 1024;
    let inactive = kib("Inactive(file)").unwrap_or(0) * 1024;
    Some(Reading {
        cpu_ns: busy.saturating_mul(NANOS_PER_TICK),
        memory_usage: usage,
        working_set: usage.saturating_sub(inactive),
    })
}

fn rfc3339(at: SystemTime) -> String {
    jiff::Timestamp::try_from(at)
        .map(|t| t.strftime("%Y-%m-%dT%H:%M:%SZ").to_string())
        .unwrap_or_default()
}

fn millis(at: SystemTime) -> u128 {
    at.duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis())
}

/// The node's resource usage, kept up to date by [`Stats::run`].
#[derive(Debug)]
pub struct Stats {
    node_name: String,
    hierarchies: Hierarchies,
    snapshot: Mutex<Snapshot>,
}

impl Stats {
    pub fn new(node_name: &str) -> Arc<Self> {
        Arc::new(Stats {
            node_name: node_name.to_owned(),
            hierarchies: Hierarchies::discover(),
            snapshot: Mutex::new(Snapshot::default()),
        })
    }

    /// Samples every [`PERIOD`], for as long as the agent runs.
    pub(crate) async fn run<R: Runtime>(self: Arc<Self>, runtime: Arc<R>) {
        loop {
            let (stats, runtime) = (self.clone(), runtime.clone());
            let _ = tokio::task::spawn_blocking(move || stats.sample(runtime.as_ref())).await;
            tokio::time::sleep(PERIOD).await;
        }
    }

    /// Reads the node and every running container and its pod.
    fn sample<R: Runtime>(&self, runtime: &R) {
        let at = SystemTime::now();
        let taken = Instant::now();
        let node = node_reading(
            &std::fs::read_to_string("/proc/stat").unwrap_or_default(),
            &std::fs::read_to_string("/proc/meminfo").unwrap_or_default(),
        );
        let mut containers = Vec::new();
        let mut pods: HashMap<String, (String, String, String)> = HashMap::new();
        for container in runtime.containers() {
            let started_at = match &container.state {
                State::Running(started) => started.started_at.clone(),
                _ => continue,
            };
            let Some(cgroup) = runtime.cgroup(&container) else {
                continue;
            };
            if let Some((pod_cgroup, _)) = cgroup.rsplit_once('/') {
                pods.entry(container.meta.pod_uid.clone()).or_insert((
                    container.meta.pod_namespace.clone(),
                    container.meta.pod_name.clone(),
                    pod_cgroup.to_owned(),
                ));
            }
            if let Some(reading) = self.hierarchies.read(&cgroup) {
                containers.push((container.id.clone(), container, started_at, reading));
            }
        }
        let pod_readings: Vec<(String, String, String, Reading)> = pods
            .into_iter()
            .filter_map(|(uid, (namespace, name, cgroup))| {
                Some((uid, namespace, name, self.hierarchies.read(&cgroup)?))
            })
            .collect();
        let mut snapshot = self.snapshot.lock();
        snapshot.node = match (node, snapshot.node.take()) {
            (Some(reading), Some(last)) => Some(last.next(reading, at, taken)),
            (Some(reading), None) => Some(Series::first(reading, at, taken)),
            (None, _) => None,
        };
        let mut next_containers = HashMap::with_capacity(containers.len());
        for (id, container, started_at, reading) in containers {
            let series = match snapshot.containers.get(&id) {
                Some(last) => last.series.next(reading, at, taken),
                None => Series::first(reading, at, taken),
            };
            next_containers.insert(
                id,
                ContainerUsage {
                    pod_uid: container.meta.pod_uid,
                    name: container.meta.name,
                    started_at,
                    series,
                },
            );
        }
        let mut next_pods = HashMap::with_capacity(pod_readings.len());
        for (uid, namespace, name, reading) in pod_readings {
            let series = match snapshot.pods.get(&uid) {
                Some(last) => last.series.next(reading, at, taken),
                None => Series::first(reading, at, taken),
            };
            next_pods.insert(
                uid,
                PodUsage {
                    namespace,
                    name,
                    series,
                },
            );
        }
        snapshot.containers = next_containers;
        snapshot.pods = next_pods;
    }

    /// The kubelet's summary API document (`/stats/summary`): the node,
    /// and each running pod with its containers.
    pub fn summary(&self) -> Value {
        let snapshot = self.snapshot.lock();
        let mut node = json!({"nodeName": self.node_name});
        if let Some(series) = &snapshot.node {
            node["cpu"] = series.cpu_json();
            node["memory"] = series.memory_json();
        }
        let mut pods: Vec<(&String, &PodUsage)> = snapshot.pods.iter().collect();
        pods.sort_by(|a, b| (&a.1.namespace, &a.1.name).cmp(&(&b.1.namespace, &b.1.name)));
        let pods: Vec<Value> = pods
            .into_iter()
            .map(|(uid, pod)| {
                let mut containers: Vec<&ContainerUsage> = snapshot
                    .containers
                    .values()
                    .filter(|c| &c.pod_uid == uid)
                    .collect();
                containers.sort_by(|a, b| a.name.cmp(&b.name));
                let containers: Vec<Value> = containers
                    .into_iter()
                    .map(|c| {
                        json!({
                            "name": c.name,
                            "startTime": c.started_at,
                            "cpu": c.series.cpu_json(),
                            "memory": c.series.memory_json(),
                        })
                    })
                    .collect();
                json!({
                    "podRef": {"name": pod.name, "namespace": pod.namespace, "uid": uid},
                    "containers": containers,
                    "cpu": pod.series.cpu_json(),
                    "memory": pod.series.memory_json(),
                })
            })
            .collect();
        json!({"node": node, "pods": pods})
    }

    /// `/metrics/resource`: the kubelet's resource metrics, Prometheus text.
    pub fn resource_metrics(&self) -> String {
        let snapshot = self.snapshot.lock();
        let mut out = String::new();
        let pods = &snapshot.pods;
        let pod_of = |uid: &str| {
            pods.get(uid)
                .map(|p| (p.namespace.as_str(), p.name.as_str()))
        };
        let mut containers: Vec<&ContainerUsage> = snapshot.containers.values().collect();
        containers.sort_by_key(|c| (pod_of(&c.pod_uid), c.name.clone()));
        let container_labels = |c: &ContainerUsage| {
            let (namespace, pod) = pod_of(&c.pod_uid).unwrap_or(("", ""));
            format!(
                "container=\"{}\",namespace=\"{}\",pod=\"{}\"",
                escape(&c.name),
                escape(namespace),
                escape(pod)
            )
        };
        let mut family =
            |name: &str, help: &str, kind: &str, samples: Vec<(String, String, SystemTime)>| {
                let _ = writeln!(out, "# HELP {name} [STABLE] {help}");
                let _ = writeln!(out, "# TYPE {name} {kind}");
                for (labels, value, at) in samples {
                    let labels = if labels.is_empty() {
                        String::new()
                    } else {
                        format!("{{{labels}}}")
                    };
                    let _ = writeln!(out, "{name}{labels} {value} {}", millis(at));
                }
            };
        family(
            "container_cpu_usage_seconds_total",
            "Cumulative cpu time consumed by the container in core-seconds",
            "counter",
            containers
                .iter()
                .map(|c| {
                    (
                        container_labels(c),
                        seconds(c.series.reading.cpu_ns),
                        c.series.at,
                    )
                })
                .collect(),
        );
        family(
            "container_memory_working_set_bytes",
            "Current working set of the container in bytes",
            "gauge",
            containers
                .iter()
                .map(|c| {
                    (
                        container_labels(c),
                        c.series.reading.working_set.to_string(),
                        c.series.at,
                    )
                })
                .collect(),
        );
        family(
            "container_start_time_seconds",
            "Start time of the container since unix epoch in seconds",
            "gauge",
            containers
                .iter()
                .filter_map(|c| {
                    let started = c.started_at.parse::<jiff::Timestamp>().ok()?;
                    Some((
                        container_labels(c),
                        started.as_second().to_string(),
                        c.series.at,
                    ))
                })
                .collect(),
        );
        let node: Vec<&Series> = snapshot.node.iter().collect();
        family(
            "node_cpu_usage_seconds_total",
            "Cumulative cpu time consumed by the node in core-seconds",
            "counter",
            node.iter()
                .map(|s| (String::new(), seconds(s.reading.cpu_ns), s.at))
                .collect(),
        );
        family(
            "node_memory_working_set_bytes",
            "Current working set of the node in bytes",
            "gauge",
            node.iter()
                .map(|s| (String::new(), s.reading.working_set.to_string(), s.at))
                .collect(),
        );
        let mut pods: Vec<&PodUsage> = snapshot.pods.values().collect();
        pods.sort_by(|a, b| (&a.namespace, &a.name).cmp(&(&b.namespace, &b.name)));
        let pod_labels = |p: &PodUsage| {
            format!(
                "namespace=\"{}\",pod=\"{}\"",
                escape(&p.namespace),
                escape(&p.name)
            )
        };
        family(
            "pod_cpu_usage_seconds_total",
            "Cumulative cpu time consumed by the pod in core-seconds",
            "counter",
            pods.iter()
                .map(|p| (pod_labels(p), seconds(p.series.reading.cpu_ns), p.series.at))
                .collect(),
        );
        family(
            "pod_memory_working_set_bytes",
            "Current working set of the pod in bytes",
            "gauge",
            pods.iter()
                .map(|p| {
                    (
                        pod_labels(p),
                        p.series.reading.working_set.to_string(),
                        p.series.at,
                    )
                })
                .collect(),
        );
        let _ = writeln!(out, "# HELP resource_scrape_error [STABLE] 1 if there was an error while getting container metrics, 0 otherwise");
        let _ = writeln!(out, "# TYPE resource_scrape_error gauge");
        let error = u8::from(self.hierarchies.cpu.is_none() || self.hierarchies.memory.is_none());
        let _ = writeln!(out, "resource_scrape_error {error}");
        out
    }
}

fn seconds(nanos: u64) -> String {
    format!("{:.9}", nanos as f64 / 1e9)
}

/// A Prometheus label value: backslash, quote and newline escaped.
fn escape(value: &str) -> String {
    value
        .replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_is_a_rate_between_two_readings() {
        let start = Instant::now();
        let at = SystemTime::now();
        let first = Series::first(
            Reading {
                cpu_ns: 1_000_000_000,
                ..Reading::default()
            },
            at,
            start,
        );
        assert_eq!(first.nano_cores, None);
        // Half a core over two seconds.
        let second = first.next(
            Reading {
                cpu_ns: 2_000_000_000,
                ..Reading::default()
            },
            at,
            start + Duration::from_secs(2),
        );
        assert_eq!(second.nano_cores, Some(500_000_000));
        // A counter that went back (a new cgroup): no rate, not a huge one.
        let reset = second.next(Reading::default(), at, start + Duration::from_secs(4));
        assert_eq!(reset.nano_cores, None);
    }

    #[test]
    fn reads_the_node_from_proc() {
        let stat = "cpu  100 20 30 1000 50 5 5 0 0 0\ncpu0 1 2 3 4 5 6 7 8 9 10\n";
        let meminfo = "MemTotal:       1000 kB\nMemFree:         200 kB\nMemAvailable:    600 kB\nInactive(file):  300 kB\n";
        let reading = node_reading(stat, meminfo).expect("a reading");
        // user + nice + system + irq + softirq + steal = 160 ticks.
        assert_eq!(reading.cpu_ns, 160 * NANOS_PER_TICK);
        assert_eq!(reading.memory_usage, 800 * 1024);
        assert_eq!(reading.working_set, 500 * 1024);
    }

    #[test]
    fn stat_files_and_label_values() {
        assert_eq!(
            parse_stat("usage_usec 1500\nuser_usec 1000\n", "usage_usec"),
            Some(1500)
        );
        assert_eq!(
            parse_stat("cache 1\ntotal_inactive_file 42\n", "total_inactive_file"),
            Some(42)
        );
        assert_eq!(parse_stat("cache 1\n", "inactive_file"), None);
        assert_eq!(escape("a\"b\\c\nd"), "a\\\"b\\\\c\\nd");
    }
}

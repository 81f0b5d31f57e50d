//! The OCI runtime `config.json` of a container: its process, the pod's
//! namespaces joined by path (network, UTS, IPC) and its own PID and mount
//! namespaces, the default mounts, the pod's files bound in, Docker's
//! default capabilities, and its cgroup with memory and CPU limits.
//! Resource limits (rlimits) are the node's, inherited: raising them past
//! the machine's hard limits fails the start.

use std::path::Path;

use serde_json::{json, Value};

use super::{ContainerConfig, SandboxPaths};

/// Docker's (and containerd's CRI) default capability set.
const CAPABILITIES: &[&str] = &[
    "CAP_CHOWN",
    "CAP_DAC_OVERRIDE",
    "CAP_FSETID",
    "CAP_FOWNER",
    "CAP_MKNOD",
    "CAP_NET_RAW",
    "CAP_SETGID",
    "CAP_SETUID",
    "CAP_SETFCAP",
    "CAP_SETPCAP",
    "CAP_NET_BIND_SERVICE",
    "CAP_SYS_CHROOT",
    "CAP_KILL",
    "CAP_AUDIT_WRITE",
];

/// All capabilities, for privileged containers.
const ALL_CAPABILITIES: &[&str] = &[
    "CAP_AUDIT_CONTROL",
    "CAP_AUDIT_READ",
    "CAP_AUDIT_WRITE",
    "CAP_BLOCK_SUSPEND",
    "CAP_CHOWN",
    "CAP_DAC_OVERRIDE",
    "CAP_DAC_READ_SEARCH",
    "CAP_FOWNER",
    "CAP_FSETID",
    "CAP_IPC_LOCK",
    "CAP_IPC_OWNER",
    "CAP_KILL",
    "CAP_LEASE",
    "CAP_LINUX_IMMUTABLE",
    "CAP_MAC_ADMIN",
    "CAP_MAC_OVERRIDE",
    "CAP_MKNOD",
    "CAP_NET_ADMIN",
    "CAP_NET_BIND_SERVICE",
    "CAP_NET_BROADCAST",
    "CAP_NET_RAW",
    "CAP_SETFCAP",
    "CAP_SETGID",
    "CAP_SETPCAP",
    "CAP_SETUID",
    "CAP_SYS_ADMIN",
    "CAP_SYS_BOOT",
    "CAP_SYS_CHROOT",
    "CAP_SYS_MODULE",
    "CAP_SYS_NICE",
    "CAP_SYS_PACCT",
    "CAP_SYS_PTRACE",
    "CAP_SYS_RAWIO",
    "CAP_SYS_RESOURCE",
    "CAP_SYS_TIME",
    "CAP_SYS_TTY_CONFIG",
    "CAP_SYSLOG",
    "CAP_WAKE_ALARM",
];

/// CFS period for CPU limits, as the kubelet uses.
const CPU_PERIOD: i64 = 100_000;

/// The config of a container with root filesystem `rootfs` in `sandbox`,
/// in cgroup `cgroup` (absolute).
pub fn config(
    rootfs: &Path,
    sandbox: &SandboxPaths,
    container: &ContainerConfig,
    cgroup: &str,
) -> Value {
    let capabilities: Vec<&str> = if container.privileged {
        ALL_CAPABILITIES.to_vec()
    } else {
        CAPABILITIES.to_vec()
    };
    let mut namespaces = vec![
        json!({"type": "pid"}),
        json!({"type": "mount"}),
        json!({"type": "uts", "path": sandbox.uts}),
        json!({"type": "ipc", "path": sandbox.ipc}),
    ];
    if let Some(netns) = &sandbox.netns {
        namespaces.push(json!({"type": "network", "path": netns}));
    }
    let mut mounts = vec![
        json!({"destination": "/proc", "type": "proc", "source": "proc", "options": ["nosuid", "noexec", "nodev"]}),
        json!({"destination": "/dev", "type": "tmpfs", "source": "tmpfs", "options": ["nosuid", "strictatime", "mode=755", "size=65536k"]}),
        json!({"destination": "/dev/pts", "type": "devpts", "source": "devpts", "options": ["nosuid", "noexec", "newinstance", "ptmxmode=0666", "mode=0620", "gid=5"]}),
        json!({"destination": "/dev/shm", "type": "tmpfs", "source": "shm", "options": ["nosuid", "noexec", "nodev", "mode=1777", "size=65536k"]}),
        json!({"destination": "/dev/mqueue", "type": "mqueue", "source": "mqueue", "options": ["nosuid", "noexec", "nodev"]}),
        json!({"destination": "/sys", "type": "sysfs", "source": "sysfs", "options": ["nosuid", "noexec", "nodev", "ro"]}),
        json!({"destination": "/sys/fs/cgroup", "type": "cgroup", "source": "cgroup", "options": ["nosuid", "noexec", "nodev", "relatime", "ro"]}),
    ];
    for (source, destination, read_only) in &container.mounts {
        let mode = if *read_only { "ro" } else { "rw" };
        mounts.push(json!({
            "destination": destination, "type": "bind", "source": source,
            "options": ["rbind", "rprivate", mode]
        }));
    }
    let mut resources = json!({"devices": [{"allow": false, "access": "rwm"}]});
    if let Some(limit) = container.memory_limit {
        resources["memory"] = json!({"limit": limit});
        if container.limit_swap {
            // No swapping past the limit either, as containerd sets it.
            resources["memory"]["swap"] = json!(limit);
        }
    }
    let mut cpu = serde_json::Map::new();
    if let Some(millis) = container.cpu_limit_millis {
        let quota = millis.saturating_mul(CPU_PERIOD) / 1000;
        cpu.insert("quota".into(), json!(quota.max(1000)));
        cpu.insert("period".into(), json!(CPU_PERIOD));
    }
    if let Some(millis) = container.cpu_request_millis {
        // The kubelet's milli-CPU to shares conversion (2 to 262144).
        let shares = (millis.saturating_mul(1024) / 1000).clamp(2, 262_144);
        cpu.insert("shares".into(), json!(shares));
    }
    if !cpu.is_empty() {
        resources["cpu"] = Value::Object(cpu);
    }
    let (uid, gid) = container.user;
    json!({
        "ociVersion": "1.0.2",
        "process": {
            "terminal": container.tty,
            "user": {"uid": uid, "gid": gid},
            "args": container.argv,
            "env": container.env,
            "cwd": if container.working_dir.is_empty() { "/" } else { container.working_dir.as_str() },
            "capabilities": {
                "bounding": capabilities,
                "effective": capabilities,
                "permitted": capabilities,
            },
            "noNewPrivileges": container.no_new_privileges && !container.privileged,
        },
        "root": {"path": rootfs, "readonly": false},
        "mounts": mounts,
        "linux": {
            "cgroupsPath": cgroup,
            "namespaces": namespaces,
            "resources": resources,
            "maskedPaths": if container.privileged { json!([]) } else { json!([
                "/proc/acpi", "/proc/asound", "/proc/kcore", "/proc/keys", "/proc/latency_stats",
                "/proc/timer_list", "/proc/timer_stats", "/proc/sched_debug", "/sys/firmware", "/proc/scsi"
            ]) },
            "readonlyPaths": if container.privileged { json!([]) } else { json!([
                "/proc/bus", "/proc/fs", "/proc/irq", "/proc/sys", "/proc/sysrq-trigger"
            ]) },
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::PathBuf;

    #[test]
    fn joins_the_pod_namespaces_and_sets_limits() {
        let sandbox = SandboxPaths {
            netns: Some(PathBuf::from("/run/netns/portal-x-uid")),
            uts: PathBuf::from("/data/pods/uid/uts"),
            ipc: PathBuf::from("/data/pods/uid/ipc"),
        };
        let container = ContainerConfig {
            argv: vec!["httpd".into(), "-f".into()],
            env: vec!["A=1".into()],
            memory_limit: Some(64 << 20),
            cpu_limit_millis: Some(500),
            cpu_request_millis: Some(250),
            mounts: vec![(
                PathBuf::from("/data/pods/uid/hosts"),
                "/etc/hosts".into(),
                false,
            )],
            ..ContainerConfig::default()
        };
        let config = config(
            Path::new("/data/c/1/rootfs"),
            &sandbox,
            &container,
            "/portal/t/poduid/1",
        );
        let namespaces = &config["linux"]["namespaces"];
        assert!(namespaces
            .as_array()
            .unwrap()
            .contains(&json!({"type": "network", "path": "/run/netns/portal-x-uid"})));
        assert!(namespaces
            .as_array()
            .unwrap()
            .contains(&json!({"type": "pid"})));
        assert_eq!(config["linux"]["resources"]["memory"]["limit"], 64 << 20);
        assert_eq!(config["linux"]["resources"]["cpu"]["quota"], 50_000);
        assert_eq!(config["linux"]["resources"]["cpu"]["shares"], 256);
        assert_eq!(config["process"]["cwd"], "/");
        assert!(config["mounts"]
            .as_array()
            .unwrap()
            .iter()
            .any(|m| m["destination"] == "/etc/hosts"));
        let host = SandboxPaths {
            netns: None,
            ..sandbox
        };
        let config = super::config(Path::new("/r"), &host, &container, "/c");
        assert!(!config["linux"]["namespaces"]
            .as_array()
            .unwrap()
            .iter()
            .any(|n| n["type"] == "network"));
    }
}

//! The parts of an OCI image config a container runs with, and the image
//! user (`1000`, `1000:1000`, `nobody`, `app:app`) resolved to numbers
//! through the image's own `/etc/passwd` and `/etc/group`.

use std::path::Path;

use serde::{Deserialize, Serialize};

/// `config` of an OCI image configuration, as the runtime needs it.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ImageConfig {
    #[serde(default)]
    pub entrypoint: Vec<String>,
    #[serde(default)]
    pub cmd: Vec<String>,
    #[serde(default)]
    pub env: Vec<String>,
    #[serde(default)]
    pub working_dir: String,
    #[serde(default)]
    pub user: String,
    #[serde(default)]
    pub stop_signal: Option<String>,
}

impl ImageConfig {
    /// Reads the `config` section of an image configuration document.
    pub fn from_document(document: &serde_json::Value) -> Self {
        let config = &document["config"];
        let strings = |key: &str| -> Vec<String> {
            config[key]
                .as_array()
                .map(|a| {
                    a.iter()
                        .filter_map(|v| v.as_str().map(str::to_owned))
                        .collect()
                })
                .unwrap_or_default()
        };
        let text = |key: &str| config[key].as_str().unwrap_or_default().to_owned();
        ImageConfig {
            entrypoint: strings("Entrypoint"),
            cmd: strings("Cmd"),
            env: strings("Env"),
            working_dir: text("WorkingDir"),
            user: text("User"),
            stop_signal: config["StopSignal"].as_str().map(str::to_owned),
        }
    }
}

/// The uid and gid of an image's `User` (empty: root).
pub fn resolve_user(rootfs: &Path, user: &str) -> Result<(u32, u32), String> {
    if user.is_empty() {
        return Ok((0, 0));
    }
    let (name, group) = match user.split_once(':') {
        Some((name, group)) => (name, Some(group)),
        None => (user, None),
    };
    let passwd = std::fs::read_to_string(rootfs.join("etc/passwd")).unwrap_or_default();
    let (uid, primary_gid) = match name.parse::<u32>() {
        Ok(uid) => (
            uid,
            lookup(&passwd, |fields| fields.get(2) == Some(&name))
                .and_then(|f| f.get(3).and_then(|g| g.parse().ok()))
                .unwrap_or(0),
        ),
        Err(_) => {
            let fields = lookup(&passwd, |fields| fields.first() == Some(&name))
                .ok_or_else(|| format!("no user {name:?} in the image's /etc/passwd"))?;
            let number = |i: usize| fields.get(i).and_then(|v| v.parse::<u32>().ok());
            (
                number(2).ok_or("malformed /etc/passwd")?,
                number(3).unwrap_or(0),
            )
        }
    };
    let gid = match group {
        None => primary_gid,
        Some(group) => match group.parse::<u32>() {
            Ok(gid) => gid,
            Err(_) => {
                let groups = std::fs::read_to_string(rootfs.join("etc/group")).unwrap_or_default();
                lookup(&groups, |fields| fields.first() == Some(&group))
                    .and_then(|f| f.get(2).and_then(|g| g.parse().ok()))
                    .ok_or_else(|| format!("no group {group:?} in the image's /etc/group"))?
            }
        },
    };
    Ok((uid, gid))
}

fn lookup<'a>(file: &'a str, matches: impl Fn(&[&'a str]) -> bool) -> Option<Vec<&'a str>> {
    file.lines()
        .map(|line| line.split(':').collect::<Vec<_>>())
        .find(|fields| matches(fields))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn config_and_users() {
        let document = serde_json::json!({"config": {"Entrypoint": ["/bin/sh"], "Cmd": ["-c", "x"], "Env": ["PATH=/bin"], "WorkingDir": "/srv", "User": "www"}});
        let config = ImageConfig::from_document(&document);
        assert_eq!(config.entrypoint, ["/bin/sh"]);
        assert_eq!(config.working_dir, "/srv");
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("etc")).unwrap();
        std::fs::write(
            dir.path().join("etc/passwd"),
            "root:x:0:0::/root:/bin/sh\nwww:x:33:34::/srv:/bin/false\n",
        )
        .unwrap();
        std::fs::write(dir.path().join("etc/group"), "root:x:0:\nweb:x:80:\n").unwrap();
        assert_eq!(resolve_user(dir.path(), ""), Ok((0, 0)));
        assert_eq!(resolve_user(dir.path(), "www"), Ok((33, 34)));
        assert_eq!(resolve_user(dir.path(), "www:web"), Ok((33, 80)));
        assert_eq!(resolve_user(dir.path(), "1000:1000"), Ok((1000, 1000)));
        assert!(resolve_user(dir.path(), "nobody").is_err());
    }
}

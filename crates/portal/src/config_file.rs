//! The configuration file, as k3s's: every flag of a command can be set
//! in a YAML map instead of on the command line, under its long name.
//!
//! ```yaml
//! # /etc/portal/config.yaml
//! data-dir: /var/lib/portal/server
//! node-ip: 192.168.1.10
//! api-bind: 0.0.0.0:6443
//! disable: [dns]            # a list: the flag once per item
//! node-external-ip: 203.0.113.7
//! ```
//!
//! The file is `--config FILE`, else `$PORTAL_CONFIG_FILE`, else
//! `/etc/portal/config.yaml` when it exists. Its settings become flags
//! placed before the command line's, and a flag given on the command line
//! wins over the file's (lists too: the command line's replace the file's).
//! One file serves every command: a key that is a flag of another command
//! (`kubeconfig` for `portal proxy`) is left out of the others; a key that
//! is no command's flag is an error, as a misspelt flag is. `portal images`
//! takes none (its `--data-dir` is the agent's directory, not the server's).

use std::ffi::OsString;
use std::path::PathBuf;

use clap::ArgAction;

/// Where the file is when nothing says.
const DEFAULT_PATH: &str = "/etc/portal/config.yaml";

/// The environment variable naming the file.
const ENV: &str = "PORTAL_CONFIG_FILE";

/// The largest file read (a configuration, not data).
const MAX_BYTES: u64 = 1024 * 1024;

/// `args` (the process's, program name first) with the configuration
/// file's settings inserted after the subcommand, and `--config` taken out.
pub(crate) fn apply(args: Vec<OsString>, command: &clap::Command) -> Result<Vec<OsString>, String> {
    let (mut args, given) = take_config_flag(args)?;
    let path = match given {
        Some(path) => Some(path),
        None => match std::env::var_os(ENV) {
            Some(path) if !path.is_empty() => Some(PathBuf::from(path)),
            _ => Some(PathBuf::from(DEFAULT_PATH)).filter(|p| p.exists()),
        },
    };
    let Some(path) = path else {
        return Ok(args);
    };
    // The subcommand chain (`store migrate`): settings go after its end.
    let mut current = command;
    let mut insert_at = 1;
    while let Some(sub) = args
        .get(insert_at)
        .and_then(|a| a.to_str())
        .and_then(|name| current.find_subcommand(name))
    {
        current = sub;
        insert_at += 1;
    }
    // No command to configure (help, version), or one whose flags mean
    // something else: `images import --data-dir` is the agent's directory,
    // not the server's, and the shim is the agent's own.
    if insert_at == 1 || ["shim", "images"].contains(&args[1].to_str().unwrap_or("")) {
        return Ok(args);
    }
    let text = read(&path)?;
    let settings = settings(&text).map_err(|e| format!("{}: {e}", path.display()))?;
    let flags = flags_for(current, command, &settings, &args[insert_at..])
        .map_err(|e| format!("{}: {e}", path.display()))?;
    args.splice(insert_at..insert_at, flags);
    Ok(args)
}

/// Removes `--config FILE` / `--config=FILE` from the arguments.
fn take_config_flag(args: Vec<OsString>) -> Result<(Vec<OsString>, Option<PathBuf>), String> {
    let mut kept = Vec::with_capacity(args.len());
    let mut path = None;
    let mut iter = args.into_iter();
    while let Some(arg) = iter.next() {
        match arg.to_str() {
            Some("--") => {
                kept.push(arg);
                kept.extend(iter.by_ref());
            }
            Some("--config") => {
                let value = iter.next().ok_or("--config needs a file")?;
                path = Some(PathBuf::from(value));
            }
            Some(text) if text.starts_with("--config=") => {
                path = Some(PathBuf::from(&text["--config=".len()..]));
            }
            _ => kept.push(arg),
        }
    }
    Ok((kept, path))
}

fn read(path: &std::path::Path) -> Result<String, String> {
    let size = std::fs::metadata(path)
        .map_err(|e| format!("configuration file {}: {e}", path.display()))?
        .len();
    if size > MAX_BYTES {
        return Err(format!(
            "configuration file {}: {size} bytes, more than {MAX_BYTES}",
            path.display()
        ));
    }
    std::fs::read_to_string(path).map_err(|e| format!("configuration file {}: {e}", path.display()))
}

/// One setting: a flag's long name and its values (none for a switch
/// that is off).
#[derive(Debug, PartialEq)]
struct Setting {
    name: String,
    values: Vec<String>,
    /// A YAML boolean (a switch, or a flag taking true/false).
    boolean: Option<bool>,
}

/// The YAML map's settings, in the file's order.
fn settings(text: &str) -> Result<Vec<Setting>, String> {
    let value: serde_yaml_ng::Value = serde_yaml_ng::from_str(text).map_err(|e| e.to_string())?;
    let map = match value {
        serde_yaml_ng::Value::Null => return Ok(Vec::new()), // empty file
        serde_yaml_ng::Value::Mapping(map) => map,
        _ => return Err("expected a map of flag names to values".into()),
    };
    let mut settings = Vec::with_capacity(map.len());
    for (key, value) in map {
        let name = key
            .as_str()
            .ok_or_else(|| format!("a key that is not a string: {key:?}"))?
            .trim_start_matches("--")
            .replace('_', "-");
        let scalar = |value: &serde_yaml_ng::Value| -> Result<String, String> {
            match value {
                serde_yaml_ng::Value::String(s) => Ok(s.clone()),
                serde_yaml_ng::Value::Number(n) => Ok(n.to_string()),
                serde_yaml_ng::Value::Bool(b) => Ok(b.to_string()),
                other => Err(format!(
                    "{name}: expected a value or a list of values, not {other:?}"
                )),
            }
        };
        let (values, boolean) = match &value {
            serde_yaml_ng::Value::Sequence(items) => {
                (items.iter().map(scalar).collect::<Result<_, _>>()?, None)
            }
            serde_yaml_ng::Value::Bool(b) => (vec![b.to_string()], Some(*b)),
            other => (vec![scalar(other)?], None),
        };
        settings.push(Setting {
            name,
            values,
            boolean,
        });
    }
    Ok(settings)
}

/// The flags `settings` stand for in `command`; `root` knows every
/// command's flags (for telling another command's from a misspelt one).
fn flags_for(
    command: &clap::Command,
    root: &clap::Command,
    settings: &[Setting],
    command_line: &[OsString],
) -> Result<Vec<OsString>, String> {
    let mut flags = Vec::new();
    for setting in settings {
        let Some(arg) = command
            .get_arguments()
            .find(|a| a.get_long() == Some(setting.name.as_str()))
        else {
            if any_command_has(root, &setting.name) {
                continue; // another command's setting
            }
            return Err(format!(
                "`{}` is not a flag of any portal command (see `portal {} --help`)",
                setting.name,
                command.get_name()
            ));
        };
        let flag = format!("--{}", setting.name);
        // The command line wins (by any of the flag's names).
        if given(arg, command_line) {
            continue;
        }
        match arg.get_action() {
            ArgAction::SetTrue => match setting.boolean {
                Some(true) => flags.push(OsString::from(&flag)),
                Some(false) => {}
                None => return Err(format!("{}: a switch: true or false", setting.name)),
            },
            ArgAction::SetFalse => match setting.boolean {
                Some(false) => flags.push(OsString::from(&flag)),
                Some(true) => {}
                None => return Err(format!("{}: a switch: true or false", setting.name)),
            },
            ArgAction::Append => {
                for value in &setting.values {
                    flags.push(OsString::from(format!("{flag}={value}")));
                }
            }
            _ => match setting.values.as_slice() {
                [value] => flags.push(OsString::from(format!("{flag}={value}"))),
                _ => return Err(format!("{}: takes one value, not a list", setting.name)),
            },
        }
    }
    Ok(flags)
}

/// Whether the command line gives `arg`: `--name`, `--name=…`, an alias,
/// or its short form (`-n`, `-nVALUE`).
fn given(arg: &clap::Arg, command_line: &[OsString]) -> bool {
    let longs: Vec<String> = arg
        .get_long()
        .into_iter()
        .chain(arg.get_all_aliases().unwrap_or_default())
        .map(|name| format!("--{name}"))
        .collect();
    let shorts: Vec<String> = arg
        .get_short()
        .into_iter()
        .chain(arg.get_all_short_aliases().unwrap_or_default())
        .map(|c| format!("-{c}"))
        .collect();
    command_line.iter().filter_map(|a| a.to_str()).any(|a| {
        longs
            .iter()
            .any(|long| a == long || a.starts_with(&format!("{long}=")))
            || (!a.starts_with("--") && shorts.iter().any(|short| a.starts_with(short.as_str())))
    })
}

fn any_command_has(command: &clap::Command, name: &str) -> bool {
    command.get_arguments().any(|a| a.get_long() == Some(name))
        || command.get_subcommands().any(|c| any_command_has(c, name))
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::{Arg, Command};

    fn root() -> Command {
        Command::new("portal")
            .subcommand(
                Command::new("server")
                    .arg(Arg::new("data-dir").long("data-dir"))
                    .arg(Arg::new("node-ip").long("node-ip"))
                    .arg(
                        Arg::new("disable")
                            .long("disable")
                            .action(ArgAction::Append),
                    )
                    .arg(
                        Arg::new("verbose")
                            .long("verbose")
                            .action(ArgAction::SetTrue),
                    ),
            )
            .subcommand(Command::new("node").arg(Arg::new("token-file").long("token-file")))
            .subcommand(
                Command::new("store")
                    .subcommand(Command::new("migrate").arg(Arg::new("from").long("from"))),
            )
    }

    fn with_file(text: &str, args: &[&str]) -> Result<Vec<String>, String> {
        let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
        let file = dir.path().join("config.yaml");
        std::fs::write(&file, text).map_err(|e| e.to_string())?;
        let mut all: Vec<OsString> = vec!["portal".into()];
        all.extend(args.iter().map(OsString::from));
        all.push(format!("--config={}", file.display()).into());
        Ok(apply(all, &root())?
            .into_iter()
            .map(|a| a.to_string_lossy().into_owned())
            .collect())
    }

    #[test]
    fn settings_become_flags_after_the_command_and_the_command_line_wins() {
        let text = "data-dir: /var/lib/portal\nnode-ip: 10.0.0.1\ndisable: [dns, proxy]\nverbose: true\ntoken-file: /t\n";
        assert_eq!(
            with_file(text, &["server", "--node-ip", "10.0.0.2"]).expect("applies"),
            [
                "portal",
                "server",
                "--data-dir=/var/lib/portal",
                "--disable=dns",
                "--disable=proxy",
                "--verbose",
                "--node-ip",
                "10.0.0.2"
            ]
        );
        // `token-file` is `portal node`'s; `server` leaves it out.
        assert_eq!(
            with_file("token-file: /t\n", &["node"]).expect("applies"),
            ["portal", "node", "--token-file=/t"]
        );
    }

    #[test]
    fn a_short_flag_wins_and_images_is_left_alone() {
        let root = || {
            Command::new("portal")
                .subcommand(
                    Command::new("server").arg(Arg::new("node-ip").long("node-ip").short('n')),
                )
                .subcommand(Command::new("images").arg(Arg::new("data-dir").long("data-dir")))
        };
        let dir = tempfile::tempdir().expect("a temporary directory");
        let file = dir.path().join("c.yaml");
        std::fs::write(&file, "node-ip: 10.0.0.1\ndata-dir: /srv\n").expect("written");
        let run = |args: &[&str]| {
            let mut all: Vec<OsString> = vec!["portal".into()];
            all.extend(args.iter().map(OsString::from));
            all.push(format!("--config={}", file.display()).into());
            apply(all, &root()).expect("applies")
        };
        assert_eq!(
            run(&["server", "-n", "10.0.0.2"]),
            ["portal", "server", "-n", "10.0.0.2"]
        );
        assert_eq!(run(&["images"]), ["portal", "images"]);
    }

    #[test]
    fn nested_commands_switches_off_and_empty_files() {
        assert_eq!(
            with_file("from: /d\n", &["store", "migrate"]).expect("applies"),
            ["portal", "store", "migrate", "--from=/d"]
        );
        assert_eq!(
            with_file("verbose: false\n", &["server"]).expect("applies"),
            ["portal", "server"]
        );
        assert_eq!(
            with_file("", &["server"]).expect("applies"),
            ["portal", "server"]
        );
    }

    #[test]
    fn mistakes_are_named() {
        let unknown = with_file("nod-ip: 1.2.3.4\n", &["server"]).expect_err("refused");
        assert!(
            unknown.contains("`nod-ip` is not a flag of any portal command"),
            "{unknown}"
        );
        let list = with_file("node-ip: [a, b]\n", &["server"]).expect_err("refused");
        assert!(list.contains("takes one value"), "{list}");
        let switch = with_file("verbose: yes please\n", &["server"]).expect_err("refused");
        assert!(switch.contains("a switch"), "{switch}");
        let not_a_map = with_file("- a\n", &["server"]).expect_err("refused");
        assert!(not_a_map.contains("expected a map"), "{not_a_map}");
    }
}

//! How an exec or attach ended, as the error stream tells the client: a
//! JSON `Status` from protocol v4 on (`NonZeroExitCode` with the code as
//! its cause, which kubectl turns into its own exit code), a plain message
//! before.

use crate::Version;

/// How a command ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// It ran and exited with this code.
    Exited(i32),
    /// It could not run (or the session failed): why.
    Failed(String),
}

impl Outcome {
    /// What goes on the error stream; `None` for nothing at all.
    pub fn encode(&self, version: Version) -> Option<Vec<u8>> {
        if version < Version::V4 {
            return match self {
                Outcome::Exited(0) => None,
                Outcome::Exited(code) => Some(
                    format!("command terminated with non-zero exit code: exit status {code}")
                        .into_bytes(),
                ),
                Outcome::Failed(why) => Some(why.clone().into_bytes()),
            };
        }
        let status = match self {
            Outcome::Exited(0) => serde_json::json!({"metadata": {}, "status": "Success"}),
            Outcome::Exited(code) => serde_json::json!({
                "metadata": {},
                "status": "Failure",
                "message": format!("command terminated with non-zero exit code: exit status {code}"),
                "reason": "NonZeroExitCode",
                "details": {"causes": [{"reason": "ExitCode", "message": code.to_string()}]},
            }),
            Outcome::Failed(why) => serde_json::json!({
                "metadata": {},
                "status": "Failure",
                "message": why,
                "reason": "InternalError",
                "code": 500,
            }),
        };
        serde_json::to_vec(&status).ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exit_codes_as_kubectl_reads_them() {
        let json: serde_json::Value =
            serde_json::from_slice(&Outcome::Exited(3).encode(Version::V4).unwrap()).unwrap();
        assert_eq!(json["reason"], "NonZeroExitCode");
        assert_eq!(json["details"]["causes"][0]["reason"], "ExitCode");
        assert_eq!(json["details"]["causes"][0]["message"], "3");
        let ok: serde_json::Value =
            serde_json::from_slice(&Outcome::Exited(0).encode(Version::V5).unwrap()).unwrap();
        assert_eq!(ok["status"], "Success");
        assert_eq!(Outcome::Exited(0).encode(Version::V2), None);
        assert!(Outcome::Failed("no".into()).encode(Version::V1).is_some());
    }
}

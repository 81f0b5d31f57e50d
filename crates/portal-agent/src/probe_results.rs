//! What probes found, as the kubelet's `prober/results`: the kinds of
//! probe, their outcomes and the verdict on one container instance. The
//! prober writes them; the pod workers and the status manager read them,
//! without depending on the prober.

use k8s_openapi::api::core::v1::{Container, Probe};

/// Which probe.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Kind {
    Readiness,
    Liveness,
    Startup,
}

impl Kind {
    pub(crate) fn label(self) -> &'static str {
        match self {
            Kind::Readiness => "Readiness",
            Kind::Liveness => "Liveness",
            Kind::Startup => "Startup",
        }
    }

    pub(crate) fn of(self, container: &Container) -> Option<&Probe> {
        match self {
            Kind::Readiness => container.readiness_probe.as_ref(),
            Kind::Liveness => container.liveness_probe.as_ref(),
            Kind::Startup => container.startup_probe.as_ref(),
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Outcome {
    Success,
    Failure,
}

/// What the probes say of one container instance.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Verdict {
    /// Started (no startup probe, or it succeeded).
    pub started: bool,
    /// Ready to serve (started, and no readiness probe or it succeeds).
    pub ready: bool,
    /// Liveness or startup failed: to be restarted.
    pub failed: Option<Kind>,
}

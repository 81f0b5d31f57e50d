//! Leader election on a `coordination.k8s.io/v1` Lease, as client-go's
//! `leaderelection` (kube-controller-manager's `--leader-elect`): of every
//! process campaigning for one Lease, one does the work at a time; when it
//! dies, another takes over once the lease has run out.
//!
//! Expiry is judged by this process's own clock, from when it last saw the
//! Lease change (client-go's `observedTime`), never by comparing clocks of
//! different machines. Writes are compare-and-swap on `resourceVersion`, so
//! two candidates can never both think they hold it.

use std::future::Future;
use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use kube::api::{Api, ObjectMeta, PostParams};
use kube::Client;

/// What to campaign for, and the timing (client-go's defaults are 15 s /
/// 10 s / 2 s).
#[derive(Clone, Debug)]
pub struct Election {
    pub namespace: String,
    /// The Lease's name: one per kind of work (`portal-controllers`, …).
    pub name: String,
    /// This candidate, unique among all of them (host name and a random
    /// part, as client-go does).
    pub identity: String,
    /// How long a lease not renewed keeps others out.
    pub lease_duration: Duration,
    /// A leader that cannot renew for this long stops working (before
    /// others may take over: shorter than `lease_duration`).
    pub renew_deadline: Duration,
    /// How often to renew, and to try again while not leading.
    pub retry_period: Duration,
}

impl Election {
    /// An election with client-go's timing and a unique identity.
    pub fn new(namespace: &str, name: &str) -> Self {
        Election {
            namespace: namespace.to_owned(),
            name: name.to_owned(),
            identity: unique_identity(),
            lease_duration: Duration::from_secs(15),
            renew_deadline: Duration::from_secs(10),
            retry_period: Duration::from_secs(2),
        }
    }
}

/// `<host name>_<random>`: what client-go's callers use.
pub fn unique_identity() -> String {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_owned())
        .unwrap_or_else(|_| "portal".into());
    format!("{host}_{:016x}", rand::random::<u64>())
}

/// Campaigns for ever: runs `work` while this process leads, and stops it
/// (drops its task) as soon as it cannot renew in time.
pub async fn lead<F, Fut>(client: Client, election: Election, work: F)
where
    F: Fn() -> Fut,
    Fut: Future<Output = ()> + Send + 'static,
{
    let leases: Api<Lease> = Api::namespaced(client, &election.namespace);
    let mut candidate = Candidate::new(election);
    loop {
        let acquired = candidate.acquire(&leases).await;
        tracing::info!(lease = %candidate.election.name, identity = %candidate.election.identity, "became leader");
        let mut task = tokio::spawn(work());
        tokio::select! {
            () = candidate.keep(&leases, acquired) => {
                task.abort();
                let _ = (&mut task).await;
                tracing::warn!(lease = %candidate.election.name, "lost the lease; stopped leading");
            }
            ended = &mut task => {
                // The work stopped on its own (a panic): start it again, if
                // this candidate still leads.
                tracing::error!(lease = %candidate.election.name, ?ended, "the leader's work stopped; starting again");
            }
        }
    }
}

/// One candidate's view of the Lease.
struct Candidate {
    election: Election,
    /// The Lease as last seen, and when (by this process's clock) it last
    /// changed.
    observed: Option<(Lease, Instant)>,
    /// The last reason an attempt failed, said once.
    last_failure: Option<String>,
}

fn micro_now() -> MicroTime {
    MicroTime(k8s_openapi::jiff::Timestamp::now())
}

impl Candidate {
    fn new(election: Election) -> Self {
        Candidate {
            election,
            observed: None,
            last_failure: None,
        }
    }

    /// Returns once this candidate holds the Lease: when the request that
    /// took it was sent.
    async fn acquire(&mut self, leases: &Api<Lease>) -> Instant {
        loop {
            let sent = Instant::now();
            let deadline = self.election.renew_deadline;
            match tokio::time::timeout(deadline, self.try_acquire_or_renew(leases)).await {
                Ok(Ok(true)) => return sent,
                Ok(Ok(false)) => {}
                Ok(Err(error)) => self.failed(&error.to_string()),
                Err(_) => self.failed("no answer in time"),
            }
            tokio::time::sleep(self.election.retry_period).await;
        }
    }

    /// Renews until someone else holds the Lease or no renewal succeeded
    /// for `renew_deadline`, counted from when the last good renewal was
    /// sent: no attempt may outlive it, so this candidate stops before any
    /// other may start (`renew_deadline` < `lease_duration`).
    async fn keep(&mut self, leases: &Api<Lease>, acquired: Instant) {
        let mut renewed = acquired;
        loop {
            tokio::time::sleep(self.election.retry_period).await;
            let left = self
                .election
                .renew_deadline
                .saturating_sub(renewed.elapsed());
            if left.is_zero() {
                return;
            }
            let sent = Instant::now();
            match tokio::time::timeout(left, self.try_acquire_or_renew(leases)).await {
                Ok(Ok(true)) => renewed = sent,
                // Someone else holds it now: stop at once.
                Ok(Ok(false)) => return,
                Ok(Err(error)) => self.failed(&error.to_string()),
                Err(_) => return,
            }
        }
    }

    /// Says why an attempt failed, once per distinct reason (a candidate
    /// that can never reach its Lease must not be silent, nor flood).
    fn failed(&mut self, why: &str) {
        if self.last_failure.as_deref() != Some(why) {
            tracing::warn!(lease = %self.election.name, error = why, "leader election: cannot reach the Lease");
            self.last_failure = Some(why.to_owned());
        }
    }

    /// One attempt: takes the Lease if it is free, ours, or expired;
    /// `Ok(false)` if someone else holds it.
    async fn try_acquire_or_renew(&mut self, leases: &Api<Lease>) -> Result<bool, kube::Error> {
        let name = self.election.name.clone();
        let identity = self.election.identity.clone();
        let duration = i32::try_from(self.election.lease_duration.as_secs()).unwrap_or(i32::MAX);
        let Some(current) = leases.get_opt(&name).await? else {
            let lease = Lease {
                metadata: ObjectMeta {
                    name: Some(name.clone()),
                    namespace: Some(self.election.namespace.clone()),
                    ..ObjectMeta::default()
                },
                spec: Some(LeaseSpec {
                    holder_identity: Some(identity),
                    lease_duration_seconds: Some(duration),
                    acquire_time: Some(micro_now()),
                    renew_time: Some(micro_now()),
                    lease_transitions: Some(0),
                    ..LeaseSpec::default()
                }),
            };
            return match leases.create(&PostParams::default(), &lease).await {
                Ok(created) => {
                    self.observed = Some((created, Instant::now()));
                    Ok(true)
                }
                Err(kube::Error::Api(status)) if status.code == 409 => Ok(false),
                Err(error) => Err(error),
            };
        };
        // Note when the record changed, by our clock.
        let changed = self.observed.as_ref().is_none_or(|(seen, _)| {
            seen.metadata.resource_version != current.metadata.resource_version
        });
        if changed {
            self.observed = Some((current.clone(), Instant::now()));
        }
        let spec = current.spec.clone().unwrap_or_default();
        let holder = spec.holder_identity.clone().unwrap_or_default();
        let ours = holder == identity;
        let held_for = spec
            .lease_duration_seconds
            .map_or(self.election.lease_duration, |s| {
                Duration::from_secs(u64::try_from(s).unwrap_or(0))
            });
        let expired = self
            .observed
            .as_ref()
            .is_some_and(|(_, at)| at.elapsed() >= held_for);
        if !ours && !holder.is_empty() && !expired {
            return Ok(false);
        }
        let mut next = current.clone();
        let spec = next.spec.get_or_insert_with(LeaseSpec::default);
        if !ours {
            spec.acquire_time = Some(micro_now());
            spec.lease_transitions = Some(spec.lease_transitions.unwrap_or(0) + 1);
        }
        spec.holder_identity = Some(identity);
        spec.lease_duration_seconds = Some(duration);
        spec.renew_time = Some(micro_now());
        // `replace` carries the resourceVersion read: a competing write in
        // between makes this one fail with 409, never both succeed.
        match leases.replace(&name, &PostParams::default(), &next).await {
            Ok(written) => {
                self.observed = Some((written, Instant::now()));
                Ok(true)
            }
            Err(kube::Error::Api(status)) if status.code == 409 => Ok(false),
            Err(error) => Err(error),
        }
    }
}

/// Gives the Lease up if this candidate holds it (at a clean stop), so that
/// another takes over at once instead of after the lease duration
/// (client-go's `ReleaseOnCancel`).
pub async fn release(client: Client, election: &Election) -> Result<(), kube::Error> {
    let leases: Api<Lease> = Api::namespaced(client, &election.namespace);
    let Some(mut lease) = leases.get_opt(&election.name).await? else {
        return Ok(());
    };
    let spec = lease.spec.get_or_insert_with(LeaseSpec::default);
    if spec.holder_identity.as_deref() != Some(election.identity.as_str()) {
        return Ok(());
    }
    spec.holder_identity = None;
    spec.lease_duration_seconds = Some(1);
    spec.renew_time = Some(micro_now());
    leases
        .replace(&election.name, &PostParams::default(), &lease)
        .await
        .map(drop)
}

//! Starting one container instance: the image by its pull policy (with
//! back-off and the kubelet's events and waiting reasons), the process
//! (environment, argv, user, limits, the pod's files), then the runtime.

use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Container, Pod};

use super::{Context, Place};
use crate::backoff::Backoff;
use crate::env::{self, PodFacts};
use crate::images::Image;
use crate::images::{self, PullPolicy, PullSecret};
use crate::runtime::{ContainerConfig, ContainerMeta, Runtime, State};
use crate::status::Waiting;

/// Why the container did not start now; the worker tries again later.
#[derive(Debug)]
pub(super) enum StartFailure {
    Waiting(Waiting),
}

/// A `Failed` event (`Error: …`, as the kubelet words it) and the reason
/// the container waits.
async fn failed<R: Runtime>(
    ctx: &Context<R>,
    pod: &Pod,
    name: &str,
    reason: &str,
    message: String,
) -> StartFailure {
    ctx.event(
        pod,
        Some(name),
        "Warning",
        "Failed",
        &format!("Error: {message}"),
    )
    .await;
    waiting(reason, message)
}

fn waiting(reason: &str, message: impl Into<String>) -> StartFailure {
    StartFailure::Waiting(Waiting {
        reason: reason.into(),
        message: message.into(),
    })
}

pub(super) async fn start<R: Runtime>(
    ctx: &Arc<Context<R>>,
    backoff: &mut Backoff,
    pod: &Arc<Pod>,
    container: &Container,
    place: &Place<'_>,
    attempt: u32,
) -> Result<(Duration, String), StartFailure> {
    let name = container.name.as_str();
    let began = Instant::now();
    let (image, pulled) = image(ctx, backoff, pod, container, place.objects).await?;
    let pulling = if pulled {
        began.elapsed()
    } else {
        Duration::ZERO
    };
    // The termination message: a file of this instance, bound in.
    let uid = pod.metadata.uid.clone().unwrap_or_default();
    let message_file = ctx
        .pods_dir
        .join(&uid)
        .join("termination")
        .join(format!("{name}-{attempt}"));
    let message_path = container
        .termination_message_path
        .clone()
        .filter(|p| p.starts_with('/'))
        .unwrap_or_else(|| "/dev/termination-log".into());
    let made = message_file
        .parent()
        .map(std::fs::create_dir_all)
        .unwrap_or(Ok(()))
        .and_then(|()| std::fs::write(&message_file, b""));
    if let Err(error) = made {
        return Err(waiting(
            "CreateContainerError",
            format!("{}: {error}", message_file.display()),
        ));
    }
    let config = match process(ctx, pod, container, &image, place).map(|mut config| {
        config
            .mounts
            .push((message_file.clone(), message_path, false));
        config
    }) {
        Ok(config) => config,
        Err(message) => {
            return Err(failed(ctx, pod, name, "CreateContainerConfigError", message).await)
        }
    };
    let meta = ContainerMeta {
        pod_uid: pod.metadata.uid.clone().unwrap_or_default(),
        pod_namespace: pod.metadata.namespace.clone().unwrap_or_default(),
        pod_name: pod.metadata.name.clone().unwrap_or_default(),
        name: name.to_owned(),
        attempt,
        image: container.image.clone().unwrap_or_default(),
        image_id: image.id.clone(),
        created_at: crate::durable::now(),
        log_path: ctx.log_path(pod, name, attempt),
        stop_signal: image.config.stop_signal.clone(),
        termination_message: Some(message_file),
    };
    let id = match ctx
        .runtime
        .start_container(place.sandbox, meta, &image, &config)
        .await
    {
        Ok(id) => id,
        Err(error) => {
            return Err(failed(ctx, pod, name, "CreateContainerError", error.to_string()).await)
        }
    };
    ctx.event(
        pod,
        Some(name),
        "Normal",
        "Created",
        &format!("Created container {name}"),
    )
    .await;
    let state = ctx
        .runtime
        .containers()
        .into_iter()
        .find(|c| c.id == id)
        .map(|c| c.state);
    match state {
        Some(State::Exited { exit, .. }) if exit.reason == "StartError" => {
            ctx.event(
                pod,
                Some(name),
                "Warning",
                "Failed",
                &format!("Error: {}", exit.message),
            )
            .await;
        }
        _ => {
            ctx.event(
                pod,
                Some(name),
                "Normal",
                "Started",
                &format!("Started container {name}"),
            )
            .await;
            ctx.metrics.container_started();
        }
    }
    Ok((pulling, id))
}

/// The container's image as its pull policy says, with the kubelet's
/// events: Pulling/Pulled, Failed + ErrImagePull, then BackOff +
/// ImagePullBackOff while the back-off lasts. `true` when it was pulled.
async fn image<R: Runtime>(
    ctx: &Arc<Context<R>>,
    backoff: &mut Backoff,
    pod: &Arc<Pod>,
    container: &Container,
    objects: &crate::objects::Objects,
) -> Result<(Image, bool), StartFailure> {
    let name = container.name.as_str();
    let reference = container.image.clone().unwrap_or_default();
    let key = format!("image:{name}");
    let policy = PullPolicy::of(container.image_pull_policy.as_deref(), &reference);
    if policy != PullPolicy::Always {
        if let Some(image) = ctx.images.present(&reference) {
            ctx.event(
                pod,
                Some(name),
                "Normal",
                "Pulled",
                &format!("Container image \"{reference}\" already present on machine"),
            )
            .await;
            return Ok((image, false));
        }
    }
    if policy == PullPolicy::Never {
        let message =
            format!("Container image \"{reference}\" is not present with pull policy of Never");
        ctx.event(pod, Some(name), "Warning", "ErrImageNeverPull", &message)
            .await;
        return Err(waiting("ErrImageNeverPull", message));
    }
    if backoff.remaining(&key, Instant::now()).is_some() {
        let message = format!("Back-off pulling image \"{reference}\"");
        ctx.event(pod, Some(name), "Normal", "BackOff", &message)
            .await;
        return Err(waiting("ImagePullBackOff", message));
    }
    ctx.event(
        pod,
        Some(name),
        "Normal",
        "Pulling",
        &format!("Pulling image \"{reference}\""),
    )
    .await;
    let began = Instant::now();
    // The pod's pull secrets that exist (a missing one is passed over, as
    // the kubelet does: the pull may still work without it).
    let entries: Vec<(String, std::collections::BTreeMap<String, Vec<u8>>)> = pod
        .spec
        .iter()
        .flat_map(|s| s.image_pull_secrets.iter().flatten())
        .filter_map(|r| {
            let secret = objects.secrets.get(&r.name)?.as_ref()?;
            Some((
                secret.type_.clone().unwrap_or_default(),
                objects.secret(&r.name)?,
            ))
        })
        .collect();
    let secrets: Vec<PullSecret<'_>> = entries
        .iter()
        .map(|(secret_type, data)| PullSecret { secret_type, data })
        .collect();
    match ctx.images.pull(&reference, &secrets).await {
        Ok(image) => {
            backoff.reset(&key);
            let took = began.elapsed();
            ctx.event(
                pod,
                Some(name),
                "Normal",
                "Pulled",
                &format!(
                    "Successfully pulled image \"{reference}\" in {}",
                    seconds(took)
                ),
            )
            .await;
            Ok((image, true))
        }
        Err(error) => {
            backoff.fail(&key, Instant::now());
            let message = format!("Failed to pull image \"{reference}\": {error}");
            ctx.event(pod, Some(name), "Warning", "Failed", &message)
                .await;
            ctx.event(pod, Some(name), "Warning", "Failed", "Error: ErrImagePull")
                .await;
            Err(waiting("ErrImagePull", message))
        }
    }
}

fn seconds(took: Duration) -> String {
    format!("{:.3}s", took.as_secs_f64())
}

/// The process of the container: environment, argv, user, limits, mounts.
fn process<R: Runtime>(
    ctx: &Arc<Context<R>>,
    pod: &Pod,
    container: &Container,
    image: &Image,
    place: &Place<'_>,
) -> Result<ContainerConfig, String> {
    let (files, pod_ip) = (place.files, place.pod_ip);
    let spec = pod.spec.clone().unwrap_or_default();
    let namespace = pod.metadata.namespace.as_deref().unwrap_or("default");
    let services = ctx.service_environment(namespace, spec.enable_service_links != Some(false));
    let facts = PodFacts {
        pod_ip: pod_ip.to_owned(),
        pod_ips: place.pod_ips.to_vec(),
        host_ip: ctx.me.ip.to_string(),
    };
    let mut environment = env::environment(
        pod,
        container,
        &image.config.env,
        &services,
        &facts,
        place.objects,
    )
    .map_err(|e| e.to_string())?;
    if environment.get("HOSTNAME").is_none() {
        environment.set("HOSTNAME", crate::files::hostname(pod));
    }
    // As containerd does for a container on a terminal.
    if container.tty == Some(true) && environment.get("TERM").is_none() {
        environment.set("TERM", "xterm".to_owned());
    }
    let argv = env::argv(
        container,
        &image.config.entrypoint,
        &image.config.cmd,
        &environment,
    )
    .map_err(|e| e.to_string())?;
    let security = container.security_context.clone().unwrap_or_default();
    let pod_security = spec.security_context.clone().unwrap_or_default();
    let (image_uid, image_gid) = images::resolve_user(&image.rootfs, &image.config.user)
        .map_err(|e| format!("image user {:?}: {e}", image.config.user))?;
    let uid = security
        .run_as_user
        .or(pod_security.run_as_user)
        .map_or(image_uid, |u| u32::try_from(u).unwrap_or(image_uid));
    let gid = security
        .run_as_group
        .or(pod_security.run_as_group)
        .map_or(image_gid, |g| u32::try_from(g).unwrap_or(image_gid));
    if security.run_as_non_root.or(pod_security.run_as_non_root) == Some(true) && uid == 0 {
        return Err("container has runAsNonRoot and image will run as root".into());
    }
    let resources = container.resources.clone().unwrap_or_default();
    let limit = |name: &str| {
        resources
            .limits
            .as_ref()
            .and_then(|l| l.get(name))
            .map(|q| q.0.clone())
    };
    let request = |name: &str| {
        resources
            .requests
            .as_ref()
            .and_then(|r| r.get(name))
            .map(|q| q.0.clone())
            .or_else(|| limit(name))
    };
    let memory_limit = match limit("memory") {
        Some(text) => Some(
            portal_api::quantity::bytes(&text)
                .ok_or(format!("memory limit {text:?} is not a quantity"))?,
        ),
        None => None,
    };
    let cpu_limit_millis = limit("cpu").and_then(|t| portal_api::quantity::millicores(&t));
    let cpu_request_millis = request("cpu").and_then(|t| portal_api::quantity::millicores(&t));
    // The volumes first, the managed files over them (as the kubelet
    // orders them).
    let mut mounts = crate::volumes::mounts(container, place.volumes, &environment)?;
    if let Some(hosts) = &files.hosts {
        mounts.push((hosts.clone(), "/etc/hosts".to_owned(), false));
    }
    mounts.push((
        files.resolv_conf.clone(),
        "/etc/resolv.conf".to_owned(),
        false,
    ));
    mounts.push((files.hostname.clone(), "/etc/hostname".to_owned(), false));
    Ok(ContainerConfig {
        argv,
        env: environment.to_strings(),
        working_dir: container
            .working_dir
            .clone()
            .filter(|w| !w.is_empty())
            .unwrap_or_else(|| image.config.working_dir.clone()),
        user: (uid, gid),
        memory_limit,
        cpu_limit_millis,
        cpu_request_millis,
        mounts,
        host_network: spec.host_network == Some(true),
        privileged: security.privileged == Some(true),
        no_new_privileges: security.allow_privilege_escalation == Some(false),
        limit_swap: swap_accounted(),
        stdin: container.stdin == Some(true),
        stdin_once: container.stdin_once == Some(true),
        tty: container.tty == Some(true),
    })
}

/// Whether the node's memory cgroups account swap (v1 `memsw`, v2 `swap.max`).
fn swap_accounted() -> bool {
    std::path::Path::new("/sys/fs/cgroup/memory/memory.memsw.limit_in_bytes").exists()
        || std::fs::read_to_string("/sys/fs/cgroup/cgroup.subtree_control")
            .is_ok_and(|c| c.split_whitespace().any(|c| c == "memory"))
}

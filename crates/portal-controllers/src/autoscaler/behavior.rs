//! `spec.behavior`, as kube-controller-manager applies it to a
//! recommendation: stabilization (scale down only to the highest count
//! recommended within the scale-down window, up only to the lowest within
//! the scale-up window), then the rate policies (how many pods, or what
//! percent, may be added or removed per period, counting the scalings
//! already made in it), then the minimum and maximum.

use std::time::{Duration, Instant};

use k8s_openapi::api::autoscaling::v2::{
    HPAScalingPolicy, HPAScalingRules, HorizontalPodAutoscalerBehavior,
};

/// The rules Kubernetes uses where `spec.behavior` says nothing.
fn default_rules(up: bool) -> HPAScalingRules {
    let policy = |type_: &str, value: i32| HPAScalingPolicy {
        type_: type_.into(),
        value,
        period_seconds: 15,
    };
    if up {
        HPAScalingRules {
            stabilization_window_seconds: Some(0),
            select_policy: Some("Max".into()),
            policies: Some(vec![policy("Pods", 4), policy("Percent", 100)]),
            tolerance: None,
        }
    } else {
        HPAScalingRules {
            stabilization_window_seconds: Some(300),
            select_policy: Some("Max".into()),
            policies: Some(vec![policy("Percent", 100)]),
            tolerance: None,
        }
    }
}

/// The scale-up and scale-down rules, defaults filled in.
pub(crate) fn rules(
    behavior: Option<&HorizontalPodAutoscalerBehavior>,
) -> (HPAScalingRules, HPAScalingRules) {
    let fill = |given: Option<&HPAScalingRules>, up: bool| {
        let defaults = default_rules(up);
        match given {
            None => defaults,
            Some(given) => HPAScalingRules {
                stabilization_window_seconds: given
                    .stabilization_window_seconds
                    .or(defaults.stabilization_window_seconds),
                select_policy: given.select_policy.clone().or(defaults.select_policy),
                policies: given.policies.clone().or(defaults.policies),
                tolerance: given.tolerance.clone(),
            },
        }
    };
    (
        fill(behavior.and_then(|b| b.scale_up.as_ref()), true),
        fill(behavior.and_then(|b| b.scale_down.as_ref()), false),
    )
}

/// One autoscaler's memory: its recent recommendations and scalings.
#[derive(Debug)]
pub(crate) struct History {
    recommendations: Vec<(Instant, i32)>,
    /// When, and by how many replicas (positive up, negative down).
    scalings: Vec<(Instant, i32)>,
    /// The last full sync (status writes wake the controller in between).
    pub(crate) synced: Option<Instant>,
    /// Last looked at (histories of deleted autoscalers are dropped).
    pub(crate) seen: Instant,
}

impl History {
    /// A new autoscaler's history starts with the count it found, as
    /// upstream's: a restart of the controller must not skip the
    /// scale-down window.
    pub(crate) fn starting_at(now: Instant, current: i32) -> Self {
        History {
            recommendations: vec![(now, current)],
            scalings: Vec::new(),
            synced: None,
            seen: now,
        }
    }
}

/// Why the count was held back, for the `ScalingLimited` condition.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Limited {
    None,
    TooFewReplicas,
    TooManyReplicas,
    ScaleUpLimit,
    ScaleDownLimit,
}

impl History {
    /// The count to scale to from `current`, given this sync's
    /// recommendation `desired`; remembers the recommendation.
    pub(crate) fn normalize(
        &mut self,
        now: Instant,
        current: i32,
        desired: i32,
        (up, down): &(HPAScalingRules, HPAScalingRules),
        (min, max): (i32, i32),
    ) -> (i32, Limited) {
        let window = |rules: &HPAScalingRules| {
            Duration::from_secs(
                u64::try_from(rules.stabilization_window_seconds.unwrap_or(0)).unwrap_or(0),
            )
        };
        let (up_window, down_window) = (window(up), window(down));
        let mut up_recommendation = desired;
        let mut down_recommendation = desired;
        for (at, value) in &self.recommendations {
            if now.duration_since(*at) < up_window {
                up_recommendation = up_recommendation.min(*value);
            }
            if now.duration_since(*at) < down_window {
                down_recommendation = down_recommendation.max(*value);
            }
        }
        let keep = up_window.max(down_window);
        self.recommendations
            .retain(|(at, _)| now.duration_since(*at) < keep);
        self.recommendations.push((now, desired));
        let mut stabilized = current;
        if stabilized < up_recommendation {
            stabilized = up_recommendation;
        }
        if stabilized > down_recommendation {
            stabilized = down_recommendation;
        }
        let (mut result, mut limit) = (stabilized, Limited::None);
        if stabilized > current {
            let allowed = self.up_limit(now, current, up).max(current);
            if stabilized > allowed {
                (result, limit) = (allowed, Limited::ScaleUpLimit);
            }
        } else if stabilized < current {
            let allowed = self.down_limit(now, current, down).min(current);
            if stabilized < allowed {
                (result, limit) = (allowed, Limited::ScaleDownLimit);
            }
        }
        if result < min {
            (result, limit) = (min, Limited::TooFewReplicas);
        } else if result > max {
            (result, limit) = (max, Limited::TooManyReplicas);
        }
        (result, limit)
    }

    /// Records a scaling made (for the rate policies' periods).
    pub(crate) fn scaled(&mut self, now: Instant, from: i32, to: i32) {
        // Nothing is kept longer than the longest period allowed (30 min).
        self.scalings
            .retain(|(at, _)| now.duration_since(*at) < Duration::from_secs(1800));
        self.scalings.push((now, to - from));
    }

    /// The count at the start of a policy's period: now, less what was
    /// added and plus what was removed within it (upstream's
    /// `periodStartReplicas`, the same for both directions).
    fn period_start(&self, now: Instant, current: i32, period: i32) -> i32 {
        let period = Duration::from_secs(u64::try_from(period).unwrap_or(0));
        let changed: i32 = self
            .scalings
            .iter()
            .filter(|(at, _)| now.duration_since(*at) < period)
            .map(|(_, change)| *change)
            .sum();
        current - changed
    }

    fn up_limit(&self, now: Instant, current: i32, rules: &HPAScalingRules) -> i32 {
        let select = rules.select_policy.as_deref().unwrap_or("Max");
        if select == "Disabled" {
            return current;
        }
        let proposals = rules.policies.iter().flatten().map(|policy| {
            let start = self.period_start(now, current, policy.period_seconds);
            match policy.type_.as_str() {
                "Pods" => start.saturating_add(policy.value),
                _ => (f64::from(start) * (1.0 + f64::from(policy.value) / 100.0)).ceil() as i32,
            }
        });
        if select == "Min" {
            proposals.min().unwrap_or(current)
        } else {
            proposals.max().unwrap_or(current)
        }
    }

    fn down_limit(&self, now: Instant, current: i32, rules: &HPAScalingRules) -> i32 {
        let select = rules.select_policy.as_deref().unwrap_or("Max");
        if select == "Disabled" {
            return current;
        }
        let proposals = rules.policies.iter().flatten().map(|policy| {
            let start = self.period_start(now, current, policy.period_seconds);
            match policy.type_.as_str() {
                "Pods" => start - policy.value,
                _ => (f64::from(start) * (1.0 - f64::from(policy.value) / 100.0)) as i32,
            }
        });
        // "Max" is the policy that allows the most change: the fewest pods.
        if select == "Min" {
            proposals.max().unwrap_or(current)
        } else {
            proposals.min().unwrap_or(current)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scale_down_waits_out_its_window_and_scale_up_is_rate_limited() {
        let rules = rules(None);
        let mut history = History::starting_at(Instant::now(), 1);
        let start = Instant::now();
        // Up from 1 to 10 at once: at most max(1 + 4, 1 * 2) = 5.
        assert_eq!(
            history.normalize(start, 1, 10, &rules, (1, 20)),
            (5, Limited::ScaleUpLimit)
        );
        history.scaled(start, 1, 5);
        // Within the same 15 s period the start is still 1: 5 again.
        let soon = start + Duration::from_secs(5);
        assert_eq!(history.normalize(soon, 5, 10, &rules, (1, 20)).0, 5);
        // Load gone: down is held by the 10s recommended in the last 300 s.
        let later = start + Duration::from_secs(60);
        assert_eq!(
            history.normalize(later, 5, 1, &rules, (1, 20)),
            (5, Limited::None)
        );
        // Once they age out, down to 1.
        let much_later = start + Duration::from_secs(400);
        assert_eq!(history.normalize(much_later, 5, 1, &rules, (1, 20)).0, 1);
    }

    #[test]
    fn a_zero_window_and_bounds() {
        let behavior = HorizontalPodAutoscalerBehavior {
            scale_down: Some(HPAScalingRules {
                stabilization_window_seconds: Some(0),
                ..HPAScalingRules::default()
            }),
            ..HorizontalPodAutoscalerBehavior::default()
        };
        let rules = rules(Some(&behavior));
        let mut history = History::starting_at(Instant::now(), 1);
        let now = Instant::now();
        assert_eq!(
            history.normalize(now, 3, 1, &rules, (2, 5)),
            (2, Limited::TooFewReplicas)
        );
        assert_eq!(
            history.normalize(now, 5, 9, &rules, (1, 6)),
            (6, Limited::TooManyReplicas)
        );
        let disabled = HPAScalingRules {
            select_policy: Some("Disabled".into()),
            ..default_rules(true)
        };
        assert_eq!(
            history
                .normalize(now, 2, 4, &(disabled, rules.1.clone()), (1, 9))
                .0,
            2
        );
    }
}

//! The candidate's LeaseCandidate: created on start, kept fresh, pings answered, deleted on a
//! clean exit.

use std::time::{Duration, Instant};

use anyhow::Context;

use backon::BackoffBuilder;
use futures::StreamExt;
use futures::future::BoxFuture;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, OwnerReference};
use kube::api::{Api, DeleteParams, GetParams, Patch, PatchParams, PostParams};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, ResourceExt};
use serde_json::json;

use super::Config;
use arbiter_api::lease::INCARNATION_ANNOTATION;
use arbiter_api::tolerant::Tolerant;
use arbiter_api::{
    INSTANCE_LABEL, LEASE_DURATION_ANNOTATION, LeaseCandidate, LeaseCandidateSpec,
    OVERRAN_ANNOTATION, WITHDRAWN_ANNOTATION,
};

/// How often the candidate refreshes `renewTime` on its own: upstream's interval. It also
/// answers every ping at once, and the arbiter pings before it relies on a candidate, so the
/// refresh is only a sign of life between elections (and what keeps a candidate without a pod
/// from `--candidate-expiry`). At 30,000 candidates it is 100 writes a second.
pub const REFRESH: Duration = Duration::from_secs(300);

/// How often while the candidate carries another process's incarnation: two live processes
/// sharing one identity then overwrite each other's stamp within a minute, which the arbiter
/// reports (`DuplicateIdentity`; its window is two minutes).
pub const REFRESH_CONTESTED: Duration = Duration::from_secs(30);

/// How soon the agent writes when it first sees a given other process's incarnation on its
/// candidate: its own stamp then returns within seconds, which is what the arbiter reports,
/// instead of up to [`REFRESH_CONTESTED`] later. One write per other process it sees (however
/// many share the identity), not while a failed write waits out its backoff.
pub const REFRESH_ON_NEW_OTHER: Duration = Duration::from_secs(2);

/// How many other incarnations an agent remembers having seen on its candidate: beyond it (a
/// twin restarting in a loop) the oldest is forgotten, and seen again counts as new.
const OTHERS_KEPT: usize = 16;

/// How often the agent reads its candidate from the API server's cache (and how long a read
/// may take), in case its watch hangs on a dead connection: a ping it missed is answered, and
/// another process's stamp noticed, no later than this.
const READ_EVERY: Duration = Duration::from_secs(30);

/// The longest wait between two tries of a write that failed (before jitter).
const RETRY_AT_MOST: Duration = Duration::from_secs(30);

/// The first retry of a write that failed (an answer to a ping above all: until one lands the
/// candidate stays Unresponsive); each next one waits twice as long, up to
/// [`RETRY_AT_MOST`], jittered.
const RETRY_FIRST: Duration = Duration::from_secs(2);

/// Creates the LeaseCandidate, or updates the one a previous process of this identity left.
///
/// While the API server cannot be reached (connection refused or reset, a timeout, 5xx, 429),
/// it retries with backoff ([`crate::client::reconnect_backoff`]: 0.5 s doubling to 2 s, each jittered up to twice itself)
/// and logs each attempt. A refusal for want of rights (403) is retried the same way for
/// [`FORBIDDEN_FOR_AT_MOST`]: the RoleBinding may be created with the pod, or by the operator
/// just after an injected pod appears. Anything else the API server refuses outright (no CRD,
/// an invalid candidate, a changed leaseName) fails at once, and so does a 403 after that.
///
/// Returns the ping the candidate carried when the registration wrote its `renewTime`: that
/// write answers it (the arbiter counts a `renewTime` written after its ping as the answer).
pub async fn register(
    client: &Client,
    config: &Config,
    incarnation: &str,
) -> anyhow::Result<Option<jiff::Timestamp>> {
    let mut backoff = crate::client::reconnect_backoff();
    let mut attempt = 1u32;
    let started = tokio::time::Instant::now();
    loop {
        let e = match try_register(client, config, incarnation).await {
            Ok(ping) => return Ok(ping),
            Err(e) => e,
        };
        let transient = e
            .chain()
            .any(|c| c.downcast_ref::<kube::Error>().is_some_and(is_transient));
        let forbidden = e
            .chain()
            .any(|c| c.downcast_ref::<kube::Error>().is_some_and(is_forbidden));
        let retry = transient || (forbidden && started.elapsed() < FORBIDDEN_FOR_AT_MOST);
        if !retry {
            return Err(e);
        }
        let wait = backoff.next().unwrap_or(crate::client::RECONNECT_AT_MOST);
        let why = if forbidden {
            "cannot register the candidate yet: forbidden (its RBAC may not be bound yet); retrying"
        } else {
            "cannot register the candidate yet: the API server is unreachable; retrying"
        };
        tracing::warn!(attempt, retry_in = ?wait, error = %format!("{e:#}"), "{why}");
        tokio::time::sleep(wait).await;
        attempt += 1;
    }
}

/// How long a registration refused for want of rights is retried.
pub const FORBIDDEN_FOR_AT_MOST: Duration = Duration::from_secs(30);

fn is_forbidden(e: &kube::Error) -> bool {
    matches!(e, kube::Error::Api(s) if s.code == 403)
}

/// An error worth retrying: the API server did not answer, or answered "not now".
fn is_transient(e: &kube::Error) -> bool {
    match e {
        kube::Error::Api(s) => s.code >= 500 || s.code == 429,
        kube::Error::HyperError(_) | kube::Error::Service(_) => true,
        _ => false,
    }
}

async fn try_register(
    client: &Client,
    config: &Config,
    incarnation: &str,
) -> anyhow::Result<Option<jiff::Timestamp>> {
    // (Answers decoded tolerantly: see arbiter_api::tolerant.)
    let api: Api<Tolerant<LeaseCandidate>> = Api::namespaced(client.clone(), &config.namespace);
    let declared = config.timings.lease_duration.as_secs().to_string();
    // Twice at most: a create that loses a race with another writer becomes an update.
    for _ in 0..2 {
        let renew_time = Some(MicroTime(jiff::Timestamp::now()));
        let written = match read(&api, config).await? {
            Some(existing) if existing.spec.lease_name != config.lease => anyhow::bail!(
                "LeaseCandidate {}/{} already exists for lease {:?}, and leaseName is immutable: delete it, or run with another identity",
                config.namespace,
                config.identity,
                existing.spec.lease_name
            ),
            Some(existing) => {
                let patch = registered_again(&existing, config, incarnation, &declared, renew_time);
                api.patch(
                    &config.identity,
                    &PatchParams::default(),
                    &Patch::Merge(&patch),
                )
                .await?
                .0
            }
            None => {
                let candidate = registered(config, incarnation, &declared, renew_time);
                match api
                    .create(&PostParams::default(), &Tolerant(candidate))
                    .await
                {
                    Ok(c) => c.0,
                    Err(kube::Error::Api(s)) if s.code == 409 => continue,
                    Err(kube::Error::Api(s)) if s.code == 422 => {
                        anyhow::bail!("the API server refused the candidate: {}", s.message)
                    }
                    Err(e) => {
                        return Err(anyhow::Error::new(e).context(format!(
                            "creating LeaseCandidate {}/{}",
                            config.namespace, config.identity
                        )));
                    }
                }
            }
        };
        tracing::info!(candidate = %config.identity, lease = %config.lease, "registered as a candidate");
        return Ok(written.spec.ping_time.map(|t| t.0));
    }
    anyhow::bail!(
        "LeaseCandidate {}/{} keeps changing under us",
        config.namespace,
        config.identity
    )
}

/// The candidate of this identity, if there is one; a clear error when the API is not served.
async fn read(
    api: &Api<Tolerant<LeaseCandidate>>,
    config: &Config,
) -> anyhow::Result<Option<LeaseCandidate>> {
    let existing = api.get_opt(&config.identity).await.map_err(|e| match &e {
        kube::Error::Api(s) if s.code == 404 => anyhow::anyhow!(
            "the LeaseCandidate API (arbiter.dev/v1alpha1) is not served: is arbiter's CRD installed? ({e})"
        ),
        _ => {
            let what = format!("reading LeaseCandidate {}/{}", config.namespace, config.identity);
            anyhow::Error::new(e).context(what)
        }
    })?;
    Ok(existing.map(|c| c.0))
}

/// The merge patch that registers this process on the candidate an earlier one left.
fn registered_again(
    existing: &LeaseCandidate,
    config: &Config,
    incarnation: &str,
    declared: &str,
    renew_time: Option<MicroTime>,
) -> serde_json::Value {
    // A new process: an overrun reported by an earlier one is history (its Event
    // and metric remain). It may run in a new pod of the same name (a StatefulSet's
    // replacement): the candidate goes with this pod from now on. A process outside
    // a pod drops a pod an earlier one left as owner (the arbiter would take that
    // pod for this process's: record terms in it, which this process cannot take);
    // owners of other kinds stay.
    let left_pods = existing
        .metadata
        .owner_references
        .as_ref()
        .is_some_and(|o| o.iter().any(|r| r.kind == "Pod"));
    let owners = owner_references(config).or_else(|| {
        left_pods.then(|| {
            existing
                .metadata
                .owner_references
                .clone()
                .unwrap_or_default()
                .into_iter()
                .filter(|r| r.kind != "Pod")
                .collect()
        })
    });
    let mut patch = json!({
        "metadata": { "annotations": {
            INCARNATION_ANNOTATION: incarnation,
            OVERRAN_ANNOTATION: null,
            WITHDRAWN_ANNOTATION: null,
            LEASE_DURATION_ANNOTATION: declared,
        } },
        "spec": {
            "binaryVersion": config.binary_version,
            "emulationVersion": config.emulation_version,
            "strategy": config.strategy,
            "renewTime": renew_time,
        },
    });
    if let Some(owners) = owners {
        patch["metadata"]["ownerReferences"] = json!(owners);
    }
    // The install that arbitrates it, as this process was told (none: removed).
    patch["metadata"]["labels"] = json!({ INSTANCE_LABEL: config.instance });
    patch
}

/// A new candidate for this process.
fn registered(
    config: &Config,
    incarnation: &str,
    declared: &str,
    renew_time: Option<MicroTime>,
) -> LeaseCandidate {
    let spec = LeaseCandidateSpec {
        lease_name: config.lease.clone(),
        binary_version: config.binary_version.clone(),
        emulation_version: config.emulation_version.clone(),
        strategy: config.strategy.clone(),
        ping_time: None,
        renew_time,
    };
    let mut candidate = LeaseCandidate::new(&config.identity, spec);
    candidate.metadata.annotations = Some(
        [
            (INCARNATION_ANNOTATION.to_string(), incarnation.to_string()),
            (LEASE_DURATION_ANNOTATION.to_string(), declared.to_string()),
        ]
        .into(),
    );
    candidate.metadata.owner_references = owner_references(config);
    candidate.metadata.labels = config
        .instance
        .as_ref()
        .map(|i| [(INSTANCE_LABEL.to_string(), i.clone())].into());
    candidate
}

/// What the agent knows of its own candidate, and when it writes it next. Pure: fed what the
/// watch (or a read) delivers and how each write went.
struct Freshness {
    incarnation: String,
    /// When the next refresh is due.
    next: Instant,
    /// Another process's incarnation is on the candidate (as last seen).
    contested: bool,
    /// The other incarnations seen on the candidate so far (each reported once, and each
    /// answered with one write within [`REFRESH_ON_NEW_OTHER`]); at most [`OTHERS_KEPT`].
    others: Vec<String>,
    /// A `renewTime` that could not be written (a ping's answer): written with the next try.
    pending: Option<jiff::Timestamp>,
    /// The last ping this process answered. Each ping is answered once, by writing a
    /// `renewTime` other than the one the candidate carries: the arbiter counts such a change,
    /// seen after its ping, as the answer, whatever either clock says (this machine's clock
    /// may run ahead of the arbiter's, so `renewTime >= pingTime` may hold before any answer).
    answered: Option<jiff::Timestamp>,
}

impl Freshness {
    /// Just registered, at `now`; the registration's write answered `answered`.
    fn new(incarnation: String, now: Instant, answered: Option<jiff::Timestamp>) -> Freshness {
        Freshness {
            incarnation,
            next: now + REFRESH,
            contested: false,
            others: Vec::new(),
            pending: None,
            answered,
        }
    }

    /// The candidate as seen at `now` (`wall`: this machine's clock): the `renewTime` to
    /// write at once, when it carries a ping not answered yet.
    fn seen(
        &mut self,
        c: &LeaseCandidate,
        now: Instant,
        wall: jiff::Timestamp,
    ) -> Option<jiff::Timestamp> {
        let stamp = c.annotations().get(INCARNATION_ANNOTATION);
        let other = stamp.filter(|s| **s != self.incarnation);
        if let Some(other) = other {
            let new_other = !self.others.contains(other);
            // Not while a failed write waits out its backoff.
            if new_other && self.pending.is_none() {
                self.next = self.next.min(now + REFRESH_ON_NEW_OTHER);
            } else if !self.contested {
                self.next = self.next.min(now + REFRESH_CONTESTED);
            }
            if new_other {
                tracing::warn!(
                    candidate = %c.name_any(),
                    %other,
                    "another process wrote this candidate: refreshing every {}s while it does",
                    REFRESH_CONTESTED.as_secs()
                );
                if self.others.len() == OTHERS_KEPT {
                    self.others.remove(0);
                }
                self.others.push(other.clone());
            }
        }
        self.contested = other.is_some();
        // Answer a ping not answered yet, with a renewTime other than the one on the candidate
        // (and, for readers comparing them as upstream does, not below the ping).
        match &c.spec.ping_time {
            Some(ping) if self.answered != Some(ping.0) => {
                tracing::debug!(candidate = %c.name_any(), "answering ping");
                self.answered = Some(ping.0);
                let renew = self.take_pending(ping.0.max(wall));
                Some(other_than(renew, c.spec.renew_time.as_ref().map(|t| t.0)))
            }
            _ => None,
        }
    }

    /// The `renewTime` to write now (`renew`), or the one a failed write left, if later.
    fn take_pending(&mut self, renew: jiff::Timestamp) -> jiff::Timestamp {
        self.pending.take().map_or(renew, |p| p.max(renew))
    }

    /// The write of `renew` succeeded at `now`.
    fn written(&mut self, now: Instant) {
        self.next = now
            + if self.contested {
                REFRESH_CONTESTED
            } else {
                REFRESH
            };
    }

    /// The write of `renew` failed at `now`; tried again after `wait`.
    fn failed(&mut self, renew: jiff::Timestamp, now: Instant, wait: Duration) {
        self.pending = Some(renew);
        self.next = now + wait;
    }
}

/// `renew` to the microsecond (as the API server keeps it), one microsecond later if that is
/// `current`: an answer must change the candidate's `renewTime`.
fn other_than(renew: jiff::Timestamp, current: Option<jiff::Timestamp>) -> jiff::Timestamp {
    let micros = jiff::Timestamp::from_microsecond(renew.as_microsecond()).unwrap_or(renew);
    if Some(micros) == current {
        micros + jiff::SignedDuration::from_micros(1)
    } else {
        micros
    }
}

/// Answers pings and refreshes `renewTime`, forever. Returns only on error.
///
/// A ping is answered as the watch delivers it. The refresh comes [`REFRESH`] after the last
/// write, or [`REFRESH_CONTESTED`] while the candidate carries another process's incarnation
/// (within [`REFRESH_ON_NEW_OTHER`] of the first sight of each other process's); a write that
/// failed is retried with backoff from [`RETRY_FIRST`]. Every
/// [`READ_EVERY`] the candidate is also read from the API server's cache, which answers
/// a ping a hung watch did not deliver.
/// `answered` is the ping the registration answered.
pub async fn keep_fresh(
    client: Client,
    config: Config,
    incarnation: String,
    answered: Option<jiff::Timestamp>,
) -> anyhow::Error {
    let api: Api<Tolerant<LeaseCandidate>> = Api::namespaced(client.clone(), &config.namespace);
    let cfg = watcher::Config::default().fields(&format!("metadata.name={}", config.identity));
    let mut events =
        arbiter_api::tolerant::watch::<LeaseCandidate>(client, Some(&config.namespace), cfg)
            .backoff(crate::client::reconnect_backoff())
            .applied_objects()
            .boxed();
    // Registration has just written the candidate.
    let mut state = Freshness::new(incarnation.clone(), Instant::now(), answered);
    let mut retries = retry_backoff();
    let mut check = tokio::time::interval(READ_EVERY);
    check.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    check.tick().await;
    // The read in flight, if any: polled beside the watch, so that a read that hangs (until
    // the client's timeout) holds up no answer to a ping the watch delivers meanwhile.
    let mut reading: Option<BoxFuture<'static, Option<kube::Result<LeaseCandidate>>>> = None;
    loop {
        let renew = tokio::select! {
            ev = events.next() => match ev {
                None => return anyhow::anyhow!("the watch on the candidate ended"),
                Some(Err(e)) => { tracing::debug!(error = %e, "candidate watch error (retrying)"); continue }
                Some(Ok(c)) => match state.seen(&c, Instant::now(), jiff::Timestamp::now()) {
                    Some(renew) => renew,
                    None => continue,
                },
            },
            _ = check.tick(), if reading.is_none() => {
                let (api, name) = (api.clone(), config.identity.clone());
                // Bounded even on a client without request timeouts (a library user's).
                reading = Some(Box::pin(async move {
                    tokio::time::timeout(READ_EVERY, api.get_with(&name, &GetParams::any()))
                        .await
                        .ok()
                        .map(|r| r.map(|c| c.0))
                }));
                continue;
            }
            read = async {
                match reading.as_mut() {
                    Some(r) => r.await,
                    None => std::future::pending().await,
                }
            }, if reading.is_some() => {
                reading = None;
                match read {
                Some(Ok(c)) => match state.seen(&c, Instant::now(), jiff::Timestamp::now()) {
                    Some(renew) => renew,
                    None => continue,
                },
                // A cache may lag (another API server's, say): a deletion is only believed from
                // a write's answer.
                Some(Err(e)) => { tracing::debug!(error = %e, "reading the candidate failed"); continue }
                None => { tracing::debug!("reading the candidate timed out"); continue }
                }
            }
            _ = tokio::time::sleep_until(state.next.into()) => state.take_pending(jiff::Timestamp::now()),
        };
        match stamp(&api, &config.identity, &incarnation, renew).await {
            Ok(_) => {
                retries = retry_backoff();
                state.written(Instant::now());
            }
            Err(kube::Error::Api(s)) if s.code == 404 => {
                return anyhow::anyhow!("LeaseCandidate {} was deleted", config.identity);
            }
            Err(e) => {
                let wait = retries.next().unwrap_or(RETRY_AT_MOST);
                tracing::warn!(error = %e, retry_in = ?wait, "writing the candidate failed (retrying)");
                state.failed(renew, Instant::now(), wait);
            }
        }
    }
}

/// Writes `renew` as the candidate's `renewTime`, with this process's incarnation.
async fn stamp(
    api: &Api<Tolerant<LeaseCandidate>>,
    name: &str,
    incarnation: &str,
    renew: jiff::Timestamp,
) -> kube::Result<()> {
    let patch = json!({
        "metadata": { "annotations": { INCARNATION_ANNOTATION: incarnation } },
        "spec": { "renewTime": MicroTime(renew) },
    });
    api.patch(name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .map(|_| ())
}

/// Retries of a failed write: [`RETRY_FIRST`] doubling to [`RETRY_AT_MOST`], each jittered
/// up to twice itself (so that thousands of agents do not retry in step after an outage).
fn retry_backoff() -> impl Iterator<Item = Duration> {
    backon::ExponentialBuilder::default()
        .with_min_delay(RETRY_FIRST)
        .with_max_delay(RETRY_AT_MOST)
        .with_factor(2.0)
        .with_jitter()
        .without_max_times()
        .build()
}

/// Withdraws the candidate: deletes it, or, with `keep`, marks it withdrawn by `incarnation`
/// (and records `overran`, see [`arbiter_api::OVERRAN_ANNOTATION`]).
pub async fn withdraw(
    client: &Client,
    config: &Config,
    incarnation: &str,
    keep: bool,
    overran: Option<i32>,
) -> anyhow::Result<()> {
    let api: Api<Tolerant<LeaseCandidate>> = Api::namespaced(client.clone(), &config.namespace);
    if !keep {
        return match api.delete(&config.identity, &DeleteParams::default()).await {
            Ok(_) => {
                tracing::info!(candidate = %config.identity, "withdrew the candidate");
                Ok(())
            }
            Err(kube::Error::Api(s)) if s.code == 404 => Ok(()),
            Err(e) => Err(anyhow::Error::new(e).context("deleting the candidate")),
        };
    }
    let patch = json!({ "metadata": { "annotations": {
        OVERRAN_ANNOTATION: overran.map(|t| t.to_string()),
        WITHDRAWN_ANNOTATION: incarnation,
    } } });
    // Written as arbiter's field manager: the operator counts only such a mark (a hand edit
    // must not pass for a withdrawal).
    let pp = PatchParams {
        field_manager: Some(arbiter_api::FIELD_MANAGER.into()),
        ..PatchParams::default()
    };
    api.patch(&config.identity, &pp, &Patch::Merge(&patch))
        .await
        .context("marking the candidate withdrawn")?;
    tracing::info!(candidate = %config.identity, ?overran, "withdrew the candidate (kept, marked withdrawn: the term's work stopped)");
    Ok(())
}

/// The candidate's owner: the pod it runs in, when known.
fn owner_references(config: &Config) -> Option<Vec<OwnerReference>> {
    let (Some(pod), Some(uid)) = (&config.pod_name, &config.pod_uid) else {
        return None;
    };
    Some(vec![OwnerReference {
        api_version: "v1".into(),
        kind: "Pod".into(),
        name: pod.clone(),
        uid: uid.clone(),
        ..OwnerReference::default()
    }])
}

#[cfg(test)]
mod tests {
    use super::*;
    use jiff::{SignedDuration, Timestamp};

    const ME: &str = "me";

    fn candidate(stamp: &str, ping: Option<Timestamp>, renew: Option<Timestamp>) -> LeaseCandidate {
        let mut c = LeaseCandidate::new(
            "c",
            LeaseCandidateSpec {
                lease_name: "l".into(),
                binary_version: "1.0.0".into(),
                emulation_version: None,
                strategy: arbiter_api::OLDEST_EMULATION_VERSION.into(),
                ping_time: ping.map(MicroTime),
                renew_time: renew.map(MicroTime),
            },
        );
        c.metadata.annotations =
            Some([(INCARNATION_ANNOTATION.to_string(), stamp.to_string())].into());
        c
    }

    /// This machine's clock, to the microsecond (as the API server keeps timestamps).
    fn now() -> Timestamp {
        Timestamp::from_microsecond(Timestamp::now().as_microsecond()).unwrap()
    }

    fn secs(n: i64) -> SignedDuration {
        SignedDuration::from_secs(n)
    }

    #[test]
    fn alone_it_refreshes_every_five_minutes() {
        let t0 = Instant::now();
        let wall = now();
        // Its registration answered the ping on the candidate.
        let mut f = Freshness::new(ME.into(), t0, Some(wall));
        assert_eq!(f.next, t0 + REFRESH);
        // Its own writes, a status, an answered ping: nothing to write, nothing sooner.
        assert_eq!(
            f.seen(&candidate(ME, Some(wall), Some(wall)), t0, wall),
            None
        );
        assert_eq!(f.seen(&candidate(ME, None, Some(wall)), t0, wall), None);
        assert_eq!(f.next, t0 + REFRESH);
        let t1 = t0 + REFRESH;
        assert_eq!(f.take_pending(wall + secs(300)), wall + secs(300));
        f.written(t1);
        assert_eq!(f.next, t1 + REFRESH);
    }

    #[test]
    fn a_ping_is_answered_at_once_and_not_before_the_ping() {
        let t0 = Instant::now();
        let wall = now();
        let mut f = Freshness::new(ME.into(), t0, None);
        let ping = wall + secs(5); // this machine's clock is 5 s behind the arbiter's
        let c = candidate(ME, Some(ping), Some(wall - secs(60)));
        assert_eq!(f.seen(&c, t0, wall), Some(ping));
        // Once: seen again (the read, a status write), the same ping is not answered again.
        assert_eq!(f.seen(&c, t0, wall + secs(9)), None);
        // A new ping is.
        let again = candidate(ME, Some(wall + secs(20)), Some(ping));
        assert_eq!(f.seen(&again, t0, wall + secs(30)), Some(wall + secs(30)));
    }

    #[test]
    fn a_ping_is_answered_with_a_changed_renew_time_whatever_this_machines_clock_says() {
        let t0 = Instant::now();
        let wall = now();
        let ahead = Timestamp::from_microsecond((wall + secs(600)).as_microsecond()).unwrap();
        // This machine's clock is 10 minutes ahead: its registration wrote `ahead`, which is
        // after the arbiter's ping. It answers all the same, with another renewTime.
        let mut f = Freshness::new(ME.into(), t0, None);
        let c = candidate(ME, Some(wall), Some(ahead));
        let renew = f.seen(&c, t0, ahead).expect("answered");
        assert_ne!(renew, ahead, "the answer changes renewTime");
        assert!(renew > ahead);
        // The ping the registration's write answered is not answered again.
        let mut g = Freshness::new(ME.into(), t0, Some(wall));
        assert_eq!(g.seen(&c, t0, ahead), None);
        assert!(
            g.seen(&candidate(ME, Some(wall + secs(1)), Some(ahead)), t0, ahead)
                .is_some()
        );
    }

    #[test]
    fn another_process_on_the_candidate_makes_it_write_within_seconds_then_every_30_s() {
        let t0 = Instant::now();
        let wall = now();
        let mut f = Freshness::new(ME.into(), t0, None);
        let t1 = t0 + Duration::from_secs(100);
        assert_eq!(
            f.seen(&candidate("other", None, Some(wall)), t1, wall),
            None
        );
        assert!(f.contested);
        // A process not seen before: its own stamp goes back within seconds.
        assert_eq!(f.next, t1 + REFRESH_ON_NEW_OTHER);
        // Seeing it again does not push the refresh back.
        f.seen(
            &candidate("other", None, Some(wall)),
            t1 + Duration::from_secs(1),
            wall,
        );
        assert_eq!(f.next, t1 + REFRESH_ON_NEW_OTHER);
        // Its write lands before its echo: still contested, so 30 s from then.
        let t2 = t1 + REFRESH_ON_NEW_OTHER;
        f.written(t2);
        assert_eq!(f.next, t2 + REFRESH_CONTESTED);
        // The same other process's stamp again, after its own: every 30 s, not sooner.
        f.seen(&candidate(ME, None, Some(wall)), t2, wall);
        f.seen(&candidate("other", None, Some(wall)), t2, wall);
        assert_eq!(f.next, t2 + REFRESH_CONTESTED);
        // A third process: within seconds again.
        let t3 = t2 + Duration::from_secs(5);
        f.seen(&candidate("third", None, Some(wall)), t3, wall);
        assert_eq!(f.next, t3 + REFRESH_ON_NEW_OTHER);
        let t2 = t3 + REFRESH_ON_NEW_OTHER;
        f.written(t2);
        // The first one's stamp again (three processes taking turns): not new, 30 s.
        f.seen(&candidate("other", None, Some(wall)), t2, wall);
        assert_eq!(f.next, t2 + REFRESH_CONTESTED);
        assert_eq!(f.next, t2 + REFRESH_CONTESTED);
        // Its own stamp stays: back to five minutes after the next write.
        f.seen(&candidate(ME, None, Some(wall)), t2, wall);
        assert!(!f.contested);
        f.written(t2 + REFRESH_CONTESTED);
        assert_eq!(f.next, t2 + REFRESH_CONTESTED + REFRESH);
        // A refresh due sooner is not put off by another stamp.
        let mut g = Freshness::new(ME.into(), t0, None);
        g.next = t0 + Duration::from_secs(1);
        g.seen(&candidate("other", None, Some(wall)), t0, wall);
        assert_eq!(g.next, t0 + Duration::from_secs(1));
        // A failed write's backoff is not cut to seconds by a new process (to the contested
        // 30 s at most, as before).
        let mut h = Freshness::new(ME.into(), t0, None);
        h.failed(wall, t0, Duration::from_secs(40));
        h.seen(&candidate("other", None, Some(wall)), t0, wall);
        assert_eq!(h.next, t0 + REFRESH_CONTESTED);
    }

    #[test]
    fn a_failed_answer_is_retried_without_going_below_the_ping() {
        let t0 = Instant::now();
        let wall = now();
        let mut f = Freshness::new(ME.into(), t0, None);
        let ping = wall + secs(5);
        let renew = f
            .seen(&candidate(ME, Some(ping), Some(wall - secs(60))), t0, wall)
            .unwrap();
        f.failed(renew, t0, Duration::from_secs(2));
        assert_eq!(f.next, t0 + Duration::from_secs(2));
        // 2 s later this machine's clock still reads before the ping: the ping's time is kept.
        assert_eq!(f.take_pending(wall + secs(2)), ping);
        f.written(t0 + Duration::from_secs(2));
        assert_eq!(f.next, t0 + Duration::from_secs(2) + REFRESH);
        // Once written, nothing is carried over.
        assert_eq!(f.take_pending(wall + secs(3)), wall + secs(3));
    }
}

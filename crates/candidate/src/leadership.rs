//! Holding a lease the arbiter assigned: take it, renew it, notice the end, release it.

use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, ResourceExt};
use tokio::sync::watch;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::{Config, EndReason, Renewed, State};
use arbiter_api::lease::{
    self, CasError, HOLDER_POD_ANNOTATION, INCARNATION_ANNOTATION, LeaseStore,
    TAKEN_IN_POD_ANNOTATION,
};
use arbiter_election::standing::{Process, Record, Standing};

/// What `l` says about this process ([`arbiter_election::standing`], the rule the protocol
/// model runs too). `took`: the term this process is taking or leads (none while it follows).
fn standing(l: &Lease, config: &Config, incarnation: &str, took: Option<i32>) -> Standing {
    let annotation = |name: &str| l.annotations().get(name).map(String::as_str);
    let record = Record {
        holder: lease::holder(l),
        term: lease::term(l),
        incarnation: annotation(INCARNATION_ANNOTATION),
        assigned_by_arbiter: lease::assigned_by_arbiter(l),
        assigned_in: annotation(HOLDER_POD_ANNOTATION),
        preferred_holder: lease::preferred_holder(l),
    };
    let me = Process {
        identity: &config.identity,
        incarnation,
        pod: config.pod_uid.as_deref(),
        took,
    };
    arbiter_election::standing::standing(&record, &me)
}

/// One renew by compare-and-swap: the lease must still be ours. Returns the term.
async fn renew(
    store: &LeaseStore,
    config: &Config,
    incarnation: &str,
    took: Option<i32>,
) -> anyhow::Result<Result<i32, EndReason>> {
    let Some(mut l) = store.get(&config.lease).await? else {
        return Ok(Err(EndReason::LeaseDeleted));
    };
    match standing(&l, config, incarnation, took) {
        Standing::Ours => {}
        Standing::HandoverTo(to) => return Ok(Err(EndReason::Handover { to })),
        Standing::Other | Standing::Stale | Standing::OtherPod(_) | Standing::Unassigned => {
            return Ok(Err(EndReason::HolderChanged(
                lease::holder(&l).map(str::to_string),
            )));
        }
    }
    let spec = l.spec.get_or_insert_with(LeaseSpec::default);
    spec.renew_time = Some(lease::renewed_after(spec.renew_time.as_ref()));
    spec.lease_duration_seconds = Some(arbiter_api::lease::seconds(config.timings.lease_duration));
    lease::set_annotation(&mut l, INCARNATION_ANNOTATION, Some(incarnation));
    // The pod it took the term in: the arbiter takes the stop of the pod it recorded for the
    // term as its end only if the term was taken there.
    let taken_in = config
        .pod_uid
        .as_deref()
        .map(|uid| lease::taken_in(incarnation, uid));
    lease::set_annotation(&mut l, TAKEN_IN_POD_ANNOTATION, taken_in.as_deref());
    let written = store.replace(&l).await?;
    Ok(Ok(lease::term(&written)))
}

/// Gives the lease up (holder `""`) if this process still holds it.
pub async fn release(
    store: &LeaseStore,
    config: &Config,
    incarnation: &str,
) -> anyhow::Result<bool> {
    // A renew still in flight may win the compare-and-swap: read again and retry.
    for _ in 0..3 {
        let Some(mut l) = store.get(&config.lease).await? else {
            return Ok(false);
        };
        if lease::holder(&l) != Some(config.identity.as_str())
            || l.annotations()
                .get(INCARNATION_ANNOTATION)
                .is_some_and(|i| !i.is_empty() && i != incarnation)
        {
            return Ok(false);
        }
        lease::mark_released(&mut l, Some(&config.identity));
        match store.replace(&l).await {
            Ok(_) => {
                tracing::info!(lease = %config.lease, "released the lease");
                return Ok(true);
            }
            Err(CasError::Conflict(_)) => continue,
            Err(e) => return Err(e.into()),
        }
    }
    anyhow::bail!("releasing lease {}: it kept changing", config.lease)
}

/// Follows and leads, forever; returns only on error (the watch ended).
pub async fn run(
    client: Client,
    config: Config,
    incarnation: String,
    state: watch::Sender<State>,
    ended: watch::Sender<Option<(i32, EndReason)>>,
    renewed: watch::Sender<Option<Renewed>>,
) -> anyhow::Error {
    let store = LeaseStore::new(client.clone(), &config.namespace);
    let cfg = watcher::Config::default().fields(&format!("metadata.name={}", config.lease));
    let mut events = arbiter_api::tolerant::watch::<Lease>(client, Some(&config.namespace), cfg)
        .backoff(crate::client::reconnect_backoff())
        .boxed();
    let mut latest = Latest::default();
    // The term this process is taking (set when it tries to, cleared when a term ends): a
    // take whose answer was lost is retaken, a term edited in under its stamp never is.
    let mut taking: Option<i32> = None;
    loop {
        // Following: wait for the arbiter to name us.
        state.send_replace(State::Following);
        let follower = Follower::new(&store, &config, &incarnation);
        let assigned = follower.wait_for_assignment(taking, &mut events, &mut latest);
        if let Err(e) = assigned.await {
            return e;
        }

        // Assigned: take it with one renew, then keep renewing.
        let started = (Instant::now(), crate::clock::boottime_now());
        taking = latest.lease.as_ref().map(lease::term);
        let term = match renew(&store, &config, &incarnation, taking).await {
            Ok(Ok(term)) => term,
            Ok(Err(why)) => {
                tracing::info!(?why, "the assignment ended before it was taken");
                tokio::time::sleep(config.timings.retry_period).await;
                continue;
            }
            Err(e) => {
                tracing::warn!(error = %e, "taking the lease failed; retrying");
                tokio::time::sleep(config.timings.retry_period).await;
                continue;
            }
        };
        renewed.send_replace(Some(Renewed {
            term,
            sent: started.0,
            sent_boot_ns: started.1,
        }));
        let lost = CancellationToken::new();
        state.send_replace(State::Leading {
            term,
            lost: lost.clone(),
        });
        tracing::info!(lease = %config.lease, term, "leading");
        let why = lead(
            &store,
            &config,
            &incarnation,
            (term, started.0),
            &renewed,
            &mut events,
            &mut latest,
        )
        .await;
        // The reason is recorded before the token fires, so whoever wakes on it can read why.
        ended.send_replace(Some((term, why.clone())));
        lost.cancel();
        tracing::warn!(lease = %config.lease, term, reason = ?why, "leadership ended");
        state.send_replace(State::Ended { term, why });
        taking = None;
        // Do not take the lease again until it has moved on from this term.
        if let Err(e) = wait_moved_on(&config, term, &mut events, &mut latest).await {
            return e;
        }
    }
}

/// The lease's watch events.
type Events =
    dyn futures::Stream<Item = Result<watcher::Event<Lease>, watcher::Error>> + Send + Unpin;

/// What following the lease needs.
struct Follower<'a> {
    store: &'a LeaseStore,
    config: &'a Config,
    incarnation: &'a str,
}

impl<'a> Follower<'a> {
    fn new(store: &'a LeaseStore, config: &'a Config, incarnation: &'a str) -> Self {
        Follower {
            store,
            config,
            incarnation,
        }
    }

    /// Waits until the lease assigns this process a term it may take (`taking`: the term it
    /// is taking, if any), saying once what else the lease says meanwhile, and giving back
    /// unled a fresh assignment the arbiter already wants moved on. Err when the watch ended.
    async fn wait_for_assignment(
        &self,
        taking: Option<i32>,
        events: &mut Events,
        latest: &mut Latest,
    ) -> Result<(), anyhow::Error> {
        let config = self.config;
        tracing::info!(lease = %config.lease, identity = %config.identity, "standing by: waiting for the arbiter to assign the lease");
        // The term of a Lease naming this identity without the arbiter's assignment, once
        // reported (its holder may renew it every few seconds).
        let mut reported_unassigned = None;
        // The other pod a fresh assignment was made for, once reported.
        let mut reported_other_pod = None;
        loop {
            match latest
                .lease
                .as_ref()
                .map(|l| standing(l, config, self.incarnation, taking))
            {
                Some(Standing::Ours) => return Ok(()),
                Some(Standing::Stale) => {
                    // An earlier process of this identity held it: never resume its term, and
                    // do not release it either (that process, or its workload, may still run;
                    // the arbiter reassigns the lease once it expires).
                    tracing::warn!(lease = %config.lease, "the lease names this identity but an earlier process held it; waiting for the arbiter to reassign it");
                }
                // Like an earlier process's term: neither taken nor released (the other pod may
                // still run); the arbiter reassigns once that pod stops. Said once per pod.
                Some(Standing::OtherPod(uid)) if reported_other_pod.as_ref() != Some(&uid) => {
                    tracing::warn!(lease = %config.lease, pod_uid = %uid, "the lease was assigned to this identity in another pod; waiting for the arbiter to reassign it");
                    reported_other_pod = Some(uid);
                }
                Some(Standing::Unassigned) => {
                    // Never run under a term the arbiter did not assign (its fencing token
                    // would be someone else's counter); the arbiter adopts such a Lease once
                    // its holder's duration has passed without a change, then assigns it.
                    let term = latest.lease.as_ref().map(lease::term);
                    if reported_unassigned != term {
                        reported_unassigned = term;
                        tracing::warn!(lease = %config.lease, ?term, "the lease names this identity but the arbiter did not assign it (no arbiter.dev/managed label and assignment mark): waiting for the arbiter");
                    }
                }
                Some(Standing::HandoverTo(_)) => {
                    // The arbiter already wants someone else: give it back without leading.
                    tracing::warn!(lease = %config.lease, "the lease names this identity but the arbiter wants another holder; releasing it");
                    if let Err(e) = release(self.store, config, self.incarnation).await {
                        tracing::warn!(error = %e, "releasing the lease failed");
                    }
                }
                _ => {}
            }
            match events.next().await {
                None => anyhow::bail!("the watch on lease {} ended", config.lease),
                Some(Err(e)) => tracing::debug!(error = %e, "lease watch error (retrying)"),
                Some(Ok(ev)) => {
                    latest.apply(ev);
                }
            }
        }
    }
}

/// Waits until the lease has moved on from `term` (another term or holder, or no Lease). Err
/// when the watch ended.
async fn wait_moved_on(
    config: &Config,
    term: i32,
    events: &mut Events,
    latest: &mut Latest,
) -> Result<(), anyhow::Error> {
    loop {
        if latest.lease.as_ref().is_none_or(|l| {
            lease::term(l) != term || lease::holder(l) != Some(config.identity.as_str())
        }) {
            return Ok(());
        }
        match events.next().await {
            None => anyhow::bail!("the watch on lease {} ended", config.lease),
            Some(Ok(ev)) => {
                latest.apply(ev);
            }
            Some(Err(_)) => {}
        }
    }
}

/// Renews every retry period until leadership ends, and says why.
async fn lead(
    store: &LeaseStore,
    config: &Config,
    incarnation: &str,
    (term, mut last_ok): (i32, Instant),
    renewed: &watch::Sender<Option<Renewed>>,
    events: &mut (impl futures::Stream<Item = Result<watcher::Event<Lease>, watcher::Error>> + Unpin),
    latest: &mut Latest,
) -> EndReason {
    let t = &config.timings;
    let mut tick = tokio::time::interval(t.retry_period);
    tick.tick().await;
    loop {
        // Every renew is measured from when it was sent, so the deadline is conservative.
        let deadline = last_ok + t.renew_deadline;
        tokio::select! {
            _ = tokio::time::sleep_until(deadline) => return EndReason::RenewDeadline,
            _ = tick.tick() => {
                let (sent, sent_boot_ns) = (Instant::now(), crate::clock::boottime_now());
                match tokio::time::timeout_at(deadline, renew(store, config, incarnation, Some(term))).await {
                    Err(_) => return EndReason::RenewDeadline,
                    Ok(Ok(Ok(_))) => {
                        last_ok = sent;
                        renewed.send_replace(Some(Renewed { term, sent, sent_boot_ns }));
                    }
                    Ok(Ok(Err(why))) => return why,
                    Ok(Err(e)) => tracing::warn!(error = %e, "renew failed; retrying until the renew deadline"),
                }
            }
            ev = events.next() => match ev {
                None => return EndReason::Failed("the lease watch ended".into()),
                Some(Err(_)) => {}
                Some(Ok(ev)) => {
                    if !latest.apply(ev) {
                        continue;
                    }
                    // React at once to a handover request or a new holder.
                    match latest.lease.as_ref().map(|l| standing(l, config, incarnation, Some(term))) {
                        None => return EndReason::LeaseDeleted,
                        Some(Standing::HandoverTo(to)) => return EndReason::Handover { to },
                        Some(Standing::Other | Standing::Stale | Standing::OtherPod(_) | Standing::Unassigned) => {
                            return EndReason::HolderChanged(latest.lease.as_ref().and_then(lease::holder).map(str::to_string));
                        }
                        Some(Standing::Ours) => {}
                    }
                }
            },
        }
    }
}

/// The lease as the watch last showed it. A relist (`Init` .. `InitDone`) replaces it only
/// when complete, so a watch restart never looks like a deletion.
#[derive(Default)]
struct Latest {
    lease: Option<Lease>,
    relist: Option<Option<Lease>>,
}

impl Latest {
    /// Applies a watch event; true when the view is settled (worth acting on).
    fn apply(&mut self, ev: watcher::Event<Lease>) -> bool {
        match ev {
            watcher::Event::Apply(l) => self.lease = Some(l),
            watcher::Event::Delete(_) => self.lease = None,
            watcher::Event::Init => {
                self.relist = Some(None);
                return false;
            }
            watcher::Event::InitApply(l) => {
                self.relist = Some(Some(l));
                return false;
            }
            watcher::Event::InitDone => self.lease = self.relist.take().flatten(),
        }
        true
    }
}

/// How long to wait for the API when releasing on the way out.
pub const RELEASE_TIMEOUT: Duration = Duration::from_secs(2);

#[cfg(test)]
mod tests {
    use super::*;

    /// The standing of a process taking or leading term 3.
    fn standing(l: &Lease, c: &Config, incarnation: &str) -> Standing {
        super::standing(l, c, incarnation, Some(3))
    }

    fn config() -> Config {
        Config {
            lease: "l".into(),
            identity: "me".into(),
            namespace: "ns".into(),
            binary_version: "1.0.0".into(),
            emulation_version: None,
            strategy: arbiter_api::OLDEST_EMULATION_VERSION.into(),
            pod_name: None,
            pod_uid: None,
            termination_log: None,
            instance: None,
            timings: super::super::Timings {
                lease_duration: Duration::from_secs(15),
                renew_deadline: Duration::from_secs(10),
                retry_period: Duration::from_secs(2),
            },
        }
    }

    fn lease(
        holder: &str,
        term: i32,
        labelled: bool,
        mark: Option<&str>,
        incarnation: Option<&str>,
    ) -> Lease {
        let mut l = Lease {
            spec: Some(LeaseSpec {
                holder_identity: Some(holder.into()),
                lease_transitions: Some(term),
                ..LeaseSpec::default()
            }),
            ..Lease::default()
        };
        if labelled {
            l.labels_mut()
                .insert(lease::MANAGED_LABEL.into(), "true".into());
        }
        lease::set_annotation(&mut l, lease::ASSIGNED_ANNOTATION, mark);
        lease::set_annotation(&mut l, INCARNATION_ANNOTATION, incarnation);
        l
    }

    /// Trust-boundary item 4: a term is taken only from the arbiter's assignment.
    #[test]
    fn a_term_is_taken_only_from_the_arbiters_assignment() {
        let c = config();
        let ours = |l: &Lease| matches!(standing(l, &c, "inc"), Standing::Ours);
        let unassigned = |l: &Lease| matches!(standing(l, &c, "inc"), Standing::Unassigned);
        assert!(
            ours(&lease("me", 3, true, Some("me/3"), None)),
            "a fresh assignment"
        );
        assert!(
            unassigned(&lease("me", 7, false, None, None)),
            "a client-go Lease naming this identity"
        );
        assert!(
            unassigned(&lease("me", 3, false, Some("me/3"), None)),
            "no label"
        );
        assert!(unassigned(&lease("me", 3, true, None, None)), "no mark");
        assert!(
            unassigned(&lease("me", 4, true, Some("me/3"), None)),
            "the term edited since the assignment"
        );
        assert!(
            ours(&lease("me", 3, false, None, Some("inc"))),
            "taken by this process already: its own term, whatever was edited since"
        );
        // A term edited in under this process's stamp (the label and mark gone, or not) is
        // nobody's assignment: only the term this process is taking or leads is its own.
        assert!(unassigned(&lease("me", 900, false, None, Some("inc"))));
        assert!(unassigned(&lease(
            "me",
            900,
            true,
            Some("me/900"),
            Some("inc")
        )));
        assert!(matches!(
            super::standing(
                &lease("me", 3, true, Some("me/3"), Some("inc")),
                &c,
                "inc",
                None
            ),
            Standing::Unassigned
        ));
        assert!(matches!(
            standing(
                &lease("me", 3, true, Some("me/3"), Some("other")),
                &c,
                "inc"
            ),
            Standing::Stale
        ));
        assert!(matches!(
            standing(&lease("you", 3, true, Some("you/3"), None), &c, "inc"),
            Standing::Other
        ));
    }

    /// A StatefulSet pod deleted and created again under its name: the new pod's process must
    /// not take a term the arbiter assigned in the old pod (whose stop ends that term).
    #[test]
    fn a_fresh_assignment_is_taken_only_in_the_pod_it_was_made_for() {
        let in_pod = |uid: Option<&str>| Config {
            pod_uid: uid.map(str::to_string),
            ..config()
        };
        let assigned_in = |uid: &str, incarnation: Option<&str>| {
            let mut l = lease("me", 3, true, Some("me/3"), incarnation);
            lease::set_annotation(&mut l, HOLDER_POD_ANNOTATION, Some(uid));
            l
        };
        let old = assigned_in("uid-old", None);
        assert!(matches!(
            standing(&old, &in_pod(Some("uid-new")), "inc"),
            Standing::OtherPod(uid) if uid == "uid-old"
        ));
        assert!(
            matches!(standing(&old, &in_pod(None), "inc"), Standing::OtherPod(_)),
            "a process that cannot say its pod cannot be the one"
        );
        assert!(matches!(
            standing(&old, &in_pod(Some("uid-old")), "inc"),
            Standing::Ours
        ));
        assert!(
            matches!(
                standing(
                    &lease("me", 3, true, Some("me/3"), None),
                    &in_pod(Some("uid-new")),
                    "inc"
                ),
                Standing::Ours
            ),
            "assigned with no pod recorded"
        );
        assert!(
            matches!(
                standing(
                    &assigned_in("uid-old", Some("inc")),
                    &in_pod(Some("uid-new")),
                    "inc"
                ),
                Standing::Ours
            ),
            "taken by this process already"
        );
    }
}

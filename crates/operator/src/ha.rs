//! The operator's own high availability: one replica acts, chosen through a Lease.
//!
//! Replicas race for the Lease by compare-and-swap. A holder renews every retry period; one
//! that has not renewed for the renew deadline (on its monotonic clock) gives up by exiting the
//! process. Others take over only after the record has been unchanged for the lease duration on
//! *their* monotonic clock, or at once when the holder released it (on SIGTERM). That silence is
//! counted only while the standby could read the Lease ([`Silence`]): a time it could not
//! reach the API server for longer than the renew deadline does not count, which leaves the
//! active replica, cut off the same way, the time to resume (below).
//!
//! The renew deadline counts from when the last successful renew was **sent**, not from when its
//! answer came back, and each renew is cut off at the deadline: an answer delayed by a slow or
//! dead connection never extends what this replica believes. Each successful acquire or renew
//! opens the write [`Gate`] until that deadline; the gate closes by itself when it passes, even
//! before [`Elector::keep`] returns.
//!
//! A renew is one compare-and-swap UPDATE from the object this replica last wrote: if nobody
//! else wrote the Lease since, that is all it costs (one request per retry period). Only when
//! it conflicts (someone wrote it), or the last write's outcome is unknown, does the replica
//! read the Lease again and check it still holds it.
//!
//! A replica that finds no Lease and never saw one (a fresh install, or a Lease deleted under
//! an active replica) creates it, then waits the renew deadline before it acts: any replica
//! that was active stops writing by then (its renews fail from the create on).
//!
//! **Resuming.** A replica whose renew deadline passed only because it could not reach the API
//! server (an API server restart, a network blip) has stopped writing, but it need not give up:
//! [`Elector::resume`] retries a compare-and-swap from the object it last wrote successfully.
//! That succeeds only if nobody wrote the Lease since, and every replica that takes over writes
//! it first: so it proves no other replica acted meanwhile, and this one carries on with
//! everything it remembers, instead of a standby starting from nothing (which must wait a full
//! lease duration before judging any lease expired). If anyone wrote it, the replica exits.

use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use kube::ResourceExt;

use arbiter_api::lease::{self, CasError, LeaseStore};
use arbiter_candidate::client::Gate;

#[derive(Clone, Debug)]
pub struct Timings {
    pub lease_duration: Duration,
    pub renew_deadline: Duration,
    pub retry_period: Duration,
}

pub struct Elector {
    store: LeaseStore,
    name: String,
    identity: String,
    timings: Timings,
    gate: Gate,
    /// The Lease as this replica last wrote it successfully: what a renew, and
    /// [`Elector::resume`], swap from.
    written: std::sync::Mutex<Option<Lease>>,
}

/// What a standby replica has seen of the Lease.
#[derive(Default)]
struct Observed {
    silence: Silence,
    /// Whether it ever saw the Lease exist.
    ever_seen: bool,
    /// The highest term (`leaseTransitions`) it saw: a Lease it creates again starts above it,
    /// so that every takeover moves the term (a replica's renewal goes by it).
    last_term: i32,
}

/// How long a standby has seen the Lease's record unchanged, counting only the time it could
/// read it: an interval between two answers counts only if the second read was sent within the
/// renew deadline of the first answer. A longer gap (most likely an API server restart, in
/// which the active replica may have stopped writing only to resume once the server is back)
/// adds nothing, and takes nothing away: a standby whose reads fail now and then still gets
/// there. Intervals run from answer to answer, so the count never exceeds the time since the
/// record was first seen in an answer.
#[derive(Default)]
struct Silence {
    /// The record (or "missing") and how long it has been seen unchanged.
    record: Option<(String, Duration)>,
    /// When the last successful read answered.
    last_answer: Option<Instant>,
}

impl Silence {
    /// A read sent at `asked` answered at `answered` with `record`; returns how long the
    /// record has now been seen unchanged.
    fn read(
        &mut self,
        record: String,
        asked: Instant,
        answered: Instant,
        gap: Duration,
    ) -> Duration {
        let quiet = match (self.last_answer, &mut self.record) {
            (Some(last), Some((seen, quiet))) if *seen == record => {
                if asked.saturating_duration_since(last) <= gap {
                    *quiet += answered.saturating_duration_since(last);
                }
                *quiet
            }
            _ => {
                self.record = Some((record, Duration::ZERO));
                Duration::ZERO
            }
        };
        self.last_answer = Some(answered);
        quiet
    }
}

/// What an acquire attempt did.
enum Acquired {
    NotYet,
    /// Took an existing Lease (free, released, or silent for a full duration).
    Took,
    /// Created the Lease: act only after the renew deadline.
    Created,
}

/// Why a renew did not succeed.
enum Renew {
    /// The Lease is gone or names another replica.
    Lost(String),
    Failed(anyhow::Error),
}

/// Leadership was lost (the renew deadline passed); the caller must stop acting at once.
#[derive(Debug, thiserror::Error)]
#[error("lost leadership of lease {name}: no successful renew for {since:?}")]
pub struct Lost {
    pub name: String,
    pub since: Duration,
    /// The Lease is gone or names another replica (not only: no renew got through).
    pub taken: bool,
}

impl Elector {
    pub fn new(
        store: LeaseStore,
        name: &str,
        identity: &str,
        timings: Timings,
        gate: Gate,
    ) -> Elector {
        Elector {
            store,
            name: name.into(),
            identity: identity.into(),
            timings,
            gate,
            written: std::sync::Mutex::new(None),
        }
    }

    /// Opens the write gate until the renew deadline after a successful write sent when the
    /// boot clock read `sent_boot` (the gate counts a suspension of the machine; this
    /// process's timers do not).
    fn open_gate(&self, sent_boot: u64) {
        self.gate.open_until(arbiter_candidate::clock::after(
            sent_boot,
            self.timings.renew_deadline,
        ));
    }

    fn remember(&self, written: Lease) {
        *self.written.lock().unwrap() = Some(written);
    }

    /// Whether `current` is the very record this replica last wrote.
    fn wrote(&self, current: &Lease) -> bool {
        let written = self.written.lock().unwrap();
        let version = |l: &Lease| l.metadata.resource_version.clone();
        written
            .as_ref()
            .is_some_and(|w| version(w).is_some() && version(w) == version(current))
    }

    /// Waits until this replica holds the Lease; returns when the write that took it was sent
    /// (the renew deadline counts from there).
    pub async fn acquire(&self) -> Instant {
        let mut observed = Observed::default();
        loop {
            let sent = Instant::now();
            let sent_boot = arbiter_candidate::clock::boottime_now();
            match self.try_acquire(&mut observed).await {
                Ok(Acquired::Took) => {
                    self.open_gate(sent_boot);
                    return sent;
                }
                Ok(Acquired::Created) => {
                    // A Lease this replica never saw may have been deleted under an active
                    // replica, whose write gate stays open until its last renew + the renew
                    // deadline (its renews fail from our create on). Act only after that, with a
                    // renew that proves nobody else wrote since.
                    tokio::time::sleep(self.timings.renew_deadline).await;
                    let sent = Instant::now();
                    let sent_boot = arbiter_candidate::clock::boottime_now();
                    if let Ok(Ok(())) =
                        tokio::time::timeout(self.timings.renew_deadline, self.renew()).await
                    {
                        self.open_gate(sent_boot);
                        return sent;
                    }
                }
                Ok(Acquired::NotYet) => {}
                Err(e) => tracing::debug!(error = %e, "acquire attempt failed"),
            }
            tokio::time::sleep(self.timings.retry_period).await;
        }
    }

    async fn try_acquire(&self, observed: &mut Observed) -> anyhow::Result<Acquired> {
        let asked = Instant::now();
        let current = self.store.get(&self.name).await?;
        // How long the Lease has looked like this (missing included), on this clock, counted
        // while this replica could read it ([`Silence`]).
        let fingerprint = match &current {
            None => "missing".to_string(),
            Some(l) => serde_json::to_string(&l.spec)?,
        };
        let unchanged_for = observed.silence.read(
            fingerprint,
            asked,
            Instant::now(),
            self.timings.renew_deadline,
        );
        let ever_seen = &mut observed.ever_seen;
        // A full duration of silence, judged with the longest duration either side knows: a
        // deleted Lease, a holder cleared by hand, or a lowered duration do not shorten it.
        let quiet = |l: Option<&Lease>| {
            let written = l.and_then(lease::duration).unwrap_or_default();
            unchanged_for >= written.max(self.timings.lease_duration)
        };
        let existed = *ever_seen;
        *ever_seen |= current.is_some();
        if let Some(l) = &current {
            observed.last_term = observed.last_term.max(lease::term(l));
        }
        if !existed && let Some(l) = &current {
            tracing::info!(lease = %self.name, holder = ?lease::holder(l), "watching the operator lease");
        }
        let Some(current) = current else {
            // Deleted while this replica watched (the active one may still be writing): wait a
            // full duration. Never seen at all (a fresh install): take it at once.
            if existed && !quiet(None) {
                return Ok(Acquired::NotYet);
            }
            let mut l = Lease::default();
            l.metadata.name = Some(self.name.clone());
            l.spec = Some(self.record(observed.last_term + 1));
            self.remember(self.store.create(&l).await?);
            tracing::info!(lease = %self.name, identity = %self.identity, "created the operator lease; acting after the renew deadline");
            return Ok(Acquired::Created);
        };
        let free = match lease::holder(&current) {
            // Released by the active replica itself (on SIGTERM): at once.
            None if lease::released_by(&current).is_some() => true,
            // Names this replica as it wrote it. One naming it that it never wrote (edited by
            // hand, restored from a backup) proves nothing: another replica may be acting; a
            // full duration of silence, as for anyone else's.
            Some(h) if h == self.identity && self.wrote(&current) => true,
            _ => quiet(Some(&current)),
        };
        if !free {
            return Ok(Acquired::NotYet);
        }
        let mut l = current.clone();
        l.spec = Some(self.record(lease::term(&current) + 1));
        // The last release is history: a later hand edit clearing the holder must not pass for it.
        lease::set_annotation(&mut l, lease::RELEASED_BY_ANNOTATION, None);
        self.remember(self.store.replace(&l).await?);
        tracing::info!(lease = %self.name, identity = %self.identity, "acquired operator lease");
        Ok(Acquired::Took)
    }

    /// A fresh record: acquired and renewed at the same instant (a later renew time says the
    /// holder has renewed since).
    fn record(&self, term: i32) -> LeaseSpec {
        let now = lease::now();
        LeaseSpec {
            holder_identity: Some(self.identity.clone()),
            lease_duration_seconds: Some(arbiter_api::lease::seconds(self.timings.lease_duration)),
            lease_transitions: Some(term),
            acquire_time: Some(now.clone()),
            renew_time: Some(now),
            ..LeaseSpec::default()
        }
    }

    /// Renews every retry period from `acquired` (when the acquiring write was sent); returns
    /// when leadership is lost, at the latest at the renew deadline after the last successful
    /// renew was sent.
    pub async fn keep(&self, acquired: Instant) -> Lost {
        let mut last_ok = acquired;
        let mut taken = false;
        loop {
            let deadline = tokio::time::Instant::from_std(last_ok + self.timings.renew_deadline);
            tokio::select! {
                _ = tokio::time::sleep_until(deadline) => break,
                _ = tokio::time::sleep(self.timings.retry_period) => {}
            }
            let sent = Instant::now();
            let sent_boot = arbiter_candidate::clock::boottime_now();
            match tokio::time::timeout_at(deadline, self.renew()).await {
                Ok(Ok(())) => {
                    last_ok = sent;
                    self.open_gate(sent_boot);
                }
                // The Lease is gone or names someone else: stop writing now, not at the deadline.
                Ok(Err(Renew::Lost(why))) => {
                    self.gate.close();
                    tracing::error!(lease = %self.name, %why, "lost the operator lease");
                    taken = true;
                    break;
                }
                Ok(Err(Renew::Failed(e))) => {
                    tracing::warn!(error = %e, "renewing the operator lease failed")
                }
                Err(_) => break,
            }
        }
        Lost {
            name: self.name.clone(),
            since: last_ok.elapsed(),
            taken,
        }
    }

    /// After the renew deadline passed without the Lease being taken: retries, every retry
    /// period, a compare-and-swap renew from the object this replica last wrote successfully.
    /// Returns when it went through (when that write was sent: the renew deadline counts from
    /// there), or `None` as soon as the Lease turns out to have been written by anyone else (or
    /// deleted): then another replica may have acted, and this one must not.
    pub async fn resume(&self) -> Option<Instant> {
        let mut l = self.written.lock().unwrap().clone()?;
        loop {
            tokio::time::sleep(self.timings.retry_period).await;
            let spec = l.spec.get_or_insert_with(LeaseSpec::default);
            spec.renew_time = Some(lease::renewed_after(spec.renew_time.as_ref()));
            let sent = Instant::now();
            let sent_boot = arbiter_candidate::clock::boottime_now();
            let attempt =
                tokio::time::timeout(self.timings.renew_deadline, self.store.replace(&l)).await;
            match attempt {
                Ok(Ok(written)) => {
                    self.remember(written);
                    self.open_gate(sent_boot);
                    tracing::info!(lease = %self.name, "resumed: nobody wrote the operator lease meanwhile");
                    return Some(sent);
                }
                Ok(Err(CasError::Conflict(_) | CasError::NotFound(_))) => {
                    tracing::error!(lease = %self.name, "the operator lease was written by someone else meanwhile: not resuming");
                    return None;
                }
                Ok(Err(e)) => {
                    tracing::debug!(error = %e, "resuming: the API server is still unreachable")
                }
                Err(_) => tracing::debug!("resuming: the renew timed out"),
            }
        }
    }

    async fn renew(&self) -> Result<(), Renew> {
        let failed = |e: anyhow::Error| Renew::Failed(e);
        // From the last write: nobody else wrote since, or the compare-and-swap says so, and
        // then (in this same renew) from the Lease as it is now.
        let cached = self.written.lock().unwrap().clone();
        if let Some(l) = cached.clone() {
            match self.swap(l).await {
                Err(Renew::Failed(e))
                    if e.downcast_ref::<CasError>().is_some_and(|c| {
                        matches!(c, CasError::Conflict(_) | CasError::NotFound(_))
                    }) => {}
                other => return other,
            }
        }
        let Some(l) = self
            .store
            .get(&self.name)
            .await
            .map_err(|e| failed(e.into()))?
        else {
            return Err(Renew::Lost("it was deleted".into()));
        };
        // Someone wrote it since. At another term, another replica took it over in between,
        // whoever names this one now (a hand edit, a backup restored): it may be acting.
        if let Some(last) = cached
            && lease::term(&l) != lease::term(&last)
        {
            return Err(Renew::Lost(format!(
                "it was taken over since (term {} is now {})",
                lease::term(&last),
                lease::term(&l)
            )));
        }
        self.swap(l).await
    }

    /// One renew of `l` (as read or last written) by compare-and-swap, if it names this replica.
    async fn swap(&self, mut l: Lease) -> Result<(), Renew> {
        let failed = |e: anyhow::Error| Renew::Failed(e);
        if lease::holder(&l) != Some(self.identity.as_str()) {
            return Err(Renew::Lost(format!(
                "it is now held by {:?}",
                lease::holder(&l)
            )));
        }
        let spec = l.spec.get_or_insert_with(LeaseSpec::default);
        // Always another renewTime: a standby counts silence by the record not changing.
        spec.renew_time = Some(lease::renewed_after(spec.renew_time.as_ref()));
        // Renewing also restores the duration, should someone have lowered it.
        spec.lease_duration_seconds =
            Some(arbiter_api::lease::seconds(self.timings.lease_duration));
        match self.store.replace(&l).await {
            Ok(written) => {
                self.remember(written);
                Ok(())
            }
            // Someone wrote the Lease since (or it is gone): the caller reads it again. An
            // unknown outcome that did land makes the next swap from this object conflict.
            Err(e) => Err(failed(e.into())),
        }
    }

    /// Gives the Lease up (holder `""`) so a standby takes over at once.
    pub async fn release(&self) -> Result<(), CasError> {
        let mut l = match self.store.get(&self.name).await {
            Ok(Some(l)) => l,
            Ok(None) => return Ok(()),
            // Said, not returned: a replica that cannot read its Lease cannot release it, and
            // its standby (or the next install) waits the lease out.
            Err(e) => {
                tracing::warn!(lease = %self.name, error = %e, "reading the operator lease to release it failed: the next replica waits it out");
                return Ok(());
            }
        };
        if lease::holder(&l) != Some(self.identity.as_str()) {
            return Ok(());
        }
        lease::mark_released(&mut l, Some(&self.identity));
        self.store.replace(&l).await?;
        tracing::info!(lease = %l.name_any(), "released operator lease");
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fake_api::{Answer, FakeApi};

    const GAP: Duration = Duration::from_secs(10);

    /// Replica `identity`'s elector for the HA Lease, on `client`.
    fn elector(client: kube::Client, identity: &str, lease_duration: Duration) -> Elector {
        let timings = Timings {
            lease_duration,
            renew_deadline: GAP,
            retry_period: secs(2),
        };
        Elector::new(
            LeaseStore::new(client, "ns"),
            "arbiter-operator",
            identity,
            timings,
            Gate::default(),
        )
    }

    fn record(version: &str, term: i32) -> serde_json::Value {
        serde_json::json!({
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": {"name": "arbiter-operator", "namespace": "ns", "resourceVersion": version},
            "spec": {
                "holderIdentity": "op-a",
                "leaseDurationSeconds": 15,
                "leaseTransitions": term,
                "renewTime": "2026-01-01T00:00:00.000000Z",
            },
        })
    }

    /// A Lease deleted under the replicas and created again by one of them starts above every
    /// term that replica saw: a takeover always moves the term, which a renewal goes by.
    #[tokio::test]
    async fn a_lease_created_again_starts_above_the_terms_seen() {
        let (client, api) = FakeApi::new(|r| match r.method.as_str() {
            "GET" => Answer::status(404, "NotFound", "not found"),
            _ => Answer::echo(r, 201),
        });
        // Silent for a full duration at once.
        let elector = elector(client, "op-b", Duration::ZERO);
        let mut observed = Observed {
            ever_seen: true,
            last_term: 7,
            ..Observed::default()
        };
        assert!(matches!(
            elector.try_acquire(&mut observed).await.unwrap(),
            Acquired::Created
        ));
        let created = api.requests();
        let post = created
            .iter()
            .find(|r| r.method == "POST")
            .expect("a create");
        assert!(
            post.body.contains(r#""leaseTransitions":8"#),
            "{}",
            post.body
        );
    }

    /// The renew from the last write conflicts, and the Lease read back names this replica
    /// again, but at the next term: another replica took it over in between and someone edited
    /// it back (or restored a backup). That is lost leadership, not a renew.
    #[tokio::test]
    async fn a_lease_that_names_this_replica_at_another_term_is_lost() {
        let (client, api) = FakeApi::new(|r| match r.method.as_str() {
            "GET" => Answer::ok(record("6", 4)),
            // A compare-and-swap from version 5 conflicts; from 6 it goes through.
            "PUT" if r.body.contains(r#""resourceVersion":"5""#) => {
                Answer::status(409, "Conflict", "the object has been modified")
            }
            _ => Answer::echo(r, 200),
        });
        let elector = elector(client, "op-a", secs(15));
        elector.remember(serde_json::from_value(record("5", 3)).unwrap());
        match elector.renew().await {
            Err(Renew::Lost(why)) => assert!(why.contains("term 3 is now 4"), "{why}"),
            Err(Renew::Failed(e)) => panic!("renew failed: {e}"),
            Ok(()) => panic!("renewed a Lease another replica took over in between"),
        }
        let puts = api.requests().iter().filter(|r| r.method == "PUT").count();
        assert_eq!(puts, 1, "no write after the read: {:?}", api.requests());
    }

    fn secs(s: u64) -> Duration {
        Duration::from_secs(s)
    }

    #[test]
    fn silence_counts_from_answer_to_answer_while_reads_go_through() {
        let (t0, mut s) = (Instant::now(), Silence::default());
        assert_eq!(s.read("a".into(), t0, t0 + secs(1), GAP), secs(0));
        assert_eq!(s.read("a".into(), t0 + secs(3), t0 + secs(4), GAP), secs(3));
        assert_eq!(s.read("a".into(), t0 + secs(6), t0 + secs(7), GAP), secs(6));
        assert_eq!(
            s.read("b".into(), t0 + secs(9), t0 + secs(10), GAP),
            secs(0),
            "a changed record starts again"
        );
    }

    #[test]
    fn a_gap_longer_than_the_renew_deadline_adds_nothing_and_takes_nothing_away() {
        let (t0, mut s) = (Instant::now(), Silence::default());
        s.read("a".into(), t0, t0, GAP);
        assert_eq!(s.read("a".into(), t0 + secs(2), t0 + secs(2), GAP), secs(2));
        // Unreachable for 20 s (an API server restart): the active replica may resume.
        assert_eq!(
            s.read("a".into(), t0 + secs(22), t0 + secs(22), GAP),
            secs(2)
        );
        assert_eq!(
            s.read("a".into(), t0 + secs(24), t0 + secs(24), GAP),
            secs(4)
        );
    }

    #[test]
    fn a_slow_answer_counts_up_to_the_answer_only() {
        let (t0, mut s) = (Instant::now(), Silence::default());
        s.read("a".into(), t0, t0 + secs(9), GAP);
        assert_eq!(
            s.read("a".into(), t0 + secs(11), t0 + secs(12), GAP),
            secs(3),
            "from the first answer, not from when the first read was sent"
        );
    }

    #[test]
    fn a_standby_whose_reads_fail_now_and_then_still_gets_there() {
        let (t0, mut s) = (Instant::now(), Silence::default());
        let mut at = t0;
        let mut quiet = s.read("a".into(), at, at, GAP);
        // Every third read times out (a 10 s timeout, then the 2 s retry period).
        for i in 0..30 {
            at += if i % 3 == 2 { secs(14) } else { secs(2) };
            quiet = s.read("a".into(), at, at, GAP);
        }
        assert!(quiet >= secs(15), "{quiet:?}");
    }
}

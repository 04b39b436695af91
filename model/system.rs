//! The protocol as a state machine for stateright: the Lease store, the candidates (agent, guard
//! and CMD each), one or two operator replicas with their own HA lease and write gate, on a
//! discrete clock (one step of `Tick` is one second of real time). The operator's step runs the
//! real election: [`arbiter_election::heard::Heard`] judges liveness from what its watches
//! delivered and the pings it wrote, and [`arbiter_election::decide::decide`] picks the action.
//!
//! What is abstracted (docs/model.md says why): every process's clock runs at real time's rate;
//! a replica's watches deliver each second's writes at the end of the second (a paused replica's
//! when it runs again); a reconcile, and a write, is one atomic step; an agent does its second's
//! work in one step; a candidate's pod is judged only for forced exits.

use std::sync::OnceLock;
use std::time::{Duration, Instant};

use arbiter_election::decide::{self, Action, Candidate, PodSeen, PodState, Rules};
use arbiter_election::heard::{Heard, Version};
use arbiter_election::proof::{forced_exit_due, stop_proof};
use arbiter_election::standing::{Process, Record, Standing, standing};
use arbiter_election::strategy::OLDEST_EMULATION_VERSION;
use arbiter_election::terms::{Block, next_term};
use arbiter_election::timings::kill_grace_fits;
use jiff::Timestamp;

/// The timings, in ticks (seconds), scaled down from the defaults (15 s / 10 s / 2 s / 3 s)
/// with their relations kept: renew deadline + kill grace < lease duration. The kill grace is
/// the longest whole number of seconds the agent's own check allows ([`kill_grace`]): 1 s.
pub const LEASE: u8 = 4;
pub const RENEW_DEADLINE: u8 = 2;
pub const ACK_WINDOW: u8 = 2;
/// The settle (`--settle`, at most the ack window): a registration is delivered at the end of
/// its second, so candidates that register in the same second or the next are counted before
/// a first election, and before a live holder is asked to hand over.
pub const SETTLE: u8 = 2;
/// The longest kill grace, in whole seconds up to the lease, that the agent's check of its
/// timings ([`arbiter_election::timings::kill_grace_fits`]) allows with [`LEASE`] and
/// [`RENEW_DEADLINE`]: a looser check gives the model a longer grace.
pub fn kill_grace() -> u8 {
    static GRACE: OnceLock<u8> = OnceLock::new();
    *GRACE.get_or_init(|| {
        (0..=LEASE)
            .filter(|k| kill_grace_fits(secs(LEASE), secs(RENEW_DEADLINE), secs(*k)))
            .max()
            .expect("the renew deadline leaves room in the lease")
    })
}

/// How many terms a mark write reserves (the operator's is 16).
pub const BLOCK: i32 = 2;
/// The operator's own HA lease, scaled the same way (15 s / 10 s, renewed every 2 s): a
/// standby takes over after the HA lease was unchanged this long on its clock ...
pub const OP_LEASE: u8 = 3;
/// ... and the active replica's write gate stays open this long after a successful renew was
/// sent (it renews every second).
pub const OP_RENEW_DEADLINE: u8 = 2;
/// Liveness: once nothing has happened for this long (no fault, no recovery, no registration),
/// a live candidate runs CMD and no term is assigned any more. The worst case the checker
/// found: the active replica is paused just after a candidate registered and froze; the
/// standby takes over once the HA lease was unchanged for its duration (3 s), elects the
/// frozen candidate (its registration, seen within the ack validity, counts as alive), waits
/// its term out (4 s), and assigns and hands the term to a live candidate (2 s): 9 s, after the
/// second in which the last fault fell.
pub const CALM: u8 = 10;
/// Version order: with no fault, the holder is outranked by the same best live registered
/// candidate for fewer than this many seconds (a registration is delivered at the end of its
/// second, the pool settles for the next, the candidate is pinged and answers, the holder is
/// asked to hand over and releases in the second after). A better candidate registering
/// meanwhile starts the count again: the holder is asked once, for the best, after the pool
/// has settled (`--settle`), so each better registration can postpone the handover by up to
/// the settle.
pub const HANDOVER: u8 = 4;

/// A seeded change of the protocol that the checker must catch.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Mutation {
    /// Neither the agent nor its guard stops CMD at the renew deadline.
    NoRenewDeadline,
    /// The guard kills CMD at the renew deadline plus a kill grace that runs past the lease.
    LongKillGrace,
    /// The operator judges a term over from the holder's `renewTime` read on its own wall clock
    /// (a holder whose clock runs behind looks expired) instead of its own observation.
    ExpiryByRenewTime,
    /// The operator takes the next term from the Lease alone, without the term mark (a deleted
    /// Lease restarts its terms).
    NoTermMark,
    /// The term mark is written after the Lease that names the term (an operator that stops in
    /// between leaves a term above the mark).
    MarkAfterLease,
    /// The operator never asks a holder to hand over to a candidate the rules rank higher.
    NoHandover,
    /// Agents do not answer pings (a standby is then never found alive once its registration
    /// is old).
    IgnorePings,
    /// A lapsed holder's forced exit targets the pod its candidate names now, not the pod its
    /// term was assigned in (with the same containers).
    OwnerPod,
    /// A replica that finds no Lease and remembers no holder elects at once, though the term
    /// mark says a term was handed out before it became active.
    NoUnknownTerm,
    /// The agent counts its renew deadline from a renew's answer instead of its send, and so
    /// waits for a slow answer to its take as long as it comes (the real agent cuts every
    /// request off at the renew deadline counted from the send).
    RenewDeadlineFromAnswer,
    /// An agent takes a fresh assignment to its name whatever pod the arbiter recorded for it
    /// (a new pod of the same name takes a term assigned while the old one ran, and the old
    /// pod's stop then ends the term the new one runs).
    TakeInAnyPod,
    /// The operator ends a term when the pod it recorded at assignment stops, whichever pod
    /// took the term (and, with the Lease gone, whether or not a take was seen).
    PodStopWhoeverTook,
    /// The agent never stops CMD itself at its renew deadline: only its guard does.
    AgentReliesOnGuard,
    /// No guard: only the agent stops CMD at its renew deadline.
    NoGuard,
    /// The operator takes a candidate's `renewTime` at or after its ping's time, on its own
    /// wall clock, as the answer (upstream's `renewTime >= pingTime`): a candidate written by
    /// hand with a `renewTime` in the future answers every ping without a process behind it.
    FutureRenewAsAnswer,
    /// No settle (`--settle=0s`): a first election does not wait for candidates started
    /// together, and the first to register leads first, whatever its version.
    NoSettle,
}

impl Mutation {
    pub const ALL: [Mutation; 16] = [
        Mutation::NoRenewDeadline,
        Mutation::LongKillGrace,
        Mutation::ExpiryByRenewTime,
        Mutation::NoTermMark,
        Mutation::MarkAfterLease,
        Mutation::NoHandover,
        Mutation::IgnorePings,
        Mutation::OwnerPod,
        Mutation::NoUnknownTerm,
        Mutation::RenewDeadlineFromAnswer,
        Mutation::TakeInAnyPod,
        Mutation::PodStopWhoeverTook,
        Mutation::AgentReliesOnGuard,
        Mutation::NoGuard,
        Mutation::FutureRenewAsAnswer,
        Mutation::NoSettle,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Mutation::NoRenewDeadline => "no-renew-deadline",
            Mutation::LongKillGrace => "long-kill-grace",
            Mutation::ExpiryByRenewTime => "expiry-by-renew-time",
            Mutation::NoTermMark => "no-term-mark",
            Mutation::MarkAfterLease => "mark-after-lease",
            Mutation::NoHandover => "no-handover",
            Mutation::IgnorePings => "ignore-pings",
            Mutation::OwnerPod => "owner-pod",
            Mutation::NoUnknownTerm => "no-unknown-term",
            Mutation::RenewDeadlineFromAnswer => "renew-deadline-from-answer",
            Mutation::TakeInAnyPod => "take-in-any-pod",
            Mutation::PodStopWhoeverTook => "pod-stop-whoever-took",
            Mutation::AgentReliesOnGuard => "agent-relies-on-guard",
            Mutation::NoGuard => "no-guard",
            Mutation::FutureRenewAsAnswer => "future-renew-as-answer",
            Mutation::NoSettle => "no-settle",
        }
    }

    /// The property it breaks.
    pub fn breaks(self) -> &'static str {
        match self {
            Mutation::NoTermMark | Mutation::MarkAfterLease => "fencing",
            Mutation::NoHandover => "version order",
            Mutation::IgnorePings | Mutation::FutureRenewAsAnswer => "liveness",
            Mutation::OwnerPod => "forced exits",
            Mutation::NoSettle => "started together",
            Mutation::NoUnknownTerm => "exclusion",
            _ => "exclusion",
        }
    }
}

/// The model: how many candidates and operator replicas, how long real time may run, how many
/// faults.
#[derive(Clone, Debug)]
pub struct System {
    pub candidates: u8,
    pub replicas: u8,
    pub max_time: u8,
    pub faults: u8,
    /// The settle, in ticks ([`SETTLE`]; the recorded counterexamples of other mechanisms were
    /// found with none).
    pub settle: u8,
    /// The fault kinds added with late answers: slow answers, hand-written candidates, an agent
    /// or guard frozen alone, force-deleted pods, the recorded pod deleted from the Lease by
    /// hand (off: the first kinds only, for the deeper fault budgets).
    pub extended: bool,
    pub mutation: Option<Mutation>,
}

/// The Lease object in the store.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct LeaseObj {
    pub rv: u64,
    pub holder: Option<u8>,
    pub term: i32,
    /// The arbiter's assignment mark: (holder, term).
    pub assigned: Option<(u8, i32)>,
    pub released_by: Option<u8>,
    pub preferred: Option<u8>,
    /// When the holder last renewed, on its own wall clock ([`Stamp`]).
    pub renew: Stamp,
    /// The holder's pod and its container restarts, as the operator recorded them when it
    /// assigned the term (`arbiter.dev/holder-pod-uid`, `arbiter.dev/holder-restarts`).
    pub holder_pod: Option<(u8, u8)>,
    /// What really happened, for the forced-exit property: the pod the holder ran in when the
    /// term was assigned and its container restarts then, and the same of the pod whose agent
    /// took the term, when it took it.
    pub truth: (u8, u8, Option<(u8, u8)>),
    /// The process that took the term (`arbiter.dev/incarnation`; none on a fresh assignment).
    pub incarnation: Option<u8>,
    /// The pod it took the term in (`arbiter.dev/taken-in-pod`).
    pub taken_in: Option<u8>,
}

/// A `renewTime`: a second of a wall clock, and how many renewals in that second (or after a
/// clock went back) wrote a later instant than the last (`lease::renewed_after`: a renewal
/// always writes a later `renewTime` than the one it replaces, by a millisecond at least).
pub type Stamp = (u8, u8);

/// The `renewTime` a renewal at wall-clock second `wall` writes over `previous`.
fn renewed_after(previous: Stamp, wall: u8) -> Stamp {
    if wall > previous.0 {
        (wall, 0)
    } else {
        (previous.0, previous.1 + 1)
    }
}

/// What the operator compares of two Lease records (`lease_records::fingerprint`: the spec):
/// holder, term, preferred holder, renewTime.
fn fingerprint(l: &LeaseObj) -> (Option<u8>, i32, Option<u8>, Stamp) {
    (l.holder, l.term, l.preferred, l.renew)
}

/// How far ahead of real time a candidate written by hand puts its `renewTime`
/// ([`Step::Ghost`]).
pub const GHOST_AHEAD: u8 = 60;

/// A LeaseCandidate object in the store.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct CandObj {
    pub rv: u64,
    /// `renewTime`, on the candidate's wall clock (ticks).
    pub renew: u8,
    /// The resourceVersion the operator's last ping wrote.
    pub pinged_at_rv: Option<u64>,
    /// How many times a process registered it (a new process is a new registration).
    pub registrations: u8,
    /// The pod it names as its owner (the one its latest process runs in).
    pub owner_pod: u8,
    /// That pod's container restarts when it registered: a later restart is the registering
    /// process's end (production reads the kubelet's termination message for its incarnation:
    /// `pod_facts::registered_process_exited`).
    pub restarts: u8,
}

/// The operator's own HA lease: the replica it names, and its resourceVersion.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct HaLease {
    pub holder: Option<u8>,
    pub rv: u64,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Agent {
    Down,
    Standby,
    /// Holds `term`; its last successful renew was sent at `sent`.
    Holding {
        term: i32,
        sent: u8,
    },
    /// Stands by after its leadership of `term` ended: it does not take that term again.
    Ended {
        term: i32,
    },
}

/// A candidate's processes: the agent, its guard (which holds the deadline), CMD.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Cand {
    pub agent: Agent,
    /// CMD runs with this term.
    pub cmd: Option<i32>,
    /// The guard's deadline for CMD (last successful renew sent + renew deadline).
    pub deadline: u8,
    /// The whole candidate is frozen (a paused container or VM).
    pub paused: bool,
    /// Only its agent is frozen (CMD and the guard run).
    pub agent_paused: bool,
    /// Only its guard is frozen (CMD and the agent run).
    pub guard_paused: bool,
    /// Its wall clock runs this many ticks behind.
    pub clock_behind: u8,
    /// Cut off from the API server: its writes fail.
    pub cut: bool,
    /// The last ping (by rv) it answered.
    pub answered: Option<u64>,
    /// Its agent process (a new registration, a new number): its incarnation.
    pub inc: u8,
    /// Its pods below this number are confirmed stopped (deleted through the kubelet); a pod
    /// force-deleted is gone without that proof ([`Step::ForceReplacePod`]).
    pub confirmed: u8,
    /// The pod it runs in (a new pod, a new number) and its container restarts.
    pub pod: u8,
    pub restarts: u8,
    /// Its pod was evicted and is terminating: it goes at some later step ([`Step::PodGone`]),
    /// after a termination grace the protocol does not count on.
    pub evicted: bool,
    /// Its take of a term (the first renew, before CMD) is applied but answered late
    /// ([`Step::SlowAnswer`]).
    pub slow: bool,
    /// A take applied in the store whose answer has not arrived: its term, and when it was
    /// sent.
    pub in_flight: Option<(i32, u8)>,
}

impl Cand {
    /// Its wall clock at real time `t`.
    fn wall(&self, t: u8) -> u8 {
        t.saturating_sub(self.clock_behind)
    }

    /// Running, reachable and registered: a candidate that can lead.
    pub fn live(&self) -> bool {
        self.agent != Agent::Down && !self.paused && !self.agent_paused && !self.cut
    }
}

/// A replica's memory of a holder (`operator/term/held.rs`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Held {
    pub holder: u8,
    pub term: i32,
    /// When the last record naming it was first seen.
    pub seen: u8,
    /// Its pod, as recorded when the term was assigned.
    pub pod: Option<u8>,
    /// The pod its agent took the term in, once a record of the take was seen.
    pub taker: Option<u8>,
}

impl Held {
    fn new(holder: u8, term: i32, seen: u8, pod: Option<u8>) -> Held {
        Held {
            holder,
            term,
            seen,
            pod,
            taker: None,
        }
    }
}

/// One operator replica: its memory of the election (all of it from its own watches and
/// writes), and its part in the operator's HA.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Op {
    pub heard: Vec<Heard>,
    /// The registrations of each candidate its watch delivered.
    pub registrations: Vec<u8>,
    /// The pod each candidate names, as its candidate watch delivered it, and that pod's
    /// container restarts as its pod watch did (pods live as long as the model: never absent).
    pub pods: Vec<Option<(u8, u8)>>,
    /// What its watches showed of the pod each candidate names (`pod_facts::seen`): `decide`
    /// is given the state production judges from it ([`PodState::of`]).
    pub pods_seen: Vec<PodSeen>,
    /// The Lease record as last delivered, and when (tick) a record with its content was first.
    pub record: Option<(LeaseObj, u8)>,
    /// The holder it last saw or assigned (what makes hand edits harmless:
    /// [`decide::Previous`]).
    pub held: Option<Held>,
    /// Per candidate, the pods below this number its pod watch saw deleted (a kubelet's
    /// report that whatever ran in them stopped).
    pub gone: Vec<u8>,
    /// When it first saw the current term.
    pub term_seen: Option<(i32, u8)>,
    /// The terms reserved by its last mark write.
    pub block: Option<Block>,
    /// A mark write still to make (only under [`Mutation::MarkAfterLease`]: after the Lease).
    pub pending_mark: Option<i32>,
    /// The tick it last operated at (renewed or tried the HA lease, and reconciled): once a
    /// second, while it runs.
    pub operated: Option<u8>,
    /// It holds the HA lease, as far as it knows.
    pub active: bool,
    /// Its writes pass while real time is below this (its last successful HA renew's send +
    /// the renew deadline, on its monotonic clock).
    pub gate: u8,
    /// The HA lease's resourceVersion as it last wrote it.
    pub written: Option<u64>,
    /// As a standby: the HA lease version it has seen unchanged, for how long (counting only
    /// the time it could read it), and when it last read it.
    pub silence: Option<(u64, u8, u8)>,
    /// Frozen whole (a paused process or node): it neither renews, reconciles nor receives.
    pub paused: bool,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct State {
    pub t: u8,
    pub lease: Option<LeaseObj>,
    pub cand_objs: Vec<Option<CandObj>>,
    /// The last resourceVersion of the Lease, and of each candidate (the protocol compares
    /// versions of one object only: one counter each keeps writes to different objects from
    /// making otherwise equal states differ).
    pub lease_rv: u64,
    pub cand_rv: Vec<u64>,
    /// The term mark (high-water) in the store.
    pub mark: i32,
    pub ha: HaLease,
    pub cands: Vec<Cand>,
    pub ops: Vec<Op>,
    pub faults: u8,
    /// Sticky: two CMDs acted at once, neither frozen.
    pub overlap: bool,
    /// Sticky: a term was assigned that was not above every term assigned before.
    pub term_reused: bool,
    /// The protected resource: the highest `ARBITER_TERM` it accepted a write with, and the
    /// process that wrote it (candidate, incarnation). It refuses a lower term.
    pub accepted: Option<(i32, u8, u8)>,
    /// Sticky: it accepted writes from two processes at one term (what fencing rules out).
    pub two_writers: bool,
    /// Sticky: it refused a write (a resumed holder's, below a later term: the model reaches
    /// that).
    pub refused: bool,
    /// The highest term ever assigned.
    pub max_term: i32,
    /// Sticky: a pod was forced out that neither ran the deposed holder when its term was
    /// assigned nor took the term, or that the evicting replica saw restart since the term was
    /// taken there (or assigned, untaken).
    pub wrong_eviction: bool,
    /// Sticky: a pod was forced out (the model reaches that).
    pub evicted: bool,
    /// Sticky: a term went to a candidate written by hand with a `renewTime` ahead and no
    /// process behind it ([`Step::Ghost`]), whom the arbiter cannot have heard from.
    pub unheard_elected: bool,
    /// Sticky: a replica assigned a term to a candidate whose pod its watches showed gone or
    /// terminating, or whose registering process they showed exited.
    pub gone_elected: bool,
    /// When the last thing happened that the election must react to: a fault, a recovery, a
    /// registration.
    pub calm_since: u8,
    /// When a term was last assigned.
    pub assigned_at: u8,
    /// The best live registered candidate that outranks the holder, and since when it has.
    pub outranked_since: Option<(u8, u8)>,
    /// When the first candidate registered, and which candidates registered by the end of the
    /// next second (started together, as a Deployment's pods do).
    pub first_registration: Option<u8>,
    pub together: Vec<bool>,
    /// The first term's holder.
    pub first_holder: Option<u8>,
    /// Sticky: the first term went to a candidate that one started together with it outranks.
    pub scattered: bool,
}

impl State {
    /// Liveness, as a bounded promise: once calm for [`CALM`] with a live candidate and a
    /// running operator replica, some CMD runs and no term was assigned in the calm's last part.
    pub fn live(&self) -> bool {
        !self.live_due()
            || (self.cands.iter().any(|c| c.cmd.is_some())
                && self.assigned_at < self.calm_since + CALM)
    }

    /// Whether liveness is due: calm for [`CALM`], a live candidate, a running replica.
    pub fn live_due(&self) -> bool {
        self.t >= self.calm_since + CALM
            && self.cands.iter().any(Cand::live)
            && self.ops.iter().any(|o| !o.paused)
    }

    /// Every promise holds in this state (what a replayed trace of the protocol must keep).
    /// (`gather`: the system settles, so candidates started together must elect the oldest.)
    pub fn promises_hold(&self, gather: bool) -> bool {
        !self.overlap
            && !self.term_reused
            && !self.two_writers
            && self.live()
            && self.in_order()
            && (!gather || self.gathered())
            && !self.wrong_eviction
            && !self.unheard_elected
            && !self.gone_elected
    }

    /// Started together: with no fault, the first term goes to a candidate that none of those
    /// registered with it (in the same second as the first registration, or the next) outranks.
    pub fn gathered(&self) -> bool {
        self.faults > 0 || !self.scattered
    }

    /// Version order: with no fault, the holder is never outranked for [`HANDOVER`] or longer.
    pub fn in_order(&self) -> bool {
        self.faults > 0
            || self
                .outranked_since
                .is_none_or(|(_, since)| self.t < since + HANDOVER)
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Step {
    Tick,
    Register(u8),
    /// A replica's mark write, after the Lease (only under [`Mutation::MarkAfterLease`]).
    WriteMark(u8),
    /// A replica's second: renew (or try to take) the HA lease, and reconcile while its write
    /// gate is open.
    Operate(u8),
    // Faults.
    Crash(u8),
    Pause(u8),
    Resume(u8),
    /// Only the agent is frozen (a SIGSTOP to its process, a hung runtime): its guard and CMD
    /// run on.
    PauseAgent(u8),
    ResumeAgent(u8),
    /// Only the guard is frozen: the agent and CMD run on.
    PauseGuard(u8),
    ResumeGuard(u8),
    Cut(u8),
    Heal(u8),
    ClockBehind(u8),
    /// The answer to the candidate's take of the term assigned to it is late (the write itself
    /// is applied at once); it arrives at some later step ([`Step::Answer`]), or never.
    SlowAnswer(u8),
    /// A late answer arrives.
    Answer(u8),
    /// Someone writes the candidate by hand, with no process behind it: a new registration
    /// with a `renewTime` [`GHOST_AHEAD`] seconds in the future.
    Ghost(u8),
    /// The candidate's pod is deleted and replaced (its processes die; a new agent registers
    /// from the new pod).
    ReplacePod(u8),
    /// An evicted pod's termination ends: its processes die, a new pod replaces it.
    PodGone(u8),
    /// The candidate's pod is force-deleted (its node lost): its processes stop, a new pod
    /// replaces it, and nothing confirms the old one stopped.
    ForceReplacePod(u8),
    DeleteLease,
    /// The Lease's `arbiter.dev/holder-pod-uid` deleted by hand.
    EditHolderPod,
    RestartOperator(u8),
    PauseOperator(u8),
    ResumeOperator(u8),
}

fn base() -> (Instant, Timestamp) {
    static BASE: OnceLock<(Instant, Timestamp)> = OnceLock::new();
    *BASE.get_or_init(|| {
        (
            Instant::now(),
            Timestamp::from_second(1_800_000_000).unwrap(),
        )
    })
}

fn instant(t: u8) -> Instant {
    base().0 + Duration::from_secs(t.into())
}

fn wall(t: u8) -> Timestamp {
    base().1 + jiff::SignedDuration::from_secs(t.into())
}

fn secs(t: u8) -> Duration {
    Duration::from_secs(t.into())
}

/// The holder remembered when nothing names one but the term mark (`held::UNKNOWN_HOLDER`).
const UNKNOWN: u8 = u8::MAX;

fn name(i: u8) -> String {
    format!("c{i}")
}

fn index(name: &str) -> u8 {
    name[1..].parse().unwrap()
}

impl System {
    fn rules(&self) -> Rules {
        Rules {
            ack_window: secs(ACK_WINDOW),
            ack_valid_for: secs(2 * ACK_WINDOW),
            settle: match self.mutation {
                Some(Mutation::NoSettle) => Duration::ZERO,
                _ => secs(self.settle),
            },
            max_skew: None,
            refuse_skew: false,
        }
    }

    fn kill_grace(&self) -> u8 {
        match self.mutation {
            Some(Mutation::LongKillGrace) => LEASE,
            _ => kill_grace(),
        }
    }

    pub fn init(&self) -> State {
        let n = self.candidates as usize;
        // Replica 0 has just taken the HA lease (at rv 1); the others stand by.
        let mut ops = vec![Op::new(n); self.replicas as usize];
        ops[0].active = true;
        ops[0].written = Some(1);
        ops[0].gate = OP_RENEW_DEADLINE;
        State {
            t: 0,
            lease: None,
            cand_objs: vec![None; n],
            lease_rv: 0,
            cand_rv: vec![0; n],
            mark: 0,
            ha: HaLease {
                holder: Some(0),
                rv: 1,
            },
            cands: vec![
                Cand {
                    agent: Agent::Down,
                    cmd: None,
                    deadline: 0,
                    paused: false,
                    agent_paused: false,
                    guard_paused: false,
                    clock_behind: 0,
                    cut: false,
                    answered: None,
                    inc: 0,
                    confirmed: 0,
                    pod: 0,
                    restarts: 0,
                    evicted: false,
                    slow: false,
                    in_flight: None,
                };
                n
            ],
            ops,
            faults: 0,
            overlap: false,
            term_reused: false,
            accepted: None,
            two_writers: false,
            refused: false,
            max_term: 0,
            wrong_eviction: false,
            unheard_elected: false,
            gone_elected: false,
            evicted: false,
            calm_since: 0,
            assigned_at: 0,
            outranked_since: None,
            first_registration: None,
            together: vec![false; n],
            first_holder: None,
            scattered: false,
        }
    }

    /// The steps enabled in `s`.
    pub fn steps(&self, s: &State, out: &mut Vec<Step>) {
        // A running replica operates once a second: time moves on only after each did. It
        // finishes a write it began (a mark after the Lease, under that mutation) first.
        let mut all_operated = true;
        for (r, o) in s.ops.iter().enumerate() {
            let r = r as u8;
            if o.paused {
                out.push(Step::ResumeOperator(r));
                continue;
            }
            if o.pending_mark.is_some() {
                out.push(Step::WriteMark(r));
                all_operated = false;
            } else if o.operated != Some(s.t) {
                out.push(Step::Operate(r));
                all_operated = false;
            }
            if s.faults < self.faults {
                out.push(Step::RestartOperator(r));
                if self.replicas > 1 {
                    out.push(Step::PauseOperator(r));
                }
            }
        }
        if s.t < self.max_time && all_operated {
            out.push(Step::Tick);
        }
        for i in 0..self.candidates {
            let c = &s.cands[i as usize];
            if !c.paused && c.agent == Agent::Down && !c.cut {
                out.push(Step::Register(i));
            }
            if s.faults < self.faults {
                if c.agent != Agent::Down {
                    out.push(Step::Crash(i));
                }
                if !c.paused {
                    out.push(Step::Pause(i));
                }
                if !c.cut {
                    out.push(Step::Cut(i));
                }
                if c.clock_behind == 0 {
                    out.push(Step::ClockBehind(i));
                }
                out.push(Step::ReplacePod(i));
            }
            let holder = s.lease.as_ref().is_some_and(|l| l.holder == Some(i));
            if s.faults < self.faults && self.extended {
                // A force-deleted holder's pod (the forced exit and the pod-stop rule look at
                // its pods).
                if holder {
                    out.push(Step::ForceReplacePod(i));
                }
                // A slow answer to the take of a term assigned to it. (To a later renewal, in
                // whole seconds, it is a failed renewal: the agent gives the term up at the
                // deadline counted from its last answered renewal; the store holds a later one,
                // which only makes the operator wait longer.)
                let named = s
                    .lease
                    .as_ref()
                    .is_some_and(|l| l.holder == Some(i) && l.assigned == Some((i, l.term)));
                if !c.slow
                    && c.in_flight.is_none()
                    && c.cmd.is_none()
                    && matches!(c.agent, Agent::Standby | Agent::Ended { .. })
                    && named
                {
                    out.push(Step::SlowAnswer(i));
                }
                // One process of a running CMD's candidate frozen, not both (then nothing
                // stops CMD: docs/concepts/limits.md).
                if c.cmd.is_some() && !c.paused && !c.agent_paused && !c.guard_paused {
                    out.push(Step::PauseAgent(i));
                    out.push(Step::PauseGuard(i));
                }
                // A candidate created by hand under a name no process registered yet.
                if c.agent == Agent::Down && s.cand_objs[i as usize].is_none() {
                    out.push(Step::Ghost(i));
                }
            }
            if c.paused {
                out.push(Step::Resume(i));
            }
            if c.agent_paused {
                out.push(Step::ResumeAgent(i));
            }
            if c.guard_paused {
                out.push(Step::ResumeGuard(i));
            }
            if c.cut {
                out.push(Step::Heal(i));
            }
            if c.evicted {
                out.push(Step::PodGone(i));
            }
            if c.in_flight.is_some() && !c.paused {
                out.push(Step::Answer(i));
            }
        }
        if s.faults < self.faults && s.lease.is_some() {
            out.push(Step::DeleteLease);
            // Before the take (what an agent reads to take it).
            let untaken = s
                .lease
                .as_ref()
                .is_some_and(|l| l.holder_pod.is_some() && l.incarnation.is_none());
            if self.extended && untaken {
                out.push(Step::EditHolderPod);
            }
        }
    }

    /// `s` after `step`; `None` when the step changes nothing.
    pub fn next(&self, s: &State, step: Step) -> Option<State> {
        let mut n = s.clone();
        let changed = match step {
            Step::Tick => self.tick(&mut n),
            Step::Register(i) => register(&mut n, i),
            Step::WriteMark(r) => {
                n.mark = n.mark.max(n.ops[r as usize].pending_mark.take().unwrap());
                true
            }
            Step::Operate(r) => self.operate(&mut n, r),
            Step::Crash(i) => fault(&mut n, |n| {
                let c = &mut n.cands[i as usize];
                // The agent dies; CMD dies with it (its parent-death signal; the guard kills it
                // too); the container restarts.
                c.agent = Agent::Down;
                c.cmd = None;
                c.paused = false;
                c.agent_paused = false;
                c.guard_paused = false;
                c.restarts += 1;
                c.slow = false;
                c.in_flight = None;
            }),
            Step::ReplacePod(i) => fault(&mut n, |n| {
                let c = &mut n.cands[i as usize];
                replace_pod(c);
                c.confirmed = c.pod;
            }),
            Step::ForceReplacePod(i) => fault(&mut n, |n| replace_pod(&mut n.cands[i as usize])),
            Step::PodGone(i) => {
                let c = &mut n.cands[i as usize];
                replace_pod(c);
                c.confirmed = c.pod;
                n.calm_since = n.t;
                true
            }
            Step::Pause(i) => fault(&mut n, |n| n.cands[i as usize].paused = true),
            Step::Resume(i) => {
                let c = &mut n.cands[i as usize];
                c.paused = false;
                // The guard's deadline is on CLOCK_BOOTTIME: past it, CMD dies on resuming, but
                // may write once first (the moment before the guard runs), with its old term:
                // the resource must refuse it if a later term wrote.
                if c.cmd.is_some() && n.t >= c.deadline + self.kill_grace() && !self.no_deadline() {
                    write_resource(&mut n, i);
                    n.cands[i as usize].cmd = None;
                }
                n.calm_since = n.t;
                true
            }
            Step::PauseAgent(i) => fault(&mut n, |n| n.cands[i as usize].agent_paused = true),
            Step::PauseGuard(i) => fault(&mut n, |n| n.cands[i as usize].guard_paused = true),
            Step::ResumeAgent(i) | Step::ResumeGuard(i) => {
                let c = &mut n.cands[i as usize];
                if matches!(step, Step::ResumeAgent(_)) {
                    c.agent_paused = false;
                } else {
                    c.guard_paused = false;
                }
                // Either one, running again past the deadline and the kill grace, kills CMD at
                // once (the deadline is on CLOCK_BOOTTIME, which counts the pause).
                if c.cmd.is_some() && n.t >= c.deadline + self.kill_grace() && self.stops_cmd(c) {
                    c.cmd = None;
                }
                n.calm_since = n.t;
                true
            }
            Step::Cut(i) => fault(&mut n, |n| n.cands[i as usize].cut = true),
            Step::Heal(i) => {
                n.cands[i as usize].cut = false;
                n.calm_since = n.t;
                true
            }
            Step::ClockBehind(i) => fault(&mut n, |n| n.cands[i as usize].clock_behind = LEASE),
            Step::SlowAnswer(i) => fault(&mut n, |n| n.cands[i as usize].slow = true),
            Step::Answer(i) => {
                self.answered(&mut n, i);
                n.calm_since = n.t;
                true
            }
            Step::Ghost(i) => fault(&mut n, |n| ghost(n, i)),
            Step::DeleteLease => fault(&mut n, |n| n.lease = None),
            Step::EditHolderPod => fault(&mut n, |n| {
                let l = n.lease.as_mut().unwrap();
                n.lease_rv += 1;
                l.rv = n.lease_rv;
                l.holder_pod = None;
            }),
            Step::RestartOperator(r) => fault(&mut n, |n| {
                // A crash: the HA lease still names it until someone takes it over.
                n.ops[r as usize] = Op::new(n.cands.len())
            }),
            Step::PauseOperator(r) => fault(&mut n, |n| n.ops[r as usize].paused = true),
            Step::ResumeOperator(r) => {
                n.ops[r as usize].paused = false;
                n.calm_since = n.t;
                true
            }
        };
        changed.then(|| {
            check(&mut n);
            n
        })
    }

    fn no_deadline(&self) -> bool {
        self.mutation == Some(Mutation::NoRenewDeadline)
    }

    /// One second passes: guards and agents stop CMD past the renew deadline; then every
    /// agent that runs and reaches the API server does its second's work, in candidate order:
    /// renew its term (or find it gone), release it when asked to hand over, answer a ping,
    /// take a term assigned to it. (A slow or partitioned agent is the `Cut` fault.) Each
    /// running replica's watches deliver what was written.
    fn tick(&self, n: &mut State) -> bool {
        // The second's writes so far are delivered by its end (in order: a deletion never
        // overtakes the renewals before it), whether or not a replica reconciles.
        deliver_all(n);
        n.t += 1;
        self.deadlines(n);
        for i in 0..n.cands.len() as u8 {
            let c = &n.cands[i as usize];
            if c.paused || c.agent_paused || c.cut || c.agent == Agent::Down {
                continue;
            }
            self.renew(n, i);
            release(n, i);
            if self.mutation != Some(Mutation::IgnorePings) {
                answer(n, i);
            }
            take_term(n, i, self.mutation == Some(Mutation::TakeInAnyPod));
        }
        // Every CMD that runs writes to the protected resource with its term.
        for i in 0..n.cands.len() as u8 {
            if n.cands[i as usize].cmd.is_some() && !n.cands[i as usize].paused {
                write_resource(n, i);
            }
        }
        deliver_all(n);
        true
    }

    /// Past the renew deadline, the agent gives its term up; a kill grace after its guard's
    /// deadline, CMD is dead.
    fn deadlines(&self, n: &mut State) {
        if self.no_deadline() {
            return;
        }
        let answer_cut_off = self.mutation != Some(Mutation::RenewDeadlineFromAnswer);
        let kill_grace = self.kill_grace();
        for c in n.cands.iter_mut().filter(|c| !c.paused) {
            // CMD is dead a kill grace after the deadline, stopped by the agent itself (SIGTERM
            // at the deadline, SIGKILL a kill grace later) or by its guard, whichever runs.
            if c.cmd.is_some() && n.t >= c.deadline + kill_grace && self.stops_cmd(c) {
                c.cmd = None;
            }
            if c.agent_paused {
                continue;
            }
            if let Agent::Holding { sent, term } = c.agent
                && n.t >= sent + RENEW_DEADLINE
            {
                // Past the renew deadline the agent gives the term up and stops CMD: SIGTERM,
                // SIGKILL a kill grace later (CMD may act until then).
                c.agent = Agent::Ended { term };
            }
            // The take is cut off at the renew deadline counted from its send.
            if answer_cut_off
                && c.in_flight
                    .is_some_and(|(_, sent)| n.t >= sent + RENEW_DEADLINE)
            {
                c.in_flight = None;
            }
        }
    }

    /// Whether anything of candidate `c` that stops CMD at its deadline runs: its agent (not
    /// under [`Mutation::AgentReliesOnGuard`]) or its guard (none under [`Mutation::NoGuard`]).
    fn stops_cmd(&self, c: &Cand) -> bool {
        let agent = !c.agent_paused && self.mutation != Some(Mutation::AgentReliesOnGuard);
        let guard = !c.guard_paused && self.mutation != Some(Mutation::NoGuard);
        agent || guard
    }

    fn renew(&self, n: &mut State, i: u8) -> bool {
        let Agent::Holding { term, sent } = n.cands[i as usize].agent else {
            return false;
        };
        // Once a second (the retry period), and not while cut off (the write fails).
        if n.cands[i as usize].cut || sent >= n.t {
            return false;
        }
        // Its term, or its term with a handover asked for (the release follows: [`release`]).
        let ours = n.lease.as_ref().is_some_and(|l| {
            let c = &n.cands[i as usize];
            matches!(
                standing_of(l, c, i, Some(term), false),
                Standing::Ours | Standing::HandoverTo(_)
            )
        });
        let c = &mut n.cands[i as usize];
        if !ours {
            // Deleted, reassigned, or its holder cleared: stop CMD (SIGTERM now, SIGKILL a kill
            // grace later) and stand by.
            c.agent = Agent::Ended { term };
            c.deadline = c.deadline.min(n.t);
            return true;
        }
        let wall_now = c.wall(n.t);
        c.agent = Agent::Holding { term, sent: n.t };
        c.deadline = n.t + RENEW_DEADLINE;
        n.lease_rv += 1;
        let l = n.lease.as_mut().unwrap();
        l.rv = n.lease_rv;
        l.renew = renewed_after(l.renew, wall_now);
        true
    }

    /// The late answer to candidate `i`'s take arrives: a success, its renew deadline counted
    /// from the take's send (from the answer under [`Mutation::RenewDeadlineFromAnswer`]); CMD
    /// starts if the guard's deadline has not passed (the guard lets CMD start only before it).
    fn answered(&self, n: &mut State, i: u8) {
        let c = &mut n.cands[i as usize];
        let Some((term, sent)) = c.in_flight.take() else {
            return;
        };
        let from = match self.mutation {
            Some(Mutation::RenewDeadlineFromAnswer) => n.t,
            _ => sent,
        };
        let standby = matches!(c.agent, Agent::Standby | Agent::Ended { .. });
        if standby && c.cmd.is_none() && n.t < from + RENEW_DEADLINE {
            c.agent = Agent::Holding { term, sent: from };
            c.deadline = from + RENEW_DEADLINE;
            c.cmd = Some(term);
        }
    }

    /// A replica's second: as the active replica, renew the HA lease by compare-and-swap from
    /// what it last wrote (which also resumes it after its gate closed, if nobody wrote the HA
    /// lease since), or exit when someone else did; as a standby, read the HA lease and take it
    /// once it was released or unchanged for the HA lease duration. Then reconcile, while the
    /// write gate is open.
    fn operate(&self, n: &mut State, r: u8) -> bool {
        let t = n.t;
        let ri = r as usize;
        n.ops[ri].operated = Some(t);
        if n.ops[ri].active {
            if n.ops[ri].written != Some(n.ha.rv) {
                // Another replica took over: exit; the process restarts as a standby.
                n.ops[ri] = Op::new(n.cands.len());
                n.ops[ri].operated = Some(t);
                return true;
            }
        } else {
            let (rv, quiet, last) = n.ops[ri].silence.unwrap_or((n.ha.rv, 0, t));
            let quiet = match rv == n.ha.rv {
                // Only time it could read counts: a gap past the renew deadline (it was
                // paused) adds nothing.
                true if t - last <= OP_RENEW_DEADLINE => quiet + (t - last),
                true => quiet,
                false => 0,
            };
            n.ops[ri].silence = Some((n.ha.rv, quiet, t));
            if n.ha.holder.is_some() && quiet < OP_LEASE {
                return true;
            }
            n.ops[ri].active = true;
            n.ops[ri].silence = None;
        }
        n.ha.rv += 1;
        n.ha.holder = Some(r);
        n.ops[ri].written = Some(n.ha.rv);
        n.ops[ri].gate = t + OP_RENEW_DEADLINE;
        self.reconcile(n, r);
        true
    }

    /// The replica's reconcile: decide with the real rules from what its watches delivered
    /// and its own memory, and carry out the action (every write is refused at a closed gate).
    fn reconcile(&self, n: &mut State, r: u8) {
        let now = n.t;
        let ri = r as usize;
        if now >= n.ops[ri].gate {
            return;
        }
        self.learn(n, r);
        let candidates: Vec<Candidate> = (0..self.candidates)
            .filter(|&i| n.ops[ri].registrations[i as usize] > 0)
            .map(|i| candidate(n, r, i, self.rules(), self.mutation))
            .collect();
        if candidates.is_empty() {
            return;
        }
        let lease = n.ops[ri]
            .record
            .as_ref()
            .map(|(l, since)| self.lease_input(n, r, l, *since));
        let previous = self.previous(n, r);
        let decision = decide::decide(
            &candidates,
            lease.as_ref(),
            previous.as_ref(),
            wall(now),
            &self.rules(),
        );
        match decision.action {
            Action::CreateLease {
                holder: Some(h), ..
            } => {
                self.assign(n, r, index(&h), true);
            }
            Action::Assign { holder, lapsed } => {
                // The lapsed holder's pod to force out, judged before the write that deposes it
                // and carried out once that write succeeded.
                let lapsed = lapsed.map(|h| index(&h));
                let target = lapsed.and_then(|h| self.forced_exit_target(n, r, h));
                let deposed = n.lease.clone();
                if self.assign(n, r, index(&holder), false)
                    && let (Some(h), Some(pod), Some(deposed)) = (lapsed, target, deposed)
                {
                    force_out(n, h, pod, &deposed);
                }
            }
            Action::Ping { candidates } => {
                for c in candidates {
                    let i = index(&c);
                    let Some(o) = n.cand_objs[i as usize].as_mut() else {
                        continue; // deleted: the write fails
                    };
                    n.cand_rv[i as usize] += 1;
                    o.rv = n.cand_rv[i as usize];
                    o.pinged_at_rv = Some(o.rv);
                    let v = Version {
                        resource_version: Some(o.rv),
                        renew: Some(wall(o.renew)),
                    };
                    n.ops[ri].heard[i as usize].pinged(v, instant(now));
                }
            }
            Action::RequestHandover { to } if self.mutation != Some(Mutation::NoHandover) => {
                // A compare-and-swap on the record it saw.
                let seen = n.ops[ri].record.as_ref().map(|(l, _)| l.rv);
                if let Some(l) = n.lease.as_mut().filter(|l| Some(l.rv) == seen) {
                    n.lease_rv += 1;
                    l.rv = n.lease_rv;
                    l.preferred = Some(index(&to));
                }
            }
            _ => {}
        }
    }

    fn lease_input(&self, n: &State, r: u8, l: &LeaseObj, since: u8) -> decide::Lease {
        let op = &n.ops[r as usize];
        let mut unchanged_for = secs(n.t - since);
        if self.mutation == Some(Mutation::ExpiryByRenewTime) {
            // The holder's timestamp read on the operator's wall clock.
            unchanged_for = secs(n.t.saturating_sub(l.renew.0));
        }
        decide::Lease {
            holder: l.holder.map(name),
            preferred_holder: l.preferred.map(name),
            strategy: Some(OLDEST_EMULATION_VERSION.into()),
            duration: secs(LEASE),
            unchanged_for,
            released_by: l.released_by.map(name),
            holder_pod_stopped: self.holder_pod_stopped(op, l),
            term_seen: op
                .term_seen
                .filter(|(term, _)| *term == l.term)
                .map(|(_, at)| wall(at)),
            switchover: None,
            term: l.term,
            foreign: false,
        }
    }

    /// Whether the pod the Lease's holder was assigned its term in is known to have stopped:
    /// the pod the replica recorded, while it remembers that holder, else the one the record
    /// names (`reconcile/view.rs`).
    fn holder_pod_stopped(&self, op: &Op, l: &LeaseObj) -> bool {
        let Some(h) = l.holder else {
            return false;
        };
        match op.held {
            // Of the term it remembers only (`Held::ended_by_stop_of`).
            Some(held) if held.holder == h => {
                held.term == l.term && op.stopped(h, self.stop_proof(&held, true))
            }
            // Not the holder it remembers: the record's pod, if the term was taken there.
            _ => {
                let recorded = l.holder_pod.map(|(p, _)| p);
                let taken = l.incarnation.map(|_| l.taken_in);
                op.stopped(h, stop_proof(recorded, taken, true))
            }
        }
    }

    /// The holder the replica remembers ([`System::learn`]), when the Lease as delivered no
    /// longer names it.
    fn previous(&self, n: &State, r: u8) -> Option<decide::Previous> {
        let op = &n.ops[r as usize];
        let record = op.record.as_ref().map(|(l, _)| l);
        let held = op.held?;
        let holder = held.holder;
        let named = record.is_some_and(|l| l.holder == Some(holder) && l.term == held.term);
        let released = record.is_some_and(|l| l.released_by == Some(holder));
        (!named && !released).then(|| decide::Previous {
            holder: name(holder),
            quiet_for: secs(n.t - held.seen),
            duration: secs(LEASE),
            pod_stopped: op.stopped(holder, self.stop_proof(&held, false)),
        })
    }

    /// The pod whose stop ends the remembered term: the production rule
    /// ([`arbiter_election::proof::stop_proof`]), or any recorded pod under
    /// [`Mutation::TakeInAnyPod`] and [`Mutation::PodStopWhoeverTook`].
    fn stop_proof(&self, held: &Held, with_lease: bool) -> Option<u8> {
        match self.mutation {
            Some(Mutation::TakeInAnyPod | Mutation::PodStopWhoeverTook) => held.pod,
            _ => stop_proof(held.pod, held.taker.map(Some), with_lease),
        }
    }

    /// What the replica remembers of the holder, learned as its reconcile looks at the lease
    /// (`operator/term/held.rs`): from the Lease record (since it was first delivered); on a
    /// first look with no record naming a holder that did not release it, an unknown holder
    /// when the term mark says a term was handed out, waited out a full duration from now.
    fn learn(&self, n: &mut State, r: u8) {
        let now = n.t;
        let handed_out = n.mark > 0 && self.mutation != Some(Mutation::NoUnknownTerm);
        let op = &mut n.ops[r as usize];
        let known = op.held.is_some();
        let record = op.record.as_ref().map(|(l, since)| (l.clone(), *since));
        let over = op.held.is_none_or(|held| {
            record
                .as_ref()
                .is_some_and(|(l, _)| l.holder.is_none() && l.released_by == Some(held.holder))
                || op.stopped(held.holder, self.stop_proof(&held, false))
                || now - held.seen >= LEASE
        });
        match record {
            Some((l, since)) if l.holder.is_some() => {
                let h = l.holder.unwrap();
                match op.held.as_mut() {
                    // The same holder at a later term: that term, from its record, waited out
                    // at least as long (`held.rs`).
                    Some(held) if held.holder == h && l.term > held.term => {
                        let seen = held.seen.max(since);
                        *held = Held::new(h, l.term, seen, l.holder_pod.map(|(p, _)| p));
                        held.taker = l.incarnation.and(l.taken_in);
                    }
                    Some(held) if held.holder == h => {
                        held.seen = held.seen.max(since);
                        // The take, learned once from a record of the term.
                        if held.taker.is_none() && l.incarnation.is_some() && l.term == held.term {
                            held.taker = l.taken_in;
                        }
                    }
                    Some(_) if !over => {}
                    _ => {
                        let mut held = Held::new(h, l.term, since, l.holder_pod.map(|(p, _)| p));
                        held.taker = l.incarnation.and(l.taken_in);
                        op.held = Some(held);
                    }
                }
            }
            ref record
                if !known && record.as_ref().is_none_or(|(l, _)| l.released_by.is_none()) =>
            {
                op.held = handed_out.then(|| Held::new(UNKNOWN, 0, now, None));
            }
            _ => {}
        }
    }

    /// Assigns the next term to `holder`: from the block the replica's last mark write
    /// reserved, else by a mark write first (reserving [`BLOCK`] terms), then the Lease by
    /// compare-and-swap on the version the replica saw (or a create).
    fn assign(&self, n: &mut State, r: u8, holder: u8, create: bool) -> bool {
        let ri = r as usize;
        let seen = n.ops[ri].record.as_ref().map(|(l, _)| l.clone());
        let current = seen.as_ref().map_or(0, |l| l.term);
        // The ledger's rules ([`arbiter_election::terms`]), with blocks of 2.
        let from_block = n.ops[ri]
            .block
            .filter(|_| !create)
            .and_then(|b| b.next(current));
        let term = match (self.mutation, from_block) {
            (Some(Mutation::NoTermMark), _) => current + 1,
            (_, Some(term)) => term,
            _ => {
                // A compare-and-swap from the mark as read now.
                let term = next_term(n.mark, current).unwrap();
                let block = Block::reserved_with(term, BLOCK);
                if self.mutation == Some(Mutation::MarkAfterLease) {
                    n.ops[ri].pending_mark = Some(block.mark);
                } else {
                    n.mark = block.mark;
                }
                n.ops[ri].block = Some(block);
                term
            }
        };
        n.ops[ri].block = n.ops[ri].block.map(|b| b.handed_out(term));
        let seen_rv = seen.map(|l| l.rv);
        if (create && n.lease.is_some()) || (!create && n.lease.as_ref().map(|l| l.rv) != seen_rv) {
            return false; // the create or the compare-and-swap fails; the term is used up
        }
        if term <= n.max_term {
            n.term_reused = true;
        }
        n.max_term = n.max_term.max(term);
        n.assigned_at = n.t;
        // A `renewTime` ahead of every process's clock: only a hand edit writes one.
        if n.cand_objs[holder as usize]
            .as_ref()
            .is_some_and(|o| o.renew > n.t)
        {
            n.unheard_elected = true;
        }
        // Its pod as this replica's watches showed it: gone, terminating, or its registering
        // process ended.
        let running = PodSeen::Present {
            terminal: false,
            deleting: false,
            running: true,
            registered_process_exited: false,
        };
        if n.ops[ri].pods_seen[holder as usize] != running {
            n.gone_elected = true;
        }
        n.first_holder.get_or_insert(holder);
        n.lease_rv += 1;
        n.lease = Some(LeaseObj {
            rv: n.lease_rv,
            holder: Some(holder),
            term,
            assigned: Some((holder, term)),
            released_by: None,
            preferred: None,
            renew: (n.t, 0),
            holder_pod: n.ops[ri].pods[holder as usize],
            truth: (
                n.cands[holder as usize].pod,
                n.cands[holder as usize].restarts,
                None,
            ),
            incarnation: None,
            taken_in: None,
        });
        let op = &mut n.ops[ri];
        op.held = Some(Held::new(
            holder,
            term,
            n.t,
            op.pods[holder as usize].map(|(p, _)| p),
        ));
        op.term_seen = Some((term, n.t));
        true
    }

    /// The pod of lapsed holder `h` to force out, as replica `r` sees it: the pod its
    /// candidate names, if that is the pod the Lease record says its term was assigned in,
    /// with the same container restarts (nothing in it exited).
    fn forced_exit_target(&self, n: &State, r: u8, h: u8) -> Option<(u8, u8)> {
        let op = &n.ops[r as usize];
        let (pod, restarts) = op.pods[h as usize]?;
        if self.mutation == Some(Mutation::OwnerPod) {
            return Some((pod, restarts));
        }
        // The record of the term it held ([`arbiter_election::proof::forced_exit_due`]); the
        // model's pods never end every container without a restart.
        let record = &op.record.as_ref()?.0;
        let (assigned_in, recorded) = match record.holder_pod {
            Some((p, r)) if record.holder == Some(h) => (Some(p), Some(r)),
            _ => (None, None),
        };
        forced_exit_due(assigned_in, recorded, pod, restarts, false).then_some((pod, restarts))
    }
}

impl Op {
    /// Whether candidate `h`'s pod `pod` is known to have stopped (its deletion delivered).
    fn stopped(&self, h: u8, pod: Option<u8>) -> bool {
        h != UNKNOWN && pod.is_some_and(|p| p < self.gone[h as usize])
    }

    fn new(n: usize) -> Op {
        Op {
            heard: vec![Heard::default(); n],
            registrations: vec![0; n],
            pods: vec![None; n],
            pods_seen: vec![PodSeen::Absent { stopped: false }; n],
            record: None,
            held: None,
            gone: vec![0; n],
            term_seen: None,
            block: None,
            pending_mark: None,
            operated: None,
            active: false,
            gate: 0,
            written: None,
            silence: None,
            paused: false,
        }
    }
}

/// Every running replica's watches deliver what the store holds now.
fn deliver_all(n: &mut State) {
    for r in 0..n.ops.len() {
        if !n.ops[r].paused {
            deliver(n, r);
        }
    }
}

/// Replica `r`'s watches deliver what the store holds now.
fn deliver(n: &mut State, r: usize) {
    let now = n.t;
    let op = &mut n.ops[r];
    // The pod watch: the pods confirmed stopped.
    for (i, c) in n.cands.iter().enumerate() {
        op.gone[i] = c.confirmed;
    }
    for (i, o) in n.cand_objs.iter().enumerate() {
        if let Some(o) = o {
            if op.registrations[i] != o.registrations {
                op.registrations[i] = o.registrations;
                op.heard[i].registered(instant(now));
            }
            let v = Version {
                resource_version: Some(o.rv),
                renew: Some(wall(o.renew)),
            };
            op.heard[i].delivered(v, instant(now), true, wall(now));
            // The pod it names, and that pod's restarts while it exists.
            let c = &n.cands[i];
            op.pods[i] = (c.pod == o.owner_pod).then_some((c.pod, c.restarts));
            op.pods_seen[i] = pod_seen(c, o);
        }
    }
    match &n.lease {
        Some(l) => {
            // A record is judged by its content (a write that changes no field of the spec,
            // like an annotation, is no sign of life).
            let since = op
                .record
                .as_ref()
                .filter(|(r, _)| fingerprint(r) == fingerprint(l))
                .map(|(_, since)| *since);
            if let Some(since) = since {
                op.record = Some((l.clone(), since));
            } else {
                op.record = Some((l.clone(), now));
                if let Some(h) = l.holder {
                    // A record naming the holder it remembers: seen now (the watch learns no
                    // new holder; a reconcile does, [`System::learn`]).
                    if let Some(Held { holder, seen, .. }) = op.held.as_mut()
                        && *holder == h
                    {
                        *seen = now;
                    }
                    if op.term_seen.is_none_or(|(term, _)| term != l.term) {
                        op.term_seen = Some((l.term, now));
                    }
                }
            }
        }
        None => op.record = None,
    }
}

fn candidate(n: &State, r: u8, i: u8, rules: Rules, mutation: Option<Mutation>) -> Candidate {
    let mut judged =
        n.ops[r as usize].heard[i as usize].judge(instant(n.t), wall(n.t), rules.ack_valid_for);
    if mutation == Some(Mutation::FutureRenewAsAnswer)
        && let (Some(p), Some(o)) = (judged.ping.as_mut(), n.cand_objs[i as usize].as_ref())
    {
        // The candidate's timestamp compared with the ping's time on the operator's clock.
        p.answered |= wall(o.renew) >= p.sent;
    }
    // Older candidates rank first: c0 runs 1.30.0, c1 1.31.0, ...
    let version = format!("1.{}.0", 30 + i);
    Candidate {
        name: name(i),
        binary_version: version.clone(),
        emulation_version: Some(version),
        strategy: OLDEST_EMULATION_VERSION.into(),
        created: wall(0),
        ping: judged.ping,
        renewed_lately: judged.renewed_lately,
        pod: PodState::of(n.ops[r as usize].pods_seen[i as usize]),
        withdrawn: false,
        registered: judged.registered,
    }
}

fn register(n: &mut State, i: u8) -> bool {
    let c = &mut n.cands[i as usize];
    if c.cut {
        return false;
    }
    c.agent = Agent::Standby;
    c.answered = None;
    c.inc += 1;
    n.cand_rv[i as usize] += 1;
    let registrations = n.cand_objs[i as usize]
        .as_ref()
        .map_or(0, |o| o.registrations);
    n.cand_objs[i as usize] = Some(CandObj {
        rv: n.cand_rv[i as usize],
        renew: c.wall(n.t),
        pinged_at_rv: None,
        registrations: registrations + 1,
        owner_pod: c.pod,
        restarts: c.restarts,
    });
    n.calm_since = n.t;
    let first = *n.first_registration.get_or_insert(n.t);
    if n.t <= first + 1 {
        n.together[i as usize] = true;
    }
    true
}

fn answer(n: &mut State, i: u8) -> bool {
    let c = &mut n.cands[i as usize];
    let Some(o) = n.cand_objs[i as usize].as_mut() else {
        return false;
    };
    let Some(ping) = o.pinged_at_rv else {
        return false;
    };
    if c.cut || c.answered == Some(ping) {
        return false;
    }
    c.answered = Some(ping);
    n.cand_rv[i as usize] += 1;
    o.rv = n.cand_rv[i as usize];
    // Another renewTime than the one on the candidate, as the agent writes it.
    o.renew = (c.wall(n.t)).max(o.renew + 1);
    true
}

fn take_term(n: &mut State, i: u8, any_pod: bool) -> bool {
    let Some(l) = n.lease.as_mut() else {
        return false;
    };
    let c = &mut n.cands[i as usize];
    // An assignment to its name that no other process took (a take whose answer was lost is
    // taken again), made for the pod it runs in (any pod under [`Mutation::TakeInAnyPod`]):
    // the candidate library's rule. And not a term whose leadership it ended (the library's
    // loop waits for the lease to move on).
    if c.cut
        || standing_of(l, c, i, Some(l.term), any_pod) != Standing::Ours
        || matches!(c.agent, Agent::Ended { term } if term == l.term)
        || c.cmd.is_some()
        || c.in_flight.is_some()
        || matches!(c.agent, Agent::Holding { .. })
    {
        return false;
    }
    // Its first renew of the term, then CMD.
    n.lease_rv += 1;
    l.rv = n.lease_rv;
    l.renew = renewed_after(l.renew, c.wall(n.t));
    l.truth.2 = Some((c.pod, c.restarts));
    l.incarnation = Some(c.inc);
    l.taken_in = Some(c.pod);
    if c.slow {
        // Applied now, answered later (or never): CMD waits for the answer.
        c.slow = false;
        c.in_flight = Some((l.term, n.t));
        return true;
    }
    c.agent = Agent::Holding {
        term: l.term,
        sent: n.t,
    };
    c.deadline = n.t + RENEW_DEADLINE;
    c.cmd = Some(l.term);
    true
}

/// What the Lease says of candidate `i`'s process, taking or leading `took`: the candidate
/// library's rule ([`arbiter_election::standing::standing`]), given the record as the Lease
/// carries it (under [`Mutation::TakeInAnyPod`], with `any_pod`, without the recorded pod).
fn standing_of(l: &LeaseObj, c: &Cand, i: u8, took: Option<i32>, any_pod: bool) -> Standing {
    let record = Record {
        holder: l.holder.map(label::name),
        term: l.term,
        incarnation: l.incarnation.map(label::number),
        assigned_by_arbiter: l.holder.is_some_and(|h| l.assigned == Some((h, l.term))),
        assigned_in: l
            .holder_pod
            .filter(|_| !any_pod)
            .map(|(p, _)| label::number(p)),
        preferred_holder: l.preferred.map(label::name),
    };
    let me = Process {
        identity: label::name(i),
        incarnation: label::number(c.inc),
        pod: Some(label::number(c.pod)),
        took,
    };
    standing(&record, &me)
}

/// Names and numbers as the Lease's strings, made once (the model asks for them in every step).
mod label {
    use std::sync::LazyLock;

    static NAMES: LazyLock<Vec<String>> =
        LazyLock::new(|| (0..=u8::MAX).map(super::name).collect());
    static NUMBERS: LazyLock<Vec<String>> =
        LazyLock::new(|| (0..=u8::MAX).map(|i| i.to_string()).collect());

    /// Candidate `i`'s name.
    pub fn name(i: u8) -> &'static str {
        &NAMES[i as usize]
    }

    /// An incarnation or a pod uid.
    pub fn number(i: u8) -> &'static str {
        &NUMBERS[i as usize]
    }
}

/// Candidate `i`'s CMD writes to the protected resource with its term: accepted at or above the
/// highest term accepted, refused below it. Two processes accepted at one term is what fencing
/// must rule out.
fn write_resource(n: &mut State, i: u8) {
    let c = &n.cands[i as usize];
    let Some(term) = c.cmd else {
        return;
    };
    let writer = (term, i, c.inc);
    match n.accepted {
        Some((highest, ..)) if term < highest => n.refused = true,
        Some(accepted) if term == accepted.0 && accepted != writer => n.two_writers = true,
        _ => n.accepted = Some(writer),
    }
}

/// Candidate `i` written by hand: a new registration whose `renewTime` is far in the future,
/// naming its pod, with no process behind it.
fn ghost(n: &mut State, i: u8) {
    let c = &n.cands[i as usize];
    n.cand_rv[i as usize] += 1;
    let old = n.cand_objs[i as usize].as_ref();
    n.cand_objs[i as usize] = Some(CandObj {
        rv: n.cand_rv[i as usize],
        renew: n.t + GHOST_AHEAD,
        pinged_at_rv: None,
        registrations: old.map_or(0, |o| o.registrations) + 1,
        owner_pod: c.pod,
        restarts: c.restarts,
    });
}

fn release(n: &mut State, i: u8) -> bool {
    let c = &mut n.cands[i as usize];
    let Agent::Holding { term, .. } = c.agent else {
        return false;
    };
    let Some(l) = n.lease.as_mut() else {
        return false;
    };
    let asked = matches!(
        standing_of(l, c, i, Some(term), false),
        Standing::HandoverTo(_)
    );
    if c.cut || !asked {
        return false;
    }
    // Asked to hand over: CMD stops first, then the release.
    c.cmd = None;
    c.agent = Agent::Ended { term };
    n.lease_rv += 1;
    l.rv = n.lease_rv;
    l.holder = None;
    l.released_by = Some(i);
    true
}

/// What a pod watch shows of the pod candidate `c`'s object `o` names: gone through the
/// kubelet (its stop recorded), gone without that (force-deleted), or there: terminating once
/// evicted, always running, and its container restarted since the candidate registered (the
/// model's restart count stands for the kubelet's termination message with the registering
/// process's incarnation).
fn pod_seen(c: &Cand, o: &CandObj) -> PodSeen {
    if o.owner_pod != c.pod {
        PodSeen::Absent {
            stopped: o.owner_pod < c.confirmed,
        }
    } else {
        PodSeen::Present {
            terminal: false,
            deleting: c.evicted,
            running: true,
            registered_process_exited: o.restarts != c.restarts,
        }
    }
}

/// The pod is deleted (its processes die with it) and its workload controller makes another.
fn replace_pod(c: &mut Cand) {
    c.agent = Agent::Down;
    c.cmd = None;
    c.paused = false;
    c.agent_paused = false;
    c.guard_paused = false;
    c.cut = false;
    c.answered = None;
    c.pod += 1;
    c.restarts = 0;
    c.evicted = false;
    c.slow = false;
    c.in_flight = None;
}

/// Evicts `pod` of candidate `h`, deposed from `deposed`, with the pod's uid as a
/// precondition (a pod since replaced is not hit); it terminates at a later step. `seen`: the
/// pod's container restarts as the evicting replica's watch showed them. The forced-exit
/// property: it must be the pod that held the deposed term (assigned in it, or taken by its
/// agent), and not one the replica saw restart since the term was taken there (or, untaken,
/// assigned): the process that held the term exited, and the eviction would stop its
/// successor for nothing.
fn force_out(n: &mut State, h: u8, (pod, seen): (u8, u8), deposed: &LeaseObj) {
    let c = &mut n.cands[h as usize];
    if c.pod != pod || c.evicted {
        return;
    }
    let (assigned_in, restarts, taken) = deposed.truth;
    let (last_pod, last_restarts) = taken.unwrap_or((assigned_in, restarts));
    let held = pod == assigned_in || pod == last_pod;
    let restarted = pod == last_pod && seen > last_restarts;
    if !held || restarted {
        n.wrong_eviction = true;
    }
    n.evicted = true;
    c.evicted = true;
}

fn fault(n: &mut State, f: impl FnOnce(&mut State)) -> bool {
    n.faults += 1;
    n.calm_since = n.t;
    f(n);
    true
}

/// After every step: two CMDs acting at once (running, neither frozen) is the exclusion
/// property's violation; and whether the holder is outranked by a live registered candidate.
fn check(n: &mut State) {
    let acting = n
        .cands
        .iter()
        .filter(|c| c.cmd.is_some() && !c.paused)
        .count();
    if acting > 1 {
        n.overlap = true;
    }
    let holder = n.lease.as_ref().and_then(|l| l.holder);
    let best_above = holder.and_then(|h| {
        (0..h).find(|&j| n.cand_objs[j as usize].is_some() && n.cands[j as usize].live())
    });
    n.outranked_since = match (best_above, n.outranked_since) {
        (None, _) => None,
        // Only a strictly better one starts the count again (the handover waits for it to
        // settle); a worse one becoming the best (the best died) keeps counting.
        (Some(b), Some((was, since))) if b >= was => Some((b, since)),
        (Some(b), _) => Some((b, n.t)),
    };
    // The first term's holder, outranked by one started together with it.
    if n.first_holder
        .is_some_and(|h| (0..h).any(|j| n.together[j as usize]))
    {
        n.scattered = true;
    }
}

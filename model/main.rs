//! `make model`: the protocol model-checked with stateright (see docs/model.md).
//!
//!   cargo test --release -p arbiter-election --test model  the bounded exhaustive check, then
//!                                                          every seeded mutation (each must be
//!                                                          caught)
//!   ... --test model -- --small                            a smaller bound (part of `make test`)
//!   ... --test model -- --mutation NAME                    one mutation, its counterexample
//!
//! The operator's step in the model calls the real `election::decide` and judges liveness with
//! the real `election::heard::Heard` (model/system.rs).

mod regressions;
mod system;

use std::time::Instant;

use stateright::{Checker, Expectation, HasDiscoveries, Model, Property};

use system::{Mutation, State, Step, System};

impl Model for System {
    type State = State;
    type Action = Step;

    fn init_states(&self) -> Vec<State> {
        vec![self.init()]
    }

    fn actions(&self, state: &State, actions: &mut Vec<Step>) {
        self.steps(state, actions);
    }

    fn next_state(&self, state: &State, action: Step) -> Option<State> {
        self.next(state, action)
    }

    fn properties(&self) -> Vec<Property<Self>> {
        vec![
            // Two CMDs never act at once (a frozen one does not act).
            Property::<Self>::always("exclusion", |_, s: &State| !s.overlap),
            // Every assignment's term is above every term assigned before, and the protected
            // resource never accepts two processes' writes at one term (a frozen holder's
            // write as it resumes is refused).
            Property::<Self>::always("fencing", |_, s: &State| !s.term_reused && !s.two_writers),
            // Once calm for long enough, a live candidate runs CMD and stays there.
            Property::<Self>::always("liveness", |_, s: &State| s.live()),
            // With no fault, a holder outranked by a live candidate hands over in time.
            Property::<Self>::always("version order", |_, s: &State| s.in_order()),
            // With no fault, candidates started together elect the oldest from the first term.
            Property::<Self>::always("started together", |_, s: &State| s.gathered()),
            // A forced exit hits only the pod that held the deposed term.
            Property::<Self>::always("forced exits", |_, s: &State| !s.wrong_eviction),
            // No term goes to a candidate written by hand with a renewTime ahead and no
            // process behind it: nothing it wrote counts as a renewal seen now.
            Property::<Self>::always("unheard", |_, s: &State| !s.unheard_elected),
            // No term goes to a candidate whose pod the assigning replica saw gone or
            // terminating, or whose registering process it saw exit.
            Property::<Self>::always("gone passed over", |_, s: &State| !s.gone_elected),
            // Sanity: the model reaches a CMD running, and a term after a first one.
            Property::<Self>::sometimes("a CMD runs", |_, s: &State| {
                s.cands.iter().any(|c| c.cmd.is_some())
            }),
            Property::<Self>::sometimes("a second term", |_, s: &State| s.max_term >= 2),
            Property::<Self>::sometimes("a replica takes over", |_, s: &State| {
                s.ops.iter().skip(1).any(|o| o.active)
            }),
            Property::<Self>::sometimes("liveness is due", |_, s: &State| s.live_due()),
            Property::<Self>::sometimes("a pod is forced out", |_, s: &State| s.evicted),
            Property::<Self>::sometimes("a stale write is refused", |_, s: &State| s.refused),
        ]
    }
}

/// A counterexample as the steps taken, each with what it left of the lease and the candidates.
fn trace(path: stateright::Path<State, Step>) -> String {
    let mut out = String::new();
    for (s, step) in path.into_vec() {
        let cands: Vec<String> = s
            .cands
            .iter()
            .map(|c| {
                format!(
                    "pod{} {:?}{}{}",
                    c.pod,
                    c.agent,
                    c.cmd.map(|t| format!(" CMD@{t}")).unwrap_or_default(),
                    if c.paused { " paused" } else { "" }
                )
            })
            .collect();
        let lease = s
            .lease
            .as_ref()
            .map(|l| {
                format!(
                    "holder {:?} term {} rv {} preferred {:?} released_by {:?}",
                    l.holder, l.term, l.rv, l.preferred, l.released_by
                )
            })
            .unwrap_or_else(|| "no Lease".into());
        let ops: Vec<String> = s
            .ops
            .iter()
            .map(|o| {
                format!(
                    "{}{}",
                    if o.active {
                        format!("active, gate {}", o.gate)
                    } else {
                        "standby".into()
                    },
                    if o.paused { " paused" } else { "" }
                )
            })
            .collect();
        out += &format!(
            "t={} {lease} | {} || operator: {}\n",
            s.t,
            cands.join(" | "),
            ops.join(" | ")
        );
        if let Some(step) = step {
            out += &format!("  -> {step:?}\n");
        }
    }
    out
}

struct Options {
    small: bool,
    mutation: Option<String>,
}

fn options() -> Options {
    let args: Vec<String> = std::env::args().collect();
    let value = |flag: &str| {
        args.iter()
            .position(|a| a == flag)
            .and_then(|i| args.get(i + 1).cloned())
    };
    Options {
        small: args.iter().any(|a| a == "--small"),
        mutation: value("--mutation")
            .or_else(|| std::env::var("MUTATION").ok().filter(|m| !m.is_empty())),
    }
}

/// A bound: how many candidates and operator replicas, seconds of real time, faults.
type Bound = (u8, u8, u8, u8);

/// The bounds checked exhaustively by `make model`: liveness due after a fault (13 s), three
/// candidates, two faults, and three faults with one replica ([`THREE_FAULTS`]). `--small`
/// (in `make test`) checks [`SMALL`] instead.
const BOUNDS: [Bound; 4] = [LONG, (3, 2, 9, 1), (2, 2, 9, 2), THREE_FAULTS];
const SMALL: [Bound; 3] = [(2, 2, 8, 2), LONG, THREE_FAULTS];

/// The bounds to check: MODEL_CANDIDATES, MODEL_REPLICAS, MODEL_TIME and MODEL_FAULTS set one
/// of their own.
fn bounds(small: bool) -> Vec<Bound> {
    let env = |name: &str| std::env::var(name).ok().and_then(|v| v.parse().ok());
    if let (Some(c), Some(r), Some(t), Some(f)) = (
        env("MODEL_CANDIDATES"),
        env("MODEL_REPLICAS"),
        env("MODEL_TIME"),
        env("MODEL_FAULTS"),
    ) {
        return vec![(c, r, t, f)];
    }
    if small {
        SMALL.to_vec()
    } else {
        BOUNDS.to_vec()
    }
}

/// The bound a mutation is checked at: the smallest of those the protocol is checked within
/// that holds its counterexample (fewer faults and seconds make the breadth-first search,
/// which must see every shorter path first, far cheaper). Liveness needs a long one (a fault,
/// then [`system::CALM`] seconds of calm), and so does a take answered after its term lapsed;
/// a term nobody reported needs three faults (one replica), an agent that leaves stopping CMD
/// to its frozen guard two (one replica, 8 s: the first election waits out the settle); a replica paused between two writes, a pod
/// force-deleted or its record edited, and a second fault, two; the rest one.
fn mutation_bound(m: Mutation, small: bool) -> Bound {
    use Mutation::*;
    match m {
        NoUnknownTerm => THREE_FAULTS,
        AgentReliesOnGuard => (2, 1, 8, 2),
        IgnorePings | FutureRenewAsAnswer | RenewDeadlineFromAnswer => LONG,
        MarkAfterLease | OwnerPod | PodStopWhoeverTook if small => (2, 2, 8, 2),
        MarkAfterLease | OwnerPod | PodStopWhoeverTook => (2, 2, 9, 2),
        _ => (2, 2, 9, 1),
    }
}

/// Liveness due after a fault: 13 s with one fault.
const LONG: Bound = (2, 2, 13, 1);

/// The bound for what takes three faults (a replica dying between two writes, the Lease
/// deleted, the holder cut off): one replica, which restarts, so the state space stays small.
/// Checked exhaustively by `make model` and `make test` alike.
const THREE_FAULTS: Bound = (2, 1, 7, 3);

fn system((candidates, replicas, max_time, faults): Bound, mutation: Option<Mutation>) -> System {
    System {
        candidates,
        replicas,
        max_time,
        faults,
        settle: system::SETTLE,
        // Three faults from the first kinds only: the deeper budget's state space.
        extended: faults < 3,
        mutation,
    }
}

/// The promises checked (always), and what the model must reach (sometimes) to prove anything.
const PROMISES: [&str; 8] = [
    "exclusion",
    "fencing",
    "liveness",
    "version order",
    "started together",
    "forced exits",
    "unheard",
    "gone passed over",
];
const SANITY: [&str; 6] = [
    "a CMD runs",
    "a second term",
    "a replica takes over",
    "liveness is due",
    "a pod is forced out",
    "a stale write is refused",
];

type Discoveries = std::collections::HashMap<&'static str, stateright::Path<State, Step>>;

/// Checks `sys` exhaustively: depth first for the protocol (the visited set holds fingerprints
/// only, the stack one path), breadth first for a mutation, until its first violation (its
/// counterexample is then a shortest one). Prints what was explored; returns the discoveries.
fn check(sys: System, label: &str) -> Discoveries {
    let bound = format!(
        "{} candidates, {} operator replicas, {} s of real time, {} faults",
        sys.candidates, sys.replicas, sys.max_time, sys.faults
    );
    let start = Instant::now();
    let mutation = sys.mutation.is_some();
    let finish = match sys.mutation {
        Some(m) => HasDiscoveries::AnyOf([m.breaks()].into()),
        None => HasDiscoveries::All,
    };
    let builder = sys.checker().threads(2).finish_when(finish);
    let report = |c: &dyn Checker<System>| {
        println!(
            "model {label}: {bound}: {} states ({} unique), depth {}, {:.1} s",
            c.state_count(),
            c.unique_state_count(),
            c.max_depth(),
            start.elapsed().as_secs_f64()
        );
        c.discoveries()
    };
    if mutation {
        report(&builder.spawn_bfs().join())
    } else {
        report(&builder.spawn_dfs().join())
    }
}

/// Random walks through a larger system than the exhaustive bounds reach, for `seconds`.
fn simulate(sys: System, seconds: u64) {
    let bound = format!(
        "{} candidates, {} operator replicas, {} s of real time, {} faults",
        sys.candidates, sys.replicas, sys.max_time, sys.faults
    );
    let start = Instant::now();
    let checker = sys
        .checker()
        .threads(2)
        .timeout(std::time::Duration::from_secs(seconds))
        .finish_when(HasDiscoveries::AnyFailures)
        .spawn_simulation(20261205, stateright::UniformChooser)
        .join();
    println!(
        "model simulation: {bound}: {} states, {:.0} s",
        checker.state_count(),
        start.elapsed().as_secs_f64()
    );
    for name in PROMISES {
        if let Some(path) = checker.discovery(name) {
            panic!("{name} is violated:\n{}", trace(path));
        }
    }
}

/// Replays every recorded counterexample ([`regressions`]).
fn replay_regressions() {
    let cases = regressions::cases();
    for case in &cases {
        let states = regressions::replay(&case.system, &case.steps)
            .unwrap_or_else(|e| panic!("regression {}: {e}", case.name));
        assert!(
            (case.end)(states.last().unwrap()),
            "regression {}: the trace no longer ends as recorded:\n{}",
            case.name,
            states
                .iter()
                .map(|s| format!(
                    "t={} lease {:?} CMDs {:?}",
                    s.t,
                    s.lease.as_ref().map(|l| (l.holder, l.term, l.renew)),
                    s.cands.iter().map(|c| c.cmd).collect::<Vec<_>>()
                ))
                .collect::<Vec<_>>()
                .join("\n")
        );
        if case.system.mutation.is_none() {
            let gather = case.system.settle > 0;
            if let Some(k) = states.iter().position(|s| !s.promises_hold(gather)) {
                let s = &states[k];
                panic!(
                    "regression {}: a promise is broken at step {k} (t={}): overlap {}, term reused {}, two writers {}, live {}, in order {}, gathered {}, wrong eviction {}, unheard elected {}, gone elected {}",
                    case.name,
                    s.t,
                    s.overlap,
                    s.term_reused,
                    s.two_writers,
                    s.live(),
                    s.in_order(),
                    s.gathered(),
                    s.wrong_eviction,
                    s.unheard_elected,
                    s.gone_elected
                );
            }
        }
    }
    println!(
        "model: {} recorded counterexamples replay as recorded",
        cases.len()
    );
}

fn main() {
    replay_regressions();
    let opts = options();
    let bounds = bounds(opts.small);
    if let Some(name) = opts.mutation {
        let m = Mutation::ALL
            .into_iter()
            .find(|m| m.name() == name)
            .unwrap_or_else(|| {
                panic!(
                    "no mutation {name}; one of: {:?}",
                    Mutation::ALL.map(Mutation::name)
                )
            });
        let mut found = check(system(mutation_bound(m, opts.small), Some(m)), m.name());
        match found.remove(m.breaks()) {
            Some(path) => println!("counterexample to {}:\n{}", m.breaks(), trace(path)),
            None => panic!(
                "mutation {} survived: no counterexample to {} (found: {:?})",
                m.name(),
                m.breaks(),
                found.keys().collect::<Vec<_>>()
            ),
        }
        return;
    }
    for bound in &bounds {
        let mut discoveries = check(system(*bound, None), "protocol");
        let promises = PROMISES.map(|p| (p, Expectation::Always));
        let sanity = SANITY.map(|p| (p, Expectation::Sometimes));
        for (name, expectation) in promises.into_iter().chain(sanity) {
            let unreachable = match name {
                "a replica takes over" => bound.1 < 2,
                "liveness is due" => bound.2 < system::CALM,
                // A holder frozen, its term lapsed, the next one taken and written: 9 s.
                "a stale write is refused" => bound.2 < 9,
                _ => false,
            };
            if unreachable {
                continue;
            }
            let found = discoveries.remove(name);
            match expectation {
                Expectation::Always => {
                    if let Some(path) = found {
                        panic!("{name} is violated:\n{}", trace(path));
                    }
                }
                _ => assert!(
                    found.is_some(),
                    "{name} was never reached: the model is vacuous"
                ),
            }
        }
    }
    println!("model: {} hold", PROMISES.join(", "));
    let mut survived = Vec::new();
    for m in Mutation::ALL {
        match check(system(mutation_bound(m, opts.small), Some(m)), m.name()).remove(m.breaks()) {
            Some(path) => println!(
                "  {} caught: {} violated after {} steps",
                m.name(),
                m.breaks(),
                path.into_actions().len()
            ),
            None => survived.push(m.name()),
        }
    }
    assert!(survived.is_empty(), "mutations not caught: {survived:?}");
    println!("model: every seeded mutation was caught");
    if !opts.small {
        simulate(system((3, 2, 30, 4), None), 60);
    }
}

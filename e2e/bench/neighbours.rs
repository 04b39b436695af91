//! Noisy neighbour: one namespace's burst of first elections against single failovers in
//! other namespaces, with the operator's fair queue (`--queue-fairness namespaces`, the
//! default) and with the queue it replaced (`none`: the longest-waiting lease first, whatever
//! its namespace).
//!
//! Each round: in five quiet namespaces, one lease each with two simulated candidates; their
//! holders renew together, then die. Just before their leases expire, `--burst` leases (default
//! 1,000) with three candidates each register in the noisy namespace, so that the quiet leases
//! expire while the operator has the burst's elections due. What is measured is how long after
//! its expiry each quiet lease gets its next holder; beside it, how long the burst took.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use arbiter::api::LeaseCandidate;
use futures::{StreamExt, TryStreamExt, stream};
use k8s_openapi::api::core::v1::Namespace;
use kube::Client;
use kube::api::{Api, DeleteParams, PostParams};
use std::path::Path;

use crate::scale::{self, Fleet, IN_FLIGHT, LEASE_SECONDS};
use crate::stats;
use crate::support::{self, operator::Operator};

/// The quiet namespaces, one failover each.
const QUIET: usize = 5;
/// How long before the quiet leases expire the burst starts registering.
const LEAD: Duration = Duration::from_secs(5);

/// One round's figures.
pub struct Round {
    /// Each quiet lease: its next holder, seconds after its expiry.
    pub after_expiry: Vec<f64>,
    /// Every burst lease held, seconds after the burst began.
    pub burst_held: f64,
    /// Burst leases still without a holder when the quiet leases expired.
    pub burst_unheld_at_expiry: usize,
}

/// A namespace of simulated candidates: its fleet and the tasks that answer for it.
struct Simulated {
    ns: String,
    fleet: Arc<Mutex<Fleet>>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Simulated {
    async fn start(client: &Client, ns: String) -> Simulated {
        crate::support::create_namespace(client, &ns).await;
        let fleet = Arc::new(Mutex::new(Fleet::default()));
        let tasks = scale::simulate(client, &ns, &fleet);
        Simulated { ns, fleet, tasks }
    }

    async fn stop(self, client: &Client) {
        for t in self.tasks {
            t.abort();
        }
        let namespaces: Api<Namespace> = Api::all(client.clone());
        let _ = namespaces
            .delete(&self.ns, &DeleteParams::background())
            .await;
    }
}

/// One round with `--queue-fairness fairness`.
pub async fn round(kubeconfig: &Path, fairness: &str, burst: usize, n: usize) -> Option<Round> {
    let client = support::client_for(kubeconfig).await;
    let tag = format!("{fairness}-{n}");
    let noisy = Simulated::start(&client, format!("noisy-{tag}")).await;
    let mut quiet = Vec::new();
    for i in 0..QUIET {
        quiet.push(Simulated::start(&client, format!("quiet-{tag}-{i}")).await);
    }
    let lease_duration = format!("{LEASE_SECONDS}s");
    let operator = Operator::start_args(
        kubeconfig,
        &[
            "--namespace",
            &noisy.ns,
            "--metrics-address",
            "127.0.0.1:0",
            "--lease-duration",
            &lease_duration,
            "--queue-fairness",
            fairness,
        ],
    );
    let result = measure(&client, &noisy, &quiet, burst).await;
    drop(operator);
    noisy.stop(&client).await;
    for q in quiet {
        q.stop(&client).await;
    }
    result
}

async fn measure(
    client: &Client,
    noisy: &Simulated,
    quiet: &[Simulated],
    burst: usize,
) -> Option<Round> {
    // The quiet leases get their holders.
    for q in quiet {
        let candidates: Api<LeaseCandidate> = Api::namespaced(client.clone(), &q.ns);
        for c in ["c0", "c1"] {
            candidates
                .create(&PostParams::default(), &scale::candidate(c, "work"))
                .await
                .expect("creating a quiet candidate");
        }
    }
    let held = |q: &Simulated| q.fleet.lock().unwrap().last_renew.contains_key("work");
    wait(Duration::from_secs(120), || quiet.iter().all(held)).await?;
    // Their holders renew together, then die: their leases expire within moments of each other.
    for q in quiet {
        q.fleet.lock().unwrap().last_renew.remove("work");
    }
    wait(Duration::from_secs(30), || quiet.iter().all(held)).await?;
    for q in quiet {
        let mut f = q.fleet.lock().unwrap();
        let holder = f
            .leases
            .get("work")
            .and_then(arbiter::lease::holder)
            .map(str::to_string);
        f.dead.extend(holder);
    }
    // When each quiet lease expires: its holder's last renewal plus the lease duration.
    let expiries: Vec<(Instant, String)> = quiet
        .iter()
        .map(|q| {
            let f = q.fleet.lock().unwrap();
            let last = f.renewed_after_death.get("work").copied();
            let renew = f.last_renew["work"].max(last.unwrap_or(f.last_renew["work"]));
            let holder = f.leases.get("work").and_then(arbiter::lease::holder);
            (
                renew + Duration::from_secs(LEASE_SECONDS as u64),
                holder.unwrap_or_default().to_string(),
            )
        })
        .collect();
    let first_expiry = expiries.iter().map(|e| e.0).min()?;
    tokio::time::sleep_until((first_expiry - LEAD).into()).await;

    // The burst.
    let began = Instant::now();
    let candidates: Api<LeaseCandidate> = Api::namespaced(client.clone(), &noisy.ns);
    let register = tokio::spawn(async move {
        stream::iter((0..burst).flat_map(|l| (0..3).map(move |c| (l, c))))
            .map(|(l, c)| {
                let candidates = candidates.clone();
                async move {
                    let lc = scale::candidate(&format!("l{l}-c{c}"), &format!("l{l}"));
                    candidates.create(&PostParams::default(), &lc).await
                }
            })
            .buffer_unordered(IN_FLIGHT)
            .try_collect::<Vec<_>>()
            .await
    });
    tokio::time::sleep_until(first_expiry.into()).await;
    let burst_unheld_at_expiry = burst - noisy.fleet.lock().unwrap().last_renew.len().min(burst);
    let after_expiry = wait(Duration::from_secs(600), || {
        quiet
            .iter()
            .zip(&expiries)
            .map(|(q, (expiry, old))| {
                let f = q.fleet.lock().unwrap();
                let next = f
                    .assignments
                    .get("work")?
                    .iter()
                    .find(|(h, t)| h != old && t > expiry)?;
                Some(next.1.saturating_duration_since(*expiry).as_secs_f64())
            })
            .collect::<Option<Vec<f64>>>()
    })
    .await?;
    register.await.ok()?.ok()?;
    let burst_held = {
        let held = || noisy.fleet.lock().unwrap().last_renew.len() >= burst;
        wait(Duration::from_secs(900), || held().then_some(())).await?;
        began.elapsed().as_secs_f64()
    };
    Some(Round {
        after_expiry,
        burst_held,
        burst_unheld_at_expiry,
    })
}

/// Polls `check` every 100 ms until it gives a value or `deadline` passes.
async fn wait<T>(deadline: Duration, mut check: impl FnMut() -> T) -> Option<T::Output>
where
    T: Ready,
{
    let until = Instant::now() + deadline;
    loop {
        if let Some(v) = check().ready() {
            return Some(v);
        }
        if Instant::now() > until {
            return None;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// What [`wait`] waits for: a condition, or a value.
trait Ready {
    type Output;
    fn ready(self) -> Option<Self::Output>;
}

impl Ready for bool {
    type Output = ();
    fn ready(self) -> Option<()> {
        self.then_some(())
    }
}

impl<T> Ready for Option<T> {
    type Output = T;
    fn ready(self) -> Option<T> {
        self
    }
}

/// The bench: `runs` rounds with each queue, then the table.
pub async fn run(kubeconfig: &Path, runs: usize, burst: usize) {
    println!(
        "\nnoisy neighbour: {burst} first elections in one namespace while one holder fails in each of {QUIET} others, {runs} rounds per queue"
    );
    let mut rows = Vec::new();
    for fairness in ["none", "namespaces"] {
        let mut after = Vec::new();
        let mut bursts = Vec::new();
        let mut unheld = Vec::new();
        for n in 0..runs {
            match round(kubeconfig, fairness, burst, n).await {
                Some(r) => {
                    println!(
                        "{fairness} round {n}: quiet re-elections after expiry {:?} s; burst held after {:.1} s ({} unheld at the quiet expiry)",
                        r.after_expiry
                            .iter()
                            .map(|x| (x * 100.0).round() / 100.0)
                            .collect::<Vec<_>>(),
                        r.burst_held,
                        r.burst_unheld_at_expiry
                    );
                    after.extend(r.after_expiry);
                    bursts.push(r.burst_held);
                    unheld.push(r.burst_unheld_at_expiry as f64);
                }
                None => println!("{fairness} round {n}: did not complete"),
            }
        }
        rows.push((fairness, after, bursts, unheld));
    }
    println!(
        "\n| queue (`--queue-fairness`) | quiet re-elections after expiry: n, p50, p99, max | the burst held after, p50 | burst leases unheld at the quiet expiry, p50 |"
    );
    println!("|---|---|---|---|");
    for (fairness, after, bursts, unheld) in &rows {
        if after.is_empty() {
            println!("| `{fairness}` | no round completed | | |");
            continue;
        }
        let a = stats::summary(after);
        println!(
            "| `{fairness}` | {}, {:.2} s, {:.2} s, {:.2} s | {:.1} s | {:.0} |",
            a.n,
            a.p50,
            a.p99,
            a.max,
            stats::summary(bursts).p50,
            stats::summary(unheld).p50
        );
    }
    if let [(_, old, ..), (_, new, ..)] = &rows[..]
        && !old.is_empty()
        && !new.is_empty()
    {
        let (o, n) = (stats::summary(old), stats::summary(new));
        println!(
            "\nfair ÷ unfair: p50 {:.3}, max {:.3}",
            n.p50 / o.p50.max(f64::EPSILON),
            n.max / o.max.max(f64::EPSILON)
        );
    }
}

//! One operator, many leases: what it costs and how fast it re-elects.
//!
//! The candidates are simulated by this process (one watch on the LeaseCandidates answers the
//! operator's pings, one watch on the Leases lets each assigned holder renew by
//! compare-and-swap every [`RENEW_EVERY`]), so thousands of them cost a few tasks rather than
//! thousands of processes. The operator is the real `arbiter operator` process; its API requests
//! are counted from the API server's audit log by their `arbiter/` User-Agent.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use arbiter::api::{LeaseCandidate, LeaseCandidateSpec, OLDEST_EMULATION_VERSION};
use futures::{StreamExt, TryStreamExt, stream};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Namespace;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, ResourceExt};
use serde_json::json;
use tokio::sync::Semaphore;

use crate::stats;
use crate::support::{self, operator::Operator};
use crate::write_cost;

/// Lease duration the operator assigns and the holders write: long enough that renewing
/// thousands of leases stays within what this machine's API server can take.
pub const LEASE_SECONDS: i32 = 60;
/// How often a simulated holder renews.
const RENEW_EVERY: f64 = 20.0;
/// The operator's own HA lease (its default `--ha-lease-name`): a fixed cost, counted apart.
const HA_LEASE: &str = "arbiter-operator";
/// Time allowed for every lease to get a holder: 15 minutes, or 150 ms per lease if more (on
/// this 2-core machine an election costs about 100 ms of everything's CPU).
fn converge_limit(leases: usize) -> Duration {
    Duration::from_secs(900).max(Duration::from_millis(150) * leases as u32)
}
/// Time allowed after every lease is held before steady state is measured.
const SETTLE: Duration = Duration::from_secs(60);
/// Requests the simulator keeps in flight.
pub const IN_FLIGHT: usize = 32;

/// The API server's audit log (Metadata level, one line per completed request).
pub struct Audit {
    dir: tempfile::TempDir,
}

impl Audit {
    pub fn prepare() -> Audit {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(
            dir.path().join("policy.yaml"),
            "apiVersion: audit.k8s.io/v1\nkind: Policy\n\
             omitStages: [RequestReceived, ResponseStarted]\n\
             rules:\n- level: Metadata\n",
        )
        .unwrap();
        Audit { dir }
    }

    fn log(&self) -> PathBuf {
        self.dir.path().join("audit.log")
    }

    pub fn flags(&self) -> String {
        format!(
            "--audit-policy-file={} --audit-log-path={} --audit-log-maxsize=0",
            self.dir.path().join("policy.yaml").display(),
            self.log().display()
        )
    }

    /// arbiter's requests completed between `from` and `to`, by "verb resource".
    fn count(&self, from: jiff::Timestamp, to: jiff::Timestamp) -> BTreeMap<String, usize> {
        let text = std::fs::read_to_string(self.log()).unwrap_or_default();
        let mut counts = BTreeMap::new();
        for line in text.lines() {
            if !line.contains("\"userAgent\":\"arbiter/") {
                continue;
            }
            let Ok(ev) = serde_json::from_str::<serde_json::Value>(line) else {
                continue;
            };
            let Some(at) = ev["stageTimestamp"]
                .as_str()
                .and_then(|t| t.parse::<jiff::Timestamp>().ok())
            else {
                continue;
            };
            if at < from || at > to {
                continue;
            }
            let object = &ev["objectRef"];
            let mut key = format!(
                "{} {}",
                ev["verb"].as_str().unwrap_or("?"),
                object["resource"].as_str().unwrap_or("?")
            );
            if let Some(sub) = object["subresource"].as_str() {
                key += &format!("/{sub}");
            }
            if object["name"].as_str() == Some(HA_LEASE) {
                key += " (own HA lease)";
            }
            *counts.entry(key).or_default() += 1;
        }
        counts
    }
}

/// The write requests in `counts` (create, update, patch, delete), not counting the
/// operator's own HA lease.
fn writes(counts: &BTreeMap<String, usize>) -> BTreeMap<String, usize> {
    counts
        .iter()
        .filter(|(k, _)| {
            !k.ends_with("(own HA lease)")
                && ["create ", "update ", "patch ", "delete "]
                    .iter()
                    .any(|v| k.starts_with(v))
        })
        .map(|(k, c)| (k.clone(), *c))
        .collect()
}

/// Prints the writes an election cost: `elections` elections made `writes` writes.
fn print_writes_per_election(what: &str, elections: usize, writes: &BTreeMap<String, usize>) {
    let total: usize = writes.values().sum();
    println!(
        "| API writes per election, {what} | {:.2} ({total} writes, {elections} elections) |",
        total as f64 / elections.max(1) as f64
    );
    for (kind, c) in writes {
        println!(
            "|   {kind} | {:.2} per election |",
            *c as f64 / elections.max(1) as f64
        );
    }
}

/// The operator's `arbiter_queue_wait_seconds` histogram, as scraped: how long leases that
/// were due waited for a worker (cumulative buckets by upper bound, sum, count).
#[derive(Default)]
struct QueueWait {
    buckets: Vec<(f64, u64)>,
    sum: f64,
    count: u64,
}

impl QueueWait {
    async fn read(operator: &Operator) -> QueueWait {
        let text = operator.http_get("/metrics").await;
        let mut q = QueueWait::default();
        for line in text.lines() {
            let Some(rest) = line.strip_prefix("arbiter_queue_wait_seconds") else {
                continue;
            };
            let value = rest.rsplit(' ').next().unwrap_or_default();
            if let Some(le) = rest.strip_prefix("_bucket{le=\"") {
                let le = le.split('"').next().unwrap_or_default();
                let le = if le == "+Inf" {
                    f64::INFINITY
                } else {
                    le.parse().unwrap_or(f64::NAN)
                };
                q.buckets.push((le, value.parse().unwrap_or(0)));
            } else if rest.starts_with("_sum ") {
                q.sum = value.parse().unwrap_or(0.0);
            } else if rest.starts_with("_count ") {
                q.count = value.parse().unwrap_or(0);
            }
        }
        q
    }

    /// The waits between `earlier` and this reading: their number, mean, and the bucket
    /// bounds the p50 and p99 fall under.
    fn since(&self, earlier: &QueueWait) -> String {
        let count = self.count.saturating_sub(earlier.count);
        if count == 0 {
            return "(none)".into();
        }
        let before = |le: f64| {
            earlier
                .buckets
                .iter()
                .find(|(l, _)| *l == le)
                .map_or(0, |(_, c)| *c)
        };
        let under = |q: f64| {
            self.buckets
                .iter()
                .find(|(le, c)| c.saturating_sub(before(*le)) as f64 >= q * count as f64)
                .map_or("?".to_string(), |(le, _)| match le.is_finite() {
                    true => format!("{le} s"),
                    false => "(over the largest bucket)".to_string(),
                })
        };
        format!(
            "{count} reconciles, mean {:.3} s, p50 <= {}, p99 <= {}",
            (self.sum - earlier.sum) / count as f64,
            under(0.5),
            under(0.99)
        )
    }
}

/// What the simulated candidates know.
#[derive(Default)]
pub struct Fleet {
    /// Candidates that stopped answering and renewing (their "process" died).
    pub dead: HashSet<String>,
    /// Per lease: the latest object seen, and when its current holder last renewed it.
    pub leases: HashMap<String, Lease>,
    pub last_renew: HashMap<String, Instant>,
    /// Per lease: every assignment seen (holder, when).
    pub assignments: HashMap<String, Vec<(String, Instant)>>,
    /// Per lease: when a renew by its holder completed after the holder was marked dead (it
    /// was in flight then): the lease expires counting from it.
    pub renewed_after_death: HashMap<String, Instant>,
    /// Every renewal that succeeded: when it was sent, and its round trip in seconds (what a
    /// holder's renew deadline is spent on).
    pub renewals: Vec<(Instant, f64)>,
    /// Per lease: when the create of its first candidate returned.
    pub registered: HashMap<String, Instant>,
}

/// CPU seconds and peak RSS (MiB) of a process, from /proc.
fn usage(pid: i32) -> (f64, f64) {
    let hwm_kb: f64 = std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find_map(|l| {
            l.strip_prefix("VmHWM:")?
                .split_whitespace()
                .next()?
                .parse()
                .ok()
        })
        .unwrap_or(0.0);
    (stats::cpu_seconds(pid), hwm_kb / 1024.0)
}

/// One scale run.
#[derive(Clone)]
pub struct Setup {
    /// Leases, each with 3 candidates.
    pub leases: usize,
    /// Pods that are not candidates, created first in a namespace of their own; the operator
    /// then watches every namespace.
    pub unrelated: usize,
    /// How long steady-state requests are counted.
    pub window: Duration,
    /// The operator's `--concurrency`, if not its default.
    pub concurrency: Option<String>,
    /// The operator's `--ack-valid-for`, if not its default.
    pub ack_valid_for: Option<String>,
    /// The operator binary (`--before`: another build), if not the default.
    pub operator: Option<PathBuf>,
}

/// What a run measured, for a table of two builds side by side.
#[derive(Clone, Debug, Default)]
pub struct Summary {
    pub held_after: f64,
    pub held_p99: f64,
    pub writes_first: f64,
    pub writes_re: f64,
    pub reelect_p50: f64,
    pub reelect_p99: f64,
    pub apiserver_cpu_burst: f64,
    /// kube-apiserver's CPU over the burst of re-elections, less the steady state's.
    pub apiserver_cpu_burst_own: f64,
    pub rss_peak: f64,
}

/// Prints `before` and `after` side by side, with after ÷ before.
pub fn compare(n: usize, before: &Summary, after: &Summary) {
    println!("\nscale, {n} leases x 3 candidates: before (--before) and after (this build)\n");
    println!("| | before | after | after ÷ before |");
    println!("|---|---|---|---|");
    let rows: [(&str, f64, f64, &str); 9] = [
        (
            "every lease held after",
            before.held_after,
            after.held_after,
            "s",
        ),
        (
            "each lease held after its first registration, p99",
            before.held_p99,
            after.held_p99,
            "s",
        ),
        (
            "operator writes per first election",
            before.writes_first,
            after.writes_first,
            "",
        ),
        (
            "operator writes per re-election",
            before.writes_re,
            after.writes_re,
            "",
        ),
        (
            "re-election from lease expiry, p50",
            before.reelect_p50,
            after.reelect_p50,
            "s",
        ),
        (
            "re-election from lease expiry, p99",
            before.reelect_p99,
            after.reelect_p99,
            "s",
        ),
        (
            "kube-apiserver CPU over the re-elections",
            before.apiserver_cpu_burst,
            after.apiserver_cpu_burst,
            "s",
        ),
        (
            "kube-apiserver CPU the re-elections' own requests took",
            before.apiserver_cpu_burst_own,
            after.apiserver_cpu_burst_own,
            "s",
        ),
        ("operator peak RSS", before.rss_peak, after.rss_peak, " MiB"),
    ];
    for (what, b, a, unit) in rows {
        let ratio = if b > 0.0 {
            format!("{:.3}", a / b)
        } else {
            "-".into()
        };
        println!("| {what} | {b:.2}{unit} | {a:.2}{unit} | {ratio} |");
    }
}

/// Runs the scale benchmark.
pub async fn run(kubeconfig: &Path, audit: &Audit, setup: &Setup) -> Option<Summary> {
    let (n, unrelated, window) = (setup.leases, setup.unrelated, setup.window);
    let client = support::client_for(kubeconfig).await;
    install_crd(&client).await;
    // Two builds side by side (`--before`) each get a namespace of their own.
    let ns = match setup.operator {
        Some(_) => format!("bench-scale-{n}-before"),
        None => format!("bench-scale-{n}"),
    };
    let namespaces: Api<Namespace> = Api::all(client.clone());
    let mut namespace = Namespace::default();
    namespace.metadata.name = Some(ns.clone());
    let _ = namespaces.create(&PostParams::default(), &namespace).await;
    println!("\nscale: {n} leases x 3 candidates in {ns}, {unrelated} unrelated pods");
    if unrelated > 0 {
        create_unrelated_pods(&client, unrelated).await;
    }

    let lease_duration = format!("{LEASE_SECONDS}s");
    // One namespace holds every lease: no per-namespace limit.
    let mut flags = vec![
        "--lease-duration",
        &lease_duration,
        "--max-candidates-per-namespace",
        "0",
        "--max-leases-per-namespace",
        "0",
    ];
    if let Some(c) = &setup.concurrency {
        flags.extend(["--concurrency", c]);
        println!("operator --concurrency {c}");
    }
    if let Some(v) = &setup.ack_valid_for {
        flags.extend(["--ack-valid-for", v]);
        println!("operator --ack-valid-for {v}");
    }
    if unrelated > 0 {
        flags.extend(["--namespace", &ns, "--metrics-address", "127.0.0.1:0"]);
    } else {
        flags.extend([
            "--namespace",
            &ns,
            "--watch-namespace",
            &ns,
            "--metrics-address",
            "127.0.0.1:0",
        ]);
    }
    if let Some(bin) = &setup.operator {
        println!("operator: {}", bin.display());
    }
    let operator = Operator::start_bin(setup.operator.as_deref(), kubeconfig, &flags);
    // What the operator holds before any lease: its caches, filled from the initial lists.
    wait_logged(&operator, "caches synced").await;
    let synced = settled_rss(operator.pid()).await;
    println!(
        "operator RSS with its caches synced, before any candidate: {synced:.1} MiB (peak {:.1} MiB)",
        usage(operator.pid()).1
    );
    let fleet = Arc::new(Mutex::new(Fleet::default()));
    let tasks = simulate(&client, &ns, &fleet);

    // kube-apiserver's CPU seconds, which bound the elections on this machine.
    let apiserver = write_cost::apiserver_pid(kubeconfig);
    let apiserver_cpu = || apiserver.map_or(f64::NAN, stats::cpu_seconds);
    let apiserver_at_start = apiserver_cpu();
    // Registration: 3n candidates, all at one version (no handovers in steady state).
    let started = Instant::now();
    let started_at = jiff::Timestamp::now();
    let candidates: Api<LeaseCandidate> = Api::namespaced(client.clone(), &ns);
    stream::iter((0..n).flat_map(|l| (0..3).map(move |c| (l, c))))
        .map(|(l, c)| {
            let (candidates, fleet) = (candidates.clone(), fleet.clone());
            async move {
                let lease = format!("l{l}");
                let lc = candidate(&format!("l{l}-c{c}"), &lease);
                candidates.create(&PostParams::default(), &lc).await?;
                let mut f = fleet.lock().unwrap();
                f.registered.entry(lease).or_insert_with(Instant::now);
                Ok::<(), kube::Error>(())
            }
        })
        .buffer_unordered(IN_FLIGHT)
        .try_collect::<Vec<_>>()
        .await
        .expect("creating candidates");
    let registered = started.elapsed();
    let limit = converge_limit(n);
    let all_held = wait(&fleet, limit, |f| (f.last_renew.len() >= n).then_some(())).await;
    let converged = started.elapsed();
    // Each lease, from its first candidate's registration to its first holder.
    let held_after_registration: Vec<f64> = {
        let f = fleet.lock().unwrap();
        f.registered
            .iter()
            .filter_map(|(lease, at)| {
                let first = f.assignments.get(lease)?.first()?.1;
                Some(first.saturating_duration_since(*at).as_secs_f64())
            })
            .collect()
    };
    let apiserver_at_held = apiserver_cpu();
    let (cpu_start, rss) = usage(operator.pid());
    let queue_at_held = QueueWait::read(&operator).await;
    if all_held.is_none() {
        let held = fleet.lock().unwrap().last_renew.len();
        println!(
            "| {n} leases x 3 candidates | {held} held after {} s; stopped there (operator: {cpu_start:.1} CPU s, {rss:.1} MiB peak RSS) |",
            limit.as_secs()
        );
        for t in tasks {
            t.abort();
        }
        drop(operator);
        let _ = namespaces.delete(&ns, &DeleteParams::background()).await;
        if unrelated > 0 {
            delete_unrelated_pods(&client).await;
        }
        return None;
    }

    // Steady state, once the election's after-effects (Events) are written.
    tokio::time::sleep(SETTLE).await;
    let from = jiff::Timestamp::now();
    let apiserver_at_from = apiserver_cpu();
    let (cpu_at_from, _) = usage(operator.pid());
    let steady_from = Instant::now();
    tokio::time::sleep(window).await;
    let to = jiff::Timestamp::now();
    let apiserver_steady = apiserver_cpu() - apiserver_at_from;
    let (cpu_steady, _) = usage(operator.pid());
    let steady_to = Instant::now();
    let rss_steady = rss_now(operator.pid());
    // The audit backend writes as requests complete; give it a moment to catch up.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let counts = audit.count(from, to);
    // Every lease's first election, with its after-effects (statuses, Events) written.
    let first_elections = writes(&audit.count(started_at, from));
    let total: usize = counts
        .iter()
        .filter(|(k, _)| !k.ends_with("(own HA lease)"))
        .map(|(_, c)| c)
        .sum();
    let ha: usize = counts
        .iter()
        .filter(|(k, _)| k.ends_with("(own HA lease)"))
        .map(|(_, c)| c)
        .sum();
    let lease_hours = n as f64 * window.as_secs_f64() / 3600.0;

    // 10% of the holders renew together, then die at once: their leases expire within the
    // moments those renewals take, a burst of re-elections all due together.
    let queue_at_failure = QueueWait::read(&operator).await;
    let failed_at_wall = jiff::Timestamp::now();
    let apiserver_at_failure = apiserver_cpu();
    let doomed: Vec<Lease> = {
        let f = fleet.lock().unwrap();
        let mut held: Vec<(&String, &Lease)> = f
            .leases
            .iter()
            .filter(|(_, l)| arbiter::lease::holder(l).is_some())
            .collect();
        held.sort_by_key(|(name, _)| *name);
        held.truncate(n / 10);
        held.into_iter().map(|(_, l)| l.clone()).collect()
    };
    let store = arbiter::lease::LeaseStore::new(client.clone(), &ns);
    stream::iter(doomed.iter().cloned())
        .for_each_concurrent(IN_FLIGHT, |l| renew(&store, &fleet, l))
        .await;
    let failed_at = Instant::now();
    let victims: Vec<(String, String, Instant)> = {
        let mut f = fleet.lock().unwrap();
        let held: Vec<(String, String, Instant)> = doomed
            .iter()
            .filter_map(|l| {
                let name = l.name_any();
                let holder = arbiter::lease::holder(l)?.to_string();
                let last = *f.last_renew.get(&name)?;
                Some((name, holder, last))
            })
            .collect();
        for (_, holder, _) in &held {
            f.dead.insert(holder.clone());
        }
        held
    };
    let expiries = victims
        .iter()
        .map(|(_, _, t)| *t + Duration::from_secs(LEASE_SECONDS as u64));
    let (first_expiry, last_expiry) = (
        expiries.clone().min().unwrap_or(failed_at),
        expiries.max().unwrap_or(failed_at),
    );
    let victim_leases: HashMap<String, (String, Instant)> = victims
        .iter()
        .map(|(l, h, t)| (l.clone(), (h.clone(), *t)))
        .collect();
    // kube-apiserver's CPU over the burst itself: from a second before the first expiry until
    // the last new holder is seen.
    let before_first_expiry = first_expiry.checked_sub(Duration::from_secs(1));
    if let Some(at) = before_first_expiry.filter(|at| *at > Instant::now()) {
        tokio::time::sleep_until(at.into()).await;
    }
    let (apiserver_at_expiry, expiry_seen) = (apiserver_cpu(), Instant::now());
    let latencies = wait(&fleet, Duration::from_secs(600), |f| {
        let mut out = Vec::new();
        for (lease, (old, last_renew)) in &victim_leases {
            let next = f
                .assignments
                .get(lease)?
                .iter()
                .find(|(h, t)| h != old && *t > failed_at)?;
            let last_renew = f
                .renewed_after_death
                .get(lease)
                .map_or(*last_renew, |t| (*t).max(*last_renew));
            let expiry = last_renew + Duration::from_secs(LEASE_SECONDS as u64);
            out.push((
                next.1.saturating_duration_since(expiry).as_secs_f64(),
                (next.1 - failed_at).as_secs_f64(),
            ));
        }
        Some(out)
    })
    .await;
    let burst_window = expiry_seen.elapsed();
    let apiserver_over_burst = apiserver_cpu() - apiserver_at_expiry;
    // What the burst's own requests took: less what the live holders' renewals take in as
    // long, at the steady state's rate (an estimate: nine in ten of them renew meanwhile).
    let apiserver_burst_own =
        apiserver_over_burst - apiserver_steady * burst_window.as_secs_f64() / window.as_secs_f64();
    // The burst's after-effects (the deposed candidates' statuses, Events).
    tokio::time::sleep(Duration::from_secs(10)).await;
    let apiserver_burst = apiserver_cpu() - apiserver_at_failure;
    let burst_took = failed_at.elapsed();
    let burst_end = Instant::now();
    let burst_writes = writes(&audit.count(failed_at_wall, jiff::Timestamp::now()));
    let queue_after_burst = QueueWait::read(&operator).await;
    let (cpu_end, rss_peak) = usage(operator.pid());

    println!("| {n} leases x 3 candidates | value |");
    println!("|---|---|");
    println!(
        "| candidates registered in | {:.1} s |",
        registered.as_secs_f64()
    );
    println!(
        "| every lease held after | {:.1} s |",
        converged.as_secs_f64()
    );
    let h = stats::summary(&held_after_registration);
    println!(
        "| each lease held after its first candidate registered ({} leases) | p50 {:.1} s, p99 {:.1} s, max {:.1} s |",
        h.n, h.p50, h.p99, h.max
    );
    let share = |cpu: f64, over: Duration| {
        format!(
            "{cpu:.1} s ({:.0}% of a core over {:.0} s)",
            100.0 * cpu / over.as_secs_f64(),
            over.as_secs_f64()
        )
    };
    println!(
        "| kube-apiserver CPU, registration to every lease held | {} |",
        share(apiserver_at_held - apiserver_at_start, converged)
    );
    println!(
        "| kube-apiserver CPU in steady state (mostly the holders' renewals) | {} |",
        share(apiserver_steady, window)
    );
    println!(
        "| kube-apiserver CPU, from the failure (the failed leases expire {LEASE_SECONDS} s into it) to 10 s after the last new holder | {} |",
        share(apiserver_burst, burst_took)
    );
    println!("| operator RSS in steady state | {rss_steady:.1} MiB |");
    println!("| operator peak RSS | {rss_peak:.1} MiB |");
    println!("| operator CPU, start to every lease held | {cpu_start:.1} s |");
    println!(
        "| operator CPU in steady state | {:.2} s per {} s ({:.1}% of a core) |",
        cpu_steady - cpu_at_from,
        window.as_secs(),
        100.0 * (cpu_steady - cpu_at_from) / window.as_secs_f64()
    );
    println!(
        "| operator API requests per lease-hour, steady state | {:.2} ({total} in {} s) |",
        total as f64 / lease_hours,
        window.as_secs()
    );
    println!(
        "| plus its own HA lease, whatever the number of leases | {:.0} per hour |",
        ha as f64 * 3600.0 / window.as_secs_f64()
    );
    for (what, c) in &counts {
        println!("|   {what} | {c} |");
    }
    print_writes_per_election("first election of each lease", n, &first_elections);
    println!(
        "| operator queue wait (due to picked up), registration to every lease held | {} |",
        queue_at_held.since(&QueueWait::default())
    );
    println!(
        "| operator queue wait, from the failure to 10 s after the last new holder | {} |",
        queue_after_burst.since(&queue_at_failure)
    );
    let mut summary = Summary {
        held_after: converged.as_secs_f64(),
        held_p99: h.p99,
        writes_first: per_election(first_elections.values().sum(), n),
        writes_re: f64::NAN,
        reelect_p50: f64::NAN,
        reelect_p99: f64::NAN,
        apiserver_cpu_burst: apiserver_burst,
        apiserver_cpu_burst_own: apiserver_burst_own,
        rss_peak,
    };
    match latencies {
        Some(l) => {
            print_writes_per_election("re-election of a failed holder", l.len(), &burst_writes);
            let after_expiry: Vec<f64> = l.iter().map(|x| x.0).collect();
            let after_failure: Vec<f64> = l.iter().map(|x| x.1).collect();
            let (a, b) = (
                stats::summary(&after_expiry),
                stats::summary(&after_failure),
            );
            summary.writes_re = per_election(burst_writes.values().sum(), l.len());
            summary.reelect_p50 = a.p50;
            summary.reelect_p99 = a.p99;
            println!(
                "| re-election after 10% of holders renew together and fail ({} leases): from lease expiry | p50 {:.2} s, p99 {:.2} s, max {:.2} s |",
                a.n, a.p50, a.p99, a.max
            );
            println!(
                "| same, from the failure (includes the {LEASE_SECONDS} s lease) | p50 {:.1} s, p99 {:.1} s, max {:.1} s |",
                b.p50, b.p99, b.max
            );
            println!(
                "| the failed leases expired within | {:.2} s |",
                (last_expiry - first_expiry).as_secs_f64()
            );
            println!(
                "| kube-apiserver CPU over the burst (a second before the first expiry to the last new holder) | {} |",
                share(apiserver_over_burst, burst_window)
            );
            println!(
                "| the same less the steady state's rate (the renewals): the burst's own requests | {apiserver_burst_own:.2} s; p99 from expiry ÷ it: {} |",
                // Below the noise of the steady state's rate, the ratio means nothing.
                match apiserver_burst_own > 0.0 {
                    true => format!("{:.2}", a.p99 / apiserver_burst_own),
                    false => "-".into(),
                }
            );
        }
        None => println!("| re-election after 10% of holders fail | not all within 600 s |"),
    }
    // The live holders' renewals: in steady state, and while the operator re-elects.
    let round_trips = |from: Instant, to: Instant| -> String {
        let f = fleet.lock().unwrap();
        let rt: Vec<f64> = f
            .renewals
            .iter()
            .filter(|(at, _)| *at >= from && *at <= to)
            .map(|(_, rt)| *rt)
            .collect();
        if rt.is_empty() {
            return "none".into();
        }
        let r = stats::summary(&rt);
        format!(
            "{} renewals, p50 {:.3} s, p99 {:.3} s, max {:.3} s",
            r.n, r.p50, r.p99, r.max
        )
    };
    println!(
        "| the live holders' renewal round trip, steady state | {} |",
        round_trips(steady_from, steady_to)
    );
    println!(
        "| the same, from the failure to 10 s after the last new holder | {} |",
        round_trips(failed_at, burst_end)
    );
    println!("| operator CPU, whole run | {cpu_end:.1} s |");

    for t in tasks {
        t.abort();
    }
    drop(operator);
    let _ = namespaces.delete(&ns, &DeleteParams::background()).await;
    if unrelated > 0 {
        delete_unrelated_pods(&client).await;
    }
    Some(summary)
}

fn per_election(writes: usize, elections: usize) -> f64 {
    writes as f64 / elections.max(1) as f64
}

async fn wait<T>(
    fleet: &Arc<Mutex<Fleet>>,
    deadline: Duration,
    check: impl Fn(&Fleet) -> Option<T>,
) -> Option<T> {
    let until = Instant::now() + deadline;
    loop {
        if let Some(v) = check(&fleet.lock().unwrap()) {
            return Some(v);
        }
        if Instant::now() > until {
            return None;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// The simulated candidates of namespace `ns`: they answer pings, follow the Leases and renew
/// what they hold, until the tasks are aborted.
pub fn simulate(
    client: &Client,
    ns: &str,
    fleet: &Arc<Mutex<Fleet>>,
) -> Vec<tokio::task::JoinHandle<()>> {
    vec![
        tokio::spawn(answer_pings(client.clone(), ns.to_string(), fleet.clone())),
        tokio::spawn(track_leases(client.clone(), ns.to_string(), fleet.clone())),
        tokio::spawn(renew_held(client.clone(), ns.to_string(), fleet.clone())),
    ]
}

/// Answers every ping of a live candidate with `renewTime >= pingTime`.
async fn answer_pings(client: Client, ns: String, fleet: Arc<Mutex<Fleet>>) {
    let api: Api<LeaseCandidate> = Api::namespaced(client, &ns);
    let limit = Arc::new(Semaphore::new(IN_FLIGHT));
    let mut events = watcher(api.clone(), watcher::Config::default())
        .applied_objects()
        .boxed();
    while let Some(ev) = events.next().await {
        let Ok(c) = ev else { continue };
        let Some(ping) = c.spec.ping_time.as_ref().map(|p| p.0) else {
            continue;
        };
        if c.spec.renew_time.as_ref().is_some_and(|r| r.0 >= ping)
            || fleet.lock().unwrap().dead.contains(&c.name_any())
        {
            continue;
        }
        let (api, permit) = (api.clone(), limit.clone().acquire_owned().await.unwrap());
        tokio::spawn(async move {
            let renew = MicroTime(ping.max(jiff::Timestamp::now()));
            let patch = json!({"spec": {"renewTime": renew}});
            let _ = api
                .patch(
                    &c.name_any(),
                    &PatchParams::default(),
                    &Patch::Merge(&patch),
                )
                .await;
            drop(permit);
        });
    }
}

/// Follows the Leases: the latest object of each, and every change of holder.
async fn track_leases(client: Client, ns: String, fleet: Arc<Mutex<Fleet>>) {
    let api: Api<Lease> = Api::namespaced(client, &ns);
    // The leases the operator arbitrates (not its own HA lease).
    let managed = format!("{}=true", arbiter::lease::MANAGED_LABEL);
    let mut events = watcher(api, watcher::Config::default().labels(&managed))
        .applied_objects()
        .boxed();
    while let Some(ev) = events.next().await {
        let Ok(l) = ev else { continue };
        let name = l.name_any();
        let holder = arbiter::lease::holder(&l).map(str::to_string);
        let mut f = fleet.lock().unwrap();
        let before = f
            .leases
            .get(&name)
            .and_then(|o| arbiter::lease::holder(o).map(str::to_string));
        if holder != before
            && let Some(h) = &holder
        {
            f.assignments
                .entry(name.clone())
                .or_default()
                .push((h.clone(), Instant::now()));
            // A new holder renews at once, as an agent does before starting its workload.
            if !f.dead.contains(h) {
                f.last_renew.remove(&name);
            }
        }
        f.leases.insert(name, l);
    }
}

/// Renews, by compare-and-swap, every lease held by a live candidate that is due.
async fn renew_held(client: Client, ns: String, fleet: Arc<Mutex<Fleet>>) {
    let store = arbiter::lease::LeaseStore::new(client, &ns);
    loop {
        let due: Vec<Lease> = {
            let f = fleet.lock().unwrap();
            f.leases
                .iter()
                .filter(|(name, l)| {
                    arbiter::lease::holder(l).is_some_and(|h| !f.dead.contains(h))
                        && f.last_renew
                            .get(*name)
                            .is_none_or(|t| t.elapsed().as_secs_f64() >= RENEW_EVERY)
                })
                .map(|(_, l)| l.clone())
                .collect()
        };
        stream::iter(due)
            .for_each_concurrent(IN_FLIGHT, |l| renew(&store, &fleet, l))
            .await;
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// One renewal of `l` by its holder, by compare-and-swap (a conflict: someone wrote it since).
async fn renew(store: &arbiter::lease::LeaseStore, fleet: &Mutex<Fleet>, mut l: Lease) {
    let spec = l.spec.get_or_insert_with(Default::default);
    spec.renew_time = Some(arbiter::lease::now());
    spec.lease_duration_seconds = Some(LEASE_SECONDS);
    let sent = Instant::now();
    if let Ok(written) = store.replace(&l).await {
        let mut f = fleet.lock().unwrap();
        let now = Instant::now();
        f.renewals.push((sent, (now - sent).as_secs_f64()));
        if arbiter::lease::holder(&written).is_some_and(|h| f.dead.contains(h)) {
            f.renewed_after_death.insert(written.name_any(), now);
        }
        f.last_renew.insert(written.name_any(), now);
    }
}

/// Current resident memory (MiB) of a process.
fn rss_now(pid: i32) -> f64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find_map(|l| {
            l.strip_prefix("VmRSS:")?
                .split_whitespace()
                .next()?
                .parse::<f64>()
                .ok()
        })
        .unwrap_or(0.0)
        / 1024.0
}

/// The namespace of the pods that are none of the operator's business.
const UNRELATED_NS: &str = "bench-unrelated-pods";

/// Creates `count` ordinary pods that are not candidates in [`UNRELATED_NS`], bound to the kwok
/// node (each with eight env vars, probes, resources, a port and a 1.5 KB
/// `last-applied-configuration` annotation, as a kubectl-applied Deployment's pods have).
/// Created directly rather than through a Deployment: the controller manager's request rate
/// would take half an hour for 30,000.
pub async fn create_unrelated_pods(client: &Client, count: usize) {
    let namespaces: Api<Namespace> = Api::all(client.clone());
    let mut namespace = Namespace::default();
    namespace.metadata.name = Some(UNRELATED_NS.into());
    let _ = namespaces.create(&PostParams::default(), &namespace).await;
    let pods: Api<k8s_openapi::api::core::v1::Pod> = Api::namespaced(client.clone(), UNRELATED_NS);
    let started = Instant::now();
    stream::iter(0..count)
        .map(|i| {
            let pods = pods.clone();
            async move {
                let pod = serde_json::from_value(json!({
                    "metadata": {
                        "name": format!("filler-{i}"),
                        "labels": {"app": "filler", "app.kubernetes.io/name": "filler", "app.kubernetes.io/version": "1.0.0", "pod-template-hash": "5d8f7b9c6d"},
                        "annotations": {"kubectl.kubernetes.io/last-applied-configuration": "x".repeat(1500)},
                    },
                    "spec": {
                        "nodeName": crate::support::standin::NODE,
                        "tolerations": [{"key": "kwok.x-k8s.io/node", "operator": "Exists", "effect": "NoSchedule"}],
                        "containers": [{
                            "name": "app", "image": "example.com/app:1.0.0",
                            "env": (0..8).map(|i| json!({"name": format!("SETTING_{i}"), "value": "some-value-of-a-setting"})).collect::<Vec<_>>(),
                            "resources": {"requests": {"cpu": "10m", "memory": "16Mi"}, "limits": {"memory": "64Mi"}},
                            "readinessProbe": {"httpGet": {"path": "/ready", "port": 8080}},
                            "livenessProbe": {"httpGet": {"path": "/healthz", "port": 8080}},
                            "ports": [{"containerPort": 8080, "name": "http"}],
                        }],
                    },
                }))
                .unwrap();
                match pods.create(&PostParams::default(), &pod).await {
                    Ok(_) => Ok(()),
                    Err(kube::Error::Api(e)) if e.code == 409 => Ok(()),
                    Err(e) => Err(e),
                }
            }
        })
        .buffer_unordered(IN_FLIGHT)
        .try_collect::<Vec<_>>()
        .await
        .expect("creating the unrelated pods");
    println!(
        "({count} unrelated pods created in {:.0} s)",
        started.elapsed().as_secs_f64()
    );
    // kwok then writes every pod's status (Running, Ready): 30,000 writes that would compete
    // with the elections measured next. A cluster full of pods is one whose pods have started.
    let settling = Instant::now();
    let until = settling + Duration::from_secs(1800);
    let starting = kube::api::ListParams::default()
        .fields("status.phase!=Running")
        .limit(1);
    loop {
        match pods.list_metadata(&starting).await {
            Ok(l)
                if l.items.is_empty()
                    && l.metadata.continue_.as_deref().is_none_or(str::is_empty) =>
            {
                break;
            }
            _ if Instant::now() > until => panic!("the unrelated pods did not all start in 30 min"),
            _ => tokio::time::sleep(Duration::from_secs(5)).await,
        }
    }
    println!(
        "({count} unrelated pods running {:.0} s later)",
        settling.elapsed().as_secs_f64()
    );
}

pub async fn delete_unrelated_pods(client: &Client) {
    let namespaces: Api<Namespace> = Api::all(client.clone());
    let _ = namespaces
        .delete(UNRELATED_NS, &DeleteParams::background())
        .await;
    // The namespace's pods are gone before the next case counts memory.
    let until = Instant::now() + Duration::from_secs(1800);
    while namespaces
        .get_opt(UNRELATED_NS)
        .await
        .ok()
        .flatten()
        .is_some()
        && Instant::now() < until
    {
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
}

/// The resident memory of `pid` once it has settled: read every 5 s until two readings 15 s
/// apart differ by less than 1% (or after 5 minutes).
async fn settled_rss(pid: i32) -> f64 {
    let until = Instant::now() + Duration::from_secs(300);
    let mut readings = vec![rss_now(pid)];
    loop {
        tokio::time::sleep(Duration::from_secs(5)).await;
        readings.push(rss_now(pid));
        if let [.., a, _, _, b] = readings[..]
            && (b - a).abs() < 0.01 * a
        {
            return b;
        }
        if Instant::now() > until {
            return *readings.last().unwrap();
        }
    }
}

/// A candidate of `lease` at version 1.30.0 that has just renewed, as the simulator registers it.
pub fn candidate(name: &str, lease: &str) -> LeaseCandidate {
    let mut lc = LeaseCandidate::new(
        name,
        LeaseCandidateSpec {
            lease_name: lease.into(),
            binary_version: "1.30.0".into(),
            emulation_version: Some("1.30.0".into()),
            strategy: OLDEST_EMULATION_VERSION.into(),
            ping_time: None,
            renew_time: Some(MicroTime(jiff::Timestamp::now())),
        },
    );
    lc.metadata.namespace = None;
    lc
}

/// Installs the CRD: this build's, or the one in the file `ARBITER_BENCH_CRD` names (an older
/// build's `crds/` file, to run its operator through `ARBITER_OPERATOR_BIN` as it shipped).
async fn install_crd(client: &Client) {
    let Some(path) = std::env::var_os("ARBITER_BENCH_CRD") else {
        return arbiter::api::apply_crds(client.clone(), Duration::from_secs(30))
            .await
            .expect("installing the CRD");
    };
    let yaml = std::fs::read_to_string(&path).expect("reading ARBITER_BENCH_CRD");
    let crd: CustomResourceDefinition =
        serde_yaml_ng::from_str(&yaml).expect("ARBITER_BENCH_CRD holds a CustomResourceDefinition");
    arbiter::api::apply_crd(client.clone(), crd, Duration::from_secs(30))
        .await
        .expect("applying ARBITER_BENCH_CRD");
    println!("CRD from {}", path.to_string_lossy());
}

/// What pods that are none of its business cost an operator that watches every namespace: its
/// memory idle, then with `count` ordinary pods on the kwok node.
pub async fn unrelated_pods(kubeconfig: &Path, count: usize) {
    let client = support::client_for(kubeconfig).await;
    arbiter::api::apply_crds(client.clone(), Duration::from_secs(30))
        .await
        .expect("installing the CRD");
    println!(
        "\nunrelated pods: one operator watching every namespace, {count} pods that are not candidates"
    );
    let operator = Operator::start_args(
        kubeconfig,
        &["--namespace", "default", "--metrics-address", "127.0.0.1:0"],
    );
    wait_logged(&operator, "caches synced").await;
    let idle = settled_rss(operator.pid()).await;
    create_unrelated_pods(&client, count).await;
    let full = settled_rss(operator.pid()).await;
    println!("| unrelated pods | operator RSS idle | with the pods | per 1,000 pods |");
    println!("|---|---|---|---|");
    println!(
        "| {count} | {idle:.1} MiB | {full:.1} MiB | {:.1} MiB |",
        (full - idle) * 1000.0 / count as f64
    );
    drop(operator);
    delete_unrelated_pods(&client).await;
}

async fn wait_logged(operator: &Operator, what: &str) {
    let until = Instant::now() + Duration::from_secs(120);
    while !operator.logs().contains(what) && Instant::now() < until {
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

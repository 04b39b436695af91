//! The Kubernetes client every arbiter process uses, and the two rules every request obeys:
//!
//! - **A timeout.** Every request but a watch must answer within a bound (kube's own default is
//!   none: a request on a dead connection hangs forever, and a renew that hangs keeps a process
//!   believing it still leads). Writes and reads have bounds of their own: a late write could
//!   land after leadership moved on, a late read only delays. Watches are long by design;
//!   kube-runtime's watcher restarts them.
//! - **A gate for writes** (the operator): a write (anything but GET/HEAD/OPTIONS) is sent only
//!   while the [`Gate`] is open, and the gate closes on its own, by the clock, at the renew
//!   deadline of the operator's own lease. A replica that lost its lease therefore writes nothing
//!   from that moment, whatever its reconcile was doing: the gate does not wait for anyone to
//!   notice the loss.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use futures::FutureExt;
use futures::future::BoxFuture;
use http::{Method, Request, Response};
use kube::client::{Body, ClientBuilder};
use kube::{Client, Config};
use tower::{Layer, Service};

/// The User-Agent of every request arbiter makes: `arbiter/VERSION`.
pub const USER_AGENT: &str = concat!("arbiter/", env!("CARGO_PKG_VERSION"));

/// The request timeout of [`connect`].
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(30);

/// The delay between two attempts to reach an API server that could not be reached, once it
/// has climbed; jitter adds up to as much again.
pub const RECONNECT_AT_MOST: Duration = Duration::from_secs(2);

/// How the watches an election depends on (LeaseCandidates and Leases, in the operator and in
/// every agent) reconnect, and a registration is retried, while the API server cannot be
/// reached: 0.5 s doubling to [`RECONNECT_AT_MOST`], each delay jittered up to twice itself (so
/// 2 to 4 s once it has climbed), back to 0.5 s after a success.
///
/// kube-runtime's default climbs to 30 s. After a kube-apiserver restart of ten seconds a watch
/// could then sleep another ten or more past the server's return, and so could a candidate's
/// watch that must see the arbiter's ping: the lease stayed without a leader that much longer.
/// Leader election already retries every 2 s; these watches are small (an agent's are scoped to
/// one object each). The operator's cluster-wide pod and workload watches keep the default.
pub fn reconnect_backoff()
-> kube::runtime::utils::ResetTimerBackoff<kube::runtime::watcher::ExponentialBackoff> {
    let delays = backon::ExponentialBuilder::default()
        .with_min_delay(Duration::from_millis(500))
        .with_max_delay(RECONNECT_AT_MOST)
        .with_factor(2.0)
        .with_jitter()
        .without_max_times();
    kube::runtime::utils::ResetTimerBackoff::new(delays.into(), Duration::from_secs(120))
}

/// A client from the environment (in-cluster, or `KUBECONFIG`), with kube's automatic retries
/// turned off (a request that fails must fail promptly to the caller, who owns the deadline: a
/// renew retried inside the client for minutes would outlive the lease it renews) and a
/// [`DEFAULT_TIMEOUT`] on every request but watches.
pub async fn connect() -> anyhow::Result<Client> {
    connect_with(Timeouts::both(DEFAULT_TIMEOUT), None).await
}

/// How long a request may take: reads (GET, and the list a watch starts with) and writes.
#[derive(Clone, Copy, Debug)]
pub struct Timeouts {
    pub read: Duration,
    pub write: Duration,
}

impl Timeouts {
    pub fn both(d: Duration) -> Timeouts {
        Timeouts { read: d, write: d }
    }
}

/// [`connect`] with request timeouts `timeouts`, and writes only while `gate` is open.
pub async fn connect_with(timeouts: Timeouts, gate: Option<Gate>) -> anyhow::Result<Client> {
    let config = Config::infer()
        .await
        .map_err(|e| anyhow::anyhow!("loading the Kubernetes client configuration: {e}"))?;
    build(config, timeouts, gate)
}

/// [`connect`] with a kubeconfig file and/or context named on the command line, as kubectl's
/// `--kubeconfig` and `--context` (`None`: `KUBECONFIG` or `~/.kube/config`, its current
/// context; in a pod without either, the in-cluster config).
pub async fn connect_to(
    kubeconfig: Option<&std::path::Path>,
    context: Option<&str>,
) -> anyhow::Result<Client> {
    use kube::config::{KubeConfigOptions, Kubeconfig};
    if kubeconfig.is_none() && context.is_none() {
        return connect().await;
    }
    let options = KubeConfigOptions {
        context: context.map(str::to_string),
        ..KubeConfigOptions::default()
    };
    let config = match kubeconfig {
        Some(path) => {
            let file = Kubeconfig::read_from(path)
                .map_err(|e| anyhow::anyhow!("reading kubeconfig {}: {e}", path.display()))?;
            Config::from_custom_kubeconfig(file, &options).await
        }
        None => Config::from_kubeconfig(&options).await,
    }
    .map_err(|e| anyhow::anyhow!("loading the Kubernetes client configuration: {e}"))?;
    build(config, Timeouts::both(DEFAULT_TIMEOUT), None)
}

fn build(mut config: Config, timeouts: Timeouts, gate: Option<Gate>) -> anyhow::Result<Client> {
    config.default_retry = false;
    // Name ourselves, so that API server logs and audit events tell arbiter's requests apart.
    config.headers.push((
        http::header::USER_AGENT,
        http::HeaderValue::from_static(USER_AGENT),
    ));
    let builder = ClientBuilder::try_from(config)
        .map_err(|e| anyhow::anyhow!("building the Kubernetes client: {e}"))?;
    Ok(builder.with_layer(&Policy { timeouts, gate }).build())
}

/// Open until a deadline on the boot clock, closed from the start. The boot clock
/// (`CLOCK_BOOTTIME`, [`crate::clock`]) counts the time the machine was suspended, which this
/// process's monotonic clock does not: a replica whose node is suspended past its renew
/// deadline (while a standby takes over) finds its gate closed on resuming, before any timer
/// of its own has noticed.
#[derive(Clone, Debug, Default)]
pub struct Gate {
    /// Boot-clock nanoseconds until which writes may be sent; 0: closed.
    until: Arc<AtomicU64>,
}

impl Gate {
    /// Opens the gate until `deadline`, in boot-clock nanoseconds (it never moves back: an
    /// older deadline is ignored). Computed from a boot-clock reading taken when the renew
    /// that proves leadership was sent ([`crate::clock::after`]).
    pub fn open_until(&self, deadline: u64) {
        self.until.fetch_max(deadline, Ordering::SeqCst);
    }

    /// Closes the gate now (leadership is known to be lost).
    pub fn close(&self) {
        self.until.store(0, Ordering::SeqCst);
    }

    pub fn is_open(&self) -> bool {
        crate::clock::boottime_now() < self.until.load(Ordering::SeqCst)
    }
}

/// A write refused because the gate is closed.
#[derive(Debug, thiserror::Error)]
#[error(
    "refused to send {method} {path}: this replica is not (or no longer certainly) the active arbiter"
)]
pub struct GateClosed {
    pub method: Method,
    pub path: String,
}

/// A request that did not answer in time.
#[derive(Debug, thiserror::Error)]
#[error("{method} {path} did not answer within {timeout:?}")]
pub struct TimedOut {
    pub method: Method,
    pub path: String,
    pub timeout: Duration,
}

/// The tower layer that applies the two rules.
#[derive(Clone)]
struct Policy {
    timeouts: Timeouts,
    gate: Option<Gate>,
}

impl<S> Layer<S> for Policy {
    type Service = PolicyService<S>;
    fn layer(&self, inner: S) -> Self::Service {
        PolicyService {
            inner,
            policy: self.clone(),
        }
    }
}

#[derive(Clone)]
struct PolicyService<S> {
    inner: S,
    policy: Policy,
}

/// Whether a request is a watch (long-running by design).
fn is_watch<B>(req: &Request<B>) -> bool {
    req.uri()
        .query()
        .is_some_and(|q| q.split('&').any(|p| p == "watch=true" || p == "watch=1"))
}

fn is_write<B>(req: &Request<B>) -> bool {
    !matches!(*req.method(), Method::GET | Method::HEAD | Method::OPTIONS)
}

impl<S, B> Service<Request<Body>> for PolicyService<S>
where
    S: Service<Request<Body>, Response = Response<B>>,
    S::Future: Send + 'static,
    S::Error: Into<tower::BoxError>,
    B: Send + 'static,
{
    type Response = Response<B>;
    type Error = tower::BoxError;
    type Future = BoxFuture<'static, Result<Response<B>, tower::BoxError>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, req: Request<Body>) -> Self::Future {
        let (method, path) = (req.method().clone(), req.uri().path().to_string());
        let write = is_write(&req);
        if write && self.policy.gate.as_ref().is_some_and(|g| !g.is_open()) {
            return futures::future::ready(Err(GateClosed { method, path }.into())).boxed();
        }
        let watch = is_watch(&req);
        let timeout = if write {
            self.policy.timeouts.write
        } else {
            self.policy.timeouts.read
        };
        let response = self.inner.call(req);
        async move {
            if watch {
                return response.await.map_err(Into::into);
            }
            match tokio::time::timeout(timeout, response).await {
                Ok(r) => r.map_err(Into::into),
                Err(_) => Err(TimedOut {
                    method,
                    path,
                    timeout,
                }
                .into()),
            }
        }
        .boxed()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A stand-in API server that counts what reaches it and answers after `delay`.
    #[derive(Clone)]
    struct Counting {
        reached: Arc<AtomicU64>,
        delay: Duration,
    }

    impl Service<Request<Body>> for Counting {
        type Response = Response<String>;
        type Error = tower::BoxError;
        type Future = BoxFuture<'static, Result<Response<String>, tower::BoxError>>;
        fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
            Poll::Ready(Ok(()))
        }
        fn call(&mut self, _: Request<Body>) -> Self::Future {
            self.reached.fetch_add(1, Ordering::SeqCst);
            let delay = self.delay;
            async move {
                tokio::time::sleep(delay).await;
                Ok(Response::new(String::new()))
            }
            .boxed()
        }
    }

    fn request(method: Method, uri: &str) -> Request<Body> {
        Request::builder()
            .method(method)
            .uri(uri)
            .body(Body::empty())
            .unwrap()
    }

    fn service(delay: Duration, gate: Option<Gate>) -> (PolicyService<Counting>, Arc<AtomicU64>) {
        let reached = Arc::new(AtomicU64::new(0));
        let inner = Counting {
            reached: reached.clone(),
            delay,
        };
        let layer = Policy {
            timeouts: Timeouts::both(Duration::from_secs(1)),
            gate,
        };
        (layer.layer(inner), reached)
    }

    #[tokio::test(start_paused = true)]
    async fn writes_pass_only_while_the_gate_is_open_and_it_closes_by_the_clock() {
        let gate = Gate::default();
        let (mut svc, reached) = service(Duration::ZERO, Some(gate.clone()));
        let put = || {
            request(
                Method::PUT,
                "/apis/coordination.k8s.io/v1/namespaces/a/leases/l",
            )
        };
        let err = svc.call(put()).await.unwrap_err();
        assert!(err.is::<GateClosed>(), "{err}");
        assert_eq!(
            reached.load(Ordering::SeqCst),
            0,
            "a refused write is never sent"
        );
        // Reads are always allowed (a standby keeps its caches warm).
        svc.call(request(Method::GET, "/api/v1/pods"))
            .await
            .unwrap();
        assert_eq!(reached.load(Ordering::SeqCst), 1);

        let boot = crate::clock::boottime_now;
        gate.open_until(crate::clock::after(boot(), Duration::from_secs(4)));
        for m in [Method::PUT, Method::POST, Method::PATCH, Method::DELETE] {
            svc.call(request(m, "/x")).await.unwrap();
        }
        assert_eq!(reached.load(Ordering::SeqCst), 5);
        // An older deadline does not shorten a later one.
        gate.open_until(boot());
        assert!(gate.is_open());
        // Nobody closes the gate: its deadline passing is enough.
        let gate2 = Gate::default();
        gate2.open_until(crate::clock::after(boot(), Duration::from_millis(1)));
        std::thread::sleep(Duration::from_millis(5));
        assert!(!gate2.is_open(), "the gate closes at its deadline");
        let (mut svc2, reached2) = service(Duration::ZERO, Some(gate2));
        assert!(svc2.call(put()).await.unwrap_err().is::<GateClosed>());
        assert_eq!(reached2.load(Ordering::SeqCst), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn every_request_but_a_watch_times_out() {
        let (mut svc, _) = service(Duration::from_secs(3600), None);
        let err = svc
            .call(request(Method::GET, "/api/v1/namespaces/a/pods/p"))
            .await
            .unwrap_err();
        assert!(err.is::<TimedOut>(), "{err}");
        let err = svc.call(request(Method::PUT, "/x")).await.unwrap_err();
        assert!(err.is::<TimedOut>(), "{err}");
        // A watch may stay open as long as the server keeps it.
        let watch = svc.call(request(
            Method::GET,
            "/api/v1/pods?watch=true&resourceVersion=1&timeoutSeconds=290",
        ));
        assert!(
            tokio::time::timeout(Duration::from_secs(600), watch)
                .await
                .is_err(),
            "a watch is not cut by the request timeout"
        );
    }
}

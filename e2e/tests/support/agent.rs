//! `arbiter run` agents as real processes, a workload script that logs what it does on one
//! clock, and a TCP proxy that can cut an agent off from the API server.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// Fast timings for tests, with room for a loaded 2-core machine: lease 10 s, renew deadline
/// 5 s, retry 1 s, kill grace 2 s.
pub const TIMINGS: [&str; 8] = [
    "--lease-duration",
    "10s",
    "--renew-deadline",
    "5s",
    "--retry-period",
    "1s",
    "--kill-grace",
    "2s",
];
pub const LEASE_DURATION: Duration = Duration::from_secs(10);
pub const RENEW_DEADLINE: Duration = Duration::from_secs(5);
pub const KILL_GRACE: Duration = Duration::from_secs(2);

/// The workload every test agent runs: logs `start ID TERM PID T`, forks a grandchild
/// (`child ID PID`), and on SIGTERM logs `stop ID T` and exits. T is seconds since the epoch.
pub const WORKLOAD: &str = r#"log=$1
echo "start $ARBITER_IDENTITY $ARBITER_TERM $$ $(date +%s.%N)" >> "$log"
sleep 1000 &
echo "child $ARBITER_IDENTITY $!" >> "$log"
trap 'echo "stop $ARBITER_IDENTITY $(date +%s.%N)" >> "$log"; kill $! 2>/dev/null; exit 0' TERM
while :; do sleep 0.02; done"#;

/// [`WORKLOAD`], but it takes 1.5 s to stop after SIGTERM (within the 2 s kill grace): a
/// holder whose stop is not instant, to catch a next holder that starts too early.
pub fn slow_stop_workload() -> String {
    WORKLOAD.replace("trap '", "trap 'sleep 1.5; ")
}

/// The `arbiter run` command line (after the binary) for a test agent.
pub fn agent_args(ns: &str, identity: &str, lease: &str, version: &str, log: &Path) -> Vec<String> {
    agent_args_with(ns, identity, lease, version, log, WORKLOAD)
}

/// [`agent_args`] running `workload` (a `sh -c` script given the log path as `$1`).
pub fn agent_args_with(
    ns: &str,
    identity: &str,
    lease: &str,
    version: &str,
    log: &Path,
    workload: &str,
) -> Vec<String> {
    let mut args: Vec<String> = [
        "run",
        "--lease",
        lease,
        "--identity",
        identity,
        "--namespace",
        ns,
        "--binary-version",
        version,
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    args.extend(TIMINGS.iter().map(|s| s.to_string()));
    args.extend(
        [
            "--",
            "sh",
            "-c",
            workload,
            "workload",
            log.to_str().unwrap(),
        ]
        .iter()
        .map(|s| s.to_string()),
    );
    args
}

/// An agent as a plain process (no pod). SIGKILLed on drop, with its workload.
pub struct Agent {
    pub child: Child,
    pub identity: String,
    /// The agent's own log (stderr), printed when a test fails.
    pub log: PathBuf,
}

impl Agent {
    pub fn spawn(
        kubeconfig: &Path,
        ns: &str,
        identity: &str,
        lease: &str,
        version: &str,
        log: &Path,
    ) -> Agent {
        let args = agent_args(ns, identity, lease, version, log);
        Agent::spawn_args(kubeconfig, identity, &args, log)
    }

    /// An agent with the command line `args` (after the binary).
    pub fn spawn_args(kubeconfig: &Path, identity: &str, args: &[String], log: &Path) -> Agent {
        Agent::spawn_env(kubeconfig, identity, args, log, &[])
    }

    /// An agent whose wall clock reads `offset` (faketime's syntax, e.g. `+10m`) from the true
    /// one, its monotonic clock true: an unsynchronised host. Debian's libfaketime, preloaded
    /// into this (dynamically linked) binary, as `FAKETIME_DONT_FAKE_MONOTONIC=1 faketime -f`
    /// does, but with the agent itself as the child (so a signal to it reaches it).
    #[allow(dead_code)] // used by some test binaries only
    pub fn spawn_with_clock(
        kubeconfig: &Path,
        identity: &str,
        args: &[String],
        log: &Path,
        offset: &str,
    ) -> Agent {
        let env = faketime(offset);
        let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
        Agent::spawn_env(kubeconfig, identity, args, log, &env)
    }

    fn spawn_env(
        kubeconfig: &Path,
        identity: &str,
        args: &[String],
        log: &Path,
        env: &[(&str, &str)],
    ) -> Agent {
        let agent_log = log.with_extension(format!("{identity}.agent.log"));
        let stderr = std::fs::File::create(&agent_log).unwrap();
        use std::os::unix::process::CommandExt;
        let child = Command::new(env!("CARGO_BIN_EXE_arbiter"))
            .args(args)
            // A process group of its own, as in a shell job: a test can stop "the agent's group"
            // and prove that the workload's guard is not in it.
            .process_group(0)
            .env("KUBECONFIG", kubeconfig)
            .env("RUST_LOG", "info,arbiter=debug")
            .envs(env.iter().copied())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(stderr)
            .spawn()
            .expect("starting arbiter run");
        Agent {
            child,
            identity: identity.into(),
            log: agent_log,
        }
    }

    pub fn pid(&self) -> i32 {
        self.child.id() as i32
    }

    /// Waits for the agent to exit; its exit code.
    pub async fn wait_exit(&mut self, deadline: Duration) -> Option<i32> {
        let what = format!("agent {}", self.identity);
        super::wait_child(&mut self.child, deadline, || what.clone()).await
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        if std::thread::panicking() {
            let text = std::fs::read_to_string(&self.log).unwrap_or_default();
            let plain: String = text.replace("\x1b[", "[");
            eprintln!("--- agent {} log ---\n{plain}", self.identity);
        }
        if self.child.try_wait().ok().flatten().is_none() {
            // SIGTERM first so the workload is stopped, then make sure.
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(self.pid()),
                nix::sys::signal::Signal::SIGTERM,
            );
            let start = std::time::Instant::now();
            while self.child.try_wait().ok().flatten().is_none()
                && start.elapsed() < Duration::from_secs(5)
            {
                std::thread::sleep(Duration::from_millis(20));
            }
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// The environment that makes a dynamically linked process's wall clock read `offset` from
/// the true one (faketime's syntax), its monotonic clock true.
pub fn faketime(offset: &str) -> Vec<(&'static str, String)> {
    let lib = [
        "/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1",
        "/usr/lib/aarch64-linux-gnu/faketime/libfaketime.so.1",
    ]
    .into_iter()
    .find(|p| Path::new(p).exists())
    .expect("libfaketime (Debian's faketime package; `make setup` installs it)");
    vec![
        ("LD_PRELOAD", lib.to_string()),
        ("FAKETIME", offset.to_string()),
        ("FAKETIME_DONT_FAKE_MONOTONIC", "1".to_string()),
    ]
}

/// One line of the workload log.
#[derive(Clone, Debug, PartialEq)]
pub enum Entry {
    Start {
        id: String,
        term: i32,
        pid: i32,
        at: f64,
    },
    Child {
        id: String,
        pid: i32,
    },
    Stop {
        id: String,
        at: f64,
    },
}

pub fn read_log(path: &Path) -> Vec<Entry> {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    text.lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            match f.as_slice() {
                ["start", id, term, pid, at] => Some(Entry::Start {
                    id: id.to_string(),
                    term: term.parse().ok()?,
                    pid: pid.parse().ok()?,
                    at: at.parse().ok()?,
                }),
                ["child", id, pid] => Some(Entry::Child {
                    id: id.to_string(),
                    pid: pid.parse().ok()?,
                }),
                ["stop", id, at] => Some(Entry::Stop {
                    id: id.to_string(),
                    at: at.parse().ok()?,
                }),
                _ => None,
            }
        })
        .collect()
}

pub fn starts(log: &[Entry]) -> Vec<(String, i32, i32, f64)> {
    log.iter()
        .filter_map(|e| match e {
            Entry::Start { id, term, pid, at } => Some((id.clone(), *term, *pid, *at)),
            _ => None,
        })
        .collect()
}

pub fn stop_of(log: &[Entry], who: &str) -> Option<f64> {
    log.iter().find_map(|e| match e {
        Entry::Stop { id, at } if id == who => Some(*at),
        _ => None,
    })
}

pub fn child_of(log: &[Entry], who: &str) -> Option<i32> {
    log.iter().find_map(|e| match e {
        Entry::Child { id, pid } if id == who => Some(*pid),
        _ => None,
    })
}

/// Waits until `who`'s workload has started (logged `start`); returns that start: (identity,
/// term, pid, time).
#[allow(dead_code)] // used by some test binaries only
pub async fn wait_started(log: &Path, who: &str) -> (String, i32, i32, f64) {
    super::eventually(
        &format!("{who}'s workload to start"),
        Duration::from_secs(40),
        || async { starts(&read_log(log)).into_iter().find(|s| s.0 == who) },
    )
    .await
}

/// Seconds since the epoch, on the same clock the workload's `date` uses.
pub fn now() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64()
}

pub fn alive(pid: i32) -> bool {
    // A zombie has exited; only a live process counts.
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .map(|s| s.rfind(')').is_some_and(|i| !s[i + 2..].starts_with('Z')))
        .unwrap_or(false)
}

/// A TCP proxy to the API server that can black-hole traffic: while cut, bytes in both
/// directions are swallowed and new connections hang, as in a network partition. It can also
/// delay every chunk (`delay`), or only what the server streams on its own (`lag_streams`).
pub struct Proxy {
    pub addr: SocketAddr,
    cut: Arc<AtomicBool>,
    #[allow(dead_code)] // used by the chaos suite
    delay_ms: Arc<AtomicU64>,
    #[allow(dead_code)] // used by some test binaries only
    lag_ms: Arc<AtomicU64>,
    task: tokio::task::JoinHandle<()>,
}

/// How long the client must have been silent on a connection for what the server sends to
/// count as streamed (a watch event) rather than as the answer to a request.
const STREAMED_AFTER: Duration = Duration::from_millis(300);

impl Proxy {
    pub async fn start(upstream: SocketAddr) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let cut = Arc::new(AtomicBool::new(false));
        let delay_ms = Arc::new(AtomicU64::new(0));
        let lag_ms = Arc::new(AtomicU64::new(0));
        let (flag, delay, lag) = (cut.clone(), delay_ms.clone(), lag_ms.clone());
        let task = tokio::spawn(async move {
            loop {
                let Ok((down, _)) = listener.accept().await else {
                    return;
                };
                let (flag, delay, lag) = (flag.clone(), delay.clone(), lag.clone());
                tokio::spawn(async move {
                    while flag.load(Ordering::SeqCst) {
                        tokio::time::sleep(Duration::from_millis(50)).await;
                    }
                    let Ok(up) = TcpStream::connect(upstream).await else {
                        return;
                    };
                    let (dr, dw) = down.into_split();
                    let (ur, uw) = up.into_split();
                    let spoke = Arc::new(Mutex::new(Instant::now()));
                    tokio::join!(
                        pump(
                            dr,
                            uw,
                            flag.clone(),
                            delay.clone(),
                            Side::Client(spoke.clone())
                        ),
                        pump(ur, dw, flag, delay, Side::Server { spoke, lag })
                    );
                });
            }
        });
        Proxy {
            addr,
            cut,
            delay_ms,
            lag_ms,
            task,
        }
    }

    pub fn cut(&self) {
        self.cut.store(true, Ordering::SeqCst);
    }

    /// Delays every chunk of traffic in both directions by `d` (zero: no delay).
    #[allow(dead_code)] // used by the chaos suite
    pub fn delay(&self, d: Duration) {
        self.delay_ms.store(d.as_millis() as u64, Ordering::SeqCst);
    }

    /// Delays by `d` what the server sends on a connection where the client has been silent
    /// for a while: watch events, not answers to requests. A client's caches then lag the API
    /// server by `d` while its requests (a fresh LIST, a write) are answered at once. Order
    /// on each connection is kept. Zero: no lag (for chunks read from then on).
    #[allow(dead_code)] // used by some test binaries only
    pub fn lag_streams(&self, d: Duration) {
        self.lag_ms.store(d.as_millis() as u64, Ordering::SeqCst);
    }

    /// Lets new connections through again (connections made before the cut stay dead).
    pub fn restore(&self) {
        self.cut.store(false, Ordering::SeqCst);
    }

    /// A kubeconfig like `kubeconfig` whose server is this proxy.
    pub fn kubeconfig(&self, kubeconfig: &Path, dir: &Path) -> PathBuf {
        let text = std::fs::read_to_string(kubeconfig).unwrap();
        let server = text
            .lines()
            .find_map(|l| l.trim().strip_prefix("server: "))
            .unwrap()
            .to_string();
        let out = dir.join("kubeconfig-proxied");
        std::fs::write(
            &out,
            text.replace(&server, &format!("https://{}", self.addr)),
        )
        .unwrap();
        out
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Which way a pump carries bytes: from the client (it notes when the client last spoke), or
/// from the server (it lags streamed chunks by the proxy's stream lag).
enum Side {
    Client(Arc<Mutex<Instant>>),
    Server {
        spoke: Arc<Mutex<Instant>>,
        lag: Arc<AtomicU64>,
    },
}

async fn pump(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    cut: Arc<AtomicBool>,
    delay_ms: Arc<AtomicU64>,
    side: Side,
) {
    // Chunks go through a queue to a writer, each with the instant it may be written: a
    // lagged chunk holds back the ones after it (bytes are never reordered) without holding
    // up the reading.
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<(Instant, Vec<u8>)>();
    let writer = async move {
        while let Some((at, bytes)) = rx.recv().await {
            tokio::time::sleep_until(at.into()).await;
            if to.write_all(&bytes).await.is_err() {
                return;
            }
        }
    };
    let reader = async move {
        let mut buf = vec![0u8; 16 * 1024];
        let mut last = Instant::now();
        loop {
            let n = match from.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => n,
            };
            if cut.load(Ordering::SeqCst) {
                continue; // swallowed
            }
            let delay = delay_ms.load(Ordering::SeqCst);
            if delay > 0 {
                tokio::time::sleep(Duration::from_millis(delay)).await;
            }
            let now = Instant::now();
            let at = match &side {
                Side::Client(spoke) => {
                    *spoke.lock().unwrap() = now;
                    now
                }
                Side::Server { spoke, lag } => {
                    let lag = Duration::from_millis(lag.load(Ordering::SeqCst));
                    let silent = now.duration_since(*spoke.lock().unwrap());
                    if !lag.is_zero() && silent >= STREAMED_AFTER {
                        now + lag
                    } else {
                        now
                    }
                }
            };
            last = last.max(at);
            if tx.send((last, buf[..n].to_vec())).is_err() {
                return;
            }
        }
    };
    // The reader ending (end of stream) drops the queue's sender: the writer writes what is
    // queued, then closes its half. The writer failing drops the receiver: the reader's next
    // send fails.
    tokio::join!(writer, reader);
}

/// The API server's address from a kubeconfig.
pub fn apiserver(kubeconfig: &Path) -> SocketAddr {
    let text = std::fs::read_to_string(kubeconfig).unwrap();
    let server = text
        .lines()
        .find_map(|l| l.trim().strip_prefix("server: https://"))
        .unwrap();
    server.trim().parse().unwrap()
}

//! The workload: CMD in a process group of its own, stopped as a whole, under a watchdog
//! process (`arbiter guard`, see [`super::watchdog`]) that stops it at a deadline the agent must
//! keep extending, and at once if the agent dies.
//!
//! CMD runs in a new process group, so SIGTERM/SIGKILL reach its children and grandchildren
//! too (unless one starts a session or group of its own: run such workloads as the container's
//! main process so the container boundary stops them). The guard is this binary re-executed, in
//! a group of its own, started **before** CMD: CMD's process, between fork and exec, hands its
//! pid to the guard and waits for the guard's go-ahead, so CMD never runs unwatched. CMD's leader
//! also carries a parent-death SIGKILL, so an agent killed before the guard could act leaves
//! nothing running either. The agent in turn watches the guard ([`Workload::guard_gone`]): a
//! guard that dies while CMD runs ends the term at once.

use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::process::Stdio;
use std::time::Duration;

use nix::fcntl::OFlag;
use nix::sys::signal::{Signal, kill, killpg};
use nix::unistd::Pid;
use tokio::process::{Child, Command};
use tokio::sync::watch;

use super::watchdog::Message;

/// A running CMD and its guard.
pub struct Workload {
    child: Child,
    pgid: Pid,
    guard: Guard,
    /// The agent's end of the pipe to the guard (closing it dismisses the guard).
    feed: Option<OwnedFd>,
}

/// The guard process, waited for by a task of its own: its exit code (`None` inside: killed by
/// a signal) once it has exited.
struct Guard {
    pid: Option<u32>,
    exited: watch::Receiver<Option<Option<i32>>>,
}

/// How a workload ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Ended {
    /// CMD's exit code, or 128+N for signal N.
    pub code: i32,
    /// The guard had to kill CMD later than its margin: a successor may have run beside it.
    pub overran: bool,
}

impl Workload {
    /// Starts the guard, then `cmd` with `env` in a new process group. The guard stops CMD at
    /// `deadline` (boot-clock nanoseconds: [`crate::clock`]; SIGTERM, SIGKILL `kill_grace`
    /// later) unless [`Workload::extend`] moves it; a kill more than `margin` late is reported
    /// as an overrun.
    pub fn start(
        cmd: &[String],
        env: &[(&str, String)],
        deadline: u64,
        kill_grace: Duration,
        margin: Duration,
    ) -> anyhow::Result<Workload> {
        let (program, args) = cmd
            .split_first()
            .ok_or_else(|| anyhow::anyhow!("no command to run"))?;
        // agent (and CMD's pre-exec child) -> guard: messages; guard -> CMD's child: go-ahead.
        let (feed_r, feed_w) = nix::unistd::pipe2(OFlag::O_CLOEXEC)?;
        let (go_r, go_w) = nix::unistd::pipe2(OFlag::O_CLOEXEC)?;
        let mut guard = spawn_guard(deadline, kill_grace, margin, feed_r, go_w)?;
        let mut command = gated(program, args, feed_w.as_raw_fd(), go_r.as_raw_fd());
        for (k, v) in env {
            command.env(k, v);
        }
        let spawned = command.spawn();
        drop(go_r);
        let child = match spawned {
            Ok(c) => c,
            Err(e) => {
                if let Some(pid) = guard.id() {
                    let _ = kill(Pid::from_raw(pid as i32), Signal::SIGKILL);
                }
                let _ = guard.start_kill();
                return Err(anyhow::anyhow!("starting {program}: {e}"));
            }
        };
        let pgid = Pid::from_raw(child.id().expect("a just-started child has a pid") as i32);
        super::reaper::own(pgid.as_raw());
        tracing::info!(pid = pgid.as_raw(), command = %cmd.join(" "), "workload started");
        let pid = guard.id();
        let (tx, exited) = watch::channel(None);
        tokio::spawn(async move {
            let code = guard.wait().await.ok().and_then(|s| s.code());
            let _ = tx.send(Some(code));
        });
        Ok(Workload {
            child,
            pgid,
            guard: Guard { pid, exited },
            feed: Some(feed_w),
        })
    }

    /// Moves the guard's deadline (boot-clock nanoseconds, after a successful renew). If the
    /// guard cannot be told (it is not reading), the old deadline stands: the safe direction.
    pub fn extend(&self, deadline: u64) {
        self.tell(Message::Extend(deadline));
    }

    fn tell(&self, m: Message) {
        let Some(feed) = &self.feed else {
            return;
        };
        let msg = m.encode();
        if let Err(e) = nix::unistd::write(feed.as_fd(), &msg) {
            tracing::warn!(error = %e, "could not reach the workload guard");
        }
    }

    /// Resolves when the guard has exited. While CMD runs that is never by design (the guard
    /// outlives CMD until the agent dismisses it): CMD would run on without a watchdog.
    pub fn guard_gone(&self) -> impl std::future::Future<Output = ()> + Send + 'static {
        let mut exited = self.guard.exited.clone();
        async move {
            let _ = exited.wait_for(Option::is_some).await;
        }
    }

    /// Waits for CMD (the group leader) to exit; its exit code, or 128+N for signal N.
    pub async fn wait(&mut self) -> i32 {
        let code = exit_code(self.child.wait().await);
        super::reaper::disown(self.pgid.as_raw());
        code
    }

    /// SIGTERM to the whole group, SIGKILL after `grace`. Nothing of the group is left running
    /// when this returns.
    pub async fn stop(mut self, grace: Duration) -> Ended {
        // Tell the guard first, so it does not SIGTERM a second time.
        self.tell(Message::Stopping);
        let _ = killpg(self.pgid, Signal::SIGTERM);
        let code = match tokio::time::timeout(grace, self.child.wait()).await {
            Ok(status) => exit_code(status),
            Err(_) => {
                tracing::warn!(
                    pid = self.pgid.as_raw(),
                    ?grace,
                    "workload ignored SIGTERM; killing it"
                );
                let _ = killpg(self.pgid, Signal::SIGKILL);
                exit_code(self.child.wait().await)
            }
        };
        super::reaper::disown(self.pgid.as_raw());
        // The leader is gone; make sure nothing else of its group survives.
        let _ = killpg(self.pgid, Signal::SIGKILL);
        let overran = self.dismiss_guard().await;
        tracing::info!(code, "workload stopped");
        Ended { code, overran }
    }

    /// After CMD exited: kill whatever of its group remains, stop the guard.
    pub async fn finish(mut self, code: i32) -> Ended {
        let _ = killpg(self.pgid, Signal::SIGKILL);
        let overran = self.dismiss_guard().await;
        Ended { code, overran }
    }

    /// Closes the pipe (the guard exits), waits for the guard, and says whether it reported an
    /// overrun. A guard that does not exit within a second is killed.
    async fn dismiss_guard(&mut self) -> bool {
        self.feed = None;
        let pid = self.guard.pid;
        let exited = &mut self.guard.exited;
        let first = tokio::time::timeout(Duration::from_secs(1), exited.wait_for(Option::is_some))
            .await
            .map(|code| code.ok().and_then(|c| *c).flatten());
        let code = match first {
            Ok(code) => code,
            Err(_) => {
                if let Some(pid) = pid {
                    let _ = kill(Pid::from_raw(pid as i32), Signal::SIGKILL);
                }
                let code = exited.wait_for(Option::is_some).await;
                code.ok().and_then(|c| *c).flatten()
            }
        };
        if let Some(pid) = pid {
            super::reaper::disown(pid as i32);
        }
        code == Some(super::watchdog::OVERRAN)
    }
}

fn exit_code(status: std::io::Result<std::process::ExitStatus>) -> i32 {
    use std::os::unix::process::ExitStatusExt;
    match status {
        Ok(s) => s.code().unwrap_or_else(|| 128 + s.signal().unwrap_or(0)),
        Err(_) => 1,
    }
}
/// Starts the guard (`arbiter guard`) in its own process group, reading the agent's messages
/// on `feed_r` and writing CMD's go-ahead on `go_w`. Only the guard holds those two ends once
/// this returns: when the guard is gone, CMD's child reads end-of-file and never execs.
fn spawn_guard(
    deadline: u64,
    kill_grace: Duration,
    margin: Duration,
    feed_r: std::os::fd::OwnedFd,
    go_w: std::os::fd::OwnedFd,
) -> anyhow::Result<tokio::process::Child> {
    let mut guard_cmd = Command::new(std::env::current_exe()?);
    guard_cmd
        .args([
            "guard",
            "--parent",
            &std::process::id().to_string(),
            "--until",
            &deadline.to_string(),
            "--kill-grace-ms",
            &kill_grace.as_millis().to_string(),
            "--margin-ms",
            &margin.as_millis().to_string(),
        ])
        .stdin(Stdio::from(feed_r))
        .stdout(Stdio::from(go_w))
        // Its own group, so a signal or stop sent to the agent's group does not reach it.
        .process_group(0)
        .kill_on_drop(false);
    let guard = guard_cmd
        .spawn()
        .map_err(|e| anyhow::anyhow!("starting the workload guard: {e}"))?;
    if let Some(pid) = guard.id() {
        super::reaper::own(pid as i32);
    }
    Ok(guard)
}

/// CMD in its own process group, gated: between fork and exec its child registers its group
/// with the guard (on `feed_fd`) and waits for the guard's go-ahead (on `go_fd`).
fn gated(program: &str, args: &[String], feed_fd: i32, go_fd: i32) -> Command {
    let mut command = Command::new(program);
    command.args(args).process_group(0).kill_on_drop(false);
    let agent = nix::unistd::getpid();
    // SAFETY: only async-signal-safe calls (prctl, getppid, getpid, write, read) between
    // fork and exec, on file descriptors the closure does not own.
    unsafe {
        command.pre_exec(move || {
            // The kernel SIGKILLs CMD's leader when the agent dies (and if the agent died
            // before this was armed, it does not start at all).
            nix::sys::prctl::set_pdeathsig(Signal::SIGKILL).map_err(std::io::Error::from)?;
            if nix::unistd::getppid() != agent {
                return Err(std::io::Error::other("the agent exited"));
            }
            // Register with the guard, then wait for its go-ahead.
            let msg = Message::Pgid(nix::unistd::getpid().as_raw()).encode();
            let feed = std::os::fd::BorrowedFd::borrow_raw(feed_fd);
            if nix::unistd::write(feed, &msg).map_err(std::io::Error::from)? != msg.len() {
                return Err(std::io::Error::other("short write to the guard"));
            }
            let go = std::os::fd::BorrowedFd::borrow_raw(go_fd);
            let mut b = [0u8; 1];
            loop {
                match nix::unistd::read(go, &mut b) {
                    Ok(1) => return Ok(()),
                    Err(nix::errno::Errno::EINTR) => continue,
                    _ => {
                        return Err(std::io::Error::other(
                            "the workload guard refused to start it",
                        ));
                    }
                }
            }
        });
    }
    command
}

//! The workload: CMD in a process group of its own, stopped as a whole, and a guard process
//! that kills the group if the agent itself dies (SIGKILL included).
//!
//! CMD runs in a new process group, so SIGTERM/SIGKILL reach its children and grandchildren
//! too (unless one starts a session or group of its own: run such workloads as the container's
//! main process so the container boundary stops them). The guard is this binary re-executed
//! (`arbiter guard`), a child of the agent outside CMD's group, with the parent-death signal set:
//! when the agent dies for any reason, the kernel signals the guard, which SIGKILLs CMD's group.
//! Until the guard is up, CMD's leader carries a parent-death SIGKILL of its own, so an agent
//! killed between starting CMD and starting the guard leaves nothing running either.

use std::process::Stdio;
use std::time::Duration;

use nix::sys::signal::{Signal, kill, killpg};
use nix::unistd::Pid;
use tokio::process::{Child, Command};

/// A running CMD and its guard.
pub struct Workload {
    child: Child,
    pgid: Pid,
    guard: Option<Child>,
}

impl Workload {
    /// Starts `cmd` with `env` in a new process group, and its guard.
    pub fn start(cmd: &[String], env: &[(&str, String)]) -> anyhow::Result<Workload> {
        let (program, args) = cmd
            .split_first()
            .ok_or_else(|| anyhow::anyhow!("no command to run"))?;
        let mut command = Command::new(program);
        command.args(args).process_group(0).kill_on_drop(false);
        // Until the guard is up, CMD's leader guards itself: the kernel SIGKILLs it when the
        // agent dies (and if the agent died before this was armed, it does not start at all).
        let agent = nix::unistd::getpid();
        // SAFETY: only async-signal-safe calls (prctl, getppid) between fork and exec.
        unsafe {
            command.pre_exec(move || {
                nix::sys::prctl::set_pdeathsig(Signal::SIGKILL).map_err(std::io::Error::from)?;
                if nix::unistd::getppid() != agent {
                    return Err(std::io::Error::other("the agent exited"));
                }
                Ok(())
            });
        }
        for (k, v) in env {
            command.env(k, v);
        }
        let child = command
            .spawn()
            .map_err(|e| anyhow::anyhow!("starting {program}: {e}"))?;
        let pgid = Pid::from_raw(child.id().expect("a just-started child has a pid") as i32);
        let guard = Command::new(std::env::current_exe()?)
            .args([
                "guard",
                "--pgid",
                &pgid.to_string(),
                "--parent",
                &std::process::id().to_string(),
            ])
            .stdin(Stdio::null())
            // Its own group too, so a signal to the agent's group cannot take it with the agent.
            .process_group(0)
            .kill_on_drop(false)
            .spawn()
            .map_err(|e| {
                let _ = killpg(pgid, Signal::SIGKILL);
                anyhow::anyhow!("starting the workload guard: {e}")
            })?;
        tracing::info!(pid = pgid.as_raw(), command = %cmd.join(" "), "workload started");
        Ok(Workload {
            child,
            pgid,
            guard: Some(guard),
        })
    }

    /// Waits for CMD (the group leader) to exit; its exit code, or 128+N for signal N.
    pub async fn wait(&mut self) -> i32 {
        exit_code(self.child.wait().await)
    }

    /// SIGTERM to the whole group, SIGKILL after `grace`; returns CMD's exit code. Nothing of
    /// the group is left running when this returns.
    pub async fn stop(mut self, grace: Duration) -> i32 {
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
        // The leader is gone; make sure nothing else of its group survives.
        let _ = killpg(self.pgid, Signal::SIGKILL);
        self.dismiss_guard().await;
        tracing::info!(code, "workload stopped");
        code
    }

    /// After CMD exited on its own: kill whatever of its group remains, stop the guard.
    pub async fn finish(mut self) {
        let _ = killpg(self.pgid, Signal::SIGKILL);
        self.dismiss_guard().await;
    }

    async fn dismiss_guard(&mut self) {
        if let Some(mut g) = self.guard.take() {
            if let Some(pid) = g.id() {
                let _ = kill(Pid::from_raw(pid as i32), Signal::SIGKILL);
            }
            let _ = g.wait().await;
        }
    }
}

fn exit_code(status: std::io::Result<std::process::ExitStatus>) -> i32 {
    use std::os::unix::process::ExitStatusExt;
    match status {
        Ok(s) => s.code().unwrap_or_else(|| 128 + s.signal().unwrap_or(0)),
        Err(_) => 1,
    }
}

/// `arbiter guard`: wait for the agent (`parent`) to die, then SIGKILL process group `pgid`.
///
/// Must run on the process's only thread (no async runtime): the parent-death signal is
/// process-directed, and a thread that does not block SIGTERM would take it and die of it.
pub fn guard(pgid: i32, parent: i32) -> anyhow::Result<()> {
    use nix::sys::signal::{SigSet, SigmaskHow, sigprocmask};
    // Block SIGTERM and wait for it synchronously: it is the parent-death signal.
    let mut set = SigSet::empty();
    set.add(Signal::SIGTERM);
    sigprocmask(SigmaskHow::SIG_BLOCK, Some(&set), None)?;
    nix::sys::prctl::set_pdeathsig(Signal::SIGTERM)?;
    // Wait for the signal, and also look at who the parent is every 100 ms: the agent may have
    // died before the parent-death signal was armed, and a second way to notice costs nothing.
    let tick = libc::timespec {
        tv_sec: 0,
        tv_nsec: 100_000_000,
    };
    while nix::unistd::getppid().as_raw() == parent {
        // SAFETY: a valid signal set and timeout; no siginfo is requested.
        let got = unsafe { libc::sigtimedwait(set.as_ref(), std::ptr::null_mut(), &tick) };
        if got == libc::SIGTERM {
            break;
        }
    }
    let _ = killpg(Pid::from_raw(pgid), Signal::SIGKILL);
    Ok(())
}

//! When `arbiter run` is a container's PID 1, the workload's orphans (a grandchild whose parent
//! exited) are reparented to the agent, and nobody else will ever wait for them: reap them, or
//! they stay zombies for the life of the container.
//!
//! Only processes the agent did not start itself are reaped here: CMD's leader and the guard are
//! waited for by their owners (their exit codes matter), so they are registered in [`OWN`].

use std::collections::BTreeSet;
use std::sync::Mutex;
use std::time::Duration;

use nix::sys::wait::{WaitPidFlag, waitpid};
use nix::unistd::Pid;

/// The agent's own children, which the reaper must leave to their owners.
static OWN: Mutex<BTreeSet<i32>> = Mutex::new(BTreeSet::new());

pub fn own(pid: i32) {
    OWN.lock().unwrap_or_else(|e| e.into_inner()).insert(pid);
}

pub fn disown(pid: i32) {
    OWN.lock().unwrap_or_else(|e| e.into_inner()).remove(&pid);
}

/// Starts reaping orphans if this process is PID 1; otherwise does nothing.
pub fn start_if_init() {
    if std::process::id() != 1 {
        return;
    }
    tracing::info!("running as PID 1: reaping orphaned processes");
    tokio::spawn(async {
        use tokio::signal::unix::{SignalKind, signal};
        let mut sigchld = signal(SignalKind::child()).ok();
        loop {
            reap_orphans();
            match sigchld.as_mut() {
                Some(s) => {
                    // SIGCHLD, or a slow tick in case one was coalesced away.
                    let _ = tokio::time::timeout(Duration::from_secs(5), s.recv()).await;
                }
                None => tokio::time::sleep(Duration::from_secs(1)).await,
            }
        }
    });
}

/// Waits for every exited child of this process that is not one of its own.
fn reap_orphans() {
    let me = std::process::id() as i32;
    for (pid, state) in children(me) {
        if state != "Z" || OWN.lock().unwrap_or_else(|e| e.into_inner()).contains(&pid) {
            continue;
        }
        if let Ok(status) = waitpid(Pid::from_raw(pid), Some(WaitPidFlag::WNOHANG)) {
            tracing::debug!(pid, ?status, "reaped an orphaned process");
        }
    }
}

/// The children of `parent` as `/proc` shows them: (pid, state letter such as `Z`).
pub fn children(parent: i32) -> Vec<(i32, String)> {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.flatten()
        .filter_map(|entry| {
            let pid = entry.file_name().to_str()?.parse::<i32>().ok()?;
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
            // "pid (comm) S ppid ...": the comm may hold spaces and parentheses.
            let rest = &stat[stat.rfind(')')? + 2..];
            let mut fields = rest.split_whitespace();
            let (state, ppid) = (fields.next()?, fields.next()?.parse::<i32>().ok()?);
            (ppid == parent).then(|| (pid, state.to_string()))
        })
        .collect()
}

//! `arbiter guard`: the workload's watchdog, a process of its own with a deadline of its own.
//!
//! The agent cannot be trusted to stop CMD: it may be SIGKILLed, SIGSTOPped, deadlocked or
//! starved while CMD keeps running. So CMD runs under a watchdog that needs nothing from the
//! agent to act:
//!
//! | what happens | the guard |
//! |---|---|
//! | the agent renews (it sends `Extend(t)`: last successful renew + renew deadline) | moves the deadline to `t` |
//! | the deadline passes (agent stalled, hung, or cut off and not stopping CMD) | SIGTERM to CMD's group, SIGKILL `kill_grace` later |
//! | the agent says it is stopping CMD (`Stopping`) | SIGKILL `kill_grace` later at the latest, unless the agent finished first |
//! | the agent dies (parent-death signal, parent changed, or its pipe closes) | SIGKILL to CMD's group at once |
//!
//! And the agent watches the guard: if the guard dies (the OOM killer, a stray `kill -9`), the
//! agent stops CMD and ends its term at once, rather than run on without a watchdog.
//!
//! If the guard itself had to kill CMD later than `margin` after the deadline's SIGKILL time
//! (it was paused or starved with the rest of the candidate), a successor may already have run
//! beside CMD: it says so on stderr and exits with [`OVERRAN`], and the agent reports the
//! term as overrun on its candidate (the operator's `DoubleHolder` condition).
//!
//! The deadline is an absolute `CLOCK_BOOTTIME` time, which both processes read alike, so a
//! message that arrives late (the guard was slow to read) does not extend anything. Unlike
//! `CLOCK_MONOTONIC` it counts the time the machine was suspended: a host that resumes after
//! the deadline has CMD stopped at once (and reported as an overrun), not a suspension later. The guard
//! runs in a process group of its own, so a stop or signal sent to the agent's group does not
//! reach it, and it is single-threaded, with no async runtime (see [`run`]).
//!
//! CMD cannot outrun its guard: the agent starts the guard first; CMD's process, between fork
//! and exec, sends its own pid (its process group) to the guard and waits for the guard's
//! go-ahead, which the guard gives only before the deadline. A CMD whose guard is gone never
//! execs. So from its first instruction CMD is stopped no later than the last successful
//! renew + renew deadline + kill grace, whatever the agent does. Only a freeze of the guard
//! itself (the whole candidate paused, as a container or VM is) escapes it: that is what the
//! fencing token is for.

use std::time::Duration;

/// One message on the agent → guard pipe. Fixed 16 bytes, below `PIPE_BUF`, so writes from the
/// agent and from CMD's pre-exec child never interleave.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Message {
    /// CMD's process group (sent by CMD's own process before it execs).
    Pgid(i32),
    /// The new deadline: CLOCK_BOOTTIME nanoseconds at which CMD must be told to stop.
    Extend(u64),
    /// The agent is stopping CMD itself (it sends SIGTERM right after this).
    Stopping,
}

pub const MESSAGE_LEN: usize = 16;

/// The guard's exit code when it killed CMD more than its margin late.
pub const OVERRAN: i32 = 3;

impl Message {
    pub fn encode(self) -> [u8; MESSAGE_LEN] {
        let (tag, value): (u64, u64) = match self {
            Message::Pgid(p) => (1, p as u32 as u64),
            Message::Extend(t) => (2, t),
            Message::Stopping => (3, 0),
        };
        let mut out = [0u8; MESSAGE_LEN];
        out[..8].copy_from_slice(&tag.to_le_bytes());
        out[8..].copy_from_slice(&value.to_le_bytes());
        out
    }

    pub fn decode(b: &[u8; MESSAGE_LEN]) -> Option<Message> {
        let tag = u64::from_le_bytes(b[..8].try_into().ok()?);
        let value = u64::from_le_bytes(b[8..].try_into().ok()?);
        match tag {
            1 => i32::try_from(value)
                .ok()
                .filter(|p| *p > 1)
                .map(Message::Pgid),
            2 => Some(Message::Extend(value)),
            3 => Some(Message::Stopping),
            _ => None,
        }
    }
}

/// What the guard must do now.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Action {
    /// Nothing until `wake_at` (CLOCK_BOOTTIME ns), or the next message.
    Wait { wake_at: u64 },
    /// Let CMD exec (its pid is known and the deadline has not passed).
    Go,
    /// SIGTERM to CMD's group.
    Terminate,
    /// SIGKILL to CMD's group, then exit.
    Kill,
    /// Nothing was ever started and the deadline passed: exit (CMD can no longer start).
    Exit,
}

/// The guard's state: pure, driven by messages and the clock (CLOCK_BOOTTIME nanoseconds).
#[derive(Clone, Debug)]
pub struct Watchdog {
    kill_grace: u64,
    /// When CMD must be told to stop (if the agent has not done it).
    term_at: u64,
    /// When CMD's group is SIGKILLed, whatever else happens. Only ever moves earlier once the
    /// stop has begun.
    kill_at: u64,
    pgid: Option<i32>,
    released: bool,
    /// SIGTERM sent (by the guard, or the agent said it sends it).
    stopping: bool,
}

/// How long the guard gives the agent, after the deadline, to begin the stop itself (so a
/// healthy agent and its guard do not both SIGTERM). SIGKILL still comes at deadline + grace.
const AGENT_FIRST: u64 = 100_000_000;

impl Watchdog {
    pub fn new(term_at: u64, kill_grace: Duration) -> Watchdog {
        let kill_grace = kill_grace.as_nanos() as u64;
        Watchdog {
            kill_grace,
            term_at,
            kill_at: term_at.saturating_add(kill_grace),
            pgid: None,
            released: false,
            stopping: false,
        }
    }

    pub fn pgid(&self) -> Option<i32> {
        self.pgid
    }

    /// How late a kill at `now` is, after the time CMD had to be dead by.
    pub fn late_by(&self, now: u64) -> Duration {
        Duration::from_nanos(now.saturating_sub(self.kill_at))
    }

    /// Applies one message received at `now`.
    pub fn receive(&mut self, m: Message, now: u64) {
        match m {
            Message::Pgid(p) if self.pgid.is_none() => self.pgid = Some(p),
            Message::Pgid(_) => {}
            Message::Extend(t) if !self.stopping => {
                self.term_at = t;
                self.kill_at = t.saturating_add(self.kill_grace);
            }
            Message::Extend(_) => {}
            Message::Stopping => {
                self.stopping = true;
                self.kill_at = self.kill_at.min(now.saturating_add(self.kill_grace));
            }
        }
    }

    /// What to do at `now`. `Go` and `Terminate` are reported once; call again after acting.
    pub fn next(&mut self, now: u64) -> Action {
        let Some(_) = self.pgid else {
            return if now >= self.term_at {
                Action::Exit
            } else {
                Action::Wait {
                    wake_at: self.term_at,
                }
            };
        };
        if now >= self.kill_at {
            return Action::Kill;
        }
        if !self.released {
            if now >= self.term_at {
                // Never let CMD start once its deadline has passed.
                return Action::Kill;
            }
            self.released = true;
            return Action::Go;
        }
        let term_at = self.term_at.saturating_add(AGENT_FIRST).min(self.kill_at);
        if !self.stopping {
            if now >= term_at {
                self.stopping = true;
                return Action::Terminate;
            }
            return Action::Wait { wake_at: term_at };
        }
        Action::Wait {
            wake_at: self.kill_at,
        }
    }
}

/// The guard process: reads messages on stdin, gives CMD its go-ahead on stdout, and stops
/// CMD's group at the deadline. `parent` is the agent's pid. Returns the exit code: 0, or
/// [`OVERRAN`] when it had to kill CMD more than `margin` late.
///
/// Must run on the process's only thread (no async runtime): the parent-death signal is
/// process-directed, and a thread that does not block SIGTERM would take it and die of it.
pub fn run(
    parent: i32,
    term_at: u64,
    kill_grace: Duration,
    margin: Duration,
) -> anyhow::Result<i32> {
    use std::io::Write;

    use nix::sys::signal::{SigSet, SigmaskHow, Signal, killpg, sigprocmask};
    use nix::unistd::Pid;

    // Block SIGTERM and look for it synchronously: it is the parent-death signal.
    let mut set = SigSet::empty();
    set.add(Signal::SIGTERM);
    sigprocmask(SigmaskHow::SIG_BLOCK, Some(&set), None)?;
    nix::sys::prctl::set_pdeathsig(Signal::SIGTERM)?;

    let stdin = std::io::stdin();
    let mut stdout = std::io::stdout();
    let mut dog = Watchdog::new(term_at, kill_grace);
    let mut buf = Vec::with_capacity(MESSAGE_LEN * 4);
    loop {
        // The agent died (before or after the parent-death signal was armed): kill at once.
        if parent_gone(&set, parent) {
            kill(&dog);
            return Ok(0);
        }
        let now = crate::clock::boottime_now();
        let wake_at = match dog.next(now) {
            Action::Go => {
                // CMD's pre-exec child waits for this byte; if the write fails it never execs.
                let _ = stdout.write_all(b"g").and_then(|()| stdout.flush());
                continue;
            }
            Action::Terminate => {
                if let Some(p) = dog.pgid() {
                    eprintln!(
                        "arbiter guard: the agent did not renew in time; stopping the workload (group {p})"
                    );
                    let _ = killpg(Pid::from_raw(p), Signal::SIGTERM);
                }
                continue;
            }
            Action::Kill => {
                kill(&dog);
                let late = dog.late_by(now);
                let code = if late > margin {
                    eprintln!(
                        "arbiter guard: stopped the workload {late:?} after it had to be stopped (this process was paused or starved): a successor may have run beside it"
                    );
                    OVERRAN
                } else {
                    0
                };
                // Stay until dismissed, so the agent can read the exit code, unless it is gone.
                continue_until_dismissed(&stdin, parent, &set);
                return Ok(code);
            }
            Action::Exit => return Ok(0),
            Action::Wait { wake_at } => wake_at,
        };
        match listen(&stdin, &mut buf, &mut dog, wake_at.saturating_sub(now)) {
            Ok(true) => {}
            // Every writer is gone: the agent died (or dismissed us after CMD stopped).
            Ok(false) => {
                kill(&dog);
                return Ok(0);
            }
            Err(e) => {
                kill(&dog);
                return Err(e.into());
            }
        }
    }
}

/// SIGKILL to the workload's group, if it started.
fn kill(dog: &Watchdog) {
    use nix::sys::signal::{Signal, killpg};
    if let Some(p) = dog.pgid() {
        let _ = killpg(nix::unistd::Pid::from_raw(p), Signal::SIGKILL);
    }
}

/// The agent is gone: the parent-death signal (SIGTERM, blocked in `set`) is pending, or this
/// process's parent is no longer `parent`.
fn parent_gone(set: &nix::sys::signal::SigSet, parent: i32) -> bool {
    let zero = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: a valid signal set and timeout; no siginfo is requested.
    let got = unsafe { libc::sigtimedwait(set.as_ref(), std::ptr::null_mut(), &zero) };
    got == libc::SIGTERM || nix::unistd::getppid().as_raw() != parent
}

/// Waits up to `wait_ns` (at least 1 ms, at most 100 ms: the parent is looked at again) for
/// the agent's messages, and hands every whole one to `dog`. False once every writer is gone
/// (the pipe closed, or could not be read).
fn listen(
    stdin: &std::io::Stdin,
    buf: &mut Vec<u8>,
    dog: &mut Watchdog,
    wait_ns: u64,
) -> nix::Result<bool> {
    use std::os::fd::AsFd;

    use nix::poll::{PollFd, PollFlags, PollTimeout, poll};

    let wait_ms = (wait_ns / 1_000_000).clamp(1, 100) as u16;
    let mut fds = [PollFd::new(stdin.as_fd(), PollFlags::POLLIN)];
    match poll(&mut fds, PollTimeout::from(wait_ms)) {
        Ok(0) | Err(nix::errno::Errno::EINTR) => return Ok(true),
        Ok(_) => {}
        Err(e) => return Err(e),
    }
    let mut chunk = [0u8; 256];
    let n = match nix::unistd::read(stdin.as_fd(), &mut chunk) {
        Ok(n) => n,
        Err(nix::errno::Errno::EINTR | nix::errno::Errno::EAGAIN) => return Ok(true),
        Err(_) => 0,
    };
    if n == 0 {
        return Ok(false);
    }
    buf.extend_from_slice(&chunk[..n]);
    let now = crate::clock::boottime_now();
    while buf.len() >= MESSAGE_LEN {
        let raw: [u8; MESSAGE_LEN] = buf[..MESSAGE_LEN].try_into().expect("16 bytes");
        buf.drain(..MESSAGE_LEN);
        match Message::decode(&raw) {
            Some(m) => dog.receive(m, now),
            None => eprintln!("arbiter guard: ignoring a malformed message"),
        }
    }
    Ok(true)
}

/// After the final kill: waits (up to a minute) for the agent to close the pipe or die, so
/// that it reaps this process's exit code rather than killing it first.
fn continue_until_dismissed(stdin: &std::io::Stdin, parent: i32, set: &nix::sys::signal::SigSet) {
    use std::os::fd::AsFd;

    use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
    let until = crate::clock::boottime_now() + 60_000_000_000;
    let mut chunk = [0u8; 256];
    while crate::clock::boottime_now() < until && nix::unistd::getppid().as_raw() == parent {
        let zero = libc::timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        // SAFETY: a valid signal set and timeout; no siginfo is requested.
        if unsafe { libc::sigtimedwait(set.as_ref(), std::ptr::null_mut(), &zero) } == libc::SIGTERM
        {
            return;
        }
        let mut fds = [PollFd::new(stdin.as_fd(), PollFlags::POLLIN)];
        if let Ok(n) = poll(&mut fds, PollTimeout::from(100u16))
            && n > 0
            && matches!(nix::unistd::read(stdin.as_fd(), &mut chunk), Ok(0) | Err(_))
        {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: u64 = 1_000_000_000;
    const GRACE: Duration = Duration::from_secs(2);

    #[test]
    fn messages_round_trip_and_garbage_is_refused() {
        for m in [
            Message::Pgid(4242),
            Message::Extend(7 * S),
            Message::Stopping,
        ] {
            assert_eq!(Message::decode(&m.encode()), Some(m));
        }
        let mut bad = Message::Stopping.encode();
        bad[0] = 9;
        assert_eq!(Message::decode(&bad), None);
        // Process groups 0 and 1 would be "every process": never accepted.
        assert_eq!(Message::decode(&Message::Pgid(1).encode()), None);
        assert_eq!(Message::decode(&Message::Pgid(0).encode()), None);
    }

    #[test]
    fn cmd_starts_only_before_the_deadline() {
        let mut d = Watchdog::new(10 * S, GRACE);
        assert_eq!(d.next(S), Action::Wait { wake_at: 10 * S });
        d.receive(Message::Pgid(100), S);
        assert_eq!(d.next(S), Action::Go);
        // Too late: the pid arrives after the deadline; CMD must not be let go.
        let mut late = Watchdog::new(10 * S, GRACE);
        late.receive(Message::Pgid(100), 11 * S);
        assert_eq!(late.next(11 * S), Action::Kill);
        // Nothing registered by the deadline: exit, CMD can never start.
        let mut never = Watchdog::new(10 * S, GRACE);
        assert_eq!(never.next(10 * S), Action::Exit);
    }

    #[test]
    fn a_silent_agent_gets_its_workload_stopped_at_the_deadline_plus_grace() {
        let mut d = Watchdog::new(10 * S, GRACE);
        d.receive(Message::Pgid(100), S);
        assert_eq!(d.next(S), Action::Go);
        d.receive(Message::Extend(12 * S), 5 * S);
        assert!(matches!(d.next(11 * S), Action::Wait { .. }));
        // The agent goes silent: SIGTERM just after the deadline, SIGKILL at deadline + grace.
        assert_eq!(d.next(12 * S + AGENT_FIRST), Action::Terminate);
        assert_eq!(
            d.next(12 * S + AGENT_FIRST),
            Action::Wait { wake_at: 14 * S }
        );
        // A late extension does not save it.
        d.receive(Message::Extend(30 * S), 13 * S);
        assert_eq!(d.next(14 * S), Action::Kill);
    }

    #[test]
    fn a_stopping_agent_is_not_doubled_and_the_kill_only_comes_earlier() {
        let mut d = Watchdog::new(10 * S, GRACE);
        d.receive(Message::Pgid(100), S);
        assert_eq!(d.next(S), Action::Go);
        d.receive(Message::Stopping, 3 * S);
        assert_eq!(d.next(3 * S), Action::Wait { wake_at: 5 * S });
        d.receive(Message::Extend(60 * S), 4 * S);
        assert_eq!(d.next(5 * S), Action::Kill);
        // Stopping close to the deadline keeps the deadline's kill time.
        let mut e = Watchdog::new(10 * S, GRACE);
        e.receive(Message::Pgid(100), S);
        e.next(S);
        e.receive(Message::Stopping, 11 * S);
        assert_eq!(e.next(11 * S), Action::Wait { wake_at: 12 * S });
    }
}

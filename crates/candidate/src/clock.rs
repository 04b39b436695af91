//! The boot clock, which the agent and its guard read alike.
//!
//! `CLOCK_BOOTTIME` is monotonic and, unlike `CLOCK_MONOTONIC` (what `std::time::Instant`
//! reads on Linux), counts the time the machine was suspended. Deadlines that bound a workload
//! are kept on it: a host that resumes after one has passed stops its workload at once. A
//! deadline is computed from a boot-clock reading taken when its event happened (a renew
//! sent), never by converting an older `Instant` later: across a suspension that conversion
//! would move it later by the time suspended.

/// `CLOCK_BOOTTIME` now, in nanoseconds.
pub fn boottime_now() -> u64 {
    let t = nix::time::clock_gettime(nix::time::ClockId::CLOCK_BOOTTIME)
        .expect("CLOCK_BOOTTIME is available on Linux since 2.6.39");
    t.tv_sec() as u64 * 1_000_000_000 + t.tv_nsec() as u64
}

/// `at` plus `d`, in boot-clock nanoseconds.
pub fn after(at: u64, d: std::time::Duration) -> u64 {
    at.saturating_add(d.as_nanos().min(u64::MAX as u128) as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_boot_clock() {
        let a = boottime_now();
        let boot = nix::time::clock_gettime(nix::time::ClockId::CLOCK_BOOTTIME).unwrap();
        let b = boot.tv_sec() as u64 * 1_000_000_000 + boot.tv_nsec() as u64;
        assert!(a <= b && b - a < 1_000_000_000);
        assert_eq!(after(5, std::time::Duration::from_nanos(7)), 12);
    }
}

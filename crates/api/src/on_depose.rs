//! The forced-exit policy: what the operator does with a deposed holder's pod that still runs
//! (`arbiter operator --on-depose`, a workload's `arbiter.dev/on-depose` annotation).

/// What to do with a deposed holder's pod that is still running.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "clap", derive(clap::ValueEnum))]
pub enum OnDepose {
    /// Evict it (honours PodDisruptionBudgets; retried while a PDB refuses).
    Evict,
    /// Delete it (ignores PodDisruptionBudgets).
    Delete,
    /// Only report it (Event `DeposedStillRunning`).
    None,
}

impl OnDepose {
    pub fn as_str(self) -> &'static str {
        match self {
            OnDepose::Evict => "evict",
            OnDepose::Delete => "delete",
            OnDepose::None => "none",
        }
    }
}

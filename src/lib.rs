//! arbiter: coordinated leader election for Kubernetes.
//!
//! Candidates declare themselves in a [`api::LeaseCandidate`]; the operator elects one holder
//! per Lease by version and skew rules, and the deposed holder stops before anyone else leads.

pub mod agent;
pub mod api;
pub mod candidate;
pub mod cli;
pub mod client;
pub mod clock;
pub mod election;
#[cfg(test)]
mod fake_api;
pub mod flags;
pub mod handover;
#[cfg(test)]
mod layers;
pub mod lease;
pub mod memory;
pub mod operator;
pub mod self_install;
#[cfg(test)]
mod shape;
pub mod status;
pub mod stop_operator;
pub mod tolerant;
pub mod workloads;

/// A random id for process incarnations and replica identities (not for cryptography).
pub(crate) fn random_id() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u32(std::process::id());
    h.finish()
}

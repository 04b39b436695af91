//! arbiter: coordinated leader election for Kubernetes.
//!
//! Candidates declare themselves in a [`api::LeaseCandidate`]; the operator elects one holder
//! per Lease by version and skew rules, and the deposed holder stops before anyone else leads.

pub mod api;
pub mod cli;
pub mod client;
pub mod election;
pub mod lease;
pub mod operator;

//! arbiter: coordinated leader election for Kubernetes.
//!
//! Candidates declare themselves in a [`api::LeaseCandidate`]; the operator elects one holder
//! per Lease by version and skew rules, and the deposed holder stops before anyone else leads.
//!
//! This crate is the `arbiter` binary (the CLI, the agent `arbiter run`, `status`, `handover`)
//! and a facade over the workspace's crates, by layer: [`election`] (`arbiter-election`, the
//! pure rules), [`api`] with [`lease`] and [`tolerant`] (`arbiter-api`, the resource and the
//! Lease protocol), [`candidate`] with [`client`], [`clock`] and [`flags`]
//! (`arbiter-candidate`, the library a Rust program leads with), and [`operator`] with
//! [`workloads`] (`arbiter-operator`). A Rust program that leads depends on
//! `arbiter-candidate`, not on this crate.

pub mod agent;
pub mod cli;
pub mod handover;
#[cfg(test)]
mod layers;
pub mod self_install;
#[cfg(test)]
mod shape;
pub mod status;
pub mod stop_operator;

pub use arbiter_api as api;
pub use arbiter_api::{lease, tolerant};
pub use arbiter_candidate as candidate;
pub use arbiter_candidate::{client, clock, flags, random_id, usage};
pub use arbiter_election as election;
pub use arbiter_operator as operator;
pub use arbiter_operator::{memory, workloads};

//! The election rules, as pure functions: no I/O, no clocks read, no randomness.
//!
//! Everything the arbiter decides about a lease follows from these rules, so each one is
//! table-tested against upstream's cases (`../shared/kep4355.md` §6) and property-tested:
//!
//! - [`Version`]: semantic versions compared by precedence (`1.2.0 < 1.19.0`, pre-releases
//!   below releases, a leading `v` tolerated on read).
//! - [`strategy::resolve`]: the strategy of the candidates with the highest binaryVersion
//!   governs the lease; disagreement at that version is a conflict, never a guess. The result
//!   does not depend on the order candidates are listed in.
//! - [`heard`]: what the arbiter heard from a candidate (answers to its own pings, renewals
//!   seen as they happened), on its own clocks: no other host's timestamp is compared.
//! - [`oldest_emulation`]: among eligible candidates, the lowest emulationVersion leads, then
//!   the lowest binaryVersion, the oldest candidate, and the lowest name: a total order, so the
//!   same candidates always elect the same holder.
//! - [`terms`]: the next term above a mark and a Lease, and the blocks of terms a mark write
//!   reserves.
//! - [`proof`]: which pod's confirmed stop proves a term over.
//! - [`standing`]: whether the term a Lease names is a candidate process's to take or keep.
//! - [`timings`]: the renew deadline and kill grace a lease duration leaves room for.

pub mod decide;
pub mod heard;
pub mod oldest_emulation;
pub mod proof;
pub mod standing;
pub mod strategy;
pub mod terms;
pub mod timings;
mod version;

pub use version::{Version, VersionError};

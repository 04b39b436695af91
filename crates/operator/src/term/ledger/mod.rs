//! The term high-water mark, so a term never goes backwards even if a Lease is deleted.
//!
//! Before the arbiter writes a Lease with term N it records N as the lease name's mark, by
//! compare-and-swap. If the Lease write then fails, N is simply skipped: terms stay strictly
//! increasing, gaps allowed.
//!
//! The marks of a namespace are spread over [`SHARDS`] ConfigMaps, `arbiter-terms-00` to
//! `arbiter-terms-63`, by a fixed hash of the lease name ([`shard_of`]). One ConfigMap per
//! namespace would be rewritten whole at every election and cap a namespace at 1 MiB of lease
//! names; a ConfigMap per lease would need the right to read and write every ConfigMap in the
//! cluster. A fixed set of names keeps RBAC to `resourceNames`.
//!
//! The ledger remembers each shard as it last wrote or read it, and writes against that
//! resourceVersion: a mark read from a stale copy can only be too low, and then the write is
//! refused (409), the shard is read again, and the mark recomputed. No term is ever handed out
//! twice.
//!
//! **Blocks.** A write reserves [`BLOCK`] terms at once: handing out term N records N + 15 as
//! the mark, and this ledger keeps N+1 … N+15 for the lease's next assignments, which then need
//! no ConfigMap write. Only an assignment that *updates* an existing Lease by compare-and-swap
//! draws from the block: the Lease's own compare-and-swap orders it after the term it replaces,
//! and the block lies at or below the recorded mark, so a later recreation (which writes a
//! mark, from a fresh shard if its copy is stale) still starts above it. (The one creation
//! without a mark write, a new lease's first, is below.) Nobody else can hand
//! out a term of the block: another ledger (a restarted operator, the next HA replica) reads the
//! mark and starts above it. A block is forgotten with the process, and when a mark write fails;
//! its unused terms are skipped. A mark raised by hand takes effect at the lease's next mark
//! write (at the latest 15 assignments later, or when the operator restarts).
//!
//! **New leases reserved ahead.** A mark write also reserves the first block (terms 1 to
//! [`BLOCK`], recorded as the mark [`BLOCK`]) of up to [`AHEAD`] other leases of its shard that
//! the caller expects to create ([`TermLedger::next`]'s `new_leases`: leases with candidates
//! and no Lease) and that have no mark at all in the shard as that compare-and-swap write reads
//! it. It is the write each of those leases' first election would have made (no mark, so term
//! 1), made for several at once: when many leases get their first holders together (an operator
//! installed among many candidates), a shard costs a mark write per [`AHEAD`] new leases
//! instead of one each. Such a lease's first creation takes term 1 from its block without a
//! write, after a quorum read of the shard (no etcd write, no watch event to every watcher of
//! ConfigMaps, as a mark write has) shows the resourceVersion of this ledger's own last write:
//! then every write of the shard since the reservation was this ledger's, made from its own
//! copy, so nobody else handed out a term of that name or changed its mark (not another
//! operator acting at the same time by mistake, nor a mark restored by hand). Otherwise, and
//! whenever the ledger had to read the shard from the API (a 409, a failed write), the blocks
//! it reserved ahead there are forgotten, and those leases write a mark as any creation does. A
//! block reserved ahead serves one creation, and nothing before it: an update of a Lease that
//! exists without a term of it (made by hand, or holderless under another strategy) writes a
//! mark, and once a term of it was handed out, a recreation writes a mark.
//!
//! The hash and the number of shards must never change: an operator that looked for a mark in
//! another shard would find none and could restart a deleted lease's terms from 1.

use std::collections::{BTreeMap, HashMap};

use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, PostParams};
use kube::{Client, ResourceExt};

use arbiter_election::terms::{Block, next_term};

/// How many ConfigMaps hold a namespace's marks. Fixed forever (see the module doc).
pub const SHARDS: u64 = 64;

/// How many terms one mark write reserves (see the module doc).
pub const BLOCK: i32 = 16;

/// The most new leases whose first block one mark write reserves (see the module doc).
pub const AHEAD: usize = 128;

/// How often a write is retried when another writer changed the shard in between.
const ATTEMPTS: usize = 5;

/// The ConfigMap that holds the mark of `lease`.
pub fn shard_of(lease: &str) -> String {
    format!("arbiter-terms-{:02}", shard_index(lease))
}

/// The number (below [`SHARDS`]) of the shard that holds the mark of `lease`.
pub fn shard_index(lease: &str) -> u64 {
    use std::hash::Hasher;
    // FNV-1a over the name's bytes: specified, so the same on every build and platform.
    let mut h = fnv::FnvHasher::default();
    h.write(lease.as_bytes());
    h.finish() % SHARDS
}

/// The names of every shard, for RBAC `resourceNames`.
pub fn shard_names() -> impl Iterator<Item = String> {
    (0..SHARDS).map(|i| format!("arbiter-terms-{i:02}"))
}

/// Hands out terms: each greater than every term handed out before for the same lease name.
pub struct TermLedger {
    client: Client,
    /// Each shard as last read or written, by (namespace, shard name).
    shards: HashMap<(String, String), ConfigMap>,
    /// The terms this ledger reserved and has not handed out yet, by (namespace, lease).
    blocks: HashMap<(String, String), Block>,
    /// Shards read only to learn whether a term was handed out before this replica became
    /// active ([`TermLedger::handed_out_before`]), by (namespace, shard name).
    read: HashMap<(String, String), ConfigMap>,
}

/// Of `new_leases`, those whose first block a write of `cm` (the shard of `lease`) reserves:
/// other leases of the same shard, with no mark in it (an unreadable one is not "none"), for
/// which `held` says this ledger holds no block; at most [`AHEAD`], in the order given.
fn ahead_of<'a>(
    cm: &ConfigMap,
    lease: &str,
    new_leases: &'a [String],
    held: impl Fn(&str) -> bool,
) -> Vec<&'a str> {
    let shard = shard_index(lease);
    let mut seen = std::collections::HashSet::new();
    new_leases
        .iter()
        .map(String::as_str)
        .filter(|n| *n != lease && shard_index(n) == shard)
        .filter(|n| recorded(cm, n) == Ok(0) && !held(n))
        .filter(|n| seen.insert(*n))
        .take(AHEAD)
        .collect()
}

#[derive(Debug, thiserror::Error)]
pub enum TermError {
    #[error("recording the term of {lease}: {source}")]
    Api {
        lease: String,
        #[source]
        source: kube::Error,
    },
    #[error("recording the term of {lease}: shard {shard} kept changing; will retry")]
    Contended { lease: String, shard: String },
    #[error(
        "the term mark of {lease} in ConfigMap {shard} is {value:?}, not a number; no term is \
         handed out until it is mended (set it to at least the last term the lease had)"
    )]
    Unreadable {
        lease: String,
        shard: String,
        value: String,
    },
    #[error(
        "lease {lease} has used every term up to {recorded}; delete and recreate it under a new name"
    )]
    Exhausted { lease: String, recorded: i32 },
}

impl TermLedger {
    pub fn new(client: Client) -> Self {
        Self {
            client,
            shards: HashMap::new(),
            blocks: HashMap::new(),
            read: HashMap::new(),
        }
    }

    /// The next term for `lease`, greater than every term handed out for its name before.
    /// `current` is the term on the Lease as the caller read it: `Some` when the caller will
    /// update that Lease by compare-and-swap (the term may then come from this ledger's block),
    /// `None` when it will create the Lease (a mark is written first, unless the lease's first
    /// block was reserved ahead and none of it handed out). `new_leases` names leases of the
    /// namespace the caller expects to create (it is called only if a mark is written): those
    /// in `lease`'s shard with no mark get their first block reserved by the same write.
    pub async fn next(
        &mut self,
        namespace: &str,
        lease: &str,
        current: Option<i32>,
        new_leases: impl FnOnce() -> Vec<String>,
    ) -> Result<i32, TermError> {
        if let Some(next) = self.draw_from_block(namespace, lease, current).await? {
            return Ok(next);
        }
        // The block is used up or cannot serve: forget it now, so that a mark write whose
        // outcome is unknown (applied, answer lost) leaves no block behind to draw from.
        self.blocks
            .remove(&(namespace.to_string(), lease.to_string()));
        self.reserve(namespace, lease, current.unwrap_or(0), new_leases())
            .await
    }

    /// Whether a term of `lease` may have been handed out before this replica became active:
    /// its mark is above zero, and is not a block this ledger reserved ahead and never drew
    /// from. The mark is read from the shard as this ledger last wrote or read it, else as
    /// this question last read it (read now if neither). This ledger starts when its replica
    /// becomes active, and a predecessor's marks were all written before (its write gate
    /// closed first), so any copy read since has them. A mark that cannot be read counts as
    /// one. The copy read here is kept apart from the ledger's own: a block reserved ahead is
    /// drawn from only against this ledger's own last write ([`first_unless_written`]).
    pub async fn handed_out_before(
        &mut self,
        namespace: &str,
        lease: &str,
    ) -> Result<bool, TermError> {
        let Place {
            lease_key,
            shard,
            key,
            api,
        } = Place::of(&self.client, namespace, lease);
        if self
            .blocks
            .get(&lease_key)
            .is_some_and(|b| b.first().is_some())
        {
            return Ok(false);
        }
        let cm = match self.shards.get(&key).or_else(|| self.read.get(&key)) {
            Some(cm) => cm.clone(),
            None => match api.get_opt(&shard).await.map_err(api_error(lease))? {
                Some(cm) => {
                    self.read.insert(key, cm.clone());
                    cm
                }
                None => return Ok(false),
            },
        };
        Ok(recorded(&cm, lease).map_or(true, |mark| mark > 0))
    }

    /// The next term from the block this ledger reserved for `lease`, if it can serve: the
    /// term after `current`, or the block's first for a lease with no term yet, unless someone
    /// else wrote the shard since (its blocks reserved ahead are then forgotten).
    async fn draw_from_block(
        &mut self,
        namespace: &str,
        lease: &str,
        current: Option<i32>,
    ) -> Result<Option<i32>, TermError> {
        let Place {
            lease_key,
            shard,
            key,
            api,
        } = Place::of(&self.client, namespace, lease);
        let api_err = api_error(lease);
        let block = self.blocks.get(&lease_key).copied();
        match (current, block) {
            (Some(current), Some(block)) => {
                if let Some(next) = block.next(current) {
                    self.blocks.insert(lease_key, block.handed_out(next));
                    return Ok(Some(next));
                }
            }
            (None, Some(block)) => {
                if block.first().is_some() {
                    // Reserved ahead by a write of this ledger's: see the module doc.
                    let fresh = api.get_opt(&shard).await.map_err(api_err)?;
                    let version = |cm: Option<&ConfigMap>| cm?.resource_version();
                    let ours = version(self.shards.get(&key));
                    if let Some(first) = first_unless_written(block, ours, version(fresh.as_ref()))
                    {
                        self.blocks.insert(lease_key, block.handed_out(first));
                        return Ok(Some(first));
                    }
                    // Written by someone else: a mark write, from the shard as it is now.
                    forget_ahead(&mut self.blocks, namespace, &shard);
                    match fresh {
                        Some(cm) => self.shards.insert(key.clone(), cm),
                        None => self.shards.remove(&key),
                    };
                }
            }
            (_, None) => {}
        }
        Ok(None)
    }

    /// Reserves a new block for `lease` above `current` and the recorded mark by
    /// compare-and-swap on its shard, with the first terms of `new_leases` of the same shard
    /// reserved ahead by the same write; retried on conflicts a few times.
    async fn reserve(
        &mut self,
        namespace: &str,
        lease: &str,
        current: i32,
        new_leases: Vec<String>,
    ) -> Result<i32, TermError> {
        let Place {
            lease_key,
            shard,
            key,
            api,
        } = Place::of(&self.client, namespace, lease);
        let api_err = api_error(lease);
        for _ in 0..ATTEMPTS {
            let cached = self.shards.remove(&key);
            let read = match cached {
                Some(cm) => Some(cm),
                None => {
                    // Another writer may have changed the shard since this ledger's copy: the
                    // blocks it reserved ahead there are no longer known to be its own.
                    forget_ahead(&mut self.blocks, namespace, &shard);
                    api.get_opt(&shard).await.map_err(api_err)?
                }
            };
            let mut cm = read.unwrap_or_else(|| empty_shard(&shard));
            let mark = recorded(&cm, lease).map_err(|value| TermError::Unreadable {
                lease: lease.to_string(),
                shard: shard.clone(),
                value,
            })?;
            let next = next_term(mark, current).ok_or(TermError::Exhausted {
                lease: lease.to_string(),
                recorded: mark.max(current),
            })?;
            let block = Block::reserved_with(next, BLOCK);
            let ahead: Vec<String> = ahead_of(&cm, lease, &new_leases, |n| {
                self.blocks
                    .contains_key(&(namespace.to_string(), n.to_string()))
            })
            .into_iter()
            .map(str::to_string)
            .collect();
            let data = cm.data.get_or_insert_with(BTreeMap::new);
            data.insert(lease.to_string(), block.mark.to_string());
            for n in &ahead {
                data.insert(n.clone(), Block::ahead(BLOCK).mark.to_string());
            }
            // A shard read from the API carries its resourceVersion, so a concurrent writer
            // gets 409; a new one is created, so a concurrent creator gets 409 too.
            let written = if cm.resource_version().is_some() {
                api.replace(&shard, &PostParams::default(), &cm).await
            } else {
                api.create(&PostParams::default(), &cm).await
            };
            match written {
                Ok(cm) => {
                    self.shards.insert(key, cm);
                    self.blocks.insert(lease_key, block);
                    for n in ahead {
                        self.blocks
                            .insert((namespace.to_string(), n), Block::ahead(BLOCK));
                    }
                    return Ok(next);
                }
                Err(kube::Error::Api(s)) if s.code == 409 || s.code == 404 => continue,
                Err(e) => return Err(api_err(e)),
            }
        }
        Err(TermError::Contended {
            lease: lease.to_string(),
            shard,
        })
    }
}

/// The term a creation takes from `block`, reserved ahead, given the resourceVersion of this
/// ledger's own last write of the shard (`ours`; `None` after a failed write) and the one a
/// quorum read returns now (`now`; `None`: the shard is gone). Only if nobody else wrote the
/// shard since: then every write since the reservation was this ledger's.
fn first_unless_written(block: Block, ours: Option<String>, now: Option<String>) -> Option<i32> {
    match (ours, now) {
        (Some(ours), Some(now)) if ours == now => block.first(),
        _ => None,
    }
}

/// Forgets the blocks reserved ahead in a shard and not drawn from yet (their leases' first
/// creations write a mark instead: their reserved terms are skipped).
fn forget_ahead(blocks: &mut HashMap<(String, String), Block>, namespace: &str, shard: &str) {
    blocks.retain(|(ns, lease), block| {
        !(ns == namespace && block.first().is_some() && shard_of(lease) == shard)
    });
}

/// The mark recorded for `lease` in a shard: 0 if none, the stored text if it is not a number
/// (a mark that cannot be read must not be taken for 0).
fn recorded(cm: &ConfigMap, lease: &str) -> Result<i32, String> {
    match cm.data.as_ref().and_then(|d| d.get(lease)) {
        None => Ok(0),
        Some(v) => v.trim().parse::<i32>().map_err(|_| v.clone()),
    }
}

fn empty_shard(name: &str) -> ConfigMap {
    let mut cm = ConfigMap::default();
    cm.metadata.name = Some(name.into());
    cm.metadata.labels = Some(BTreeMap::from([(
        arbiter_api::lease::MANAGED_LABEL.into(),
        "true".into(),
    )]));
    cm
}

/// Where a lease's mark lives: the lease's key in the ledger's blocks, its shard's name and key
/// in the ledger's copies, and the API of the namespace's shards.
struct Place {
    lease_key: (String, String),
    shard: String,
    key: (String, String),
    api: Api<ConfigMap>,
}

impl Place {
    fn of(client: &Client, namespace: &str, lease: &str) -> Place {
        let shard = shard_of(lease);
        Place {
            lease_key: (namespace.to_string(), lease.to_string()),
            key: (namespace.to_string(), shard.clone()),
            shard,
            api: Api::namespaced(client.clone(), namespace),
        }
    }
}

/// An API error while recording `lease`'s term.
fn api_error(lease: &str) -> impl Fn(kube::Error) -> TermError + Copy + '_ {
    move |source| TermError::Api {
        lease: lease.to_string(),
        source,
    }
}

#[cfg(test)]
mod tests;

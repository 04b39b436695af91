use super::*;

/// The shard of a name is part of the stored data's format: if this test fails, an
/// upgraded operator would look for existing marks in the wrong ConfigMap. (The values are
/// FNV-1a 64 mod 64, computed apart from this code.)
#[test]
fn shards_are_fixed_forever() {
    let pinned = [
        ("a", "arbiter-terms-12"),
        ("kube-scheduler", "arbiter-terms-36"),
        ("demo", "arbiter-terms-22"),
        ("lease-00042", "arbiter-terms-06"),
    ];
    for (lease, shard) in pinned {
        assert_eq!(shard_of(lease), shard, "shard of {lease}");
    }
}

#[test]
fn shards_spread_names_and_are_all_allowed_by_rbac() {
    let names: std::collections::HashSet<String> = shard_names().collect();
    assert_eq!(names.len(), SHARDS as usize);
    let mut counts: HashMap<String, usize> = HashMap::new();
    for i in 0..10_000 {
        let shard = shard_of(&format!("lease-{i:05}"));
        assert!(names.contains(&shard), "{shard} is not in shard_names()");
        *counts.entry(shard).or_default() += 1;
    }
    // 10,000 names over 64 shards: about 156 each; none empty, none more than twice that.
    assert_eq!(counts.len(), SHARDS as usize);
    assert!(counts.values().all(|&n| n < 2 * 10_000 / SHARDS as usize));
}

#[test]
fn the_chart_grants_every_shard() {
    let manifests = include_str!("../../../../manifests/arbiter.yaml");
    for name in shard_names() {
        assert!(
            manifests.contains(&format!("- \"{name}\"")),
            "manifests/arbiter.yaml (the chart) does not grant {name}"
        );
    }
}

#[test]
fn next_term_is_above_both_and_refuses_to_wrap() {
    assert_eq!(next_term(0, 0), Some(1));
    assert_eq!(
        next_term(7, 3),
        Some(8),
        "a recorded mark above the Lease wins"
    );
    assert_eq!(next_term(3, 7), Some(8), "a Lease above the mark wins");
    assert_eq!(next_term(i32::MAX, 0), None);
    assert_eq!(next_term(0, i32::MAX), None);
}

#[test]
fn a_block_hands_out_each_term_once_and_never_above_its_mark() {
    let mut b = Block::reserved_with(5);
    assert_eq!(b.mark, 5 + BLOCK - 1);
    let mut handed = vec![5];
    while let Some(n) = b.next(*handed.last().unwrap()) {
        b.last = n;
        handed.push(n);
    }
    assert_eq!(handed, (5..5 + BLOCK).collect::<Vec<_>>());
    assert_eq!(b.next(0), None, "a Lease behind the block cannot reuse it");
}

#[test]
fn a_block_skips_ahead_of_the_lease_and_leaves_it_when_the_lease_is_above() {
    let b = Block::reserved_with(10);
    assert_eq!(
        b.next(3),
        Some(11),
        "a recreated Lease at a low term still gets a term above the block's last"
    );
    assert_eq!(b.next(20), Some(21), "a hand-raised term within the block");
    assert_eq!(b.next(b.mark), None, "above the block needs a mark write");
    let end = Block::reserved_with(i32::MAX - 2);
    assert_eq!(end.mark, i32::MAX);
    assert_eq!(end.next(i32::MAX), None);
}

/// `count` lease names of `lease`'s shard, other than `lease`, and one of another shard.
fn shard_mates(lease: &str, count: usize) -> (Vec<String>, String) {
    let shard = shard_index(lease);
    let same = (0..100_000)
        .map(|i| format!("lease-{i:06}"))
        .filter(|n| shard_index(n) == shard && n != lease)
        .take(count)
        .collect();
    let other = (0..100)
        .map(|i| format!("other-{i}"))
        .find(|n| shard_index(n) != shard)
        .unwrap();
    (same, other)
}

#[test]
fn a_creation_takes_its_reserved_term_only_from_a_shard_nobody_else_wrote() {
    let v = |s: &str| Some(s.to_string());
    let ahead = Block::ahead();
    assert_eq!(first_unless_written(ahead, v("7"), v("7")), Some(1));
    assert_eq!(
        first_unless_written(ahead, v("7"), v("9")),
        None,
        "written by someone else (a hand edit, another operator)"
    );
    assert_eq!(
        first_unless_written(ahead, None, v("7")),
        None,
        "this ledger's last write failed: its copy is gone"
    );
    assert_eq!(
        first_unless_written(ahead, v("7"), None),
        None,
        "shard deleted"
    );
    let used = Block { last: 1, ..ahead };
    assert_eq!(
        first_unless_written(used, v("7"), v("7")),
        None,
        "used once"
    );
}

#[test]
fn a_block_reserved_ahead_serves_one_creation_then_only_updates() {
    let mut b = Block::ahead();
    assert_eq!(
        b.mark, BLOCK,
        "the mark a first mark write would have recorded"
    );
    assert_eq!(b.first(), Some(1), "the first creation takes term 1");
    b.last = 1;
    assert_eq!(b.first(), None, "a recreation writes a mark");
    assert_eq!(b.next(1), Some(2), "updates draw from it as from any block");
    assert_eq!(
        Block::ahead().next(0),
        None,
        "a Lease that exists without a term of it (by hand, or holderless) needs a mark write"
    );
    assert_eq!(b.next(BLOCK), None, "one at the mark needs a mark write");
    assert_eq!(
        Block::reserved_with(1).first(),
        None,
        "only a block reserved ahead"
    );
}

#[test]
fn new_leases_reserved_ahead_are_unmarked_unheld_others_of_the_shard() {
    let lease = "lease-00042";
    let (same, other) = shard_mates(lease, 5);
    let mut cm = empty_shard(&shard_of(lease));
    cm.data = Some(BTreeMap::from([
        (same[0].clone(), "3".to_string()),
        (same[1].clone(), "garbled".to_string()),
    ]));
    let mut given = vec![lease.to_string(), other, same[2].clone()];
    given.extend(same.iter().cloned());
    let held = |n: &str| n == same[3];
    assert_eq!(
        ahead_of(&cm, lease, &given, held),
        vec![same[2].as_str(), same[4].as_str()],
        "not the lease itself, another shard's, a marked or unreadable one, a held one, \
         nor one twice"
    );
    let (many, _) = shard_mates(lease, AHEAD + 10);
    assert!(many.len() > AHEAD);
    assert_eq!(ahead_of(&cm, lease, &many, |_| false).len(), AHEAD);
}

#[test]
fn a_shard_read_again_forgets_only_its_unused_blocks_reserved_ahead() {
    let shard = shard_of("lease-00042");
    let (same, elsewhere) = shard_mates("lease-00042", 3);
    let (unused, used, ordinary) = (same[0].as_str(), same[1].as_str(), same[2].as_str());
    let key = |ns: &str, n: &str| (ns.to_string(), n.to_string());
    let mut blocks = HashMap::from([
        (key("ns", unused), Block::ahead()),
        (
            key("ns", used),
            Block {
                last: 1,
                ..Block::ahead()
            },
        ),
        (key("ns", ordinary), Block::reserved_with(5)),
        (key("ns", &elsewhere), Block::ahead()),
        (key("other-ns", unused), Block::ahead()),
    ]);
    forget_ahead(&mut blocks, "ns", &shard);
    let mut left: Vec<_> = blocks.into_keys().collect();
    left.sort();
    let mut want = vec![
        key("ns", used),
        key("ns", ordinary),
        key("ns", &elsewhere),
        key("other-ns", unused),
    ];
    want.sort();
    assert_eq!(left, want);
}

#[test]
fn recorded_reads_the_lease_entry_only() {
    let mut cm = empty_shard("arbiter-terms-00");
    assert_eq!(recorded(&cm, "x"), Ok(0));
    cm.data = Some(BTreeMap::from([
        ("x".to_string(), "41".to_string()),
        ("y".to_string(), "not a number".to_string()),
    ]));
    assert_eq!(recorded(&cm, "x"), Ok(41));
    assert_eq!(recorded(&cm, "y"), Err("not a number".to_string()));
    assert_eq!(recorded(&cm, "z"), Ok(0));
}

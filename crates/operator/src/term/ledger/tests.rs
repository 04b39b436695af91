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
    let manifests = include_str!("../../../../../manifests/arbiter.yaml");
    for name in shard_names() {
        assert!(
            manifests.contains(&format!("- \"{name}\"")),
            "manifests/arbiter.yaml (the chart) does not grant {name}"
        );
    }
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
    let ahead = Block::ahead(BLOCK);
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
        (key("ns", unused), Block::ahead(BLOCK)),
        (
            key("ns", used),
            Block {
                last: 1,
                ..Block::ahead(BLOCK)
            },
        ),
        (key("ns", ordinary), Block::reserved_with(5, BLOCK)),
        (key("ns", &elsewhere), Block::ahead(BLOCK)),
        (key("other-ns", unused), Block::ahead(BLOCK)),
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

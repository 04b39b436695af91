//! Term arithmetic: which term comes next, and the blocks of terms one mark write reserves.
//!
//! The operator's term ledger (`operator/term/ledger`) applies these rules around its
//! ConfigMap writes, and the protocol model (`make model`) applies the same ones with a
//! smaller block; why a block is safe to draw from is said there.

/// The next term: one above both the recorded mark and the Lease's current term; `None` if
/// that would not fit the Lease's `leaseTransitions` (int32).
pub fn next_term(recorded: i32, current: i32) -> Option<i32> {
    recorded.max(current).checked_add(1)
}

/// Terms reserved by a ledger's own mark write: `last` was handed out, up to `mark` may be.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Block {
    pub last: i32,
    pub mark: i32,
}

impl Block {
    /// The next term from the block for updating a Lease now at `current`, if it is still in
    /// the block. Not from a block reserved ahead that no creation drew from ([`Block::first`]):
    /// a Lease that exists without a term of it (made by hand, or holderless under another
    /// strategy) may come after terms someone else handed out (a mark restored by hand, or
    /// another operator by mistake), which only a mark write would see.
    pub fn next(&self, current: i32) -> Option<i32> {
        if self.last == 0 {
            return None;
        }
        let next = self.last.max(current).checked_add(1)?;
        (next <= self.mark).then_some(next)
    }

    /// The block once `term` of it was handed out.
    pub fn handed_out(self, term: i32) -> Block {
        Block { last: term, ..self }
    }

    /// The block of `size` terms a mark write for `term` reserves.
    pub fn reserved_with(term: i32, size: i32) -> Block {
        Block {
            last: term,
            mark: term.saturating_add(size - 1),
        }
    }

    /// The first block (of `size` terms) of a lease with no mark, reserved ahead of its first
    /// election.
    pub fn ahead(size: i32) -> Block {
        Block {
            last: 0,
            mark: size,
        }
    }

    /// The term for creating the Lease from this block: only a block reserved ahead, before
    /// any of its terms was handed out (a recreation writes a mark).
    pub fn first(&self) -> Option<i32> {
        (self.last == 0).then_some(1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The operator's block size.
    const SIZE: i32 = 16;

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
        let mut b = Block::reserved_with(5, SIZE);
        assert_eq!(b.mark, 5 + SIZE - 1);
        let mut handed = vec![5];
        while let Some(n) = b.next(*handed.last().unwrap()) {
            b.last = n;
            handed.push(n);
        }
        assert_eq!(handed, (5..5 + SIZE).collect::<Vec<_>>());
        assert_eq!(b.next(0), None, "a Lease behind the block cannot reuse it");
    }

    #[test]
    fn a_block_skips_ahead_of_the_lease_and_leaves_it_when_the_lease_is_above() {
        let b = Block::reserved_with(10, SIZE);
        assert_eq!(
            b.next(3),
            Some(11),
            "a recreated Lease at a low term still gets a term above the block's last"
        );
        assert_eq!(b.next(20), Some(21), "a hand-raised term within the block");
        assert_eq!(b.next(b.mark), None, "above the block needs a mark write");
        let end = Block::reserved_with(i32::MAX - 2, SIZE);
        assert_eq!(end.mark, i32::MAX);
        assert_eq!(end.next(i32::MAX), None);
    }

    #[test]
    fn a_block_reserved_ahead_serves_one_creation_then_only_updates() {
        let mut b = Block::ahead(SIZE);
        assert_eq!(
            b.mark, SIZE,
            "the mark a first mark write would have recorded"
        );
        assert_eq!(b.first(), Some(1), "the first creation takes term 1");
        b.last = 1;
        assert_eq!(b.first(), None, "a recreation writes a mark");
        assert_eq!(b.next(1), Some(2), "updates draw from it as from any block");
        assert_eq!(
            Block::ahead(SIZE).next(0),
            None,
            "a Lease that exists without a term of it (by hand, or holderless) needs a mark write"
        );
        assert_eq!(b.next(SIZE), None, "one at the mark needs a mark write");
        assert_eq!(
            Block::reserved_with(1, SIZE).first(),
            None,
            "only a block reserved ahead"
        );
    }

    proptest::proptest! {
        /// Whatever the Lease's term at each draw (a hand edit, a recreation), every term a
        /// block hands out is above the one before, above the Lease's, and within the mark.
        #[test]
        fn drawn_terms_rise_above_the_lease_and_stay_within_the_mark(
            start in 1..1000i32,
            currents in proptest::collection::vec(0..1100i32, 0..40),
        ) {
            let mut block = Block::reserved_with(start, SIZE);
            let mut last = start;
            for current in currents {
                if let Some(term) = block.next(current) {
                    proptest::prop_assert!(term > last && term > current && term <= block.mark);
                    block = block.handed_out(term);
                    last = term;
                }
            }
        }
    }
}

//! Terms: the high-water mark that keeps a lease's terms increasing ([`ledger`]), and what the
//! arbiter remembers of each lease's holder on its own clock ([`held`]).

pub(crate) mod held;
pub mod ledger;

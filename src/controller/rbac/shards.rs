//! Lock Lease names spread over Roles of their own once one Role would grow too large.
//!
//! The client Role names every lock Lease of its namespace, and etcd refuses an object
//! larger than its request limit (`--max-request-bytes`, 1.5 MiB by default): about 24,000
//! names of 63 characters fill one Role. A Role the apiserver refuses would leave every
//! new lock of the namespace out of its clients' reach. So past a budget of name bytes the
//! names leave the client Role for [`SHARDS`] Lease Roles, each bound to the same clients.
//! A name's Lease Role is fixed by a CRC-32 of the name, which never changes: a lock added
//! or deleted changes one Lease Role, and no name ever moves from one to another (a name
//! moving between two Roles would be out of reach if the Role losing it were written
//! first).

use std::collections::BTreeSet;

use super::CLIENT_ROLE;

/// How many Lease Roles the names are spread over. With 16, a namespace holds about 16
/// times what one Role holds: some 350,000 names of 63 characters.
pub const SHARDS: usize = 16;

/// The default budget of Lease name bytes in the client Role ([`weight`]): half of etcd's
/// default request limit, leaving room for the Role's other rules (the Pods with the
/// sidecar) and its metadata.
pub const DEFAULT_BUDGET: usize = 768 * 1024;

/// The name of Lease Role `index`.
pub fn name(index: usize) -> String {
    format!("{CLIENT_ROLE}-leases-{index}")
}

/// Every Lease Role's name, in order.
pub fn names() -> impl DoubleEndedIterator<Item = String> {
    (0..SHARDS).map(name)
}

/// The Lease Role that names Lease `lease`.
pub fn of(lease: &str) -> usize {
    crc32fast::hash(lease.as_bytes()) as usize % SHARDS
}

/// What `leases` take in a Role: each name's bytes and about two of encoding.
pub fn weight(leases: &BTreeSet<String>) -> usize {
    leases.iter().map(|name| name.len() + 2).sum()
}

/// Where a namespace's lock Lease names go.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Layout {
    /// All in the client Role; no Lease Roles.
    Together,
    /// Each in its Lease Role ([`of`]), by index; none in the client Role.
    Spread(Vec<BTreeSet<String>>),
}

/// Where `leases` go when the client Role holds at most `budget` bytes of them.
pub fn layout(leases: &BTreeSet<String>, budget: usize) -> Layout {
    if weight(leases) <= budget {
        return Layout::Together;
    }
    let mut spread = vec![BTreeSet::new(); SHARDS];
    for lease in leases {
        spread[of(lease)].insert(lease.clone());
    }
    Layout::Spread(spread)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn set(names: &[&str]) -> BTreeSet<String> {
        names.iter().map(|n| (*n).to_owned()).collect()
    }

    #[test]
    fn a_name_keeps_its_lease_role_whatever_else_changes() {
        // CRC-32 (IEEE) of the name, modulo 16: pinned, since a controller of another
        // version must put every name where this one did.
        let table = [("orders", 0xe52f_fdee_u32), ("stock", 0x4b36_5660), ("a", 0xe8b7_be43), ("", 0)];
        for (name, crc) in table {
            assert_eq!(crc32fast::hash(name.as_bytes()), crc, "{name:?}");
            assert_eq!(of(name), crc as usize % SHARDS, "{name:?}");
        }
        assert_eq!(name(0), "leasehold-client-leases-0");
        assert_eq!(names().last().as_deref(), Some("leasehold-client-leases-15"));
    }

    #[test]
    fn names_stay_in_the_client_role_up_to_the_budget_and_then_each_goes_to_its_own() {
        let two = set(&["orders", "stock"]); // 8 + 7 bytes
        type Row = (&'static str, BTreeSet<String>, usize, bool);
        let table: [Row; 5] = [
            ("no names", set(&[]), 0, false),
            ("under the budget", two.clone(), 16, false),
            ("exactly the budget", two.clone(), 15, false),
            ("one byte over", two.clone(), 14, true),
            ("a budget of nothing", set(&["a"]), 0, true),
        ];
        for (case, leases, budget, spread) in table {
            match layout(&leases, budget) {
                Layout::Together => assert!(!spread, "{case}: expected the names spread"),
                Layout::Spread(by_role) => {
                    assert!(spread, "{case}: expected the names together");
                    assert_eq!(by_role.len(), SHARDS, "{case}: one set per Lease Role");
                    for (index, names) in by_role.iter().enumerate() {
                        assert!(names.iter().all(|n| of(n) == index), "{case}: {names:?} in Lease Role {index}");
                    }
                    let all: BTreeSet<String> = by_role.into_iter().flatten().collect();
                    assert_eq!(all, leases, "{case}: every name in exactly one Lease Role");
                }
            }
        }
    }

    #[test]
    fn many_names_spread_evenly_enough_that_no_lease_role_holds_twice_its_share() {
        // 30,000 names of 57 characters: one Role naming them all is refused by etcd
        // ("request is too large") at its default limit.
        let leases: BTreeSet<String> =
            (0..30_000).map(|i| format!("payments-ledger-reconciliation-shard-{i:06}-primary-lock")).collect();
        let Layout::Spread(by_role) = layout(&leases, DEFAULT_BUDGET) else { panic!("30,000 names spread") };
        let share = weight(&leases) / SHARDS;
        for (index, names) in by_role.iter().enumerate() {
            assert!(weight(names) < 2 * share, "Lease Role {index}: {} bytes, share {share}", weight(names));
        }
    }
}

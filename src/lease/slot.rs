//! A lock's permits are slots, each granted through a Lease of its own: slot 0 is the
//! Lease named like the lock (a mutex has only that one), slot `i` the Lease
//! `<lock>.<i>`. Lock names are DNS labels, so they hold no dot and a slot Lease can never
//! be another lock's Lease. Every slot Lease carries the lock's labels, so the guard
//! protects it exactly as it protects the lock Lease, and the claimant trusts a slot Lease
//! only if its name, its `leasehold.dev/lock` label and its `leasehold.dev/slot` label
//! agree.

/// The most permits a lock may have: every waiting claimant watches each slot Lease, and
/// every slot is named in the claimants' Role.
pub const MAX_PERMITS: u32 = 64;

/// The name of slot `slot`'s Lease of lock `lock`.
pub fn lease_name(lock: &str, slot: u32) -> String {
    if slot == 0 { lock.to_owned() } else { format!("{lock}.{slot}") }
}

/// The slot a Lease named `name` is of lock `lock`, if it is one of its slot Leases.
pub fn of_lease_name(lock: &str, name: &str) -> Option<u32> {
    if name == lock {
        return Some(0);
    }
    let digits = name.strip_prefix(lock)?.strip_prefix('.')?;
    // One spelling per slot: no sign, no leading zero, no slot 0 by a second name.
    if digits.is_empty() || digits.starts_with('0') || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse().ok().filter(|slot| *slot < MAX_PERMITS)
}

/// Every slot Lease name of a lock with `permits` permits, slot 0 first.
pub fn lease_names(lock: &str, permits: u32) -> impl Iterator<Item = String> + '_ {
    (0..permits.clamp(1, MAX_PERMITS)).map(move |slot| lease_name(lock, slot))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slot_zero_is_the_lock_lease_and_others_are_numbered() {
        assert_eq!(lease_name("orders", 0), "orders");
        assert_eq!(lease_name("orders", 1), "orders.1");
        assert_eq!(lease_name("orders", 63), "orders.63");
        assert_eq!(lease_names("orders", 3).collect::<Vec<_>>(), ["orders", "orders.1", "orders.2"]);
        assert_eq!(lease_names("orders", 0).collect::<Vec<_>>(), ["orders"], "a lock has at least one slot");
    }

    #[test]
    fn a_name_is_a_slot_of_a_lock_only_in_its_one_spelling() {
        let cases = [
            ("orders", Some(0)),
            ("orders.1", Some(1)),
            ("orders.63", Some(63)),
            ("orders.64", None),
            ("orders.0", None),
            ("orders.01", None),
            ("orders.", None),
            ("orders.-1", None),
            ("orders.+1", None),
            ("orders.1a", None),
            ("orders-1", None),
            ("ordersx", None),
            ("order", None),
            ("other.1", None),
            ("orders.99999999999999999999", None),
        ];
        for (name, expected) in cases {
            assert_eq!(of_lease_name("orders", name), expected, "{name}");
        }
        for slot in 0..MAX_PERMITS {
            assert_eq!(of_lease_name("orders", &lease_name("orders", slot)), Some(slot));
        }
    }
}

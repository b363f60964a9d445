//! How many sandboxes of each key the warm pool keeps waiting: a pure function of the floors,
//! the claims in the window and the memory budget (so it is tested without a runtime).
//!
//! The rule, in order:
//! 1. Every floor (`warm_pool: {language: N}`, for the configured default shape) is kept, even
//!    beyond the budget: it is what the operator asked for.
//! 2. Fair share first: every key claimed in the window gets one waiting sandbox, most-claimed
//!    first, while the budget allows, before any key gets a second one.
//! 3. Then in proportion to claims (D'Hondt): the next sandbox goes to the key with the highest
//!    `claims / (target + 1)`, never beyond the key's own claims in the window nor `max_per_key`,
//!    while the budget allows.
//!
//! So a burst of one tenant's shape raises only its own target, out of what is left after one
//! sandbox per recently claimed key: it never takes the waiting sandbox of another key claimed
//! in the window. A key no longer claimed (and without a floor) gets 0: it drains.

use std::collections::BTreeMap;

/// One key's claim history and cost, as the sizing sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Demand<K> {
    pub key: K,
    /// Sandboxes kept whatever the budget (the configured default shape's `warm_pool`).
    pub floor: usize,
    /// Claims (hits and misses) in the window.
    pub claims: usize,
    /// Container memory of one waiting sandbox, MB.
    pub cost_mb: u64,
}

/// The target per key (keys with a target of 0 are left out).
pub fn targets<K: Ord + Clone>(
    demands: &[Demand<K>],
    budget_mb: u64,
    max_per_key: usize,
) -> BTreeMap<K, usize> {
    let mut target: Vec<usize> = demands.iter().map(|d| d.floor).collect();
    let mut used: u64 = demands
        .iter()
        .map(|d| d.cost_mb.saturating_mul(d.floor as u64))
        .sum();
    let fits = |used: u64, cost: u64| used.saturating_add(cost) <= budget_mb;
    // 2. One each, most-claimed first.
    let mut order: Vec<usize> = (0..demands.len())
        .filter(|&i| demands[i].claims > 0)
        .collect();
    order.sort_by(|&a, &b| demands[b].claims.cmp(&demands[a].claims));
    for &i in &order {
        if target[i] == 0 && max_per_key > 0 && fits(used, demands[i].cost_mb) {
            target[i] = 1;
            used += demands[i].cost_mb;
        }
    }
    // 3. D'Hondt over the claims.
    while let Some(i) = next_by_claims(demands, &target, max_per_key, |cost| fits(used, cost)) {
        target[i] += 1;
        used += demands[i].cost_mb;
    }
    demands
        .iter()
        .zip(target)
        .filter(|(_, n)| *n > 0)
        .map(|(d, n)| (d.key.clone(), n))
        .collect()
}

/// The key that deserves the next sandbox: highest `claims / (target + 1)` among those below
/// their claims and `max_per_key` that fit; ties go to the cheaper, then the earlier key.
fn next_by_claims<K>(
    demands: &[Demand<K>],
    target: &[usize],
    max_per_key: usize,
    fits: impl Fn(u64) -> bool,
) -> Option<usize> {
    let mut best: Option<usize> = None;
    for (i, d) in demands.iter().enumerate() {
        let t = target[i];
        if d.claims == 0 || t >= d.claims || t >= max_per_key || !fits(d.cost_mb) {
            continue;
        }
        let better = match best {
            None => true,
            Some(b) => {
                // claims_i / (t_i + 1) > claims_b / (t_b + 1), in integers.
                let lhs = d.claims as u128 * (target[b] as u128 + 1);
                let rhs = demands[b].claims as u128 * (t as u128 + 1);
                lhs > rhs || (lhs == rhs && d.cost_mb < demands[b].cost_mb)
            }
        };
        if better {
            best = Some(i);
        }
    }
    best
}

#[cfg(test)]
mod tests {
    use super::*;

    fn d(key: &'static str, floor: usize, claims: usize, cost_mb: u64) -> Demand<&'static str> {
        Demand {
            key,
            floor,
            claims,
            cost_mb,
        }
    }

    #[test]
    fn floors_are_kept_even_beyond_the_budget() {
        let t = targets(&[d("default", 3, 0, 512)], 1024, 8);
        assert_eq!(t, BTreeMap::from([("default", 3)]));
    }

    #[test]
    fn a_key_no_longer_claimed_drains() {
        let t = targets(&[d("default", 1, 0, 512), d("old", 0, 0, 256)], 4096, 8);
        assert_eq!(t, BTreeMap::from([("default", 1)]));
    }

    #[test]
    fn targets_follow_claims_in_proportion_within_the_budget() {
        // 2048 MB: floor 512 + 6 x 256 left. Claims 30:10:20 -> 3:1:2.
        let t = targets(
            &[
                d("default", 1, 0, 512),
                d("a", 0, 30, 256),
                d("b", 0, 10, 256),
                d("c", 0, 20, 256),
            ],
            2048,
            8,
        );
        assert_eq!(
            t,
            BTreeMap::from([("default", 1), ("a", 3), ("b", 1), ("c", 2)])
        );
    }

    #[test]
    fn a_burst_of_one_shape_does_not_take_every_other_keys_sandbox() {
        // One tenant claims its shape 1000 times, three others a few times each.
        let demands = [
            d("burst", 0, 1000, 256),
            d("x", 0, 1, 256),
            d("y", 0, 2, 256),
            d("z", 0, 3, 512),
        ];
        let t = targets(&demands, 2048, 16);
        assert_eq!(t["x"], 1);
        assert_eq!(t["y"], 1);
        assert_eq!(t["z"], 1);
        // The rest of the budget is the burst's: 2048 - 256 - 256 - 512 = 1024 = 4 x 256.
        assert_eq!(t["burst"], 4);
    }

    #[test]
    fn never_more_than_a_key_was_claimed_nor_max_per_key() {
        let t = targets(&[d("a", 0, 2, 100), d("b", 0, 50, 100)], 100_000, 5);
        assert_eq!(t, BTreeMap::from([("a", 2), ("b", 5)]));
    }

    #[test]
    fn a_key_too_big_for_what_is_left_is_skipped_not_blocking_others() {
        let t = targets(&[d("big", 0, 10, 4096), d("small", 0, 1, 128)], 1024, 8);
        assert_eq!(t, BTreeMap::from([("small", 1)]));
    }

    #[test]
    fn no_budget_means_only_floors() {
        let t = targets(&[d("default", 1, 9, 512), d("a", 0, 9, 128)], 0, 8);
        assert_eq!(t, BTreeMap::from([("default", 1)]));
    }
}

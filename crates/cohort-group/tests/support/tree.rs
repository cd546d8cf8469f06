//! The LKH tree checks, shared by the tests that run the LKH rekey: every key on a live
//! member's path is held by no one outside its view (forward secrecy over every tree key,
//! not only the group key), every tree key a member ever held comes from a rekey whose view
//! it installed (backward secrecy), and the members of a converged view agree on the group
//! key and the root.

use super::Group;
use cohort_group::{GroupEvent, GroupMember, MemberId};
use cohort_sim::SimFailure;
use std::collections::{BTreeSet, HashSet};

/// (coordinator, key epoch) of every view whose coordinator left itself out: a member
/// that asked to leave while it coordinated draws the next keys itself before it goes (as
/// with every rekey method: the group key too). The tree check lets it hold them; the
/// report to the lead names this.
pub fn left_as_coordinator<'a>(
    events: impl Iterator<Item = &'a GroupEvent>,
) -> HashSet<(MemberId, u64)> {
    events
        .filter_map(|e| match e {
            GroupEvent::View(v) if !v.contains(&v.id.coordinator) => {
                Some((v.id.coordinator, v.key_epoch))
            }
            _ => None,
        })
        .collect()
}

/// The tree checks over `members` (each with whether it is live, and its index for the
/// messages). `exchanged`: group keys that went to another component on purpose.
pub fn check_tree(
    members: &[(usize, bool, &GroupMember)],
    exchanged: &HashSet<[u8; 8]>,
    left: &HashSet<(MemberId, u64)>,
) -> Result<(), String> {
    for (i, live, m) in members {
        // Every tree key this member held comes from a rekey whose view it installed.
        let epochs: BTreeSet<u64> = m.key_ledger().iter().map(|(e, _)| *e).collect();
        for (node, version, _) in m.tree_key_ledger() {
            if !epochs.contains(version) && !left.contains(&(m.id(), *version)) {
                return Err(format!(
                    "node {i} holds tree key {node:?} version {version} but never installed \
                     key epoch {version} (epochs {epochs:?})"
                ));
            }
        }
        if !live {
            continue;
        }
        let (Some(view), Some(fp)) = (m.view(), m.key_fingerprint()) else {
            continue;
        };
        let path = m.tree_path();
        if let Some((root, version, _)) = path.last() {
            if *version != view.key_epoch || root.index != 0 {
                // A path from another component or method; the group key came otherwise.
                continue;
            }
        } else {
            continue;
        }
        if exchanged.contains(&fp) {
            continue;
        }
        // No one outside this member's view holds any key on its path.
        for (j, _, other) in members {
            if view.contains(&other.id()) {
                continue;
            }
            let held: HashSet<[u8; 8]> = other.tree_key_ledger().iter().map(|e| e.2).collect();
            if let Some((node, version, _)) = path.iter().find(|e| held.contains(&e.2)) {
                return Err(format!(
                    "node {j}, outside node {i}'s view {}, holds its tree key {node:?} \
                     version {version}",
                    view.id
                ));
            }
        }
    }
    Ok(())
}

/// The members in `set` agree on the group key and on the root of the tree.
pub fn check_agree(members: &[&GroupMember]) -> Result<(), String> {
    let keys: BTreeSet<_> = members.iter().map(|m| m.key_fingerprint()).collect();
    // Compared by version and key only: after an Exchange the merged members may hold the
    // same root from two trees of different depths (each side reseeded under that key).
    let roots: BTreeSet<Option<(u64, [u8; 8])>> = members
        .iter()
        .map(|m| m.tree_path().last().map(|(_, v, fp)| (*v, *fp)))
        .collect();
    if keys.len() != 1 || roots.len() != 1 || roots.contains(&None) {
        return Err(format!("members disagree: keys {keys:?}, roots {roots:?}"));
    }
    let epoch = members[0].view().map(|v| v.key_epoch);
    let root = roots.into_iter().next().flatten().map(|r| r.0);
    if epoch != root {
        return Err(format!(
            "root version {root:?} is not the key epoch {epoch:?}"
        ));
    }
    Ok(())
}

/// The tree checks over the members in `started` (crashed ones count as not live), and
/// agreement on the group key and root among `set`.
pub fn tree_checks(g: &Group, started: &BTreeSet<usize>, set: &[usize]) -> Result<(), SimFailure> {
    let exchanged: HashSet<[u8; 8]> = g
        .nodes
        .iter()
        .flat_map(|n| g.sim.node(*n).member.exchanged_keys().to_vec())
        .collect();
    let members: Vec<(usize, bool, &GroupMember)> = started
        .iter()
        .map(|i| (*i, !g.crashed.contains(i), &g.sim.node(g.nodes[*i]).member))
        .collect();
    let per_node = g.event_refs_per_node();
    let left = left_as_coordinator(per_node.iter().flatten().copied());
    check_tree(&members, &exchanged, &left).map_err(|e| g.sim.failure(e))?;
    let agreeing: Vec<&GroupMember> = set
        .iter()
        .map(|i| &g.sim.node(g.nodes[*i]).member)
        .collect();
    check_agree(&agreeing).map_err(|e| g.sim.failure(e))
}

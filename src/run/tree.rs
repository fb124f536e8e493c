//! The processes below a process: read from `/proc`, so that a command's whole tree can be
//! signalled — including processes that left its process group (`setsid`, job control),
//! which a group signal would miss.

use std::collections::HashMap;

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

/// The parent pid and state letter of a `/proc/<pid>/stat` line.
///
/// The command name (second field) is in parentheses and may itself contain spaces and
/// parentheses, so the fields are counted from the last `)`.
pub fn parse_stat(stat: &str) -> Option<(i32, char)> {
    let rest = &stat[stat.rfind(')')? + 1..];
    let mut fields = rest.split_whitespace();
    let state = fields.next()?.chars().next()?;
    let ppid = fields.next()?.parse().ok()?;
    Some((ppid, state))
}

/// Every descendant of `root` in a parent map (child → parent), parents before children.
pub fn descendants_in(parents: &HashMap<i32, i32>, root: i32) -> Vec<i32> {
    let mut children: HashMap<i32, Vec<i32>> = HashMap::new();
    for (&child, &parent) in parents {
        children.entry(parent).or_default().push(child);
    }
    let mut found = Vec::new();
    let mut next = vec![root];
    while let Some(pid) = next.pop() {
        for &child in children.get(&pid).into_iter().flatten() {
            // A pid seen twice would be a cycle in a torn read of /proc: stop there.
            if child != root && !found.contains(&child) {
                found.push(child);
                next.push(child);
            }
        }
    }
    found
}

/// The live (not zombie) processes below `root`, as `/proc` shows them now.
pub fn descendants(root: Pid) -> Vec<Pid> {
    let Ok(entries) = std::fs::read_dir("/proc") else { return Vec::new() };
    let mut parents = HashMap::new();
    for entry in entries.flatten() {
        let Some(pid) = entry.file_name().to_str().and_then(|n| n.parse::<i32>().ok()) else { continue };
        // A process may exit between listing and reading: skip it.
        let Ok(stat) = std::fs::read_to_string(entry.path().join("stat")) else { continue };
        if let Some((ppid, state)) = parse_stat(&stat)
            && state != 'Z'
            && state != 'X'
        {
            parents.insert(pid, ppid);
        }
    }
    descendants_in(&parents, root.as_raw()).into_iter().map(Pid::from_raw).collect()
}

/// Sends `signal` to every live process below `root`; returns how many were signalled.
pub fn signal_descendants(root: Pid, signal: Signal) -> usize {
    let below = descendants(root);
    for &pid in &below {
        // Gone meanwhile is fine.
        let _ = kill(pid, signal);
    }
    below.len()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_lines() {
        assert_eq!(parse_stat("42 (sh) S 7 42 42 0 -1"), Some((7, 'S')));
        assert_eq!(parse_stat("43 (a) b) (c) Z 1 43 43"), Some((1, 'Z')));
        assert_eq!(parse_stat("44 (sleep 1000) R 43 1"), Some((43, 'R')));
        for bad in ["", "45 (x", "46 (x) S", "47 (x) S notanumber"] {
            assert_eq!(parse_stat(bad), None, "{bad}");
        }
    }

    #[test]
    fn descendants_of_a_tree() {
        // 1 ─ 10 ─ 11 ─ 12        (12 left the group: still below 10)
        //       └ 13
        // 1 ─ 20                    (unrelated)
        let parents: HashMap<i32, i32> = [(10, 1), (11, 10), (12, 11), (13, 10), (20, 1)].into_iter().collect();
        let mut below = descendants_in(&parents, 10);
        below.sort_unstable();
        assert_eq!(below, [11, 12, 13]);
        assert!(descendants_in(&parents, 12).is_empty());
        assert!(descendants_in(&parents, 99).is_empty());
        // A torn read that shows a cycle ends.
        let cycle: HashMap<i32, i32> = [(30, 31), (31, 30)].into_iter().collect();
        assert_eq!(descendants_in(&cycle, 30), [31]);
    }

    #[test]
    fn this_process_finds_its_child() {
        let mut child = std::process::Command::new("sleep").arg("30").spawn().expect("spawn sleep");
        let pid = Pid::from_raw(i32::try_from(child.id()).expect("a pid"));
        assert!(descendants(Pid::this()).contains(&pid));
        kill(pid, Signal::SIGKILL).expect("kill");
        child.wait().expect("reaped");
        assert!(!descendants(Pid::this()).contains(&pid));
    }
}

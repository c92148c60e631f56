//! The dynamic scheduler's decisions, modelled on SPDK's
//! `scheduler_dynamic`. Pure: thread 0 feeds it the loads it gathered from
//! every thread over the last period and gets back the moves to make (the
//! message plumbing is in the reactor).
//!
//! Two passes over the threads:
//!
//! 1. Spread. A thread busier than [`heavy_load`] hands movable pollers out,
//!    one at a time while it stays over the limit: each time the move that
//!    lowers the larger of the two loads (source after, target after) the
//!    most, by at least [`MIN_GAIN`]. A poller goes to its home thread if
//!    it fits there (home load plus its share at most [`fit_load`]), else
//!    to the least loaded thread. A poller whose share is (nearly) all of
//!    its thread's load stays: moving it would only move the load.
//! 2. Consolidate. A thread at most [`light_load`] busy, other than thread
//!    0, whose movable pollers all fit on lower threads (lowest first, each
//!    target's projected load staying at most [`fit_load`]) hands them all
//!    over, so it empties and sleeps. Threads that gave or took pollers in
//!    pass 1 sit this pass out.
//!
//! Loads are projected as moves are chosen (a move takes the poller's share
//! off its source and adds it to its target), so one round never
//! overfills a thread. Against ping-pong: `fit_load < heavy_load` (a
//! consolidated thread is not over the heavy limit unless load rises),
//! `light_load < heavy_load`, a poller that moved stays put for
//! [`min_dwell`] periods (the planner marks it not `eligible`), and the
//! reactor plans nothing until a full period has passed after the last
//! move landed.
//!
//! [`heavy_load`]: crate::SchedulerOptions::heavy_load
//! [`light_load`]: crate::SchedulerOptions::light_load
//! [`fit_load`]: crate::SchedulerOptions::fit_load
//! [`min_dwell`]: crate::SchedulerOptions::min_dwell

use crate::{Error, PollerId, SchedulerOptions};

/// A spreading move must lower the larger of the two loads by at least
/// this share of a core.
pub(crate) const MIN_GAIN: f64 = 0.01;

/// One thread's load over the last period.
#[derive(Clone, Debug, Default)]
pub(crate) struct ThreadLoad {
    /// Busy share of its time (0..=1).
    pub(crate) load: f64,
    pub(crate) movable: Vec<MovableLoad>,
}

/// One movable poller's load over the last period.
#[derive(Clone, Copy, Debug)]
pub(crate) struct MovableLoad {
    pub(crate) id: PollerId,
    /// Busy time inside it over wall time (0..=1).
    pub(crate) share: f64,
    pub(crate) home: usize,
    /// Whether it may move this round (its dwell time has passed).
    pub(crate) eligible: bool,
}

/// Move poller `id` from thread `from` to thread `to`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Move {
    pub(crate) id: PollerId,
    pub(crate) from: usize,
    pub(crate) to: usize,
}

/// Checks the options; the error names the option and its value.
pub(crate) fn validate(o: &SchedulerOptions) -> Result<(), Error> {
    let bad = |option: &'static str, value: String, reason: &'static str| {
        Err(Error::SchedulerOption {
            option,
            value,
            reason,
        })
    };
    if o.period.is_zero() {
        return bad("period", format!("{:?}", o.period), "must be positive");
    }
    for (option, v) in [
        ("light_load", o.light_load),
        ("fit_load", o.fit_load),
        ("heavy_load", o.heavy_load),
    ] {
        if !(0.0..=1.0).contains(&v) {
            return bad(option, v.to_string(), "must be a share between 0 and 1");
        }
    }
    if o.light_load >= o.heavy_load {
        return bad(
            "light_load",
            o.light_load.to_string(),
            "must be below heavy_load (hysteresis)",
        );
    }
    if o.fit_load >= o.heavy_load {
        return bad(
            "fit_load",
            o.fit_load.to_string(),
            "must be below heavy_load (hysteresis)",
        );
    }
    Ok(())
}

/// The moves for this round (see the module docs).
pub(crate) fn plan(threads: &[ThreadLoad], o: &SchedulerOptions) -> Vec<Move> {
    let n = threads.len();
    let mut proj: Vec<f64> = threads.iter().map(|t| t.load.clamp(0.0, 1.0)).collect();
    let share = |m: &MovableLoad| m.share.clamp(0.0, 1.0);
    // Pollers still free to move this round, per thread.
    let mut free: Vec<Vec<MovableLoad>> = threads
        .iter()
        .map(|t| t.movable.iter().filter(|m| m.eligible).copied().collect())
        .collect();
    let mut gave = vec![false; n];
    let mut took = vec![false; n];
    let mut moves = Vec::new();

    // 1. Spread, busiest thread first.
    let mut order: Vec<usize> = (0..n).collect();
    order.sort_by(|&a, &b| proj[b].total_cmp(&proj[a]));
    for t in order {
        while proj[t] > o.heavy_load {
            // (index in free[t], target, larger load after, goes home)
            let mut best: Option<(usize, usize, f64, bool)> = None;
            for (k, m) in free[t].iter().enumerate() {
                let s = share(m);
                // The rest of the thread's load must be real work, or the
                // move only carries the load elsewhere.
                if proj[t] - s < o.light_load {
                    continue;
                }
                let Some(to) = spread_target(m, s, t, &proj, o) else {
                    continue;
                };
                let after = (proj[t] - s).max(proj[to] + s);
                if after > proj[t] - MIN_GAIN {
                    continue;
                }
                let home = to == m.home;
                let better = match best {
                    None => true,
                    Some((_, _, b_after, b_home)) => {
                        after < b_after - 1e-9 || (after <= b_after + 1e-9 && home && !b_home)
                    }
                };
                if better {
                    best = Some((k, to, after, home));
                }
            }
            let Some((k, to, _, _)) = best else {
                break;
            };
            let m = free[t].remove(k);
            let s = share(&m);
            proj[t] -= s;
            proj[to] += s;
            gave[t] = true;
            took[to] = true;
            moves.push(Move {
                id: m.id,
                from: t,
                to,
            });
        }
    }

    // 2. Consolidate light threads onto lower ones, lowest first.
    for t in 1..n {
        let all = &threads[t].movable;
        if gave[t] || took[t] || proj[t] > o.light_load || all.is_empty() {
            continue;
        }
        if all.iter().any(|m| !m.eligible) {
            continue; // it would not empty: wait for the dwell to pass
        }
        let mut sorted = all.clone();
        sorted.sort_by(|a, b| share(b).total_cmp(&share(a)));
        let mut trial = proj.clone();
        let mut placed = Vec::with_capacity(sorted.len());
        for m in &sorted {
            let s = share(m);
            let Some(to) = (0..t).find(|&u| !gave[u] && trial[u] + s <= o.fit_load) else {
                break;
            };
            trial[to] += s;
            trial[t] -= s;
            placed.push(Move {
                id: m.id,
                from: t,
                to,
            });
        }
        if placed.len() != sorted.len() {
            continue; // not all fit: the thread would stay in use anyway
        }
        proj = trial;
        gave[t] = true;
        for mv in &placed {
            took[mv.to] = true;
        }
        moves.extend(placed);
    }
    moves
}

/// Where a poller of share `s` on the heavy thread `t` would go: home if
/// it fits there, else the least loaded other thread (lowest index on a
/// tie); None with a single thread.
fn spread_target(
    m: &MovableLoad,
    s: f64,
    t: usize,
    proj: &[f64],
    o: &SchedulerOptions,
) -> Option<usize> {
    if m.home != t && m.home < proj.len() && proj[m.home] + s <= o.fit_load {
        return Some(m.home);
    }
    (0..proj.len())
        .filter(|&u| u != t)
        .min_by(|&a, &b| proj[a].total_cmp(&proj[b]))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn opts() -> SchedulerOptions {
        SchedulerOptions::default()
    }

    fn p(id: u64, share: f64, home: usize) -> MovableLoad {
        MovableLoad {
            id: PollerId(id),
            share,
            home,
            eligible: true,
        }
    }

    fn t(load: f64, movable: Vec<MovableLoad>) -> ThreadLoad {
        ThreadLoad { load, movable }
    }

    fn mv(id: u64, from: usize, to: usize) -> Move {
        Move {
            id: PollerId(id),
            from,
            to,
        }
    }

    #[test]
    fn light_threads_consolidate_onto_the_lowest_that_fits() {
        let loads = [
            t(0.05, vec![p(1, 0.05, 0)]),
            t(0.1, vec![p(2, 0.05, 1), p(3, 0.04, 1)]),
            t(0.0, vec![p(4, 0.0, 2)]),
        ];
        let mut got = plan(&loads, &opts());
        got.sort_by_key(|m| m.id.0);
        assert_eq!(got, vec![mv(2, 1, 0), mv(3, 1, 0), mv(4, 2, 0)]);
    }

    #[test]
    fn consolidation_respects_fit_load_and_moves_all_or_nothing() {
        // Thread 0 has room for 0.1: thread 1's pair (0.15 + 0.04) does
        // not all fit, so it keeps both; thread 2's poller fits on thread 0.
        let loads = [
            t(0.7, vec![]),
            t(0.19, vec![p(2, 0.15, 1), p(3, 0.04, 1)]),
            t(0.02, vec![p(4, 0.02, 2)]),
        ];
        assert_eq!(plan(&loads, &opts()), vec![mv(4, 2, 0)]);
        // No room on thread 0: thread 2's poller goes to thread 1, which
        // stays in use.
        let loads = [
            t(0.79, vec![]),
            t(0.19, vec![p(2, 0.15, 1), p(3, 0.04, 1)]),
            t(0.02, vec![p(4, 0.02, 2)]),
        ];
        assert_eq!(plan(&loads, &opts()), vec![mv(4, 2, 1)]);
    }

    #[test]
    fn a_poller_in_its_dwell_keeps_its_thread_from_emptying() {
        let mut young = p(3, 0.0, 0);
        young.eligible = false;
        let loads = [t(0.0, vec![]), t(0.0, vec![p(2, 0.0, 1), young])];
        assert!(plan(&loads, &opts()).is_empty());
    }

    #[test]
    fn threads_between_light_and_heavy_stay() {
        let loads = [t(0.3, vec![p(1, 0.3, 0)]), t(0.4, vec![p(2, 0.4, 1)])];
        assert!(plan(&loads, &opts()).is_empty());
    }

    #[test]
    fn a_heavy_thread_spreads_home_first_one_at_a_time() {
        // Four spinners consolidated on thread 0, homes 0, 0, 1, 1.
        let loads = [
            t(
                1.0,
                vec![p(1, 0.25, 0), p(2, 0.25, 0), p(3, 0.25, 1), p(4, 0.25, 1)],
            ),
            t(0.0, vec![]),
        ];
        // One move brings thread 0 under heavy_load; it goes home.
        assert_eq!(plan(&loads, &opts()), vec![mv(3, 0, 1)]);
    }

    #[test]
    fn spreading_picks_the_move_that_balances_best_and_keeps_going() {
        // 0.5 + 0.3 + 0.2 on thread 0; threads 1 and 2 idle.
        let loads = [
            t(1.0, vec![p(1, 0.5, 0), p(2, 0.3, 0), p(3, 0.2, 0)]),
            t(0.0, vec![]),
            t(0.1, vec![]),
        ];
        // Moving 0.5 leaves max(0.5, 0.5); then thread 0 is not heavy.
        assert_eq!(plan(&loads, &opts()), vec![mv(1, 0, 1)]);
        // Lower limits: after the first move thread 0 (0.5) is still over
        // the limit; then moving 0.2 to thread 2 (max 0.3) beats moving
        // 0.3 there (max 0.4).
        let o = SchedulerOptions {
            heavy_load: 0.45,
            fit_load: 0.4,
            light_load: 0.1,
            ..opts()
        };
        let loads = [
            t(1.0, vec![p(1, 0.5, 0), p(2, 0.3, 0), p(3, 0.2, 0)]),
            t(0.0, vec![]),
            t(0.1, vec![]),
        ];
        assert_eq!(plan(&loads, &o), vec![mv(1, 0, 1), mv(3, 0, 2)]);
    }

    #[test]
    fn a_lone_spinner_is_not_moved_around() {
        let loads = [t(1.0, vec![p(1, 0.97, 0)]), t(0.0, vec![])];
        assert!(plan(&loads, &opts()).is_empty());
        // Two saturated threads, 3 and 1 spinners: no move helps.
        let loads = [
            t(1.0, vec![p(1, 0.33, 0), p(2, 0.33, 0), p(3, 0.33, 1)]),
            t(1.0, vec![p(4, 0.99, 1)]),
        ];
        assert!(plan(&loads, &opts()).is_empty());
    }

    #[test]
    fn spread_then_consolidation_in_one_round_do_not_cross() {
        // Thread 0 heavy, thread 1 light with a poller: thread 1 takes from
        // thread 0 and so does not empty onto it this round.
        let loads = [
            t(1.0, vec![p(1, 0.5, 0), p(2, 0.5, 1)]),
            t(0.05, vec![p(3, 0.05, 1)]),
        ];
        assert_eq!(plan(&loads, &opts()), vec![mv(2, 0, 1)]);
    }

    #[test]
    fn single_thread_plans_nothing() {
        let loads = [t(1.0, vec![p(1, 0.5, 0), p(2, 0.5, 0)])];
        assert!(plan(&loads, &opts()).is_empty());
    }

    #[test]
    fn bad_options_are_refused_by_name() {
        let cases: [(SchedulerOptions, &str); 5] = [
            (
                SchedulerOptions {
                    period: Duration::ZERO,
                    ..opts()
                },
                "period",
            ),
            (
                SchedulerOptions {
                    heavy_load: 1.5,
                    ..opts()
                },
                "heavy_load",
            ),
            (
                SchedulerOptions {
                    light_load: f64::NAN,
                    ..opts()
                },
                "light_load",
            ),
            (
                SchedulerOptions {
                    light_load: 0.95,
                    ..opts()
                },
                "light_load",
            ),
            (
                SchedulerOptions {
                    fit_load: 0.9,
                    heavy_load: 0.9,
                    ..opts()
                },
                "fit_load",
            ),
        ];
        for (o, name) in cases {
            match validate(&o) {
                Err(Error::SchedulerOption { option, .. }) => assert_eq!(option, name, "{o:?}"),
                other => panic!("{o:?}: {other:?}"),
            }
        }
        validate(&opts()).unwrap();
    }
}

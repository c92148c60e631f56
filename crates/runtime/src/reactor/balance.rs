//! Movable pollers and thread 0's scheduler rounds (the plan itself is
//! `crate::sched::plan`).

use super::ctx::{Counters, Moving, PollerBox, PollerEntry, PollerId, ThreadCtx};
use crate::sched::{self, MovableLoad, Move, ThreadLoad};
use crate::Poll;

impl ThreadCtx {
    /// Registers a poller the scheduler (see
    /// [`RuntimeOptions::scheduler`](crate::RuntimeOptions::scheduler)) may
    /// move to another thread, keeping its id and counters: it must be
    /// `Send` and must not rely on which thread runs it (it reads
    /// [`index`](Self::index) to know). It can remove itself with
    /// [`unregister_poller`](Self::unregister_poller) wherever it runs.
    /// This thread is its home: when load rises, the scheduler sends it
    /// back here first if it fits (see
    /// [`SchedulerOptions`](crate::SchedulerOptions)). Timers, drain
    /// callbacks and wake descriptors stay on the thread that registered
    /// them.
    pub fn register_movable_poller(
        &mut self,
        name: impl Into<String>,
        f: impl FnMut(&mut ThreadCtx) -> Poll + Send + 'static,
    ) -> PollerId {
        let id = PollerId(self.fresh_id());
        self.adopt(Moving {
            id,
            name: name.into(),
            f: Box::new(f),
            c: Counters::new(self.me.index, self.now),
        });
        id
    }

    fn adopt(&mut self, m: Moving) {
        self.pollers.push(PollerEntry {
            id: m.id,
            name: m.name,
            f: Some(PollerBox::Movable(m.f)),
            c: m.c,
            movable: true,
            removed: false,
        });
    }

    /// Takes movable poller `id` out to send it to another thread (from a
    /// message, between poller passes); None if it is not here, was
    /// removed or is not movable.
    fn take_poller(&mut self, id: PollerId) -> Option<Moving> {
        let k = self
            .pollers
            .iter()
            .position(|p| p.id == id && !p.removed && p.movable && p.f.is_some())?;
        let p = self.pollers.remove(k);
        match p.f {
            Some(PollerBox::Movable(f)) => Some(Moving {
                id: p.id,
                name: p.name,
                f,
                c: p.c,
            }),
            _ => None,
        }
    }

    /// The share of time busy since the last call (0..=1).
    fn load_since_last(&mut self) -> f64 {
        let s = &self.stats;
        let (busy, total) = (s.busy, s.busy + s.idle + s.asleep);
        let (b0, t0) = std::mem::replace(&mut self.load_mark, (busy, total));
        let dt = total.saturating_sub(t0).as_secs_f64();
        if dt <= 0.0 {
            return 0.0;
        }
        (busy.saturating_sub(b0).as_secs_f64() / dt).min(1.0)
    }

    /// This thread's load and its movable pollers' busy shares since the
    /// last report (for the scheduler on thread 0).
    fn load_report(&mut self) -> ThreadLoad {
        let load = self.load_since_last();
        let now = self.now;
        let movable = self
            .pollers
            .iter_mut()
            .filter(|p| !p.removed && p.movable)
            .map(|p| {
                let (t0, b0) = std::mem::replace(&mut p.c.mark, (now, p.c.busy));
                let dt = now.saturating_duration_since(t0).as_secs_f64();
                let share = if dt > 0.0 {
                    (p.c.busy.saturating_sub(b0).as_secs_f64() / dt).min(1.0)
                } else {
                    0.0
                };
                MovableLoad {
                    id: p.id,
                    share,
                    home: p.c.home,
                    eligible: true,
                }
            })
            .collect();
        ThreadLoad { load, movable }
    }

    /// The scheduler tick (a periodic timer on thread 0 when the scheduler
    /// is on): starts a round by asking every thread for its load report.
    pub(super) fn scheduler_tick(&mut self) {
        if self.draining {
            return;
        }
        let n = self.thread_count();
        let Some(pl) = self.planner.as_mut() else {
            return;
        };
        if pl.waiting > 0 {
            return; // the last round's reports are not all in yet
        }
        pl.round += 1;
        let round = pl.round;
        pl.waiting = n;
        pl.loads = vec![ThreadLoad::default(); n];
        let mine = self.load_report();
        self.on_load_report(round, 0, mine);
        for i in 1..n {
            let r = self.call(
                i,
                |ctx| ctx.load_report(),
                move |main, load| main.on_load_report(round, i, load),
            );
            if let Err(e) = r {
                tracing::debug!(thread = i, "scheduler: round {round} abandoned: {e}");
                if let Some(pl) = self.planner.as_mut() {
                    // Late reports of this round are ignored.
                    pl.round += 1;
                    pl.waiting = 0;
                }
                return;
            }
        }
    }

    /// Thread 0 takes thread `index`'s report; with the round's last one
    /// it plans and orders the moves.
    fn on_load_report(&mut self, round: u64, index: usize, load: ThreadLoad) {
        let Some(pl) = self.planner.as_mut() else {
            return;
        };
        if round != pl.round || pl.waiting == 0 || index >= pl.loads.len() {
            return;
        }
        pl.loads[index] = load;
        pl.waiting -= 1;
        if pl.waiting > 0 || pl.in_flight > 0 || round < pl.quiet_from || self.draining {
            return;
        }
        let dwell = u64::from(pl.opts.min_dwell);
        pl.moved_in_round.retain(|_, r| round - *r < dwell);
        for t in &mut pl.loads {
            for m in &mut t.movable {
                m.eligible = !pl.moved_in_round.contains_key(&m.id);
            }
        }
        let moves = sched::plan(&pl.loads, &pl.opts);
        if moves.is_empty() {
            return;
        }
        pl.in_flight += moves.len();
        for m in &moves {
            pl.moved_in_round.insert(m.id, round);
        }
        tracing::debug!(
            round,
            loads = ?pl.loads.iter().map(|t| t.load).collect::<Vec<_>>(),
            ?moves,
            "scheduler: moving pollers"
        );
        for Move { id, from, to } in moves {
            if let Err(e) = self.send(from, move |src| src.move_out(id, to)) {
                tracing::debug!(from, "scheduler: move not ordered: {e}");
                self.move_landed();
            }
        }
    }

    /// On the source thread: sends poller `id` to thread `to`.
    fn move_out(&mut self, id: PollerId, to: usize) {
        let target_gone = !matches!(self.producers.get(to), Some(p) if !p.is_abandoned());
        let taken = if target_gone || to == self.index() {
            None
        } else {
            self.take_poller(id)
        };
        let Some(m) = taken else {
            // Removed meanwhile, or the target has exited.
            self.report_landed();
            return;
        };
        self.stats.pollers_moved_out += 1;
        let from = self.index();
        if let Err(e) = self.send(to, move |dst| dst.move_in(m)) {
            // Only in a race with the target's exit at shutdown.
            tracing::warn!(from, to, "scheduler: poller dropped in transit: {e}");
            self.report_landed();
        }
    }

    /// On the target thread: adopts a moved poller.
    fn move_in(&mut self, mut m: Moving) {
        m.c.moves += 1;
        self.stats.pollers_moved_in += 1;
        self.adopt(m);
        self.report_landed();
    }

    fn report_landed(&mut self) {
        if let Err(e) = self.send(0, |main| main.move_landed()) {
            tracing::debug!(thread = self.index(), "scheduler: move report lost: {e}");
        }
    }

    /// On thread 0: a move ordered has completed (or was dropped).
    fn move_landed(&mut self) {
        if let Some(pl) = self.planner.as_mut() {
            pl.in_flight = pl.in_flight.saturating_sub(1);
            if pl.in_flight == 0 {
                // Loads of the next round were partly measured before
                // the move: plan again only with the one after.
                pl.quiet_from = pl.round + 2;
            }
        }
    }
}

//! Admission of sandboxes: at most `max_running` at once; the rest wait in per-tenant queues
//! served round-robin, so one tenant's burst cannot starve another; the total number waiting is
//! bounded, and so is each tenant's share of it (`max_queued_per_tenant`): one tenant filling
//! its share leaves room for the others. Beyond either bound requests are refused (429).

use std::collections::{BTreeMap, VecDeque};
use std::sync::{Arc, Mutex, PoisonError};

use tokio::sync::oneshot;

#[derive(Debug)]
pub struct Scheduler {
    max_running: usize,
    max_waiting: usize,
    max_waiting_per_tenant: usize,
    state: Mutex<State>,
}

#[derive(Debug, Default)]
struct State {
    running: usize,
    waiting: usize,
    queues: BTreeMap<String, VecDeque<oneshot::Sender<()>>>,
    /// The tenant served last; the next slot goes to the next tenant after it.
    last: Option<String>,
}

/// A running slot; dropping it hands the slot to the next waiting request.
#[derive(Debug)]
pub struct Slot {
    scheduler: Arc<Scheduler>,
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.scheduler.release();
    }
}

/// Why a request found no place: the whole queue or the tenant's share of it is full.
#[derive(Debug, Clone, Copy, PartialEq, thiserror::Error)]
pub enum QueueFull {
    #[error("{waiting} executions are already waiting for a slot")]
    All { waiting: usize },
    #[error(
        "this tenant already has {waiting} executions waiting for a slot (its share of the queue)"
    )]
    Tenant { waiting: usize },
}

/// A place in the queue, reserved before the decision is recorded.
#[derive(Debug)]
pub enum Ticket {
    Ready(Slot),
    Waiting(Arc<Scheduler>, oneshot::Receiver<()>),
}

impl Ticket {
    /// Waits for the slot. `None` if the scheduler went away (shutdown).
    pub async fn slot(self) -> Option<Slot> {
        match self {
            Ticket::Ready(slot) => Some(slot),
            Ticket::Waiting(scheduler, turn) => {
                turn.await.ok()?;
                Some(Slot { scheduler })
            }
        }
    }
}

impl Scheduler {
    pub fn new(
        max_running: usize,
        max_waiting: usize,
        max_waiting_per_tenant: usize,
    ) -> Arc<Scheduler> {
        Arc::new(Scheduler {
            max_running,
            max_waiting,
            max_waiting_per_tenant: max_waiting_per_tenant.min(max_waiting),
            state: Mutex::default(),
        })
    }

    /// A slot now, or a place in `tenant`'s queue, or `QueueFull`.
    pub fn admit(self: &Arc<Self>, tenant: &str) -> Result<Ticket, QueueFull> {
        let mut state = self.lock();
        if state.running < self.max_running && state.waiting == 0 {
            state.running += 1;
            return Ok(Ticket::Ready(Slot {
                scheduler: Arc::clone(self),
            }));
        }
        if state.waiting >= self.max_waiting {
            return Err(QueueFull::All {
                waiting: state.waiting,
            });
        }
        let mine = state.queues.get(tenant).map_or(0, VecDeque::len);
        if mine >= self.max_waiting_per_tenant {
            return Err(QueueFull::Tenant { waiting: mine });
        }
        let (tx, rx) = oneshot::channel();
        state
            .queues
            .entry(tenant.to_owned())
            .or_default()
            .push_back(tx);
        state.waiting += 1;
        Ok(Ticket::Waiting(Arc::clone(self), rx))
    }

    /// Nothing waits for a slot and fewer than half the slots run: the warm pool starts
    /// sandboxes only then, so refilling never delays or starves an execution.
    pub fn is_quiet(&self) -> bool {
        let state = self.lock();
        state.waiting == 0 && state.running * 2 < self.max_running
    }

    fn release(&self) {
        let mut state = self.lock();
        state.running -= 1;
        while state.running < self.max_running {
            let Some(tenant) = next_tenant(&state) else {
                return;
            };
            let Some(queue) = state.queues.get_mut(&tenant) else {
                return;
            };
            let next = queue.pop_front();
            if queue.is_empty() {
                state.queues.remove(&tenant);
            }
            state.last = Some(tenant);
            let Some(turn) = next else { continue };
            state.waiting -= 1;
            // The slot passes to the waiter; if it gave up (request dropped), try the next.
            state.running += 1;
            if turn.send(()).is_err() {
                state.running -= 1;
            }
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// Round-robin: the first tenant with waiters after the one served last.
fn next_tenant(state: &State) -> Option<String> {
    let after = state.last.as_deref();
    let later = state
        .queues
        .keys()
        .find(|tenant| after.is_some_and(|last| tenant.as_str() > last));
    later.or_else(|| state.queues.keys().next()).cloned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn tenants_take_turns_and_the_queue_is_bounded() {
        let scheduler = Scheduler::new(1, 4, 4);
        let running = scheduler.admit("a").unwrap().slot().await.unwrap();
        // Tenant a bursts three, tenant b sends one after them.
        let a1 = scheduler.admit("a").unwrap();
        let a2 = scheduler.admit("a").unwrap();
        let a3 = scheduler.admit("a").unwrap();
        let b1 = scheduler.admit("b").unwrap();
        assert_eq!(
            scheduler.admit("c").unwrap_err(),
            QueueFull::All { waiting: 4 }
        );

        let order = Arc::new(Mutex::new(Vec::new()));
        let mut tasks = Vec::new();
        for (name, ticket) in [("a1", a1), ("a2", a2), ("a3", a3), ("b1", b1)] {
            let order = Arc::clone(&order);
            tasks.push(tokio::spawn(async move {
                let slot = ticket.slot().await.unwrap();
                order.lock().unwrap().push(name);
                tokio::task::yield_now().await;
                drop(slot);
            }));
        }
        drop(running);
        for task in tasks {
            task.await.unwrap();
        }
        let order = order.lock().unwrap().clone();
        assert_eq!(order[0], "a1");
        assert_eq!(
            order[1], "b1",
            "b is served before a's burst continues: {order:?}"
        );
        assert_eq!(scheduler.lock().running, 0);
        assert_eq!(scheduler.lock().waiting, 0);
    }

    #[tokio::test]
    async fn one_tenant_filling_its_share_leaves_room_for_another() {
        let scheduler = Scheduler::new(1, 6, 2);
        let _running = scheduler.admit("a").unwrap().slot().await.unwrap();
        let _a1 = scheduler.admit("a").unwrap();
        let _a2 = scheduler.admit("a").unwrap();
        assert_eq!(
            scheduler.admit("a").unwrap_err(),
            QueueFull::Tenant { waiting: 2 }
        );
        let _b1 = scheduler.admit("b").unwrap();
        let _b2 = scheduler.admit("b").unwrap();
        assert_eq!(
            scheduler.admit("b").unwrap_err(),
            QueueFull::Tenant { waiting: 2 }
        );
        let _c1 = scheduler.admit("c").unwrap();
        let _c2 = scheduler.admit("c").unwrap();
        assert_eq!(
            scheduler.admit("d").unwrap_err(),
            QueueFull::All { waiting: 6 }
        );
    }
}

//! The warm pool's refill: one task keeps every key at its target, only while the scheduler is
//! quiet, one boot at a time or up to [`RESTORES_AT_ONCE`] restores; each waiting sandbox has a keeper ([`Watched`]) that hands it
//! to its claim or removes it. A start boots a sandbox ([`start_one`]), or, where checkpoints
//! are available, restores the key's preloaded template ([`super::pool_restore`]).

use std::sync::Arc;

use tokio::sync::oneshot;
use tokio::task::JoinSet;

use super::home::SandboxHome;
use super::pool::{ClaimReply, Claimed, PoolKey, Waiting, WarmPool, IDLE_CHECK};
use super::App;
use crate::runtime::{Owner, Sandbox, SandboxPlan};

/// Keeps every key at its target until shutdown, one start at a time, only while an execution
/// slot is free; a key whose starts fail is retried with back-off (1 s doubling to 30 s) while
/// the others go on.
pub async fn refill(app: Arc<App>) {
    let pool = Arc::clone(&app.pool);
    if !pool.enabled() {
        return;
    }
    keep_filled(&app, &pool).await;
    // Templates hold a preloaded interpreter's memory on disk: none outlives the gateway.
    pool.restore.clear();
}

/// Restores that may run at once, each of a different key's template (two of one template
/// collide in containerd: see `keep_filled`): two keep both cores busy here
/// (docs/performance.md). A boot (or a template being made) runs alone, as before: its imports
/// are CPU-bound.
pub const RESTORES_AT_ONCE: usize = 2;

async fn keep_filled(app: &Arc<App>, pool: &Arc<WarmPool>) {
    let mut starts = JoinSet::new();
    // Starts in flight that boot (at most one, and then nothing else starts).
    let mut booting = 0_usize;
    loop {
        if app.shutdown.is_cancelled() {
            break;
        }
        let room = booting == 0 && starts.len() < RESTORES_AT_ONCE;
        let next = if room && app.scheduler.is_quiet() {
            pool.next_to_start()
        } else {
            None
        };
        if let Some(starting) = next {
            // Restores of one template never run side by side: dockerd 20.10 uploads the image
            // to containerd's content store on each start, and two uploads of the same bytes
            // fail ("commit failed: content sha256:...: already exists"), seen here.
            let restores =
                pool.restore.ready(&starting.key) && pool.starting_of(&starting.key) == 1;
            if restores || starts.is_empty() {
                booting += usize::from(!restores);
                let at_once = starts.len() + 1;
                let (app, pool) = (Arc::clone(app), Arc::clone(pool));
                starts.spawn(async move {
                    let key = starting.key.clone();
                    let result = start_one(&app, &pool, key.clone(), at_once).await;
                    pool.started(&key, result);
                    drop(starting);
                    !restores
                });
                continue;
            }
            // A boot waits until the restores in flight are done.
        }
        tokio::select! {
            () = app.shutdown.cancelled() => break,
            Some(done) = starts.join_next(), if !starts.is_empty() => {
                booting = match done {
                    Ok(true) => booting.saturating_sub(1),
                    Ok(false) => booting,
                    // A panicked start: which kind is unknown; none can boot once all ended.
                    Err(_) => booting.min(starts.len()),
                };
            }
            () = pool.wake.notified() => {}
            () = tokio::time::sleep(IDLE_CHECK) => {}
        }
    }
    // Starts in flight end (bounded by the runtime's timeouts); their keepers see the shutdown
    // and remove what they started.
    while starts.join_next().await.is_some() {}
}

/// Starts one sandbox of `key` and leaves it waiting, watched, in the pool: restored from the
/// key's template where the pool refills by restore ([`super::pool_restore`]), else booted (a
/// failed restore boots instead, so a key never waits on a broken template). `at_once`: the
/// starts in flight when this one began, itself included.
async fn start_one(
    app: &Arc<App>,
    pool: &Arc<WarmPool>,
    key: PoolKey,
    at_once: usize,
) -> Result<(), String> {
    if let Some(template) = super::pool_restore::template_for(app, pool, &key).await {
        match super::pool_restore::restore_one(app, pool, &key, &template, at_once).await {
            Ok(()) => return Ok(()),
            Err(cause) => pool.restore.failed(&key, &cause),
        }
    }
    let (home, plan) = prepare(app, pool, &key)?;
    let (sandbox, home) = started(pool, home, app.runtime.start(plan).await)?;
    enlist(app, pool, key, sandbox, home);
    Ok(())
}

/// A new pooled sandbox's id (a member from now on), host directories and plan: the key's
/// container, the same whether it is booted or restored.
pub(super) fn prepare(
    app: &Arc<App>,
    pool: &Arc<WarmPool>,
    key: &PoolKey,
) -> Result<(SandboxHome, SandboxPlan), String> {
    let id = crate::ids::new("sb");
    // Known to the reaper before anything of it exists on the host.
    pool.lock().members.insert(id.clone());
    let home = match SandboxHome::create(&app.egress_root, &app.scratch_root, &id, key.disk_mb) {
        Ok(home) => home,
        Err(err) => {
            pool.lock().members.remove(&id);
            return Err(format!("preparing the sandbox's host directories: {err}"));
        }
    };
    let owner = Owner::Pool {
        language: key.language.clone(),
    };
    let mut plan = app.plan(&id, owner, &key.shape(), &home, pool.waits(key));
    plan.mounts = key.read_only_mounts();
    // The waiting interpreter's imports must not eat into what the decision grants the
    // program: the container gets room for them on top (see PRELOAD_MEMORY_MB).
    plan.limits.memory_mb = pool.cost_mb(key);
    Ok((home, plan))
}

/// The runtime's answer for a prepared sandbox; on failure its directories and membership go.
pub(super) fn started(
    pool: &WarmPool,
    home: SandboxHome,
    result: Result<Box<dyn Sandbox>, crate::runtime::RuntimeError>,
) -> Result<(Box<dyn Sandbox>, SandboxHome), String> {
    match result {
        Ok(sandbox) => Ok((sandbox, home)),
        Err(err) => {
            let id = home.id.clone();
            home.remove();
            pool.lock().members.remove(&id);
            Err(super::error_chain(&err))
        }
    }
}

/// Leaves a started sandbox waiting in the pool, under its keeper.
pub(super) fn enlist(
    app: &Arc<App>,
    pool: &Arc<WarmPool>,
    key: PoolKey,
    sandbox: Box<dyn Sandbox>,
    home: SandboxHome,
) {
    let (claim, claims) = oneshot::channel();
    {
        let mut state = pool.lock();
        // Still wanted (the demand may have moved while it started)? Else dropping `claim`
        // removes it.
        let target = state.targets.get(&key).copied().unwrap_or(0);
        let have = state.waiting.iter().filter(|w| w.key == key).count();
        if have < target {
            state.waiting.push(Waiting { key, claim });
        }
    }
    let watched = Watched {
        pool: Arc::clone(pool),
        sandbox,
        home,
    };
    app.tasks
        .spawn(watched.watch(claims, app.shutdown.child_token()));
}

/// A waiting sandbox's keeper: hands it to the claim, or removes it if it dies, is dropped
/// from the pool, or the gateway shuts down.
struct Watched {
    pool: Arc<WarmPool>,
    sandbox: Box<dyn Sandbox>,
    home: SandboxHome,
}

enum Event {
    Claim(Result<ClaimReply, oneshot::error::RecvError>),
    Died,
    Shutdown,
}

impl Watched {
    async fn watch(
        mut self,
        mut claims: oneshot::Receiver<ClaimReply>,
        shutdown: tokio_util::sync::CancellationToken,
    ) {
        // Death first: a sandbox whose end is already known is never handed out.
        let event = tokio::select! {
            biased;
            () = self.sandbox.closed() => Event::Died,
            () = shutdown.cancelled() => Event::Shutdown,
            claim = &mut claims => Event::Claim(claim),
        };
        // From here the pool's entry for this sandbox can no longer be claimed.
        drop(claims);
        match event {
            Event::Claim(Ok(reply)) => {
                let Watched {
                    pool,
                    sandbox,
                    home,
                } = self;
                if let Err(unclaimed) = reply.send(Claimed { sandbox, home }) {
                    Watched {
                        pool,
                        sandbox: unclaimed.sandbox,
                        home: unclaimed.home,
                    }
                    .remove()
                    .await;
                }
            }
            Event::Died => {
                tracing::warn!(sandbox = %self.home.id, "a pooled sandbox ended while waiting; removed");
                self.pool.wake.notify_one();
                self.remove().await;
            }
            Event::Claim(Err(_)) | Event::Shutdown => self.remove().await,
        }
    }

    async fn remove(self) {
        let id = self.home.id.clone();
        {
            // A sandbox that died is no longer claimable.
            let mut state = self.pool.lock();
            state.waiting.retain(|w| !w.claim.is_closed());
        }
        self.sandbox.discard().await;
        self.home.remove();
        self.pool.lock().members.remove(&id);
    }
}

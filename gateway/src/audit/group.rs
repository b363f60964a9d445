//! Group commit: callers queue their audit writes, one writer task per store appends what has
//! queued in one transaction (one chain-lock hold, one commit, one flush) and answers each
//! caller only after that commit. Durable before acting, as with one transaction each: a caller
//! returns `Ok` only once its rows are committed, and a failed batch fails every caller in it
//! (each gets [`AuditError::Batch`], the API's 503), so nothing of theirs runs.
//!
//! A lone caller waits for nothing: the writer takes whatever has queued when it is free, so
//! one writer's batch is one write (today's latency) and eight writers' batches are up to eight.
//!
//! What a batch costs: one durable commit (the WAL flush, which PostgreSQL does before it
//! releases the chain lock, so batches cannot overlap their flushes) and, for events after the
//! remembered head, one round trip. Each caller waits for its own commit, so with N callers a
//! batch holds at most N writes, and N writes per flush is the ceiling (`benches/audit.rs`
//! prints the flush and the batch it measures).

use sqlx::pool::PoolConnection;
use sqlx::{Connection, PgConnection, PgPool, Postgres};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use tokio::sync::{mpsc, oneshot};

use super::{chain, insert_execution, AuditError, ExecutionRow, NewEvent};

/// At most this many writes share one transaction.
pub const MAX_BATCH: usize = 256;
/// Writes waiting for the writer; past this, callers wait for room (backpressure).
const QUEUE: usize = 4096;

/// One write a caller queues: an event alone, or an execution row with its decision event.
#[derive(Debug)]
pub enum Write {
    Event(NewEvent),
    Decision(Box<ExecutionRow>, NewEvent),
}

impl Write {
    fn event(&self) -> &NewEvent {
        match self {
            Write::Event(event) | Write::Decision(_, event) => event,
        }
    }
}

struct Job {
    write: Write,
    /// The appended event's id once committed.
    reply: Reply,
}

/// The queue in front of a store's writer task, started on first use (so a store made outside
/// a runtime, or never written through, starts none). The task ends when the last store clone
/// holding the queue is dropped.
#[derive(Debug, Default)]
pub struct GroupWriter {
    queue: OnceLock<mpsc::Sender<Job>>,
    /// Batches committed so far (each one hold of the chain lock), for the benchmark.
    batches: Arc<AtomicU64>,
}

impl std::fmt::Debug for Job {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Job").field("write", &self.write).finish()
    }
}

impl GroupWriter {
    /// Batches committed by this writer so far.
    pub fn batches(&self) -> u64 {
        self.batches.load(Ordering::Relaxed)
    }

    /// Writes queued and not yet taken into a batch (none before the first write), so a test
    /// can tell that callers wait behind a held batch.
    pub fn queued(&self) -> usize {
        self.queue
            .get()
            .map_or(0, |queue| queue.max_capacity() - queue.capacity())
    }

    /// Queues `write` and waits for the commit of the batch it lands in.
    pub async fn submit(&self, pool: &PgPool, write: Write) -> Result<String, AuditError> {
        let queue = self.queue.get_or_init(|| {
            let (sender, receiver) = mpsc::channel(QUEUE);
            tokio::spawn(run(pool.clone(), receiver, Arc::clone(&self.batches)));
            sender
        });
        let (reply, answer) = oneshot::channel();
        queue
            .send(Job { write, reply })
            .await
            .map_err(|_| AuditError::Batch(Arc::new(sqlx::Error::PoolClosed)))?;
        match answer.await {
            Ok(Ok(id)) => Ok(id),
            Ok(Err(err)) => Err(AuditError::Batch(err)),
            Err(_) => Err(AuditError::Batch(Arc::new(sqlx::Error::PoolClosed))),
        }
    }
}

/// The writer: one batch at a time, each what queued while the previous one committed. It
/// remembers the head it committed last, so a batch of events is one round trip (the statement
/// takes the lock, inserts and commits: [`chain::append_locked`]) unless another writer
/// appended meanwhile.
async fn run(pool: PgPool, mut receiver: mpsc::Receiver<Job>, batches: Arc<AtomicU64>) {
    let mut batch = Vec::with_capacity(MAX_BATCH);
    let mut writer = Writer {
        pool,
        held: None,
        head: Remembered::default(),
    };
    let mut last = 0;
    loop {
        refill(&receiver, last).await;
        if receiver.is_empty() {
            writer.held = None;
        }
        if receiver.recv_many(&mut batch, MAX_BATCH).await == 0 {
            break;
        }
        last = batch.len();
        let (writes, replies): (Vec<Write>, Vec<_>) =
            batch.drain(..).map(|job| (job.write, job.reply)).unzip();
        match writer.commit(&writes).await {
            Ok(ids) => {
                batches.fetch_add(1, Ordering::Relaxed);
                answer_all(replies, ids);
            }
            Err(err) if writes.len() > 1 && refused_for_content(&err) => {
                // One write the database refuses for what it holds must not fail the others
                // with it: each is tried again on its own, and only what is refused fails.
                for (write, reply) in writes.into_iter().zip(replies) {
                    let alone = writer.commit(std::slice::from_ref(&write)).await;
                    let id = alone
                        .and_then(|ids| ids.into_iter().next().ok_or(sqlx::Error::RowNotFound));
                    let _ = reply.send(id.map_err(Arc::new));
                }
            }
            Err(err) => {
                tracing::warn!(error = %err, writes = writes.len(), "audit batch failed; every caller in it gets 503");
                let err = Arc::new(err);
                for reply in replies {
                    let _ = reply.send(Err(Arc::clone(&err)));
                }
            }
        }
    }
}

/// Yields before taking a batch, at most this many times.
const REFILL_YIELDS: usize = 4;

/// Lets the callers just answered queue their next write before the batch is taken: each
/// waited for its commit, so a caller that writes in a loop comes straight back, and without
/// this a batch is taken before most of them are scheduled (8 writers made batches of 6, one
/// flush each, instead of 8). Stops once as many writes as the last batch held are queued; a
/// lone caller costs a few yields, microseconds.
async fn refill(receiver: &mpsc::Receiver<Job>, last: usize) {
    for _ in 0..REFILL_YIELDS {
        if receiver.len() >= last {
            return;
        }
        tokio::task::yield_now().await;
    }
}

type Reply = oneshot::Sender<Result<String, Arc<sqlx::Error>>>;

fn answer_all(replies: Vec<Reply>, ids: Vec<String>) {
    for (reply, id) in replies.into_iter().zip(ids) {
        // A caller that stopped waiting still has its rows committed.
        let _ = reply.send(Ok(id));
    }
}

/// A data or integrity error: the content of some write, not the store, was refused.
fn refused_for_content(err: &sqlx::Error) -> bool {
    matches!(err, sqlx::Error::Database(db)
        if db.code().is_some_and(|code| code.starts_with("22") || code.starts_with("23")))
}

/// The last link this writer committed, and how many batches to come read the head instead
/// (another writer, e.g. another replica, appended recently: a remembered head would be stale).
#[derive(Debug, Default)]
struct Remembered {
    head: Option<chain::Head>,
    read_first: u32,
}

/// Batches that read the head after one found the remembered head stale.
const READ_AFTER_STALE: u32 = 32;

/// The writer task's state between batches.
struct Writer {
    pool: PgPool,
    /// The last batch's connection, kept only while more writes are queued (an idle writer
    /// holds none, so closing the pool never waits for it), which spares the pool's test.
    held: Option<PoolConnection<Postgres>>,
    head: Remembered,
}

impl Writer {
    /// Writes one batch in one transaction: the execution rows, then every event, chained in
    /// queue order under one hold of the chain lock, after the remembered head; when another
    /// writer appended since, the batch is written again after the head read under the lock.
    /// Afterwards the batch's last link is remembered (nothing is, after a failure).
    async fn commit(&mut self, writes: &[Write]) -> Result<Vec<String>, sqlx::Error> {
        let mut conn = match self.held.take() {
            Some(conn) => conn,
            None => self.pool.acquire().await?,
        };
        let known = self.head.take();
        let mut written = write_batch(&mut conn, writes, known.clone()).await;
        if known.is_some() && written.as_ref().is_err_and(chain::stale_head) {
            self.head.read_first = READ_AFTER_STALE;
            written = write_batch(&mut conn, writes, None).await;
        }
        // A connection the server answered on may be kept; one that failed otherwise is not.
        if matches!(&written, Ok(_) | Err(sqlx::Error::Database(_))) {
            self.held = Some(conn);
        }
        let (ids, last) = written?;
        self.head.head = Some(last);
        Ok(ids)
    }
}

impl Remembered {
    /// The head to chain the next batch to, if it may be trusted.
    fn take(&mut self) -> Option<chain::Head> {
        let known = self.head.take();
        if self.read_first > 0 {
            self.read_first -= 1;
            return None;
        }
        known
    }
}

/// One attempt: after `known`, or after the head read under the lock when `None`. Events
/// alone after a known head are one statement, committed on its own (one round trip).
async fn write_batch(
    conn: &mut PgConnection,
    writes: &[Write],
    known: Option<chain::Head>,
) -> Result<(Vec<String>, chain::Head), sqlx::Error> {
    let events: Vec<&NewEvent> = writes.iter().map(Write::event).collect();
    let decisions = writes
        .iter()
        .any(|write| matches!(write, Write::Decision(..)));
    if known.is_some() && !decisions {
        return chain::append_locked(conn, &events, known).await;
    }
    // The lock is taken first only when the head must be read under it.
    let mut tx = match known {
        Some(_) => conn.begin().await?,
        None => conn.begin_with(chain::begin_locked()).await?,
    };
    for write in writes {
        if let Write::Decision(row, _) = write {
            insert_execution(&mut tx, row)
                .await
                .map_err(AuditError::into_sqlx)?;
        }
    }
    let written = match known {
        Some(head) => chain::append_locked(&mut tx, &events, Some(head)).await?,
        None => {
            let head = chain::read_head(&mut tx).await?;
            chain::append_after(&mut tx, &events, head).await?
        }
    };
    tx.commit().await?;
    Ok(written)
}

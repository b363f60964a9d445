//! Writing a bundle from the database (`sandgate audit export`). Reads only: the chain, the
//! policy revisions and their files.

use std::collections::BTreeSet;
use std::io::Write;

use chrono::{DateTime, SubsecRound, Utc};
use sha2::{Digest, Sha256};

use policy_engine::SourceFile;

use super::{
    ocsf, EventFormat, Header, Hidden, Link, Parts, PolicyRevision, Proof, Record, FORMAT,
};
use super::{MAX_EVENTS, MAX_LINE_BYTES, VERSION};
use crate::audit::chain::{self, HashScheme};
use crate::audit::verify::{StoredEvent, STORED_COLUMNS};
use crate::audit::{AuditError, AuditStore};

/// Rows read per round trip.
const PAGE: i64 = 1000;

/// What to export.
#[derive(Debug, Clone)]
pub struct ExportRequest {
    pub since: DateTime<Utc>,
    pub until: DateTime<Utc>,
    pub tenant: Option<String>,
    pub format: EventFormat,
}

/// What was written, for the command to print.
#[derive(Debug, Clone)]
pub struct ExportSummary {
    pub proof: Proof,
    pub revisions: usize,
}

#[derive(Debug, thiserror::Error)]
pub enum ExportError {
    #[error(transparent)]
    Audit(#[from] AuditError),
    #[error("writing the bundle: {0}")]
    Write(#[from] std::io::Error),
    #[error("the window holds {0} events, more than one bundle may ({MAX_EVENTS}): narrow --since/--until")]
    TooMany(i64),
    #[error("--since ({since}) must be before --until ({until})")]
    EmptyWindow {
        since: DateTime<Utc>,
        until: DateTime<Utc>,
    },
    #[error("a record of {bytes} bytes is larger than a bundle line may be ({MAX_LINE_BYTES})")]
    TooLarge { bytes: usize },
}

impl From<sqlx::Error> for ExportError {
    fn from(err: sqlx::Error) -> ExportError {
        ExportError::Audit(AuditError::from(err))
    }
}

/// Writes lines and hashes every byte written, for the proof's digest.
struct Lines<W> {
    out: W,
    digest: Sha256,
}

impl<W: Write> Lines<W> {
    fn write(&mut self, record: &Record) -> Result<(), ExportError> {
        let mut line = serde_json::to_vec(record).map_err(std::io::Error::from)?;
        if line.len() >= MAX_LINE_BYTES {
            return Err(ExportError::TooLarge { bytes: line.len() });
        }
        line.push(b'\n');
        self.digest.update(&line);
        self.out.write_all(&line)?;
        Ok(())
    }
}

/// The slice being written: its ends, counts and the revisions its events name.
#[derive(Default)]
struct Slice {
    first: Option<Link>,
    last: Option<Link>,
    events: u64,
    omitted: u64,
    after: u64,
    head: Option<Link>,
    revisions: BTreeSet<String>,
}

impl AuditStore {
    /// Writes the bundle of `request` to `out`. The whole chain is verified first; its result is
    /// the proof's `chain` (a broken chain is still exported, and the bundle says so).
    pub async fn export_bundle<W: Write>(
        &self,
        request: &ExportRequest,
        out: W,
    ) -> Result<ExportSummary, ExportError> {
        // The database keeps microseconds: the bounds the query compares with are the ones the
        // header shows, which verify compares every `after` event's time with.
        let request = &ExportRequest {
            since: request.since.trunc_subsecs(6),
            until: request.until.trunc_subsecs(6),
            ..request.clone()
        };
        if request.since >= request.until {
            return Err(ExportError::EmptyWindow {
                since: request.since,
                until: request.until,
            });
        }
        let chain = self.verify_chain().await?;
        // The bundle ends at the head that walk found (an intact chain's `seq` runs from 1, so
        // its head is event `events`): later events are not in it, and `proof.head` is
        // `chain.head`. A broken chain is exported to its current end.
        let end = if chain.ok() { chain.events } else { i64::MAX };
        let mut lines = Lines {
            out,
            digest: Sha256::new(),
        };
        lines.write(&Record::Header(Header {
            format: FORMAT.to_owned(),
            version: VERSION,
            event_format: request.format,
            since: request.since,
            until: request.until,
            tenant: request.tenant.clone(),
            exported_at: crate::ids::now_micros(),
        }))?;
        let slice = self.write_events(request, end, &mut lines).await?;
        for revision in &slice.revisions {
            lines.write(&Record::PolicyRevision(
                self.policy_revision(revision).await?,
            ))?;
        }
        let proof = Proof {
            first: slice.first,
            last: slice.last,
            events: slice.events,
            omitted: slice.omitted,
            after: slice.after,
            head: slice.head,
            chain,
            digest: hex::encode(lines.digest.clone().finalize()),
        };
        lines.write(&Record::Proof(proof.clone()))?;
        lines.out.flush()?;
        Ok(ExportSummary {
            proof,
            revisions: slice.revisions.len(),
        })
    }

    /// The events from the first at or after `since` to the last before `until`, by `seq`, so
    /// the slice has no gap even where replicas' clocks disagree; then every event after them
    /// up to `end`, as links, so the bundle reaches the head.
    async fn write_events<W: Write>(
        &self,
        request: &ExportRequest,
        end: i64,
        lines: &mut Lines<W>,
    ) -> Result<Slice, ExportError> {
        let (low, high): (Option<i64>, Option<i64>) = sqlx::query_as(
            "SELECT min(seq), max(seq) FROM audit_events WHERE at >= $1 AND at < $2 AND seq <= $3",
        )
        .bind(request.since)
        .bind(request.until)
        .bind(end)
        .fetch_one(&self.pool)
        .await?;
        let mut slice = Slice::default();
        let (Some(low), Some(high)) = (low, high) else {
            return Ok(slice);
        };
        if high - low + 1 > MAX_EVENTS {
            return Err(ExportError::TooMany(high - low + 1));
        }
        self.each_event(low, high, |event| {
            write_event(event, request, lines, &mut slice)
        })
        .await?;
        self.each_event(high + 1, end, |event| {
            let hidden = hidden(&event);
            slice.after += 1;
            slice.head = Some(Link::of(hidden.seq, &hidden.prev_hash, &hidden.hash));
            lines.write(&Record::After(hidden))
        })
        .await?;
        Ok(slice)
    }

    /// Calls `each` with every event from `low` to `high` (inclusive) in `seq` order.
    async fn each_event(
        &self,
        low: i64,
        high: i64,
        mut each: impl FnMut(StoredEvent) -> Result<(), ExportError>,
    ) -> Result<(), ExportError> {
        let mut next = low;
        while next <= high {
            let page: Vec<StoredEvent> = sqlx::query_as(&format!(
                "SELECT {STORED_COLUMNS} FROM audit_events WHERE seq >= $1 AND seq <= $2 \
                 ORDER BY seq LIMIT $3"
            ))
            .bind(next)
            .bind(high)
            .bind(PAGE)
            .fetch_all(&self.pool)
            .await?;
            let Some(last) = page.last() else { break };
            next = last.seq + 1;
            for event in page {
                each(event)?;
            }
        }
        Ok(())
    }

    /// A revision's row and files; `files: None` when none were stored for it.
    async fn policy_revision(&self, revision: &str) -> Result<PolicyRevision, ExportError> {
        let row: Option<(String, DateTime<Utc>)> =
            sqlx::query_as("SELECT loaded_by, loaded_at FROM policy_revisions WHERE revision = $1")
                .bind(revision)
                .fetch_optional(&self.pool)
                .await?;
        let files: Vec<(String, String)> = sqlx::query_as(
            "SELECT path, contents FROM policy_revision_files WHERE revision = $1 \
             ORDER BY path COLLATE \"C\"",
        )
        .bind(revision)
        .fetch_all(&self.pool)
        .await?;
        let (loaded_by, loaded_at) =
            row.unwrap_or_else(|| ("(not recorded)".to_owned(), DateTime::<Utc>::default()));
        Ok(PolicyRevision {
            revision: revision.to_owned(),
            loaded_by,
            loaded_at,
            files: (!files.is_empty()).then(|| {
                files
                    .into_iter()
                    .map(|(path, contents)| SourceFile { path, contents })
                    .collect()
            }),
        })
    }

    /// Stores the files of a revision (once; a revision's files never change).
    pub async fn record_policy_sources(
        &self,
        revision: &str,
        sources: &[SourceFile],
    ) -> Result<(), AuditError> {
        let paths: Vec<&str> = sources.iter().map(|file| file.path.as_str()).collect();
        let contents: Vec<&str> = sources.iter().map(|file| file.contents.as_str()).collect();
        sqlx::query(
            "INSERT INTO policy_revision_files (revision, path, contents) \
             SELECT $1, * FROM unnest($2::text[], $3::text[]) ON CONFLICT DO NOTHING",
        )
        .bind(revision)
        .bind(&paths)
        .bind(&contents)
        .execute(&self.pool)
        .await?;
        Ok(())
    }
}

/// One event of the slice: its content when the tenant filter keeps it, its links otherwise.
fn write_event<W: Write>(
    event: StoredEvent,
    request: &ExportRequest,
    lines: &mut Lines<W>,
    slice: &mut Slice,
) -> Result<(), ExportError> {
    let link = Link::of(event.seq, &event.prev_hash, &event.hash);
    slice.first.get_or_insert_with(|| link.clone());
    slice.last = Some(link.clone());
    slice.head = Some(link);
    let kept = match &request.tenant {
        Some(tenant) => event.tenant.as_deref() == Some(tenant.as_str()),
        None => true,
    };
    if !kept {
        slice.omitted += 1;
        return lines.write(&Record::Omitted(hidden(&event)));
    }
    slice.events += 1;
    if let Some(revision) = &event.policy_revision {
        slice.revisions.insert(revision.clone());
    }
    let record = match request.format {
        EventFormat::Jsonl => Record::Event { event },
        EventFormat::Ocsf => Record::OcsfEvent {
            ocsf: ocsf::record(&event),
        },
    };
    lines.write(&record)
}

/// `event` without its content: a scheme-2 event carries the parts verify recomputes its link
/// from; a scheme-1 event's link cannot be recomputed without the content.
fn hidden(event: &StoredEvent) -> Hidden {
    let row = event.row();
    Hidden {
        seq: event.seq,
        prev_hash: event.prev_hash.clone(),
        hash: event.hash.clone(),
        parts: match event.hash_version {
            HashScheme::Content => Some(Parts {
                at: event.at,
                tenant_tag: chain::tenant_tag(row.seq, row.tenant),
                content_hash: chain::content_hash(&row),
            }),
            HashScheme::Whole => None,
        },
    }
}

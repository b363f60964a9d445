//! What snapshots (DESIGN 15) store beside the audit events: an execution that restored its
//! paused session says so (`executions.resumed`).

use super::{AuditError, AuditStore};

impl AuditStore {
    /// Marks the execution as the one that restored its paused session.
    pub async fn mark_resumed(&self, execution_id: &str) -> Result<(), AuditError> {
        sqlx::query("UPDATE executions SET resumed = true WHERE id = $1")
            .bind(execution_id)
            .execute(&self.pool)
            .await?;
        Ok(())
    }
}

//! Listing executions: agents see their own tenant's, every other role sees all.

use super::{App, AppError};
use crate::audit::read::ExecutionFilter;
use crate::audit::{ApiKey, ExecutionRow};
use crate::role::Role;
use crate::status::ExecutionStatus;

impl App {
    /// One page of executions, newest first. `filter.tenant` is replaced by the caller's tenant
    /// for agents, whatever was asked.
    pub async fn list_executions(
        &self,
        caller: &ApiKey,
        mut filter: ExecutionFilter,
    ) -> Result<Vec<ExecutionRow>, AppError> {
        if let Some(status) = &filter.status {
            if ExecutionStatus::parse(status).is_none() {
                let names: Vec<&str> = ExecutionStatus::ALL.iter().map(|s| s.as_str()).collect();
                return Err(AppError::Invalid(format!(
                    "status must be one of {}",
                    names.join(", ")
                )));
            }
        }
        if !caller.is_any(&Role::ACROSS_TENANTS) {
            filter.tenant = Some(caller.tenant.clone());
        }
        if let Some(before) = &filter.before {
            if !self
                .audit
                .execution_visible(before, filter.tenant.as_deref())
                .await?
            {
                return Err(AppError::Invalid(format!(
                    "before must be the id of an execution you can see (the next_before of the \
                     previous page, like ex_...); there is none with id {before:?}"
                )));
            }
        }
        Ok(self.audit.list_executions(&filter).await?)
    }
}

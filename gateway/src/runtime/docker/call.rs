//! Every Docker API call goes through [`bounded`]: a timeout, and bollard's error turned into a
//! [`RuntimeError`] that names the operation.

use std::future::Future;
use std::time::Duration;

use bollard::errors::Error as BollardError;

use crate::runtime::RuntimeError;

/// Bound on every Docker API call that is not waiting for the program itself.
pub const API_TIMEOUT: Duration = Duration::from_secs(30);

pub async fn bounded<T>(
    operation: &'static str,
    call: impl Future<Output = Result<T, BollardError>>,
) -> Result<T, RuntimeError> {
    match tokio::time::timeout(API_TIMEOUT, call).await {
        Ok(result) => result.map_err(|err| docker_error(operation, err)),
        Err(_) => Err(RuntimeError::Timeout {
            operation,
            seconds: API_TIMEOUT.as_secs(),
        }),
    }
}

pub fn docker_error(operation: &'static str, err: BollardError) -> RuntimeError {
    match err {
        BollardError::DockerResponseServerError { message, .. } => {
            RuntimeError::Docker { operation, message }
        }
        other => RuntimeError::Docker {
            operation,
            message: other.to_string(),
        },
    }
}

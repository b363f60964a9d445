//! `sandgate serve`: the gateway, until SIGTERM or SIGINT starts a graceful shutdown.

use std::process::ExitCode;

use tokio_util::sync::CancellationToken;

use crate::config::Config;

pub async fn run(config: Config) -> anyhow::Result<ExitCode> {
    let shutdown = CancellationToken::new();
    tokio::spawn(cancel_on_signal(shutdown.clone()));
    crate::serve(config, shutdown).await?;
    Ok(ExitCode::SUCCESS)
}

/// SIGTERM or SIGINT starts a graceful shutdown.
async fn cancel_on_signal(shutdown: CancellationToken) {
    use tokio::signal::unix::{signal, SignalKind};
    let (Ok(mut term), Ok(mut int)) = (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
    ) else {
        tracing::error!("cannot install signal handlers");
        return;
    };
    tokio::select! {
        _ = term.recv() => {}
        _ = int.recv() => {}
    }
    tracing::info!("signal received: shutting down");
    shutdown.cancel();
}

//! `sandgate repl`: an interactive session in a terminal. It opens a session
//! (`POST /v1/sessions`, decided by the policy like any), then sends each cell typed as one
//! execution of it and prints its stdout, stderr and (Python) the final expression's `repr`.
//!
//! - Line editing and history (rustyline) when stdin is a terminal; piped stdin is read line
//!   by line with no prompt, so a script can drive it.
//! - Multi-line cells: a line that opens a block or leaves a bracket open asks for more
//!   (`cells::needs_more`); an empty line ends a block.
//! - Ctrl-C while code runs cancels that execution (`POST /v1/executions/{id}/cancel`): the
//!   code is interrupted, the session goes on. Ctrl-C at the prompt drops the line typed.
//! - Ctrl-D (or the end of piped input) closes the session (`DELETE`) and leaves.
//!
//! It runs on the calling thread (rustyline blocks) and drives each call on `runtime`.

use std::io::{BufRead, IsTerminal, Write};

use anyhow::Context;
use rustyline::error::ReadlineError;
use tokio::signal::unix::{signal, Signal, SignalKind};

use super::cells::{needs_more, Dialect};
use super::sessions::{CallError, SessionClient};
use crate::session_wire::{
    SessionExecutionRequest, SessionRequest, SessionStatus, SessionView, TurnLimits,
};
use crate::status::ExecutionStatus;
use api_types::ExecutionView;

/// Most history entries kept in memory.
const HISTORY: usize = 1000;
/// Longest cell the repl sends (the gateway has its own body limit above this).
const MAX_CELL_BYTES: usize = 1024 * 1024;

/// What `sandgate repl` was asked for.
#[derive(Debug, Clone)]
pub struct ReplOptions {
    pub session: SessionRequest,
    /// Each cell's wall-time limit (default: the policy's).
    pub timeout_ms: Option<u64>,
}

/// How the repl ended: `Ok(0)` after Ctrl-D, 1 when the session closed under it, 77 when the
/// policy refused it, 70 when it could not be opened.
pub fn repl(
    runtime: &tokio::runtime::Runtime,
    client: &SessionClient,
    options: &ReplOptions,
) -> anyhow::Result<i32> {
    let mut interrupts = {
        let _entered = runtime.enter();
        signal(SignalKind::interrupt()).context("catching Ctrl-C (SIGINT)")?
    };
    let opened = match runtime.block_on(client.open(&options.session)) {
        Ok(opened) => opened,
        Err(err) => {
            report(&err);
            let denied = err.code() == Some(api_types::ErrorCode::PolicyDenied);
            return Ok(if denied {
                super::EXIT_DENIED
            } else {
                super::EXIT_ERROR
            });
        }
    };
    let id = opened.id.clone();
    eprintln!(
        "sandgate: session {id} ({}, idle limit {} s). Ctrl-C interrupts the running code, \
         Ctrl-D closes the session.",
        opened.language, opened.idle_timeout_s
    );
    if opened.status == SessionStatus::PendingApproval {
        let approval = opened.approval_id.as_deref().unwrap_or("?");
        eprintln!("sandgate: {id} waits for human review (approval {approval}); Ctrl-C gives up");
        if !runtime.block_on(wait_for_review(client, &id, &mut interrupts)) {
            if let Err(err) = runtime.block_on(client.close(&id)) {
                report(&err);
            }
            return Ok(1);
        }
    }
    let ended = cells(runtime, client, options, &opened, &mut interrupts)?;
    if ended == 0 {
        match runtime.block_on(client.close(&id)) {
            Ok(_) => eprintln!("sandgate: session {id} closed"),
            Err(err) => report(&err),
        }
    }
    Ok(ended)
}

/// Reads and runs cells until Ctrl-D (0) or the session closed under us (1).
fn cells(
    runtime: &tokio::runtime::Runtime,
    client: &SessionClient,
    options: &ReplOptions,
    opened: &SessionView,
    interrupts: &mut Signal,
) -> anyhow::Result<i32> {
    let id = &opened.id;
    let dialect = Dialect::of(&opened.language);
    let mut input = Input::new()?;
    loop {
        let Some(cell) = input.read_cell(dialect)? else {
            return Ok(0);
        };
        if cell.trim().is_empty() {
            continue;
        }
        if cell.len() > MAX_CELL_BYTES {
            eprintln!("sandgate: a cell is at most {MAX_CELL_BYTES} bytes; not sent");
            continue;
        }
        let body = SessionExecutionRequest {
            code: cell,
            limits: TurnLimits {
                timeout_ms: options.timeout_ms,
            },
            ..SessionExecutionRequest::default()
        };
        match runtime.block_on(run_interruptible(client, id, &body, interrupts)) {
            Ok(run) => print_run(&run)?,
            Err(err) => report(&err),
        }
        if let Some(code) = runtime.block_on(closed_under_us(client, id)) {
            return Ok(code);
        }
    }
}

/// Runs one cell; a Ctrl-C meanwhile cancels it (the answer still comes, `cancelled`).
async fn run_interruptible(
    client: &SessionClient,
    id: &str,
    body: &SessionExecutionRequest,
    interrupts: &mut Signal,
) -> Result<ExecutionView, CallError> {
    // A Ctrl-C pressed while nothing ran is not meant for this cell.
    while futures_util::FutureExt::now_or_never(interrupts.recv()).is_some() {}
    let run = client.run(id, body);
    tokio::pin!(run);
    loop {
        tokio::select! {
            ran = &mut run => return ran,
            _ = interrupts.recv() => {
                eprintln!("\nsandgate: interrupting...");
                if let Err(err) = client.interrupt(id).await {
                    report(&err);
                }
            }
        }
    }
}

/// Waits while session `id` is held for review: `true` once it is open, `false` when it was
/// refused, or Ctrl-C gave up.
async fn wait_for_review(client: &SessionClient, id: &str, interrupts: &mut Signal) -> bool {
    loop {
        tokio::select! {
            () = tokio::time::sleep(super::APPROVAL_POLL) => {}
            _ = interrupts.recv() => return false,
        }
        match client.get(id).await {
            Ok(session) if session.status == SessionStatus::PendingApproval => {}
            Ok(session) if session.status == SessionStatus::Closed => {
                eprintln!("sandgate: the reviewer did not approve session {id}");
                return false;
            }
            Ok(_) => return true,
            Err(err) => {
                report(&err);
                return false;
            }
        }
    }
}

/// `Some(exit code)` when the session is no longer open (it crashed, ran out of memory, hit
/// its idle or total limit, or someone deleted it).
async fn closed_under_us(client: &SessionClient, id: &str) -> Option<i32> {
    match client.get(id).await {
        Ok(session) if session.status == SessionStatus::Closed => {
            let why = session
                .closed_reason
                .map_or("no reason given", |reason| reason.as_str());
            eprintln!("sandgate: session {id} closed ({why})");
            Some(1)
        }
        Ok(_) => None,
        Err(err) => {
            report(&err);
            Some(1)
        }
    }
}

fn print_run(run: &ExecutionView) -> anyhow::Result<()> {
    let mut stdout = std::io::stdout().lock();
    let mut stderr = std::io::stderr().lock();
    stdout.write_all(run.stdout.as_bytes())?;
    stderr.write_all(run.stderr.as_bytes())?;
    if let Some(result) = &run.result {
        writeln!(stdout, "{result}")?;
    }
    stdout.flush()?;
    match run.status {
        ExecutionStatus::Succeeded => {}
        ExecutionStatus::Failed => {
            if let Some(code) = run.exit_code.filter(|code| *code != 0) {
                writeln!(stderr, "sandgate: exit code {code}")?;
            }
        }
        other => writeln!(
            stderr,
            "sandgate: execution {} ended: {}",
            run.id,
            other.as_str()
        )?,
    }
    if run.stdout_truncated || run.stderr_truncated {
        writeln!(stderr, "sandgate: output was truncated at the output limit")?;
    }
    Ok(())
}

fn report(err: &CallError) {
    eprintln!("sandgate: {err}");
    if let CallError::Api { reasons, .. } = err {
        for reason in reasons {
            eprintln!("  {}: {}", reason.code, reason.message);
        }
    }
}

/// Where cells come from: an editor on a terminal, or plain lines from a pipe.
enum Input {
    Editor(Box<rustyline::DefaultEditor>),
    Piped(std::io::StdinLock<'static>),
}

impl Input {
    fn new() -> anyhow::Result<Input> {
        if !std::io::stdin().is_terminal() {
            return Ok(Input::Piped(std::io::stdin().lock()));
        }
        let config = rustyline::Config::builder()
            .max_history_size(HISTORY)
            .context("configuring history")?
            .auto_add_history(false)
            .build();
        let editor =
            rustyline::DefaultEditor::with_config(config).context("starting the line editor")?;
        Ok(Input::Editor(Box::new(editor)))
    }

    /// The next whole cell; `None` at Ctrl-D or the end of input.
    fn read_cell(&mut self, dialect: Dialect) -> anyhow::Result<Option<String>> {
        let mut cell = String::new();
        loop {
            let prompt = if cell.is_empty() { ">>> " } else { "... " };
            let Some(line) = self.read_line(prompt)? else {
                // Ctrl-D inside a cell sends what was typed; on an empty prompt, it leaves.
                return Ok((!cell.is_empty()).then_some(cell));
            };
            let Some(line) = line else {
                cell.clear(); // Ctrl-C at the prompt: the cell is dropped.
                continue;
            };
            if !cell.is_empty() {
                cell.push('\n');
            }
            cell.push_str(&line);
            if !needs_more(dialect, &cell) {
                if let Input::Editor(editor) = self {
                    let _ = editor.add_history_entry(cell.trim_end());
                }
                return Ok(Some(cell.trim_end_matches('\n').to_owned()));
            }
        }
    }

    /// `None` at the end; `Some(None)` for Ctrl-C; `Some(Some(line))` otherwise.
    fn read_line(&mut self, prompt: &str) -> anyhow::Result<Option<Option<String>>> {
        match self {
            Input::Piped(stdin) => {
                let mut line = String::new();
                if stdin.read_line(&mut line).context("reading stdin")? == 0 {
                    return Ok(None);
                }
                let line = line.strip_suffix('\n').unwrap_or(&line);
                Ok(Some(Some(
                    line.strip_suffix('\r').unwrap_or(line).to_owned(),
                )))
            }
            Input::Editor(editor) => match editor.readline(prompt) {
                Ok(line) => Ok(Some(Some(line))),
                Err(ReadlineError::Interrupted) => {
                    eprintln!("KeyboardInterrupt");
                    Ok(Some(None))
                }
                Err(ReadlineError::Eof) => Ok(None),
                Err(err) => Err(err).context("reading the terminal"),
            },
        }
    }
}

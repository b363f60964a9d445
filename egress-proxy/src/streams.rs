//! The byte streams of an inspected tunnel: the sandbox's side with the ClientHello the proxy
//! already read put back in front, and the upstream side counted against the tunnel's counters
//! and the execution's byte budget.

use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpStream, UnixStream};

use crate::execution::Execution;

/// Bytes through the upstream side of one inspected tunnel.
#[derive(Debug, Default)]
pub(crate) struct Counters {
    pub(crate) up: AtomicU64,
    pub(crate) down: AtomicU64,
}

/// The sandbox's stream with the bytes already read from it (the ClientHello) in front.
pub(crate) struct Prefixed {
    prefix: Vec<u8>,
    offset: usize,
    inner: UnixStream,
}

impl Prefixed {
    pub(crate) fn new(prefix: Vec<u8>, inner: UnixStream) -> Prefixed {
        Prefixed {
            prefix,
            offset: 0,
            inner,
        }
    }
}

impl AsyncRead for Prefixed {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let this = self.get_mut();
        if this.offset < this.prefix.len() {
            let rest = &this.prefix[this.offset..];
            let n = rest.len().min(buf.remaining());
            buf.put_slice(&rest[..n]);
            this.offset += n;
            return Poll::Ready(Ok(()));
        }
        Pin::new(&mut this.inner).poll_read(cx, buf)
    }
}

impl AsyncWrite for Prefixed {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write(cx, buf)
    }
    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_flush(cx)
    }
    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }
}

/// The upstream TCP stream, counted against the tunnel's counters and the execution's budget.
pub(crate) struct Metered {
    pub(crate) inner: TcpStream,
    pub(crate) execution: Arc<Execution>,
    pub(crate) counters: Arc<Counters>,
}

fn budget_spent() -> std::io::Error {
    std::io::Error::other("the execution's byte budget is spent")
}

impl AsyncRead for Metered {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let this = self.get_mut();
        let before = buf.filled().len();
        let polled = Pin::new(&mut this.inner).poll_read(cx, buf);
        let n = buf.filled().len() - before;
        if n > 0 {
            this.counters.down.fetch_add(n as u64, Ordering::Relaxed);
            if this.execution.budget.take(n) < n {
                return Poll::Ready(Err(budget_spent()));
            }
        }
        polled
    }
}

impl AsyncWrite for Metered {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        let this = self.get_mut();
        if this.execution.budget.exhausted() {
            return Poll::Ready(Err(budget_spent()));
        }
        let polled = Pin::new(&mut this.inner).poll_write(cx, buf);
        if let Poll::Ready(Ok(n)) = &polled {
            this.counters.up.fetch_add(*n as u64, Ordering::Relaxed);
            let _ = this.execution.budget.take(*n);
        }
        polled
    }
    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_flush(cx)
    }
    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }
}

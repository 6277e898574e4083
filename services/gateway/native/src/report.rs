//! What the front tells the gateway: a record of each request it relayed itself, so the gateway
//! writes the same log line and metrics as for the requests it relays (`record`).
//!
//! A record is a line: `v1\t<method>\t<status>\t<micros>\t<request id>\t<by_host 0|1>\t<tenant>\t<sandbox>\t<dropped>`
//! (`dropped`: records lost since the last one that went). Lines are sent in batches, one
//! datagram of up to `BATCH` bytes at a time, when a batch is full or `flush` runs (every
//! `FLUSH_EVERY`): a datagram per request would wake the gateway's process once per request,
//! on the cores the client, the app and the front share. Sending never blocks: when the
//! gateway is behind, a batch is dropped and its records counted.

use std::cell::{Cell, RefCell};
use std::fmt::Write;
use std::os::unix::net::UnixDatagram;
use std::time::{Duration, Instant};

pub const FLUSH_EVERY: Duration = Duration::from_millis(50);
const BATCH: usize = 16 * 1024;

pub struct Reporter {
    sock: Option<UnixDatagram>,
    batch: RefCell<String>,
    lines: Cell<u64>,
    dropped: Cell<u64>,
}

pub struct Record<'a> {
    pub method: &'a str,
    pub status: u16,
    pub started: Instant,
    pub rid: &'a str,
    pub by_host: bool,
    pub tenant: &'a str,
    pub sandbox: &'a str,
}

impl Reporter {
    pub fn new(sock: Option<UnixDatagram>) -> Self {
        if let Some(s) = &sock {
            let _ = s.set_nonblocking(true);
        }
        Reporter {
            sock,
            batch: RefCell::new(String::with_capacity(BATCH)),
            lines: Cell::new(0),
            dropped: Cell::new(0),
        }
    }

    pub fn send(&self, r: &Record<'_>) {
        if self.sock.is_none() {
            return;
        }
        let full = {
            let mut batch = self.batch.borrow_mut();
            let _ = writeln!(
                batch,
                "v1\t{}\t{}\t{}\t{}\t{}\t{}\t{}\t{}",
                r.method,
                r.status,
                r.started.elapsed().as_micros(),
                r.rid,
                u8::from(r.by_host),
                r.tenant,
                r.sandbox,
                self.dropped.get(),
            );
            self.dropped.set(0);
            self.lines.set(self.lines.get() + 1);
            batch.len() >= BATCH - 512
        };
        if full {
            self.flush();
        }
    }

    /// Send what is batched (the front calls it every `FLUSH_EVERY`).
    pub fn flush(&self) {
        let Some(sock) = &self.sock else { return };
        let mut batch = self.batch.borrow_mut();
        if batch.is_empty() {
            return;
        }
        if sock.send(batch.as_bytes()).is_err() {
            self.dropped.set(self.dropped.get() + self.lines.get());
        }
        batch.clear();
        self.lines.set(0);
    }
}

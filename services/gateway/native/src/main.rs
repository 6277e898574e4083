//! sandpod-front: the gateway's HTTP/1.1 front, so a preview request on a kept admission goes
//! client -> front -> sandbox app without Python.
//!
//! The gateway (Python) binds the public socket and starts this process with it. Every request
//! the front cannot carry on a pass goes on, unchanged (plus the client's address), to the
//! gateway's own socket: API calls, WebSocket upgrades, a connection's first preview request.
//! When the gateway admits a preview request it may hand a pass back (`pass.rs`); the
//! connection's next requests with the same credential headers and Host, for the same sandbox
//! port, while the gateway's caches hold what the decision was made on (the epoch the gateway
//! bumps in a shared page, the Sandbox record's deadline), are relayed by the front itself,
//! rewritten exactly as the gateway would (`relay.rs`), and reported for the gateway's log line
//! and metrics (`report.rs`).
//!
//! Usage (the gateway runs it; never by hand):
//!   sandpod-front --listen-fd N --backend SOCKET --epoch-fd N --report-fd N
//!                 --keepalive S --connect-timeout S --grace S [--parent PID]
//! with the pass header's secret in SANDPOD_FRONT_SECRET.

mod pass;
mod relay;
mod report;

use std::os::fd::{FromRawFd, RawFd};
use std::os::unix::net::UnixDatagram;
use std::path::PathBuf;
use std::process::ExitCode;
use std::rc::Rc;
use std::time::Duration;

use hyper::header::HeaderName;
use memmap2::Mmap;

pub struct Config {
    backend: PathBuf,
    pass_header: HeaderName,
    epoch: Mmap,
    report: report::Reporter,
    keepalive: Duration,
    connect_timeout: Duration,
    rid_prefix: String,
}

impl Config {
    /// The gateway's cache epoch now (it bumps it whenever a cached key or Sandbox record
    /// changes or leaves; a torn read only ever makes a pass look stale).
    fn epoch(&self) -> u64 {
        // SAFETY: the page is at least 8 bytes (checked at start), page-aligned (mmap) and
        // mapped for our lifetime.
        #[allow(clippy::cast_ptr_alignment)]
        unsafe {
            std::ptr::read_volatile(self.epoch.as_ptr().cast::<u64>())
        }
    }
}

struct Args {
    listen: RawFd,
    backend: PathBuf,
    epoch: RawFd,
    report: Option<RawFd>,
    keepalive: f64,
    connect_timeout: f64,
    grace: f64,
    parent: Option<i32>,
}

fn parse_args() -> Result<Args, String> {
    let mut it = std::env::args().skip(1);
    let (mut listen, mut backend, mut epoch, mut report) = (None, None, None, None);
    let (mut keepalive, mut connect_timeout, mut grace) = (5.0, 10.0, 10.0);
    let mut parent = None;
    while let Some(flag) = it.next() {
        let value = it.next().ok_or(format!("{flag} needs a value"))?;
        let num = || {
            value
                .parse::<f64>()
                .map_err(|_| format!("{flag}: not a number: {value}"))
        };
        let fd = || {
            value
                .parse::<RawFd>()
                .map_err(|_| format!("{flag}: not a descriptor: {value}"))
        };
        match flag.as_str() {
            "--listen-fd" => listen = Some(fd()?),
            "--backend" => backend = Some(PathBuf::from(&value)),
            "--epoch-fd" => epoch = Some(fd()?),
            "--report-fd" => report = Some(fd()?),
            "--keepalive" => keepalive = num()?,
            "--connect-timeout" => connect_timeout = num()?,
            "--grace" => grace = num()?,
            "--parent" => {
                parent = Some(
                    value
                        .parse::<i32>()
                        .map_err(|_| format!("--parent: not a pid: {value}"))?,
                )
            }
            _ => return Err(format!("unknown flag {flag}")),
        }
    }
    Ok(Args {
        listen: listen.ok_or("--listen-fd is required")?,
        backend: backend.ok_or("--backend is required")?,
        epoch: epoch.ok_or("--epoch-fd is required")?,
        report,
        keepalive,
        connect_timeout,
        grace,
        parent,
    })
}

fn main() -> ExitCode {
    let args = match parse_args() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("sandpod-front: {e}");
            return ExitCode::from(2);
        }
    };
    // Ctrl-C at a terminal reaches the whole process group: the gateway, which owns this
    // process, stops it (SIGTERM, after its connections drain); dying first would only make
    // the gateway start it again while it shuts down
    // SAFETY: setting a signal's disposition to ignore, before any thread exists.
    unsafe { libc::signal(libc::SIGINT, libc::SIG_IGN) };
    if let Some(parent) = args.parent {
        // the gateway gone (even killed), the front goes too: it must not hold the port
        // SAFETY: plain syscalls without pointers.
        unsafe { libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM) };
        if unsafe { libc::getppid() } != parent {
            eprintln!("sandpod-front: the gateway (pid {parent}) is gone");
            return ExitCode::from(1);
        }
    }
    let secret = std::env::var("SANDPOD_FRONT_SECRET").unwrap_or_default();
    std::env::remove_var("SANDPOD_FRONT_SECRET");
    if secret.len() < 32 || !secret.bytes().all(|b| b.is_ascii_hexdigit()) {
        eprintln!("sandpod-front: SANDPOD_FRONT_SECRET must be at least 32 hex digits");
        return ExitCode::from(2);
    }
    let pass_header = match HeaderName::from_bytes(format!("x-sandpod-pass-{secret}").as_bytes()) {
        Ok(h) => h,
        Err(_) => return ExitCode::from(2),
    };
    // SAFETY: the gateway passed these descriptors to us for exactly these uses.
    let epoch_file = unsafe { std::fs::File::from_raw_fd(args.epoch) };
    let epoch = match unsafe { Mmap::map(&epoch_file) } {
        Ok(m) if m.len() >= 8 => m,
        _ => {
            eprintln!("sandpod-front: --epoch-fd is not a mappable file of 8 bytes or more");
            return ExitCode::from(2);
        }
    };
    let report = args
        .report
        .map(|fd| unsafe { UnixDatagram::from_raw_fd(fd) });
    let listener = unsafe { std::net::TcpListener::from_raw_fd(args.listen) };
    let cfg = Config {
        backend: args.backend,
        pass_header,
        epoch,
        report: report::Reporter::new(report),
        keepalive: Duration::from_secs_f64(args.keepalive.max(0.1)),
        connect_timeout: Duration::from_secs_f64(args.connect_timeout.max(0.1)),
        rid_prefix: format!("{:016x}", random_u64()),
    };
    let rt = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("sandpod-front: no runtime: {e}");
            return ExitCode::from(1);
        }
    };
    let grace = Duration::from_secs_f64(args.grace.max(0.0));
    let local = tokio::task::LocalSet::new();
    match local.block_on(&rt, relay::serve(Rc::new(cfg), listener, grace)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("sandpod-front: {e}");
            ExitCode::from(1)
        }
    }
}

/// 64 random bits for request ids (the kernel's; no RNG crate for one number).
fn random_u64() -> u64 {
    use std::io::Read;
    let mut b = [0u8; 8];
    if let Ok(mut f) = std::fs::File::open("/dev/urandom") {
        let _ = f.read_exact(&mut b);
    }
    u64::from_ne_bytes(b) ^ u64::from(std::process::id())
}

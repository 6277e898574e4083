//! Connections: accept, serve each with hyper, and per request either relay it on the
//! connection's pass (to the sandbox's app) or hand it to the gateway.

use std::cell::{Cell, RefCell};
use std::net::SocketAddr;
use std::pin::Pin;
use std::rc::Rc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::client::conn::http1::SendRequest;
use hyper::header::{HeaderMap, HeaderName, HeaderValue, CONNECTION, HOST};
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::{TcpStream, UnixStream};

use crate::pass::{Grounds, Pass};
use crate::report::Record;
use crate::Config;

/// Any response body (not Send: one thread serves every connection).
type Out = Pin<Box<dyn Body<Data = Bytes, Error = hyper::Error>>>;
type Error = Box<dyn std::error::Error + Send + Sync>;

const PEER: &str = "x-sandpod-front-peer";
const HOP_BY_HOP: [&str; 10] = [
    "connection",
    "keep-alive",
    "proxy-connection",
    "proxy-authenticate",
    "proxy-authorization",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
    "host",
];

/// One client connection's state: its pass, its kept upstream and gateway connections.
struct Conn {
    cfg: Rc<Config>,
    peer: SocketAddr,
    client_ip: HeaderValue, // X-Forwarded-For's last entry, made once per connection
    pass: RefCell<Option<Rc<Pass>>>,
    upstream: RefCell<Option<(String, SendRequest<Incoming>)>>,
    backend: RefCell<Option<SendRequest<Incoming>>>,
}

pub async fn serve(
    cfg: Rc<Config>,
    listener: std::net::TcpListener,
    grace: Duration,
) -> Result<(), Error> {
    listener.set_nonblocking(true)?;
    let listener = tokio::net::TcpListener::from_std(listener)?;
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let open = Rc::new(Cell::new(0usize));
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    let flusher = cfg.clone();
    tokio::task::spawn_local(async move {
        let mut tick = tokio::time::interval(crate::report::FLUSH_EVERY);
        loop {
            tick.tick().await;
            flusher.report.flush();
        }
    });
    loop {
        let (sock, peer) = tokio::select! {
            r = listener.accept() => match r {
                Ok(a) => a,
                Err(e) => {
                    // out of descriptors or a connection reset before accept: keep serving
                    eprintln!("sandpod-front: accept: {e}");
                    tokio::time::sleep(Duration::from_millis(10)).await;
                    continue;
                }
            },
            _ = term.recv() => break,
        };
        let _ = sock.set_nodelay(true);
        let Ok(client_ip) = HeaderValue::from_str(&peer.ip().to_string()) else {
            continue; // an address always is a header value; nothing to serve otherwise
        };
        let conn = Rc::new(Conn {
            cfg: cfg.clone(),
            peer,
            client_ip,
            pass: RefCell::new(None),
            upstream: RefCell::new(None),
            backend: RefCell::new(None),
        });
        let mut stop = stop_rx.clone();
        let keepalive = cfg.keepalive;
        let open = open.clone();
        open.set(open.get() + 1);
        tokio::task::spawn_local(async move {
            let svc = hyper::service::service_fn(move |req| handle(conn.clone(), req));
            let http = hyper::server::conn::http1::Builder::new()
                .timer(TokioTimer::new())
                .header_read_timeout(keepalive)
                .max_buf_size(1 << 20)
                .serve_connection(TokioIo::new(sock), svc)
                .with_upgrades();
            tokio::pin!(http);
            tokio::select! {
                _ = http.as_mut() => {}
                _ = stop.changed() => {
                    http.as_mut().graceful_shutdown();
                    let _ = http.await;
                }
            }
            open.set(open.get() - 1);
        });
    }
    // no more accepts here: new connections wait in the backlog of the socket the gateway
    // still holds, until it closes it
    drop(listener);
    let _ = stop_tx.send(true);
    let end = Instant::now() + grace;
    while open.get() > 0 && Instant::now() < end {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    cfg.report.flush();
    Ok(())
}

async fn handle(conn: Rc<Conn>, mut req: Request<Incoming>) -> Result<Response<Out>, Error> {
    // nobody but the front names the client to the gateway (remove drops every copy)
    req.headers_mut().remove(PEER);
    let kept = conn.pass.borrow().clone();
    if let Some(pass) = kept {
        if let Some(target) = pass.target(&req, conn.cfg.epoch()) {
            return hit(conn, pass, req, target).await;
        }
    }
    miss(conn, req).await
}

// -- the gateway's requests ---------------------------------------------------------------------

async fn miss(conn: Rc<Conn>, mut req: Request<Incoming>) -> Result<Response<Out>, Error> {
    let grounds = Grounds::of(req.headers());
    let peer = HeaderValue::from_str(&conn.peer.to_string())?;
    req.headers_mut()
        .insert(HeaderName::from_static(PEER), peer);
    let upgrading = req.headers().contains_key(hyper::header::UPGRADE);
    let client_side = upgrading.then(|| hyper::upgrade::on(&mut req));
    let kept = conn.backend.borrow_mut().take();
    let reused = kept.as_ref().is_some_and(SendRequest::is_ready);
    let mut sender = match kept {
        Some(s) if s.is_ready() => s,
        _ => match backend(&conn.cfg).await {
            Ok(s) => s,
            Err(e) => return Ok(unavailable(&e.to_string())),
        },
    };
    let mut resp = match sender.try_send_request(req).await {
        Ok(r) => r,
        Err(mut e) => match e.take_message() {
            // the gateway had just closed that idle connection: nothing was sent, so anew
            Some(again) if reused => {
                sender = match backend(&conn.cfg).await {
                    Ok(s) => s,
                    Err(e) => return Ok(unavailable(&e.to_string())),
                };
                match sender.send_request(again).await {
                    Ok(r) => r,
                    Err(e) => return Ok(unavailable(&e.to_string())),
                }
            }
            _ => return Ok(unavailable(&e.into_error().to_string())),
        },
    };
    if resp.status() == StatusCode::SWITCHING_PROTOCOLS {
        if let Some(client_side) = client_side {
            let gateway_side = hyper::upgrade::on(&mut resp);
            tokio::task::spawn_local(async move {
                if let (Ok(a), Ok(b)) = tokio::join!(client_side, gateway_side) {
                    let _ =
                        tokio::io::copy_bidirectional(&mut TokioIo::new(a), &mut TokioIo::new(b))
                            .await;
                }
            });
        }
    } else {
        *conn.backend.borrow_mut() = Some(sender);
    }
    let kept = resp.headers_mut().remove(&conn.cfg.pass_header);
    // a new decision replaces the last (or, undecodable, ends it)
    if let Some(value) = kept {
        *conn.pass.borrow_mut() = Pass::decode(&value, grounds).map(Rc::new);
    }
    Ok(resp.map(|b| Box::pin(b) as Out))
}

async fn backend(cfg: &Config) -> Result<SendRequest<Incoming>, Error> {
    let sock = UnixStream::connect(&cfg.backend).await?;
    let (sender, http) = hyper::client::conn::http1::Builder::new()
        .read_buf_exact_size(Some(256 << 10))
        .handshake(TokioIo::new(sock))
        .await?;
    tokio::task::spawn_local(async move {
        let _ = http.with_upgrades().await;
    });
    Ok(sender)
}

fn unavailable(why: &str) -> Response<Out> {
    let body = serde_json::json!({
        "code": "gateway.unavailable",
        "message": format!("the gateway did not answer ({why}): retry; if it persists, restart it"),
        "retryable": true,
    });
    json_response(StatusCode::SERVICE_UNAVAILABLE, body)
}

fn json_response(status: StatusCode, body: serde_json::Value) -> Response<Out> {
    let full = Full::new(Bytes::from(body.to_string()))
        .map_err(|n: std::convert::Infallible| -> hyper::Error { match n {} });
    let mut r = Response::new(Box::pin(full) as Out);
    *r.status_mut() = status;
    r.headers_mut().insert(
        hyper::header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    r
}

// -- requests on a pass -------------------------------------------------------------------------

async fn hit(
    conn: Rc<Conn>,
    pass: Rc<Pass>,
    req: Request<Incoming>,
    target: String,
) -> Result<Response<Out>, Error> {
    let started = Instant::now();
    let rid = request_id(req.headers(), &conn.cfg.rid_prefix);
    let kept = conn.upstream.borrow_mut().take();
    let reused = matches!(&kept, Some((up, s)) if *up == pass.up && s.is_ready());
    let sender = match kept {
        Some((up, s)) if up == pass.up && s.is_ready() => s,
        _ => match upstream(&conn.cfg, &pass.up).await {
            Ok(s) => s,
            Err(_) => {
                // nothing listens (any more): the gateway answers it, with its typed error
                conn.pass.borrow_mut().take();
                return miss(conn, req).await;
            }
        },
    };
    let method = req.method().clone();
    let up_req = rewrite(req, &pass, &target, &conn.client_ip)?;
    let mut sender = sender;
    let resp = match sender.try_send_request(up_req).await {
        Ok(r) => r,
        Err(mut e) => {
            let retry = if reused { e.take_message() } else { None };
            match retry {
                // a kept connection the app had closed: nothing reached it, once more anew
                Some(again) => match upstream(&conn.cfg, &pass.up).await {
                    Ok(mut fresh) => match fresh.send_request(again).await {
                        Ok(r) => {
                            sender = fresh;
                            r
                        }
                        Err(e) => {
                            return Ok(cut(&conn, &pass, &method, &rid, started, &e.to_string()))
                        }
                    },
                    Err(e) => return Ok(cut(&conn, &pass, &method, &rid, started, &e.to_string())),
                },
                _ => {
                    return Ok(cut(
                        &conn,
                        &pass,
                        &method,
                        &rid,
                        started,
                        &e.into_error().to_string(),
                    ))
                }
            }
        }
    };
    *conn.upstream.borrow_mut() = Some((pass.up.clone(), sender));
    let status = resp.status().as_u16();
    let (mut parts, body) = resp.into_parts();
    parts.headers.insert(
        HeaderName::from_static("x-request-id"),
        HeaderValue::from_str(&rid)?,
    );
    let body = Reported {
        inner: body,
        conn: conn.clone(),
        pass,
        method,
        rid,
        status,
        started,
    };
    Ok(Response::from_parts(parts, Box::pin(body) as Out))
}

async fn upstream(cfg: &Config, up: &str) -> Result<SendRequest<Incoming>, Error> {
    let sock = tokio::time::timeout(cfg.connect_timeout, TcpStream::connect(up)).await??;
    let _ = sock.set_nodelay(true);
    // big reads: a download is copied in a few large pieces, not in hyper's adaptive 8 KiB ones
    let (sender, http) = hyper::client::conn::http1::Builder::new()
        .read_buf_exact_size(Some(256 << 10))
        .handshake(TokioIo::new(sock))
        .await?;
    tokio::task::spawn_local(async move {
        let _ = http.await;
    });
    Ok(sender)
}

/// The request as the app gets it: what `PreviewGate.upstream_headers` and `.target` make.
fn rewrite(
    req: Request<Incoming>,
    pass: &Pass,
    target: &str,
    client_ip: &HeaderValue,
) -> Result<Request<Incoming>, Error> {
    let (parts, body) = req.into_parts();
    // more hop-by-hop names the client listed (rarely any)
    let listed: Vec<String> = parts
        .headers
        .get_all(CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(|t| t.trim().to_ascii_lowercase())
        .filter(|t| !t.is_empty())
        .collect();
    let hop = |n: &str| HOP_BY_HOP.contains(&n) || n == "expect" || listed.iter().any(|t| t == n);
    let mut out = HeaderMap::with_capacity(parts.headers.len() + 6);
    let mut forwarded_for: Option<&HeaderValue> = None;
    for (name, value) in &parts.headers {
        let n = name.as_str();
        if hop(n) {
            continue;
        }
        match n {
            "authorization" | "x-api-key" | "cookie" => {} // as the gateway made them, below
            "x-forwarded-for" => forwarded_for = Some(value),
            _ if n.starts_with("x-forwarded-") => {}
            _ => {
                out.append(name.clone(), value.clone());
            }
        }
    }
    for (k, v) in &pass.creds_out {
        if !hop(k.as_str()) {
            out.append(k.clone(), v.clone());
        }
    }
    out.insert(HOST, pass.up_host.clone());
    let xff = match forwarded_for {
        Some(prior) => {
            let mut v = Vec::with_capacity(prior.len() + 2 + client_ip.len());
            v.extend_from_slice(prior.as_bytes());
            v.extend_from_slice(b", ");
            v.extend_from_slice(client_ip.as_bytes());
            HeaderValue::from_bytes(&v)?
        }
        None => client_ip.clone(),
    };
    out.insert(HeaderName::from_static("x-forwarded-for"), xff);
    out.insert(
        HeaderName::from_static("x-forwarded-proto"),
        pass.proto.clone(),
    );
    let host = parts.headers.get(HOST).cloned();
    out.insert(
        HeaderName::from_static("x-forwarded-host"),
        host.unwrap_or_else(|| HeaderValue::from_static("")),
    );
    if let Some(prefix) = &pass.prefix_value {
        out.insert(
            HeaderName::from_static("x-forwarded-prefix"),
            prefix.clone(),
        );
    }
    let mut up = Request::builder()
        .method(parts.method)
        .uri(target)
        .version(hyper::Version::HTTP_11)
        .body(body)?;
    *up.headers_mut() = out;
    Ok(up)
}

/// The app took the request and gave no response: the gateway's typed 502 for it.
fn cut(
    conn: &Conn,
    pass: &Pass,
    method: &hyper::Method,
    rid: &str,
    started: Instant,
    why: &str,
) -> Response<Out> {
    conn.pass.borrow_mut().take();
    let port = pass.up.rsplit(':').next().unwrap_or("");
    let body = serde_json::json!({
        "code": "sandbox.port_unreachable",
        "message": format!("port {port} of the sandbox closed the connection without an HTTP response ({why})"),
        "retryable": true,
        "details": {"port": port.parse::<u16>().unwrap_or(0)},
    });
    let mut r = json_response(StatusCode::BAD_GATEWAY, body);
    if let Ok(v) = HeaderValue::from_str(rid) {
        r.headers_mut()
            .insert(HeaderName::from_static("x-request-id"), v);
    }
    r.headers_mut()
        .insert(CONNECTION, HeaderValue::from_static("close"));
    report(conn, pass, method, rid, 502, started);
    r
}

fn report(
    conn: &Conn,
    pass: &Pass,
    method: &hyper::Method,
    rid: &str,
    status: u16,
    started: Instant,
) {
    conn.cfg.report.send(&Record {
        method: method.as_str(),
        status,
        started,
        rid,
        by_host: pass.by_host,
        tenant: &pass.tenant,
        sandbox: &pass.sandbox,
    });
}

/// The client's X-Request-ID when it is a sane one, else ours (the gateway's rule).
fn request_id(headers: &HeaderMap, prefix: &str) -> String {
    thread_local! { static NEXT: Cell<u64> = const { Cell::new(0) }; }
    if let Some(v) = headers.get("x-request-id").and_then(|v| v.to_str().ok()) {
        if (1..=64).contains(&v.len())
            && v.bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b))
        {
            return v.to_owned();
        }
    }
    let n = NEXT.with(|c| {
        let n = c.get();
        c.set(n + 1);
        n
    });
    format!("f{}{:015x}", &prefix[..15], n)
}

/// A response body that reports its request when it is over (or dropped: the client left).
struct Reported {
    inner: Incoming,
    conn: Rc<Conn>,
    pass: Rc<Pass>,
    method: hyper::Method,
    rid: String,
    status: u16,
    started: Instant,
}

impl Body for Reported {
    type Data = Bytes;
    type Error = hyper::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, hyper::Error>>> {
        Pin::new(&mut self.inner).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

impl Drop for Reported {
    fn drop(&mut self) {
        report(
            &self.conn,
            &self.pass,
            &self.method,
            &self.rid,
            self.status,
            self.started,
        );
    }
}

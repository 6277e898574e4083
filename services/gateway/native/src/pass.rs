//! A kept admission: what the gateway decided for one request of a client connection, and the
//! test that the connection's next request would get the same decision.
//!
//! The gateway (Python) hands a pass back in a response header only it can name (the header's
//! name carries a secret the front got at start, so an app's own response headers can never
//! plant one). The pass holds the decision (upstream, path prefix, the credential headers as the
//! app gets them, the log fields) and what it was decided on: the request's credential headers
//! and Host, byte for byte, the gateway's cache epoch and the deadline of its Sandbox record.

use std::time::{Duration, Instant};

use base64::Engine;
use hyper::header::{HeaderMap, HeaderName, HeaderValue, HOST, UPGRADE};
use hyper::{Method, Request, Version};
use serde::Deserialize;

/// Header names admission reads credentials from (the query's `token=` never reuses a pass).
const CREDENTIALS: [&str; 3] = ["authorization", "x-api-key", "cookie"];

/// What a request is admitted on: its credential headers in order, and its Host.
#[derive(Clone)]
pub struct Grounds {
    creds: Vec<(HeaderName, HeaderValue)>,
    host: Option<HeaderValue>,
}

impl Grounds {
    pub fn of(headers: &HeaderMap) -> Self {
        let mut creds = Vec::new();
        for (name, value) in headers {
            if CREDENTIALS.contains(&name.as_str()) {
                creds.push((name.clone(), value.clone()));
            }
        }
        Grounds {
            creds,
            host: headers.get(HOST).cloned(),
        }
    }

    /// Whether `headers` hold exactly these grounds (no allocation: every kept request asks).
    fn hold_in(&self, headers: &HeaderMap) -> bool {
        if headers.get(HOST) != self.host.as_ref() {
            return false;
        }
        let mut kept = self.creds.iter();
        for (name, value) in headers {
            if CREDENTIALS.contains(&name.as_str()) {
                match kept.next() {
                    Some((n, v)) if n == name && v == value => {}
                    _ => return false,
                }
            }
        }
        kept.next().is_none()
    }
}

/// The pass as the gateway encodes it (JSON, base64url in the header).
#[derive(Deserialize)]
struct Wire {
    v: u32,
    up: String,                   // "address:port" of the sandbox's app
    prefix: String,               // the path form's prefix, "" for the host form
    creds: Vec<(String, String)>, // the credential headers as the app gets them (latin-1)
    proto: String,                // X-Forwarded-Proto
    ttl: f64,                     // seconds the Sandbox record stays the gateway's cached one
    epoch: u64,                   // the gateway's cache epoch the decision was made at
    tenant: String,
    sandbox: String,
    by_host: bool,
}

pub struct Pass {
    grounds: Grounds,
    deadline: Instant,
    epoch: u64,
    pub up: String,
    pub up_host: HeaderValue, // `up` as the Host the app gets
    pub prefix: String,
    pub prefix_value: Option<HeaderValue>, // X-Forwarded-Prefix (the path form)
    pub creds_out: Vec<(HeaderName, HeaderValue)>,
    pub proto: HeaderValue,
    pub tenant: String,
    pub sandbox: String,
    pub by_host: bool,
}

impl Pass {
    /// The pass in `value`, kept on `grounds` (the request it came back for). None when it does
    /// not decode: that request is answered, its next ones go to the gateway.
    pub fn decode(value: &HeaderValue, grounds: Grounds) -> Option<Pass> {
        let raw = base64::engine::general_purpose::URL_SAFE_NO_PAD
            .decode(value.as_bytes())
            .ok()?;
        let w: Wire = serde_json::from_slice(&raw).ok()?;
        if w.v != 1 || !(w.ttl > 0.0 && w.ttl <= 3600.0) || !w.up.contains(':') {
            return None;
        }
        let prefix_ok = w.prefix.is_empty() || (w.prefix.starts_with('/') && w.prefix.is_ascii());
        if !prefix_ok {
            return None;
        }
        let mut creds_out = Vec::with_capacity(w.creds.len());
        for (k, v) in &w.creds {
            // latin-1, as the gateway decoded the bytes: one char per byte, none above 255
            let bytes: Vec<u8> = v
                .chars()
                .map(|c| u8::try_from(u32::from(c)).ok())
                .collect::<Option<_>>()?;
            creds_out.push((
                HeaderName::from_bytes(k.as_bytes()).ok()?,
                HeaderValue::from_bytes(&bytes).ok()?,
            ));
        }
        Some(Pass {
            grounds,
            deadline: Instant::now() + Duration::from_secs_f64(w.ttl),
            epoch: w.epoch,
            up_host: HeaderValue::from_str(&w.up).ok()?,
            prefix_value: if w.prefix.is_empty() {
                None
            } else {
                Some(HeaderValue::from_str(&w.prefix).ok()?)
            },
            up: w.up,
            prefix: w.prefix,
            creds_out,
            proto: HeaderValue::from_str(&w.proto).ok()?,
            tenant: w.tenant,
            sandbox: w.sandbox,
            by_host: w.by_host,
        })
    }

    /// The upstream request target if `req` gets this pass's decision now, else None (the
    /// gateway decides it).
    pub fn target<B>(&self, req: &Request<B>, epoch: u64) -> Option<String> {
        if epoch != self.epoch || Instant::now() >= self.deadline {
            return None;
        }
        if req.version() != Version::HTTP_11 || req.method() == Method::CONNECT {
            return None;
        }
        let h = req.headers();
        if h.contains_key(UPGRADE) || !self.grounds.hold_in(h) {
            return None;
        }
        if req.uri().scheme().is_some() || req.uri().authority().is_some() {
            return None; // absolute-form: the gateway's
        }
        let pq = req.uri().path_and_query()?.as_str();
        if !pq.starts_with('/') {
            return None; // asterisk-form: the gateway's
        }
        if let Some((_, query)) = pq.split_once('?') {
            if query.split('&').any(|p| p.starts_with("token=")) {
                return None; // a link's first hit: the gateway sets its cookie
            }
        }
        if self.prefix.is_empty() {
            return Some(pq.to_owned());
        }
        let rest = pq.strip_prefix(self.prefix.as_str())?;
        rest.starts_with('/').then(|| rest.to_owned())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vectors() -> serde_json::Value {
        serde_json::from_str(include_str!("../vectors.json")).unwrap()
    }

    fn header(v: &str) -> HeaderValue {
        HeaderValue::from_str(v).unwrap()
    }

    #[test]
    fn the_gateways_passes_decode() {
        for case in vectors()["passes"].as_array().unwrap() {
            let want = &case["pass"];
            let p = Pass::decode(
                &header(case["value"].as_str().unwrap()),
                Grounds::of(&HeaderMap::new()),
            )
            .expect("decodes");
            assert_eq!(p.up, want["up"].as_str().unwrap());
            assert_eq!(p.prefix, want["prefix"].as_str().unwrap());
            assert_eq!(p.epoch, want["epoch"].as_u64().unwrap());
            assert_eq!(p.tenant, want["tenant"].as_str().unwrap());
            assert_eq!(p.sandbox, want["sandbox"].as_str().unwrap());
            assert_eq!(p.by_host, want["by_host"].as_bool().unwrap());
            assert_eq!(p.proto, want["proto"].as_str().unwrap());
            let creds = want["creds"].as_array().unwrap();
            assert_eq!(p.creds_out.len(), creds.len());
            for ((k, v), c) in p.creds_out.iter().zip(creds) {
                assert_eq!(k.as_str(), c[0].as_str().unwrap());
                let latin1: Vec<u8> = c[1]
                    .as_str()
                    .unwrap()
                    .chars()
                    .map(|c| u8::try_from(u32::from(c)).unwrap())
                    .collect();
                assert_eq!(v.as_bytes(), latin1.as_slice());
            }
        }
    }

    #[test]
    fn anything_else_is_refused() {
        for (why, value) in vectors()["refused"].as_object().unwrap() {
            let Ok(v) = HeaderValue::from_str(value.as_str().unwrap()) else {
                continue;
            };
            assert!(
                Pass::decode(&v, Grounds::of(&HeaderMap::new())).is_none(),
                "{why}"
            );
        }
    }

    fn kept(prefix: &str, auth: Option<&str>) -> (Pass, u64) {
        let mut h = HeaderMap::new();
        h.insert(HOST, header("gw"));
        if let Some(a) = auth {
            h.insert("authorization", header(a));
        }
        let case = &vectors()["passes"][0]["value"];
        let mut p = Pass::decode(&header(case.as_str().unwrap()), Grounds::of(&h)).unwrap();
        p.prefix = prefix.to_owned();
        let epoch = p.epoch;
        (p, epoch)
    }

    fn request(target: &str, headers: &[(&str, &str)]) -> Request<()> {
        let mut b = Request::builder().uri(target);
        for (k, v) in headers {
            b = b.header(*k, *v);
        }
        b.body(()).unwrap()
    }

    #[test]
    fn a_request_gets_the_pass_only_on_the_same_grounds() {
        let (p, epoch) = kept("/v1/sandboxes/s/ports/80", Some("Bearer k"));
        let same = [("host", "gw"), ("authorization", "Bearer k")];
        let ok = request("/v1/sandboxes/s/ports/80/a?b=1", &same);
        assert_eq!(p.target(&ok, epoch).as_deref(), Some("/a?b=1"));
        assert!(p.target(&ok, epoch + 1).is_none(), "the epoch moved on");
        for (target, headers) in [
            (
                "/v1/sandboxes/s/ports/80/a",
                &[("host", "gw"), ("authorization", "Bearer other")][..],
            ),
            ("/v1/sandboxes/s/ports/80/a", &[("host", "gw")][..]),
            (
                "/v1/sandboxes/s/ports/80/a",
                &[
                    ("host", "gw"),
                    ("authorization", "Bearer k"),
                    ("x-api-key", "k"),
                ][..],
            ),
            (
                "/v1/sandboxes/s/ports/80/a",
                &[("host", "elsewhere"), ("authorization", "Bearer k")][..],
            ),
            (
                "/v1/sandboxes/s/ports/80/a",
                &[("authorization", "Bearer k")][..],
            ),
            (
                "/v1/sandboxes/s/ports/80/a",
                &[
                    ("host", "gw"),
                    ("authorization", "Bearer k"),
                    ("upgrade", "websocket"),
                ][..],
            ),
            ("/v1/sandboxes/s/ports/81/a", &same[..]),
            ("/v1/sandboxes/s/ports/8080/a", &same[..]),
            ("/v1/sandboxes/s/ports/80", &same[..]),
            ("/v1/sandboxes/t/ports/80/a", &same[..]),
            ("/v1/sandboxes/s/ports/80/a?token=spl1.x", &same[..]),
            ("/v1/sandboxes/s/ports/80/a?x=1&token=y", &same[..]),
            ("http://gw/v1/sandboxes/s/ports/80/a", &same[..]),
        ] {
            assert!(
                p.target(&request(target, headers), epoch).is_none(),
                "{target} {headers:?}"
            );
        }
    }

    #[test]
    fn the_host_form_keeps_the_whole_target() {
        let (p, epoch) = kept("", None);
        let r = request("/any/path?q", &[("host", "gw")]);
        assert_eq!(p.target(&r, epoch).as_deref(), Some("/any/path?q"));
        assert!(p
            .target(&request("/x", &[("host", "gw"), ("cookie", "a=1")]), epoch)
            .is_none());
    }

    #[test]
    fn a_pass_ends_at_its_deadline() {
        let (mut p, epoch) = kept("", None);
        p.deadline = Instant::now();
        assert!(p.target(&request("/x", &[("host", "gw")]), epoch).is_none());
    }
}

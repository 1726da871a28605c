//! The S3 requests hoardfs makes, over blocking HTTP: `rusty-s3` signs (query-string
//! SigV4), `ureq` carries. Every answer is untrusted input: bodies are read up to a bound
//! fixed by what was asked, and XML is parsed by `rusty-s3`'s typed parsers.
//!
//! Retries: a request that got a 5xx, 429 or a reset connection is retried (all requests
//! here are idempotent or conditional) with jittered exponential backoff, at most
//! [`RETRIES`] times. A refused connection or a timeout is not retried: the store (or the
//! node hoardfs talks to) is down, and the caller serves from its cache.

use std::time::Duration;

use rusty_s3::actions::{CreateMultipartUpload, ListObjectsV2};
use rusty_s3::{Bucket, Credentials, S3Action, UrlStyle};
use ureq::Agent;

/// Lifetime of the presigned URLs (they are used at once).
const SIGN_FOR: Duration = Duration::from_secs(600);
/// How many times a failed request is retried.
pub const RETRIES: u32 = 3;
/// Bound on the body of a listing page or a small XML answer.
const XML_LIMIT: u64 = 16 << 20;
/// Bound on an error body we read (for its message).
const ERROR_LIMIT: u64 = 64 << 10;

/// What went wrong with a request.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum S3Error {
    /// The key does not exist (404).
    #[error("no such key")]
    NotFound,
    /// The credentials do not allow this (403).
    #[error("access denied by the store: {0}")]
    Denied(String),
    /// A condition (`If-Match`, `If-None-Match`) did not hold (412, or 409 for some stores).
    #[error("the object changed (precondition failed)")]
    Changed,
    /// The store could not be reached, or kept failing.
    #[error("store unreachable: {0}")]
    Unreachable(String),
    /// The store did not answer in time.
    #[error("store did not answer within {0:?}")]
    Timeout(Duration),
    /// The store answered something that is not valid S3.
    #[error("invalid answer from the store: {0}")]
    Protocol(String),
    /// Another error status.
    #[error("store answered {status}: {message}")]
    Status {
        /// HTTP status.
        status: u16,
        /// S3 error code and message, if any.
        message: String,
    },
}

/// Result of client calls.
pub type S3Result<T> = Result<T, S3Error>;

/// What a HEAD (or a listing) says about an object.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ObjectInfo {
    /// Size in bytes.
    pub size: u64,
    /// ETag without quotes (shared by the listing that saw it and the handle table).
    pub etag: std::sync::Arc<str>,
    /// Last modification, seconds since the epoch.
    pub mtime: i64,
}

/// One page of a listing.
#[derive(Debug, Clone, Default)]
pub struct ListPage {
    /// Objects directly under the prefix: (key, info).
    pub objects: Vec<(String, ObjectInfo)>,
    /// Common prefixes (each ends with the delimiter).
    pub prefixes: Vec<String>,
    /// Continuation token, if more pages follow.
    pub next: Option<String>,
}

/// A conditional write.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PutCondition<'a> {
    /// No condition.
    None,
    /// Only if the key does not exist (`If-None-Match: *`).
    Absent,
    /// Only if the object still has this ETag (`If-Match`).
    Matches(&'a str),
}

/// Connection settings.
#[derive(Debug, Clone)]
pub struct ClientConfig {
    /// Endpoint URL (`https://s3.REGION.amazonaws.com` when not given).
    pub endpoint: String,
    /// Region used in signatures.
    pub region: String,
    /// Path-style (`ENDPOINT/BUCKET/KEY`) rather than virtual-host URLs.
    pub path_style: bool,
    /// Bucket name.
    pub bucket: String,
    /// Credentials (`None`: unsigned requests, for public buckets).
    pub credentials: Option<Credentials>,
    /// How long a request may wait for the store.
    pub timeout: Duration,
    /// Requests in flight at most (and connections kept open to the store), however
    /// many readers, readahead threads, uploads and tier clients want one.
    pub max_connections: usize,
}

/// A bound on requests in flight: each request holds a slot from before it is sent until
/// its answer is read (not while it waits to retry).
#[derive(Debug)]
pub struct Slots {
    free: parking_lot::Mutex<usize>,
    cv: parking_lot::Condvar,
}

/// A taken slot, given back on drop.
pub struct Slot<'a>(&'a Slots);

impl Slots {
    /// `n` slots (at least one).
    pub fn new(n: usize) -> Slots {
        Slots {
            free: parking_lot::Mutex::new(n.max(1)),
            cv: parking_lot::Condvar::new(),
        }
    }

    /// Waits for a free slot.
    pub fn take(&self) -> Slot<'_> {
        let mut f = self.free.lock();
        while *f == 0 {
            self.cv.wait(&mut f);
        }
        *f -= 1;
        Slot(self)
    }
}

impl Drop for Slot<'_> {
    fn drop(&mut self) {
        *self.0.free.lock() += 1;
        self.0.cv.notify_one();
    }
}

/// A blocking S3 client for one bucket. Cheap to share: the agent pools connections.
pub struct S3Client {
    slots: Slots,
    bucket: Bucket,
    credentials: Option<Credentials>,
    agent: Agent,
    timeout: Duration,
    /// Listing requests sent so far.
    lists: std::sync::atomic::AtomicU64,
}

impl std::fmt::Debug for S3Client {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("S3Client")
            .field("bucket", &self.bucket.name())
            .field("url", &self.bucket.base_url().as_str())
            .finish()
    }
}

impl S3Client {
    /// A client for `cfg.bucket`; fails only on an unusable endpoint or bucket name.
    pub fn new(cfg: ClientConfig) -> Result<S3Client, String> {
        let url: url::Url = cfg
            .endpoint
            .parse()
            .map_err(|e| format!("invalid endpoint URL {:?}: {e}", cfg.endpoint))?;
        let style = if cfg.path_style {
            UrlStyle::Path
        } else {
            UrlStyle::VirtualHost
        };
        let bucket =
            Bucket::new(url, style, cfg.bucket.clone(), cfg.region.clone()).map_err(|e| {
                format!(
                    "cannot address bucket {:?} at {}: {e}{}",
                    cfg.bucket,
                    cfg.endpoint,
                    if cfg.path_style {
                        ""
                    } else {
                        " (try --force-path-style)"
                    }
                )
            })?;
        let agent: Agent = Agent::config_builder()
            .http_status_as_error(false)
            .timeout_connect(Some(cfg.timeout.min(Duration::from_secs(5))))
            .timeout_recv_response(Some(cfg.timeout))
            .timeout_per_read(Some(cfg.timeout))
            .timeout_send_body(Some(cfg.timeout))
            .max_idle_connections_per_host(cfg.max_connections.max(4))
            .max_idle_connections(cfg.max_connections.max(4))
            .max_redirects(0)
            .user_agent(concat!("hoardfs/", env!("CARGO_PKG_VERSION")))
            .build()
            .into();
        Ok(S3Client {
            slots: Slots::new(cfg.max_connections),
            bucket,
            credentials: cfg.credentials,
            agent,
            timeout: cfg.timeout,
            lists: Default::default(),
        })
    }

    /// The bucket's name.
    pub fn bucket(&self) -> &str {
        self.bucket.name()
    }

    /// The bucket's base URL (for messages and identities).
    pub fn base_url(&self) -> &str {
        self.bucket.base_url().as_str()
    }

    /// HEAD of `key`.
    pub fn head(&self, key: &str) -> S3Result<ObjectInfo> {
        let url = self
            .bucket
            .head_object(self.credentials.as_ref(), key)
            .sign(SIGN_FOR);
        self.retrying(|| {
            let resp = self
                .agent
                .head(url.as_str())
                .call()
                .map_err(|e| self.io(e))?;
            let status = resp.status().as_u16();
            if status != 200 {
                return Err(status_error(status, String::new()));
            }
            info_from_headers(resp.headers())
        })
    }

    /// Bytes `offset..offset+len` of `key`, only if its ETag is still `etag`. Fewer bytes
    /// at the end of the object; none past it.
    pub fn get_range(&self, key: &str, etag: &str, offset: u64, len: u32) -> S3Result<Vec<u8>> {
        if len == 0 {
            return Ok(Vec::new());
        }
        let url = self
            .bucket
            .get_object(self.credentials.as_ref(), key)
            .sign(SIGN_FOR);
        let last = offset + u64::from(len) - 1;
        let quoted = format!("\"{etag}\"");
        self.retrying(|| {
            let mut resp = self
                .agent
                .get(url.as_str())
                .header("Range", format!("bytes={offset}-{last}"))
                .header("If-Match", quoted.as_str())
                .call()
                .map_err(|e| self.io(e))?;
            let status = resp.status().as_u16();
            match status {
                200 | 206 => {}
                416 => return Ok(Vec::new()),
                _ => return Err(status_error(status, error_body(&mut resp))),
            }
            if status == 206 {
                // The range must be the one asked for (or its part inside the object).
                let cr = header(resp.headers(), "content-range").unwrap_or_default();
                let start = cr
                    .strip_prefix("bytes ")
                    .and_then(|r| r.split('-').next())
                    .and_then(|s| s.parse::<u64>().ok());
                if start != Some(offset) {
                    return Err(S3Error::Protocol(format!(
                        "asked for bytes from {offset}, got Content-Range {cr:?}"
                    )));
                }
            } else if offset != 0 {
                return Err(S3Error::Protocol(
                    "the store ignored the Range header".into(),
                ));
            }
            if let Some(e) = header(resp.headers(), "etag")
                && e.trim_matches('"') != etag
            {
                return Err(S3Error::Changed);
            }
            let mut data = resp
                .body_mut()
                .with_config()
                .limit(u64::from(len))
                .read_to_vec()
                .map_err(|e| self.io(e))?;
            data.truncate(len as usize);
            Ok(data)
        })
    }

    /// One page of the keys under `prefix`, split at `/`.
    pub fn list_page(&self, prefix: &str, token: Option<&str>, max: usize) -> S3Result<ListPage> {
        self.list(prefix, token, max, true, None)
    }

    /// One page of every key under `prefix`, at any depth (no delimiter: no common
    /// prefixes), in key order, from the first key after `start_after` if given.
    pub fn list_flat_page(
        &self,
        prefix: &str,
        token: Option<&str>,
        start_after: Option<&str>,
        max: usize,
    ) -> S3Result<ListPage> {
        self.list(prefix, token, max, false, start_after)
    }

    /// Listing requests sent so far (every page is one).
    pub fn list_requests(&self) -> u64 {
        self.lists.load(std::sync::atomic::Ordering::Relaxed)
    }

    fn list(
        &self,
        prefix: &str,
        token: Option<&str>,
        max: usize,
        delimited: bool,
        start_after: Option<&str>,
    ) -> S3Result<ListPage> {
        self.lists
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let mut action: ListObjectsV2<'_> = self.bucket.list_objects_v2(self.credentials.as_ref());
        action.with_prefix(prefix);
        if delimited {
            action.with_delimiter("/");
        }
        if let Some(s) = start_after {
            action.with_start_after(s);
        }
        action.with_max_keys(max.clamp(1, 1000));
        if let Some(t) = token {
            action.with_continuation_token(t);
        }
        let url = action.sign(SIGN_FOR);
        self.retrying(|| {
            let body = self.xml_answer(self.agent.get(url.as_str()).call())?;
            let parsed = ListObjectsV2::parse_response(&body)
                .map_err(|e| S3Error::Protocol(format!("listing: {e}")))?;
            let mut page = ListPage {
                next: parsed.next_continuation_token,
                ..ListPage::default()
            };
            for c in parsed.contents {
                let info = ObjectInfo {
                    size: c.size.unwrap_or(0),
                    etag: c.etag.unwrap_or_default().trim_matches('"').into(),
                    mtime: c.last_modified.as_deref().map(parse_iso8601).unwrap_or(0),
                };
                page.objects.push((c.key, info));
            }
            page.prefixes = parsed
                .common_prefixes
                .into_iter()
                .map(|p| p.prefix)
                .collect();
            Ok(page)
        })
    }

    /// Whether anything exists under `prefix` (one key is enough).
    pub fn any_under(&self, prefix: &str) -> S3Result<bool> {
        let page = self.list_page(prefix, None, 1)?;
        Ok(!page.objects.is_empty() || !page.prefixes.is_empty())
    }

    /// Stores `data` as `key` in one PUT (with `Content-MD5`, so the store checks it).
    /// Returns the new ETag.
    pub fn put(&self, key: &str, data: &[u8], cond: PutCondition<'_>) -> S3Result<String> {
        let url = self
            .bucket
            .put_object(self.credentials.as_ref(), key)
            .sign(SIGN_FOR);
        let md5 = content_md5(data);
        self.retrying(|| {
            let mut req = self
                .agent
                .put(url.as_str())
                .header("Content-MD5", md5.as_str())
                .header("Content-Type", "application/octet-stream");
            match cond {
                PutCondition::None => {}
                PutCondition::Absent => req = req.header("If-None-Match", "*"),
                PutCondition::Matches(e) => req = req.header("If-Match", format!("\"{e}\"")),
            }
            let mut resp = req.send(data).map_err(|e| self.io(e))?;
            let status = resp.status().as_u16();
            if status != 200 {
                return Err(status_error(status, error_body(&mut resp)));
            }
            etag_of(resp.headers())
        })
    }

    /// Starts a multipart upload of `key`; returns its upload id.
    pub fn create_multipart(&self, key: &str) -> S3Result<String> {
        let url =
            CreateMultipartUpload::new(&self.bucket, self.credentials.as_ref(), key).sign(SIGN_FOR);
        self.retrying(|| {
            let body = self.xml_answer(self.agent.post(url.as_str()).send_empty())?;
            let r = CreateMultipartUpload::parse_response(&body)
                .map_err(|e| S3Error::Protocol(format!("create multipart: {e}")))?;
            Ok(r.upload_id().to_string())
        })
    }

    /// Uploads part `number` (1-based); returns its ETag.
    pub fn upload_part(
        &self,
        key: &str,
        upload: &str,
        number: u16,
        data: &[u8],
    ) -> S3Result<String> {
        let url = self
            .bucket
            .upload_part(self.credentials.as_ref(), key, number, upload)
            .sign(SIGN_FOR);
        let md5 = content_md5(data);
        self.retrying(|| {
            let mut resp = self
                .agent
                .put(url.as_str())
                .header("Content-MD5", md5.as_str())
                .send(data)
                .map_err(|e| self.io(e))?;
            let status = resp.status().as_u16();
            if status != 200 {
                return Err(status_error(status, error_body(&mut resp)));
            }
            etag_of(resp.headers())
        })
    }

    /// Completes a multipart upload from its parts' ETags, in order; returns the ETag.
    pub fn complete_multipart(
        &self,
        key: &str,
        upload: &str,
        etags: &[String],
    ) -> S3Result<String> {
        let action = self.bucket.complete_multipart_upload(
            self.credentials.as_ref(),
            key,
            upload,
            etags.iter().map(|e| e.as_str()),
        );
        let url = action.sign(SIGN_FOR);
        let body = action.body();
        self.retrying(|| {
            let text = self.xml_answer(self.agent.post(url.as_str()).send(body.as_bytes()))?;
            let r = rusty_s3::actions::CompleteMultipartUploadResponse::parse(&text)
                .map_err(|e| S3Error::Protocol(format!("complete multipart: {e}")))?;
            Ok(r.etag().trim_matches('"').to_string())
        })
    }

    /// Abandons a multipart upload (its parts are freed).
    pub fn abort_multipart(&self, key: &str, upload: &str) -> S3Result<()> {
        let url = self
            .bucket
            .abort_multipart_upload(self.credentials.as_ref(), key, upload)
            .sign(SIGN_FOR);
        self.delete_url(url.as_str())
    }

    /// Deletes `key` (succeeds if it is already gone).
    pub fn delete(&self, key: &str) -> S3Result<()> {
        let url = self
            .bucket
            .delete_object(self.credentials.as_ref(), key)
            .sign(SIGN_FOR);
        self.delete_url(url.as_str())
    }

    /// A DELETE that succeeds when the thing is already gone.
    fn delete_url(&self, url: &str) -> S3Result<()> {
        self.retrying(|| {
            let mut resp = self.agent.delete(url).call().map_err(|e| self.io(e))?;
            match resp.status().as_u16() {
                200 | 204 | 404 => Ok(()),
                s => Err(status_error(s, error_body(&mut resp))),
            }
        })
    }

    /// Server-side copy of `src` (only while its ETag is `etag`) to `dst`; returns the
    /// new object's ETag.
    pub fn copy(&self, src: &str, etag: &str, dst: &str) -> S3Result<String> {
        let source = format!("/{}/{}", self.bucket.name(), rusty_s3_path_encode(src));
        let quoted = format!("\"{etag}\"");
        let mut action = self.bucket.put_object(self.credentials.as_ref(), dst);
        // x-amz-* headers must be signed.
        action
            .headers_mut()
            .insert("x-amz-copy-source", source.clone());
        action
            .headers_mut()
            .insert("x-amz-copy-source-if-match", quoted.clone());
        let url = action.sign(SIGN_FOR);
        self.retrying(|| {
            let text = self.xml_answer(
                self.agent
                    .put(url.as_str())
                    .header("x-amz-copy-source", source.as_str())
                    .header("x-amz-copy-source-if-match", quoted.as_str())
                    .send_empty(),
            )?;
            let etag = text
                .split("<ETag>")
                .nth(1)
                .and_then(|s| s.split("</ETag>").next())
                .map(|s| s.replace("&quot;", "").trim_matches('"').to_string())
                .ok_or_else(|| S3Error::Protocol("copy answer without an ETag".into()))?;
            Ok(etag)
        })
    }

    /// The XML body of a successful answer; S3 may also answer 200 with an error
    /// document (a multipart completion or a copy that failed late).
    fn xml_answer(
        &self,
        r: Result<ureq::http::Response<ureq::Body>, ureq::Error>,
    ) -> S3Result<String> {
        let mut resp = r.map_err(|e| self.io(e))?;
        let status = resp.status().as_u16();
        let text = resp
            .body_mut()
            .with_config()
            .limit(XML_LIMIT)
            .read_to_string()
            .map_err(|e| self.io(e))?;
        if status != 200 || text.contains("<Error>") {
            return Err(status_error(status, text));
        }
        Ok(text)
    }

    /// Runs `op`, retrying transient failures.
    fn retrying<T>(&self, mut op: impl FnMut() -> S3Result<T>) -> S3Result<T> {
        let mut attempt = 0;
        loop {
            let slot = self.slots.take();
            let r = op();
            drop(slot);
            match r {
                Err(e) if attempt < RETRIES && transient(&e) => {
                    attempt += 1;
                    let base = 50u64 << (2 * attempt);
                    let jitter = rand::random::<u64>() % (base / 2 + 1);
                    tracing::debug!("S3 request failed ({e}), retry {attempt} of {RETRIES}");
                    std::thread::sleep(Duration::from_millis(base + jitter));
                }
                r => return r,
            }
        }
    }

    /// Classifies a transport error.
    fn io(&self, e: ureq::Error) -> S3Error {
        match e {
            ureq::Error::Timeout(_) => S3Error::Timeout(self.timeout),
            ureq::Error::BodyExceedsLimit(n) => {
                S3Error::Protocol(format!("answer longer than the {n} bytes expected"))
            }
            ureq::Error::Protocol(p) => S3Error::Protocol(p.to_string()),
            ureq::Error::Io(io) if io.kind() == std::io::ErrorKind::TimedOut => {
                S3Error::Timeout(self.timeout)
            }
            other => S3Error::Unreachable(other.to_string()),
        }
    }
}

/// Failures worth another try: overload, server errors and dropped connections (but not
/// refused ones: nobody listens there).
fn transient(e: &S3Error) -> bool {
    match e {
        S3Error::Status { status, .. } => *status >= 500 || *status == 429,
        S3Error::Unreachable(m) => {
            let m = m.to_ascii_lowercase();
            !(m.contains("refused")
                || m.contains("connection failed")
                || m.contains("host not found"))
        }
        _ => false,
    }
}

fn status_error(status: u16, body: String) -> S3Error {
    let code = xml_field(&body, "Code").unwrap_or_default();
    let msg = xml_field(&body, "Message").unwrap_or_default();
    let message = match (code.is_empty(), msg.is_empty()) {
        (true, _) => String::new(),
        (false, true) => code.clone(),
        (false, false) => format!("{code}: {msg}"),
    };
    match status {
        404 => S3Error::NotFound,
        403 => S3Error::Denied(if message.is_empty() {
            "403 Forbidden".into()
        } else {
            message
        }),
        412 => S3Error::Changed,
        409 if code == "ConditionalRequestConflict" => S3Error::Changed,
        _ => S3Error::Status { status, message },
    }
}

fn error_body(resp: &mut ureq::http::Response<ureq::Body>) -> String {
    resp.body_mut()
        .with_config()
        .limit(ERROR_LIMIT)
        .read_to_string()
        .unwrap_or_default()
}

fn xml_field(body: &str, tag: &str) -> Option<String> {
    let open = format!("<{tag}>");
    let close = format!("</{tag}>");
    let start = body.find(&open)? + open.len();
    let end = body[start..].find(&close)? + start;
    // The five predefined entities (Garage quotes its errors' details: `&quot;`).
    let text = body[start..end]
        .replace("&quot;", "\"")
        .replace("&apos;", "'")
        .replace("&lt;", "<")
        .replace("&gt;", ">")
        .replace("&amp;", "&");
    Some(text.chars().take(200).collect())
}

fn header(h: &ureq::http::HeaderMap, name: &str) -> Option<String> {
    h.get(name)?.to_str().ok().map(str::to_string)
}

fn etag_of(h: &ureq::http::HeaderMap) -> S3Result<String> {
    header(h, "etag")
        .map(|e| e.trim_matches('"').to_string())
        .filter(|e| !e.is_empty() && e.len() <= 1024)
        .ok_or_else(|| S3Error::Protocol("answer without an ETag".into()))
}

fn info_from_headers(h: &ureq::http::HeaderMap) -> S3Result<ObjectInfo> {
    let size = header(h, "content-length")
        .and_then(|s| s.parse::<u64>().ok())
        .ok_or_else(|| S3Error::Protocol("HEAD without a Content-Length".into()))?;
    let etag = etag_of(h)?.into();
    let mtime = header(h, "last-modified")
        .map(|s| parse_http_date(&s))
        .unwrap_or(0);
    Ok(ObjectInfo { size, etag, mtime })
}

fn content_md5(data: &[u8]) -> String {
    use base64::Engine;
    use md5::Digest;
    base64::engine::general_purpose::STANDARD.encode(md5::Md5::digest(data))
}

/// Percent-encodes a key for `x-amz-copy-source` (as in a URL path: `/` kept).
fn rusty_s3_path_encode(key: &str) -> String {
    let mut out = String::with_capacity(key.len());
    for b in key.bytes() {
        if b.is_ascii_alphanumeric() || b"-_.~/".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// `2024-01-02T03:04:05.000Z` → seconds since the epoch (0 if unreadable).
pub fn parse_iso8601(s: &str) -> i64 {
    s.parse::<jiff::Timestamp>()
        .map(|t| t.as_second())
        .unwrap_or(0)
}

/// `Tue, 02 Jan 2024 03:04:05 GMT` → seconds since the epoch (0 if unreadable).
pub fn parse_http_date(s: &str) -> i64 {
    jiff::fmt::rfc2822::parse(s)
        .map(|z| z.timestamp().as_second())
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dates_of_both_formats_parse() {
        assert_eq!(parse_iso8601("2024-01-02T03:04:05.000Z"), 1_704_164_645);
        assert_eq!(
            parse_http_date("Tue, 02 Jan 2024 03:04:05 GMT"),
            1_704_164_645
        );
        assert_eq!(parse_iso8601("garbage"), 0);
        assert_eq!(parse_http_date("garbage"), 0);
    }

    #[test]
    fn error_statuses_map_to_meanings() {
        assert_eq!(
            status_error(
                503,
                "<Code>ServiceUnavailable</Code><Message>[&quot;a &lt;b&gt; &amp;&apos;</Message>"
                    .into()
            ),
            S3Error::Status {
                status: 503,
                message: "ServiceUnavailable: [\"a <b> &'".into()
            }
        );
        assert_eq!(status_error(404, String::new()), S3Error::NotFound);
        assert_eq!(status_error(412, String::new()), S3Error::Changed);
        let d = status_error(
            403,
            "<Error><Code>AccessDenied</Code><Message>no</Message></Error>".into(),
        );
        assert_eq!(d, S3Error::Denied("AccessDenied: no".into()));
        assert!(transient(&status_error(
            503,
            "<Code>SlowDown</Code>".into()
        )));
        assert!(!transient(&S3Error::Unreachable(
            "Connection refused".into()
        )));
    }

    #[test]
    fn slots_bound_requests_in_flight() {
        use std::sync::atomic::{AtomicUsize, Ordering};
        let slots = Slots::new(3);
        let (now, most) = (AtomicUsize::new(0), AtomicUsize::new(0));
        std::thread::scope(|s| {
            for _ in 0..12 {
                s.spawn(|| {
                    for _ in 0..20 {
                        let _slot = slots.take();
                        let n = now.fetch_add(1, Ordering::SeqCst) + 1;
                        most.fetch_max(n, Ordering::SeqCst);
                        std::thread::yield_now();
                        now.fetch_sub(1, Ordering::SeqCst);
                    }
                });
            }
        });
        assert!(most.load(Ordering::SeqCst) <= 3);
        assert_eq!(*slots.free.lock(), 3, "every slot was given back");
    }

    #[test]
    fn copy_source_is_path_encoded() {
        assert_eq!(rusty_s3_path_encode("a b/c+d"), "a%20b/c%2Bd");
    }
}

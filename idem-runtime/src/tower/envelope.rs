//! How the guard keeps an HTTP answer in a record: the status in [`StoredResponse::status`], and
//! the chosen headers, the trailers and the body bytes in a small versioned envelope in
//! [`StoredResponse::body`].
//!
//! # Envelope, version 1
//!
//! ```text
//! magic      9 bytes   "idem/http"
//! version    1 byte    0x01
//! headers    u16 BE    number of header entries, then for each:
//!              u16 BE name length, the name (lower case), u32 BE value length, the value
//! trailers   1 byte    0x00: none; 0x01: present, then a u16 BE count and entries as above
//! body       the remaining bytes, exactly as the service answered them
//! ```
//!
//! A header with several values is several entries, in the order the service sent them. Each
//! map (the headers, the trailers) holds at most 1,024 entries whose names and values add up to
//! at most 256 KiB: an answer with more is not stored ([`Error::Encode`]), and a stored envelope
//! that claims more is refused before anything is allocated for it, so a corrupt count can
//! neither abort the process nor make it allocate what the bytes do not hold.
//!
//! Decoding is strict: a wrong magic, an unknown version, a truncated entry, a name or value
//! that is not a valid header, a map past the limits above, or a missing or impossible status is
//! [`Error::Decode`] (HTTP 500), never an answer made of whatever the bytes happened to hold.
//!
//! # Request envelope, version 1
//!
//! A resumable route ([`GuardLayer::resumable`](super::GuardLayer::resumable)) keeps the request
//! itself with its claim, as the payload of its [`StoredRequest`](crate::StoredRequest), so that
//! a completer can send it again ([`resend`](super::resend)):
//!
//! ```text
//! magic      9 bytes   "idem/hreq"
//! version    1 byte    0x01
//! method     u16 BE length, the method
//! target     u32 BE length, the path and query ("/orders/7?notify=1")
//! headers    u16 BE    number of header entries, then entries as in the answer's envelope
//! body       the remaining bytes, exactly as the client sent them
//! ```
//!
//! Only the headers the route names are kept (by default `content-type` and the key's header);
//! the request's trailers are not (nor are they fingerprinted). Decoding is as strict as the
//! answer's: a method, a target or a header that is not valid is [`Error::Decode`].

use bytes::{BufMut, Bytes, BytesMut};
use http::uri::PathAndQuery;
use http::{HeaderMap, HeaderName, HeaderValue, Method, StatusCode};

use crate::error::{Error, Result};
use crate::record::StoredResponse;

const MAGIC: &[u8] = b"idem/http";
const VERSION: u8 = 1;
/// The most entries one map (headers, trailers) may hold.
const MAX_ENTRIES: usize = 1024;
/// The most bytes the names and values of one map may hold together.
const MAX_MAP_BYTES: usize = 256 * 1024;

/// An HTTP answer as the guard stores and replays it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredHttpResponse {
    /// The status.
    pub status: StatusCode,
    /// The headers that were chosen for storage ([`GuardLayer::stored_headers`]).
    ///
    /// [`GuardLayer::stored_headers`]: super::GuardLayer::stored_headers
    pub headers: HeaderMap,
    /// The trailers, when the answer had any (a gRPC answer's `grpc-status`).
    pub trailers: Option<HeaderMap>,
    /// The body bytes.
    pub body: Bytes,
}

impl StoredHttpResponse {
    /// The record's form: the status, and the envelope of version 1 as its body. A final error
    /// (any status but 2xx) is marked as one.
    pub fn encode(&self) -> Result<StoredResponse> {
        let size = MAGIC.len() + 4 + self.body.len() + entries_len(&self.headers);
        let mut out = BytesMut::with_capacity(size);
        out.put_slice(MAGIC);
        out.put_u8(VERSION);
        put_entries(&mut out, &self.headers)?;
        match &self.trailers {
            None => out.put_u8(0),
            Some(t) => {
                out.put_u8(1);
                put_entries(&mut out, t)?;
            }
        }
        out.put_slice(&self.body);
        Ok(StoredResponse {
            status: Some(self.status.as_u16()),
            is_error: !self.status.is_success(),
            body: out.freeze(),
        })
    }

    /// Reads a stored answer back, strictly (see the module's documentation).
    pub fn decode(stored: &StoredResponse) -> Result<Self> {
        let status = stored
            .status
            .ok_or_else(|| bad("the stored answer has no HTTP status".into()))?;
        let status = StatusCode::from_u16(status)
            .map_err(|_| bad(format!("the stored HTTP status {status} is not a status")))?;
        let mut r = Reader {
            bytes: &stored.body,
            at: 0,
        };
        if r.take(MAGIC.len())? != MAGIC {
            return Err(bad("the stored answer is not an HTTP envelope".into()));
        }
        match r.u8()? {
            VERSION => {}
            v => return Err(bad(format!("unknown HTTP envelope version {v}"))),
        }
        let headers = r.entries()?;
        let trailers = match r.u8()? {
            0 => None,
            1 => Some(r.entries()?),
            f => return Err(bad(format!("unknown trailers flag {f}"))),
        };
        Ok(StoredHttpResponse {
            status,
            headers,
            trailers,
            body: stored.body.slice(r.at..),
        })
    }
}

const REQUEST_MAGIC: &[u8] = b"idem/hreq";
const REQUEST_VERSION: u8 = 1;

/// An HTTP request as a resumable route stores it with its claim, for a completer to send again:
/// the method, the path and query, the headers the route keeps, and the body bytes. The module
/// documentation gives the format.
///
/// ```
/// use bytes::Bytes;
/// use http::{HeaderMap, HeaderValue, Method};
/// use idem::tower::StoredHttpRequest;
///
/// let mut headers = HeaderMap::new();
/// headers.insert("content-type", HeaderValue::from_static("application/json"));
/// let request = StoredHttpRequest {
///     method: Method::POST,
///     target: "/orders/7/refunds?notify=1".parse()?,
///     headers,
///     body: Bytes::from_static(br#"{"cents":250}"#),
/// };
/// let bytes = request.encode()?;
/// assert!(bytes.starts_with(b"idem/hreq\x01"));
/// assert_eq!(StoredHttpRequest::decode(&bytes)?, request);
/// # Ok::<(), idem::BoxError>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredHttpRequest {
    /// The method.
    pub method: Method,
    /// The path and query the request was sent to.
    pub target: PathAndQuery,
    /// The headers the route keeps ([`GuardLayer::resumable_headers`](super::GuardLayer::resumable_headers)).
    pub headers: HeaderMap,
    /// The body bytes.
    pub body: Bytes,
}

impl StoredHttpRequest {
    /// The envelope of version 1. A map of headers past the limits of the answer's envelope is
    /// [`Error::Encode`].
    pub fn encode(&self) -> Result<Vec<u8>> {
        let method = self.method.as_str();
        let target = self.target.as_str();
        let mut out = BytesMut::with_capacity(self.encoded_len());
        out.put_slice(REQUEST_MAGIC);
        out.put_u8(REQUEST_VERSION);
        let method_len = u16::try_from(method.len())
            .map_err(|_| Error::Encode("a method longer than 65535 bytes".into()))?;
        out.put_u16(method_len);
        out.put_slice(method.as_bytes());
        let target_len = u32::try_from(target.len())
            .map_err(|_| Error::Encode("a request target longer than 4 GiB".into()))?;
        out.put_u32(target_len);
        out.put_slice(target.as_bytes());
        put_entries(&mut out, &self.headers)?;
        out.put_slice(&self.body);
        Ok(out.to_vec())
    }

    /// How many bytes [`StoredHttpRequest::encode`] writes.
    pub(crate) fn encoded_len(&self) -> usize {
        REQUEST_MAGIC.len()
            + 7
            + self.method.as_str().len()
            + self.target.as_str().len()
            + entries_len(&self.headers)
            + self.body.len()
    }

    /// Reads a stored request back, strictly (see the module's documentation).
    pub fn decode(bytes: &[u8]) -> Result<Self> {
        let mut r = Reader { bytes, at: 0 };
        if r.take(REQUEST_MAGIC.len())? != REQUEST_MAGIC {
            return Err(bad(
                "the stored request is not an HTTP request envelope".into()
            ));
        }
        match r.u8()? {
            REQUEST_VERSION => {}
            v => return Err(bad(format!("unknown HTTP request envelope version {v}"))),
        }
        let method_len = usize::from(r.u16()?);
        let method = Method::from_bytes(r.take(method_len)?)
            .map_err(|_| bad("the stored method is not a method".into()))?;
        let target_len = usize::try_from(r.u32()?)
            .map_err(|_| bad("the stored request target is too long".into()))?;
        let target = r.take(target_len)?;
        let target = PathAndQuery::try_from(target)
            .ok()
            .filter(|t| t.as_str().starts_with('/'))
            .ok_or_else(|| bad("the stored request target is not a path and query".into()))?;
        let headers = r.entries()?;
        Ok(StoredHttpRequest {
            method,
            target,
            headers,
            body: Bytes::copy_from_slice(&bytes[r.at..]),
        })
    }
}

fn bad(what: String) -> Error {
    Error::Decode(what)
}

fn entries_len(map: &HeaderMap) -> usize {
    2 + map
        .iter()
        .map(|(n, v)| 6 + n.as_str().len() + v.len())
        .sum::<usize>()
}

fn put_entries(out: &mut BytesMut, map: &HeaderMap) -> Result<()> {
    if map.len() > MAX_ENTRIES {
        return Err(Error::Encode(format!(
            "{} header entries, at most {MAX_ENTRIES}",
            map.len()
        )));
    }
    let bytes: usize = map.iter().map(|(n, v)| n.as_str().len() + v.len()).sum();
    if bytes > MAX_MAP_BYTES {
        return Err(Error::Encode(format!(
            "headers of {bytes} bytes, at most {MAX_MAP_BYTES}"
        )));
    }
    // At most MAX_ENTRIES.
    out.put_u16(map.len() as u16);
    for (name, value) in map {
        // A header name is at most 65535 bytes long (the `http` crate's limit).
        let name_len = u16::try_from(name.as_str().len())
            .map_err(|_| Error::Encode("a header name longer than 65535 bytes".into()))?;
        let value_len = u32::try_from(value.len())
            .map_err(|_| Error::Encode("a header value longer than 4 GiB".into()))?;
        out.put_u16(name_len);
        out.put_slice(name.as_str().as_bytes());
        out.put_u32(value_len);
        out.put_slice(value.as_bytes());
    }
    Ok(())
}

struct Reader<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8]> {
        let end = self
            .at
            .checked_add(n)
            .filter(|end| *end <= self.bytes.len())
            .ok_or_else(|| bad("the stored HTTP envelope is truncated".into()))?;
        let out = &self.bytes[self.at..end];
        self.at = end;
        Ok(out)
    }

    fn u8(&mut self) -> Result<u8> {
        Ok(self.take(1)?[0])
    }

    fn u16(&mut self) -> Result<u16> {
        let b = self.take(2)?;
        Ok(u16::from_be_bytes([b[0], b[1]]))
    }

    fn u32(&mut self) -> Result<u32> {
        let b = self.take(4)?;
        Ok(u32::from_be_bytes([b[0], b[1], b[2], b[3]]))
    }

    fn entries(&mut self) -> Result<HeaderMap> {
        let count = usize::from(self.u16()?);
        // Checked before the map is allocated: `HeaderMap::with_capacity` aborts past 32,768.
        if count > MAX_ENTRIES {
            return Err(bad(format!(
                "the stored envelope claims {count} header entries, at most {MAX_ENTRIES}"
            )));
        }
        let mut map = HeaderMap::with_capacity(count);
        let mut bytes = 0usize;
        for _ in 0..count {
            let name_len = usize::from(self.u16()?);
            let name = HeaderName::from_bytes(self.take(name_len)?)
                .map_err(|_| bad("a stored header name is not a header name".into()))?;
            let value_len = usize::try_from(self.u32()?)
                .map_err(|_| bad("a stored header value is too long".into()))?;
            bytes = bytes.saturating_add(name_len).saturating_add(value_len);
            if bytes > MAX_MAP_BYTES {
                return Err(bad(format!(
                    "the stored headers hold more than {MAX_MAP_BYTES} bytes"
                )));
            }
            let value = HeaderValue::from_bytes(self.take(value_len)?)
                .map_err(|_| bad(format!("the stored value of {name} is not a header value")))?;
            map.append(name, value);
        }
        Ok(map)
    }
}

#[cfg(test)]
mod tests {
    use http::header::{CONTENT_TYPE, LOCATION, SET_COOKIE};

    use super::*;

    fn sample() -> StoredHttpResponse {
        let mut headers = HeaderMap::new();
        headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
        headers.insert(LOCATION, HeaderValue::from_static("/orders/7"));
        headers.append(SET_COOKIE, HeaderValue::from_static("a=1"));
        headers.append(SET_COOKIE, HeaderValue::from_static("b=2"));
        let mut trailers = HeaderMap::new();
        trailers.insert("grpc-status", HeaderValue::from_static("0"));
        StoredHttpResponse {
            status: StatusCode::CREATED,
            headers,
            trailers: Some(trailers),
            body: Bytes::from_static(b"{\"id\":7}\x00\xff"),
        }
    }

    #[test]
    fn round_trips_exactly() {
        let a = sample();
        let stored = a.encode().unwrap();
        assert_eq!(stored.status, Some(201));
        assert!(!stored.is_error);
        let b = StoredHttpResponse::decode(&stored).unwrap();
        assert_eq!(a, b);
        let cookies: Vec<_> = b.headers.get_all(SET_COOKIE).iter().collect();
        assert_eq!(cookies, ["a=1", "b=2"], "every value, in order");

        let plain = StoredHttpResponse {
            status: StatusCode::UNPROCESSABLE_ENTITY,
            headers: HeaderMap::new(),
            trailers: None,
            body: Bytes::new(),
        };
        let stored = plain.encode().unwrap();
        assert!(stored.is_error, "a stored 4xx is a final error");
        assert_eq!(StoredHttpResponse::decode(&stored).unwrap(), plain);
    }

    #[test]
    fn answers_past_the_limits_are_not_stored() {
        let mut many = HeaderMap::new();
        for i in 0..=MAX_ENTRIES {
            many.append(SET_COOKIE, HeaderValue::from(i));
        }
        let mut large = HeaderMap::new();
        large.insert(
            LOCATION,
            HeaderValue::from_bytes(&[b'v'; 300 * 1024]).unwrap(),
        );
        for headers in [many, large] {
            let answer = StoredHttpResponse {
                status: StatusCode::OK,
                headers,
                trailers: None,
                body: Bytes::new(),
            };
            assert!(matches!(answer.encode(), Err(Error::Encode(_))));
        }
        let mut at_limit = HeaderMap::new();
        for i in 0..MAX_ENTRIES {
            at_limit.append(SET_COOKIE, HeaderValue::from(i));
        }
        let answer = StoredHttpResponse {
            status: StatusCode::OK,
            headers: at_limit,
            trailers: None,
            body: Bytes::new(),
        };
        let stored = answer.encode().unwrap();
        assert_eq!(StoredHttpResponse::decode(&stored).unwrap(), answer);
    }

    #[test]
    fn the_layout_is_the_documented_one() {
        let mut headers = HeaderMap::new();
        headers.insert(CONTENT_TYPE, HeaderValue::from_static("a/b"));
        let stored = StoredHttpResponse {
            status: StatusCode::OK,
            headers,
            trailers: None,
            body: Bytes::from_static(b"hi"),
        }
        .encode()
        .unwrap();
        let mut expected =
            b"idem/http\x01\x00\x01\x00\x0ccontent-type\x00\x00\x00\x03a/b\x00".to_vec();
        expected.extend_from_slice(b"hi");
        assert_eq!(&stored.body[..], &expected[..]);
    }

    fn request() -> StoredHttpRequest {
        let mut headers = HeaderMap::new();
        headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
        headers.append("x-tenant", HeaderValue::from_static("a"));
        headers.append("x-tenant", HeaderValue::from_static("b"));
        StoredHttpRequest {
            method: Method::PATCH,
            target: PathAndQuery::from_static("/orders/7?notify=1&x=%2F"),
            headers,
            body: Bytes::from_static(b"{\"cents\":250}\x00\xff"),
        }
    }

    #[test]
    fn a_request_round_trips_exactly_in_the_documented_layout() {
        let a = request();
        let bytes = a.encode().unwrap();
        assert_eq!(bytes.len(), a.encoded_len());
        let b = StoredHttpRequest::decode(&bytes).unwrap();
        assert_eq!(a, b);
        let tenants: Vec<_> = b.headers.get_all("x-tenant").iter().collect();
        assert_eq!(tenants, ["a", "b"], "every value, in order");

        let small = StoredHttpRequest {
            method: Method::POST,
            target: PathAndQuery::from_static("/o"),
            headers: HeaderMap::new(),
            body: Bytes::from_static(b"hi"),
        };
        let expected = b"idem/hreq\x01\x00\x04POST\x00\x00\x00\x02/o\x00\x00hi";
        assert_eq!(&small.encode().unwrap()[..], &expected[..]);
    }

    #[test]
    fn anything_but_a_valid_request_envelope_is_an_error() {
        let good = request().encode().unwrap();
        let mut cases: Vec<(&str, Vec<u8>)> = vec![
            (
                "an answer's envelope",
                sample().encode().unwrap().body.to_vec(),
            ),
            ("json", b"{\"order_no\":\"ORD-1\"}".to_vec()),
            ("unknown version", {
                let mut b = good.clone();
                b[REQUEST_MAGIC.len()] = 2;
                b
            }),
            ("bad method", {
                let mut b = good.clone();
                b[REQUEST_MAGIC.len() + 3] = b' ';
                b
            }),
            (
                "a target that is not a path",
                b"idem/hreq\x01\x00\x04POST\x00\x00\x00\x05o?a=1\x00\x00".to_vec(),
            ),
            (
                "a target that is not a URI",
                b"idem/hreq\x01\x00\x04POST\x00\x00\x00\x03/ o\x00\x00".to_vec(),
            ),
            (
                "a target longer than the bytes",
                b"idem/hreq\x01\x00\x04POST\xff\xff\xff\xff/".to_vec(),
            ),
            (
                "too many headers",
                b"idem/hreq\x01\x00\x04POST\x00\x00\x00\x01/\xff\xff".to_vec(),
            ),
        ];
        let head_len = good.len() - request().body.len();
        for cut in 0..head_len {
            cases.push(("truncated", good[..cut].to_vec()));
        }
        for (what, bytes) in cases {
            match StoredHttpRequest::decode(&bytes) {
                Err(Error::Decode(_)) => {}
                other => panic!("{what}: {other:?}"),
            }
        }
    }

    #[test]
    fn anything_but_a_valid_envelope_is_an_error() {
        let good = sample().encode().unwrap();
        let with_body = |body: &[u8]| StoredResponse {
            body: Bytes::copy_from_slice(body),
            ..good.clone()
        };
        let mut cases: Vec<(&str, StoredResponse)> = vec![
            ("json written by a function", with_body(b"{\"id\":7}")),
            ("empty", with_body(b"")),
            ("unknown version", {
                let mut b = good.body.to_vec();
                b[MAGIC.len()] = 2;
                with_body(&b)
            }),
            (
                "no status",
                StoredResponse {
                    status: None,
                    ..good.clone()
                },
            ),
            (
                "impossible status",
                StoredResponse {
                    status: Some(1000),
                    ..good.clone()
                },
            ),
            ("bad header name", {
                let mut b = good.body.to_vec();
                // The first name starts after magic, version, count and its length.
                b[MAGIC.len() + 5] = b' ';
                with_body(&b)
            }),
            ("bad trailers flag", {
                let mut b = b"idem/http\x01\x00\x00".to_vec();
                b.push(7);
                with_body(&b)
            }),
        ];
        // Counts and sizes past the limits, whatever the bytes that follow.
        for count in [1025u16, 32_769, u16::MAX] {
            let mut b = b"idem/http\x01".to_vec();
            b.extend_from_slice(&count.to_be_bytes());
            b.extend_from_slice(&[0; 64]);
            cases.push(("too many headers", with_body(&b)));
            let mut t = b"idem/http\x01\x00\x00\x01".to_vec();
            t.extend_from_slice(&count.to_be_bytes());
            cases.push(("too many trailers", with_body(&t)));
        }
        let mut big = b"idem/http\x01\x00\x02".to_vec();
        for _ in 0..2 {
            big.extend_from_slice(b"\x00\x01a");
            big.extend_from_slice(&(200 * 1024u32).to_be_bytes());
            big.extend_from_slice(&vec![b'v'; 200 * 1024]);
        }
        big.push(0);
        cases.push(("headers past 256 KiB", with_body(&big)));
        // Every truncation of the envelope's head.
        let head_len = good.body.len() - sample().body.len();
        for cut in 0..head_len {
            cases.push(("truncated", with_body(&good.body[..cut])));
        }
        for (what, stored) in cases {
            match StoredHttpResponse::decode(&stored) {
                Err(Error::Decode(_)) => {}
                other => panic!("{what}: {other:?}"),
            }
        }
    }
}

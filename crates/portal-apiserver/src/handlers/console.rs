//! The web console's files, built from `console/` (scripts/build-console)
//! and embedded in the binary. They are public, as a login page is: they
//! hold no cluster data. Everything the page shows it asks the API for with
//! the user's own bearer token, so RBAC applies to it as to kubectl.

use http::{header, HeaderMap, HeaderValue, Method, Response, StatusCode};

use crate::server::http::{full, text_response, Body};

/// Where the console lives on the API port.
pub(crate) const PREFIX: &str = "/console";

struct Asset {
    path: &'static str,
    content_type: &'static str,
    bytes: &'static [u8],
    etag: u64,
}

macro_rules! asset {
    ($path:literal, $file:literal, $content_type:literal) => {{
        const BYTES: &[u8] = include_bytes!(concat!("../../console/", $file));
        Asset {
            path: $path,
            content_type: $content_type,
            bytes: BYTES,
            etag: fnv1a(BYTES),
        }
    }};
}

const ASSETS: [Asset; 4] = [
    asset!("/console/", "index.html", "text/html; charset=utf-8"),
    asset!(
        "/console/console.js",
        "console.js",
        "text/javascript; charset=utf-8"
    ),
    asset!(
        "/console/console.css",
        "console.css",
        "text/css; charset=utf-8"
    ),
    // The notices of the packages bundled into console.js.
    asset!(
        "/console/licenses.txt",
        "licenses.txt",
        "text/plain; charset=utf-8"
    ),
];

/// The page may load only its own files and talk only to this server; it
/// may not be framed (no clickjacking of a signed-in user).
const CONTENT_SECURITY_POLICY: &str = "default-src 'none'; script-src 'self'; style-src 'self'; \
     img-src 'self' data:; connect-src 'self'; base-uri 'none'; form-action 'none'; \
     frame-ancestors 'none'";

/// A fingerprint of an asset's bytes, worked out at compile time.
const fn fnv1a(bytes: &[u8]) -> u64 {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    let mut i = 0;
    while i < bytes.len() {
        hash ^= bytes[i] as u64;
        hash = hash.wrapping_mul(0x0100_0000_01b3);
        i += 1;
    }
    hash
}

/// Whether `path` is the console's.
pub(crate) fn claims(path: &str) -> bool {
    path == PREFIX || path.starts_with("/console/")
}

/// Answers a request for one of the console's paths.
pub(crate) fn serve(method: &Method, path: &str, headers: &HeaderMap) -> Response<Body> {
    if method != Method::GET && method != Method::HEAD {
        let mut response = text_response(StatusCode::METHOD_NOT_ALLOWED, "method not allowed");
        response
            .headers_mut()
            .insert(header::ALLOW, HeaderValue::from_static("GET, HEAD"));
        return response;
    }
    // Relative paths inside the page resolve against the directory.
    if path == PREFIX {
        let mut response = Response::new(full(""));
        *response.status_mut() = StatusCode::PERMANENT_REDIRECT;
        response
            .headers_mut()
            .insert(header::LOCATION, HeaderValue::from_static("/console/"));
        return response;
    }
    let path = if path == "/console/index.html" {
        "/console/"
    } else {
        path
    };
    let Some(asset) = ASSETS.iter().find(|a| a.path == path) else {
        return text_response(StatusCode::NOT_FOUND, "not found");
    };
    let etag = format!("\"{:016x}\"", asset.etag);
    let unchanged = headers
        .get(header::IF_NONE_MATCH)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|tags| tags.split(',').any(|t| t.trim() == etag || t.trim() == "*"));
    let mut response = if unchanged {
        let mut response = Response::new(full(""));
        *response.status_mut() = StatusCode::NOT_MODIFIED;
        response
    } else if method == Method::HEAD {
        let mut response = Response::new(full(""));
        response
            .headers_mut()
            .insert(header::CONTENT_LENGTH, HeaderValue::from(asset.bytes.len()));
        response
    } else {
        Response::new(full(asset.bytes))
    };
    let headers = response.headers_mut();
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static(asset.content_type),
    );
    if let Ok(value) = HeaderValue::from_str(&etag) {
        headers.insert(header::ETAG, value);
    }
    // Asked again each time, answered 304 while the binary is the same.
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    headers.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(CONTENT_SECURITY_POLICY),
    );
    headers.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    headers.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    headers.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("no-referrer"),
    );
    response
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::BodyExt;

    async fn body(response: Response<Body>) -> Vec<u8> {
        response
            .into_body()
            .collect()
            .await
            .unwrap()
            .to_bytes()
            .to_vec()
    }

    #[tokio::test]
    async fn serves_the_page_and_its_files() {
        let page = serve(&Method::GET, "/console/", &HeaderMap::new());
        assert_eq!(page.status(), StatusCode::OK);
        assert_eq!(
            page.headers()[header::CONTENT_TYPE],
            "text/html; charset=utf-8"
        );
        assert!(page.headers()[header::CONTENT_SECURITY_POLICY]
            .to_str()
            .unwrap()
            .contains("frame-ancestors 'none'"));
        let html = String::from_utf8(body(page).await).unwrap();
        // The page names the files served beside it.
        for file in ["/console/console.js", "/console/console.css"] {
            assert!(html.contains(file), "{html}");
            let response = serve(&Method::GET, file, &HeaderMap::new());
            assert_eq!(response.status(), StatusCode::OK, "{file}");
            assert!(!body(response).await.is_empty());
        }
    }

    #[tokio::test]
    async fn the_bare_prefix_redirects_and_others_are_not_found() {
        let response = serve(&Method::GET, "/console", &HeaderMap::new());
        assert_eq!(response.status(), StatusCode::PERMANENT_REDIRECT);
        assert_eq!(response.headers()[header::LOCATION], "/console/");
        let missing = serve(&Method::GET, "/console/../etc/passwd", &HeaderMap::new());
        assert_eq!(missing.status(), StatusCode::NOT_FOUND);
        let post = serve(&Method::POST, "/console/", &HeaderMap::new());
        assert_eq!(post.status(), StatusCode::METHOD_NOT_ALLOWED);
        assert!(claims("/console") && claims("/console/x") && !claims("/consoles"));
    }

    #[tokio::test]
    async fn an_unchanged_file_is_not_sent_again() {
        let first = serve(&Method::GET, "/console/console.js", &HeaderMap::new());
        let etag = first.headers()[header::ETAG].clone();
        let mut headers = HeaderMap::new();
        headers.insert(header::IF_NONE_MATCH, etag);
        let again = serve(&Method::GET, "/console/console.js", &headers);
        assert_eq!(again.status(), StatusCode::NOT_MODIFIED);
        assert!(body(again).await.is_empty());
    }
}

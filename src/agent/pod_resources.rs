//! Which GPUs the kubelet gave to which pods: the kubelet's pod-resources API
//! (`v1.PodResourcesLister/List`, gRPC over the Unix socket
//! `/var/lib/kubelet/pod-resources/kubelet.sock`).
//!
//! The call is one unary gRPC request, so it is made with hyper's HTTP/2
//! client and the few protobuf fields needed are decoded by hand: no protobuf
//! code generation and no gRPC framework in the build.
//!
//! Device IDs from the NVIDIA device plugin are GPU UUIDs (`GPU-…`), MIG UUIDs
//! (`MIG-…`), indices (`deviceIDStrategy: index`), or replicas of a shared GPU
//! (`GPU-…::3` under time-slicing or MPS).

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::rt::{TokioExecutor, TokioIo};

use super::probe::{Assignment, Assignments};

/// Where the kubelet serves the API.
pub const DEFAULT_SOCKET: &str = "/var/lib/kubelet/pod-resources/kubelet.sock";
/// The List method's path.
pub const LIST_PATH: &str = "/v1.PodResourcesLister/List";
/// Resource names counted as GPUs: `nvidia.com/gpu`, `nvidia.com/mig-1g.10gb`, …
pub const GPU_RESOURCE_PREFIX: &str = "nvidia.com/";
/// Largest response accepted (a node runs at most a few hundred pods).
const MAX_RESPONSE_BYTES: usize = 16 << 20;

/// Why the pod-resources API could not be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PodResourcesError {
    #[error("connecting to {socket}: {reason}")]
    Connect { socket: String, reason: String },
    #[error("{LIST_PATH}: {0}")]
    Http(String),
    #[error("{LIST_PATH}: gRPC status {code}: {message}")]
    Grpc { code: u32, message: String },
    #[error("{LIST_PATH}: no answer within {0:?}")]
    Timeout(Duration),
    #[error("decoding the ListPodResourcesResponse: {0}")]
    Decode(String),
}

/// One container's devices of one resource.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ContainerDevices {
    pub resource_name: String,
    pub device_ids: Vec<String>,
}

/// A pod and the devices its containers were given.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PodDevices {
    pub namespace: String,
    pub name: String,
    pub devices: Vec<ContainerDevices>,
}

/// Ask the kubelet which devices each pod holds.
pub async fn list(socket: &Path, timeout: Duration) -> Result<Vec<PodDevices>, PodResourcesError> {
    tokio::time::timeout(timeout, list_inner(socket))
        .await
        .map_err(|_| PodResourcesError::Timeout(timeout))?
}

async fn list_inner(socket: &Path) -> Result<Vec<PodDevices>, PodResourcesError> {
    let connect = |reason: String| PodResourcesError::Connect {
        socket: socket.display().to_string(),
        reason,
    };
    let stream = tokio::net::UnixStream::connect(socket)
        .await
        .map_err(|e| connect(e.to_string()))?;
    let (mut sender, conn) =
        hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(stream))
            .await
            .map_err(|e| connect(e.to_string()))?;
    // An empty ListPodResourcesRequest: not compressed, length 0.
    let request = hyper::Request::builder()
        .method(hyper::Method::POST)
        .uri(format!("http://localhost{LIST_PATH}"))
        .header(hyper::header::CONTENT_TYPE, "application/grpc")
        .header(hyper::header::TE, "trailers")
        .body(Full::new(Bytes::from_static(&[0, 0, 0, 0, 0])))
        .map_err(|e| PodResourcesError::Http(e.to_string()))?;
    let call = async move {
        let response = sender
            .send_request(request)
            .await
            .map_err(|e| PodResourcesError::Http(e.to_string()))?;
        let (parts, body) = response.into_parts();
        let collected = body
            .collect()
            .await
            .map_err(|e| PodResourcesError::Http(e.to_string()))?;
        Ok::<_, PodResourcesError>((parts, collected))
    };
    // The connection is driven alongside the call and dropped with it.
    let (parts, collected) = tokio::select! {
        r = call => r?,
        r = conn => {
            return Err(PodResourcesError::Http(match r {
                Ok(()) => "the kubelet closed the connection before answering".to_string(),
                Err(e) => e.to_string(),
            }));
        }
    };
    if parts.status != hyper::StatusCode::OK {
        return Err(PodResourcesError::Http(format!(
            "HTTP status {}",
            parts.status
        )));
    }
    // grpc-status comes in the trailers, or in the headers of a trailers-only answer.
    let trailers = collected.trailers().cloned().unwrap_or_default();
    let status = trailers
        .get("grpc-status")
        .or_else(|| parts.headers.get("grpc-status"));
    let code = status
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u32>().ok());
    match code {
        Some(0) => {}
        Some(code) => {
            let message = trailers
                .get("grpc-message")
                .or_else(|| parts.headers.get("grpc-message"))
                .and_then(|v| v.to_str().ok())
                .unwrap_or("")
                .to_string();
            return Err(PodResourcesError::Grpc { code, message });
        }
        None => {
            return Err(PodResourcesError::Http(
                "no grpc-status in the answer".to_string(),
            ));
        }
    }
    let body = collected.to_bytes();
    if body.len() > MAX_RESPONSE_BYTES {
        return Err(PodResourcesError::Decode(format!(
            "{} bytes is more than the {MAX_RESPONSE_BYTES} accepted",
            body.len()
        )));
    }
    decode_list_response(unframe(&body)?)
}

/// The one message of a unary gRPC answer, without its 5-byte frame header.
pub fn unframe(body: &[u8]) -> Result<&[u8], PodResourcesError> {
    let decode = |m: &str| PodResourcesError::Decode(m.to_string());
    let (&flag, rest) = body
        .split_first()
        .ok_or_else(|| decode("empty gRPC body"))?;
    if flag != 0 {
        return Err(decode("the message is compressed; none was asked for"));
    }
    let len_bytes: [u8; 4] = rest
        .get(..4)
        .and_then(|b| b.try_into().ok())
        .ok_or_else(|| decode("truncated gRPC frame header"))?;
    let len = u32::from_be_bytes(len_bytes) as usize;
    rest.get(4..4 + len)
        .ok_or_else(|| decode("the gRPC frame is shorter than its length"))
}

/// A protobuf field as read off the wire.
enum Wire<'a> {
    Varint,
    Bytes(&'a [u8]),
    Fixed,
}

struct Reader<'a> {
    buf: &'a [u8],
}

impl<'a> Reader<'a> {
    fn varint(&mut self) -> Result<u64, PodResourcesError> {
        let mut v: u64 = 0;
        for shift in (0..64).step_by(7) {
            let (&b, rest) = self
                .buf
                .split_first()
                .ok_or_else(|| PodResourcesError::Decode("truncated varint".to_string()))?;
            self.buf = rest;
            v |= u64::from(b & 0x7f) << shift;
            if b & 0x80 == 0 {
                return Ok(v);
            }
        }
        Err(PodResourcesError::Decode(
            "varint longer than 10 bytes".to_string(),
        ))
    }

    fn take(&mut self, n: usize) -> Result<&'a [u8], PodResourcesError> {
        if n > self.buf.len() {
            return Err(PodResourcesError::Decode(format!(
                "a field of {n} bytes with {} left",
                self.buf.len()
            )));
        }
        let (head, rest) = self.buf.split_at(n);
        self.buf = rest;
        Ok(head)
    }

    /// The next field number and value; `None` at the end.
    fn next(&mut self) -> Result<Option<(u64, Wire<'a>)>, PodResourcesError> {
        if self.buf.is_empty() {
            return Ok(None);
        }
        let key = self.varint()?;
        let wire = match key & 7 {
            0 => {
                self.varint()?;
                Wire::Varint
            }
            1 => {
                self.take(8)?;
                Wire::Fixed
            }
            2 => {
                let n = usize::try_from(self.varint()?)
                    .map_err(|_| PodResourcesError::Decode("length overflows".to_string()))?;
                Wire::Bytes(self.take(n)?)
            }
            5 => {
                self.take(4)?;
                Wire::Fixed
            }
            t => {
                return Err(PodResourcesError::Decode(format!(
                    "wire type {t} (groups) is not used by this API"
                )));
            }
        };
        Ok(Some((key >> 3, wire)))
    }
}

fn string(b: &[u8]) -> Result<String, PodResourcesError> {
    String::from_utf8(b.to_vec()).map_err(|e| PodResourcesError::Decode(e.to_string()))
}

/// Decode `ListPodResourcesResponse { repeated PodResources pod_resources = 1; }`
/// where `PodResources { name = 1; namespace = 2; repeated ContainerResources
/// containers = 3; }`, `ContainerResources { name = 1; repeated
/// ContainerDevices devices = 2; … }` and `ContainerDevices { resource_name = 1;
/// repeated string device_ids = 2; … }`. Other fields are skipped.
pub fn decode_list_response(msg: &[u8]) -> Result<Vec<PodDevices>, PodResourcesError> {
    let mut pods = Vec::new();
    let mut r = Reader { buf: msg };
    while let Some((f, w)) = r.next()? {
        if let (1, Wire::Bytes(pod)) = (f, w) {
            pods.push(decode_pod(pod)?);
        }
    }
    Ok(pods)
}

fn decode_pod(msg: &[u8]) -> Result<PodDevices, PodResourcesError> {
    let mut pod = PodDevices::default();
    let mut r = Reader { buf: msg };
    while let Some((f, w)) = r.next()? {
        match (f, w) {
            (1, Wire::Bytes(b)) => pod.name = string(b)?,
            (2, Wire::Bytes(b)) => pod.namespace = string(b)?,
            (3, Wire::Bytes(container)) => {
                let mut c = Reader { buf: container };
                while let Some((f, w)) = c.next()? {
                    if let (2, Wire::Bytes(devices)) = (f, w) {
                        pod.devices.push(decode_devices(devices)?);
                    }
                }
            }
            _ => {}
        }
    }
    Ok(pod)
}

fn decode_devices(msg: &[u8]) -> Result<ContainerDevices, PodResourcesError> {
    let mut d = ContainerDevices::default();
    let mut r = Reader { buf: msg };
    while let Some((f, w)) = r.next()? {
        match (f, w) {
            (1, Wire::Bytes(b)) => d.resource_name = string(b)?,
            (2, Wire::Bytes(b)) => d.device_ids.push(string(b)?),
            _ => {}
        }
    }
    Ok(d)
}

/// Which GPU devices are held, by whom. A device ID with a `::n` replica
/// suffix is shared; a GPU held by several pods is shared too.
pub fn assignments(pods: &[PodDevices]) -> Assignments {
    let mut pods_of: BTreeMap<String, (Vec<String>, bool)> = BTreeMap::new();
    for pod in pods {
        let who = format!("{}/{}", pod.namespace, pod.name);
        for d in &pod.devices {
            if !d.resource_name.starts_with(GPU_RESOURCE_PREFIX) {
                continue;
            }
            for id in &d.device_ids {
                let (device, replica) = match id.split_once("::") {
                    Some((dev, _)) => (dev.to_string(), true),
                    None => (id.clone(), false),
                };
                let e = pods_of.entry(device).or_default();
                if !e.0.contains(&who) {
                    e.0.push(who.clone());
                }
                e.1 |= replica;
            }
        }
    }
    let mut out = Assignments::default();
    for (device, (who, replica)) in pods_of {
        let a = Assignment {
            shared: replica || who.len() > 1,
            pod: who.join(", "),
        };
        match device.parse::<u32>() {
            Ok(i) => {
                out.by_index.insert(i, a);
            }
            Err(_) => {
                out.by_uuid.insert(device, a);
            }
        }
    }
    out
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    fn varint(mut v: u64, out: &mut Vec<u8>) {
        loop {
            let b = (v & 0x7f) as u8;
            v >>= 7;
            if v == 0 {
                out.push(b);
                return;
            }
            out.push(b | 0x80);
        }
    }

    fn bytes_field(n: u64, b: &[u8], out: &mut Vec<u8>) {
        varint(n << 3 | 2, out);
        varint(b.len() as u64, out);
        out.extend_from_slice(b);
    }

    /// Encode a ListPodResourcesResponse (plus an unknown varint field and
    /// cpu_ids, which the decoder must skip).
    pub(crate) fn encode(pods: &[PodDevices]) -> Vec<u8> {
        let mut out = Vec::new();
        for p in pods {
            let mut pod = Vec::new();
            bytes_field(1, p.name.as_bytes(), &mut pod);
            bytes_field(2, p.namespace.as_bytes(), &mut pod);
            let mut container = Vec::new();
            bytes_field(1, b"main", &mut container);
            for d in &p.devices {
                let mut dev = Vec::new();
                bytes_field(1, d.resource_name.as_bytes(), &mut dev);
                for id in &d.device_ids {
                    bytes_field(2, id.as_bytes(), &mut dev);
                }
                bytes_field(2, &dev, &mut container);
            }
            varint(3 << 3, &mut container); // cpu_ids, packed as varints one by one
            varint(7, &mut container);
            bytes_field(3, &container, &mut pod);
            varint(9 << 3, &mut pod); // a field from a newer kubelet
            varint(300, &mut pod);
            bytes_field(1, &pod, &mut out);
        }
        out
    }

    fn pod(ns: &str, name: &str, resource: &str, ids: &[&str]) -> PodDevices {
        PodDevices {
            namespace: ns.into(),
            name: name.into(),
            devices: vec![ContainerDevices {
                resource_name: resource.into(),
                device_ids: ids.iter().map(|s| s.to_string()).collect(),
            }],
        }
    }

    #[test]
    fn round_trip() {
        let pods = vec![
            pod("ml", "trainer-0", "nvidia.com/gpu", &["GPU-a", "GPU-b"]),
            pod("web", "nginx", "example.com/fpga", &["f0"]),
        ];
        let framed = {
            let msg = encode(&pods);
            let mut f = vec![0];
            f.extend_from_slice(&(msg.len() as u32).to_be_bytes());
            f.extend_from_slice(&msg);
            f
        };
        assert_eq!(
            decode_list_response(unframe(&framed).unwrap()).unwrap(),
            pods
        );
    }

    #[test]
    fn bad_input_is_an_error() {
        assert!(unframe(&[]).is_err());
        assert!(unframe(&[1, 0, 0, 0, 0]).is_err());
        assert!(unframe(&[0, 0, 0, 0, 9, 1]).is_err());
        assert!(decode_list_response(&[0x0a, 0x05, 0x01]).is_err());
        assert!(decode_list_response(&[0x0b]).is_err());
    }

    #[test]
    fn exclusive_shared_mig_and_index_ids() {
        let a = assignments(&[
            pod("ml", "a", "nvidia.com/gpu", &["GPU-1"]),
            pod("ml", "b", "nvidia.com/gpu", &["GPU-2::0"]),
            pod("ml", "c", "nvidia.com/gpu", &["GPU-2::1"]),
            pod("ml", "d", "nvidia.com/mig-1g.10gb", &["MIG-9"]),
            pod("ml", "e", "nvidia.com/gpu", &["3"]),
            pod("web", "f", "example.com/fpga", &["GPU-7"]),
        ]);
        assert_eq!(
            a.by_uuid["GPU-1"],
            Assignment {
                pod: "ml/a".into(),
                shared: false
            }
        );
        assert_eq!(
            a.by_uuid["GPU-2"],
            Assignment {
                pod: "ml/b, ml/c".into(),
                shared: true
            }
        );
        assert!(!a.by_uuid["MIG-9"].shared);
        assert_eq!(a.by_index[&3].pod, "ml/e");
        assert!(!a.by_uuid.contains_key("GPU-7"));
    }

    /// The whole client against a gRPC server on a Unix socket.
    #[tokio::test]
    async fn lists_over_grpc() {
        use http_body_util::StreamBody;
        use hyper::body::Frame;

        let dir = std::env::temp_dir().join(format!("vg-podres-{}", std::process::id()));
        let _ = std::fs::create_dir_all(&dir);
        let socket = dir.join("kubelet.sock");
        let _ = std::fs::remove_file(&socket);
        let listener = tokio::net::UnixListener::bind(&socket).unwrap();
        let pods = vec![pod("ml", "trainer-0", "nvidia.com/gpu", &["GPU-a"])];
        let msg = encode(&pods);
        let server = async move {
            let (stream, _) = listener.accept().await.unwrap();
            let service =
                hyper::service::service_fn(move |req: hyper::Request<hyper::body::Incoming>| {
                    let msg = msg.clone();
                    async move {
                        assert_eq!(req.uri().path(), LIST_PATH);
                        assert_eq!(req.headers()["content-type"], "application/grpc");
                        let mut framed = vec![0];
                        framed.extend_from_slice(&(msg.len() as u32).to_be_bytes());
                        framed.extend_from_slice(&msg);
                        let mut trailers = hyper::HeaderMap::new();
                        trailers.insert("grpc-status", "0".parse().unwrap());
                        let frames = vec![
                            Ok::<_, std::convert::Infallible>(Frame::data(Bytes::from(framed))),
                            Ok(Frame::trailers(trailers)),
                        ];
                        let body = StreamBody::new(futures::stream::iter(frames));
                        Ok::<_, std::convert::Infallible>(
                            hyper::Response::builder()
                                .header("content-type", "application/grpc")
                                .body(body)
                                .unwrap(),
                        )
                    }
                });
            let _ = hyper::server::conn::http2::Builder::new(TokioExecutor::new())
                .serve_connection(TokioIo::new(stream), service)
                .await;
        };
        let client = list(&socket, Duration::from_secs(5));
        let (got, ()) = tokio::join!(client, server);
        assert_eq!(got.unwrap(), pods);
        let missing = list(&dir.join("nope.sock"), Duration::from_secs(1))
            .await
            .unwrap_err();
        assert!(missing.to_string().contains("nope.sock"), "{missing}");
        let _ = std::fs::remove_dir_all(&dir);
    }
}

//! Connections: TLS on accepted TCP, HTTP/1.1 or HTTP/2 by ALPN (or by the
//! first bytes), each bounded in count, handshake, head and idle time, and
//! drained on shutdown.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::http::{Request, Response};
use futures::future::BoxFuture;
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto::Builder;
use hyper_util::service::TowerToHyperService;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;
use tower::ServiceExt;

use super::server::{AppState, HANDSHAKE_TIMEOUT, Limits};

/// Requests one HTTP/2 connection may have open at once.
const MAX_STREAMS: u32 = 100;
/// HTTP/2 flow-control windows: what a client may send ahead of the server's
/// reading, per request and per connection (hyper's default is 1 MiB each).
const STREAM_WINDOW: u32 = 128 * 1024;
const CONNECTION_WINDOW: u32 = 256 * 1024;
/// Largest HTTP/1.1 read buffer (a request head must fit; hyper's default is ~400 KiB).
const HTTP1_BUFFER: usize = 64 * 1024;
/// Pause after an accept error (file descriptors exhausted, say) before the next accept.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(50);

/// Where the server is in its life; connections watch it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Phase {
    Serving,
    /// Stop taking requests, finish those in flight.
    Draining,
    /// Close now.
    Stopped,
}

/// One place among `max_connections`, given back when dropped.
struct Slot(Gauge);

impl Slot {
    fn take(open: &Gauge, cap: usize) -> Option<Slot> {
        if open.inc() >= cap as i64 {
            open.dec();
            return None;
        }
        Some(Slot(open.clone()))
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.0.dec();
    }
}

/// Requests in flight on one connection, and when the last one ended.
struct Activity {
    in_flight: usize,
    since: Instant,
}

/// The router, counting the requests in flight on its connection.
#[derive(Clone)]
struct Tracked {
    router: Router,
    activity: Arc<Mutex<Activity>>,
}

/// Marks a request finished (or dropped) when it goes.
struct Busy(Arc<Mutex<Activity>>);

impl Drop for Busy {
    fn drop(&mut self) {
        let mut a = lock(&self.0);
        a.in_flight -= 1;
        a.since = Instant::now();
    }
}

fn lock(a: &Mutex<Activity>) -> std::sync::MutexGuard<'_, Activity> {
    a.lock().unwrap_or_else(|e| e.into_inner())
}

impl tower::Service<Request<Incoming>> for Tracked {
    type Response = Response<Body>;
    type Error = Infallible;
    type Future = BoxFuture<'static, Result<Response<Body>, Infallible>>;

    fn poll_ready(
        &mut self,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), Infallible>> {
        std::task::Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: Request<Incoming>) -> Self::Future {
        lock(&self.activity).in_flight += 1;
        let busy = Busy(self.activity.clone());
        let answer = self.router.clone().oneshot(request);
        Box::pin(async move {
            let response = answer.await;
            drop(busy);
            response
        })
    }
}

/// When the connection goes idle: `None` while a request is in flight.
fn idle_at(activity: &Mutex<Activity>, idle: Duration) -> Option<Instant> {
    let a = lock(activity);
    (a.in_flight == 0).then(|| a.since + idle)
}

/// The bounds on connections and where their count goes.
#[derive(Clone, Debug)]
pub struct Connections {
    /// `idle_timeout`, `max_connections`, and `timeout` (how long a closing
    /// connection's request in flight may take).
    pub limits: Limits,
    /// Connections open now.
    pub open: Gauge,
    /// Connections closed at once because `open` was at the cap.
    pub refused: Counter,
}

impl Connections {
    /// Counted in the webhook's own metrics (`/metrics` of `state`).
    pub fn of(state: &AppState, limits: Limits) -> Connections {
        Connections {
            limits,
            open: state.metrics.connections.clone(),
            refused: state.metrics.refused.clone(),
        }
    }
}

/// Serve `router` (the webhook's: [`router_with`](super::router_with)) over TLS
/// on `addr` until `shutdown` resolves, then stop accepting and give in-flight
/// requests `drain` to finish. `bound` receives the actual address (useful
/// with port 0). At most `connections.limits.max_connections` are open at once;
/// one more is closed as it is accepted.
pub async fn serve(
    addr: SocketAddr,
    router: Router,
    connections: Connections,
    tls: axum_server::tls_rustls::RustlsConfig,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
    drain: Duration,
    bound: Option<tokio::sync::oneshot::Sender<SocketAddr>>,
) -> std::io::Result<()> {
    let listener = TcpListener::bind(addr).await?;
    if let Some(tx) = bound {
        let _ = tx.send(listener.local_addr()?);
    }
    let Connections {
        limits,
        open,
        refused,
    } = connections;
    let mut builder = Builder::new(TokioExecutor::new());
    // hyper's head timeout needs a timer; it also bounds the wait for the next
    // head on a keep-alive connection.
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(HANDSHAKE_TIMEOUT)
        .max_buf_size(HTTP1_BUFFER);
    builder
        .http2()
        .timer(TokioTimer::new())
        .max_concurrent_streams(MAX_STREAMS)
        .initial_stream_window_size(STREAM_WINDOW)
        .initial_connection_window_size(CONNECTION_WINDOW);
    let builder = Arc::new(builder);
    let (phase, watching) = watch::channel(Phase::Serving);
    // Every connection holds a sender; when all are gone, `recv` answers None.
    let (alive, mut all_closed) = mpsc::channel::<Infallible>(1);
    tokio::pin!(shutdown);
    loop {
        let tcp = tokio::select! {
            biased;
            () = &mut shutdown => break,
            accepted = listener.accept() => match accepted {
                Ok((tcp, _)) => tcp,
                Err(error) => {
                    tracing::warn!(%error, "accepting a connection");
                    tokio::time::sleep(ACCEPT_BACKOFF).await;
                    continue;
                }
            },
        };
        let Some(slot) = Slot::take(&open, limits.max_connections) else {
            refused.inc();
            drop(tcp);
            continue;
        };
        tokio::spawn(connection(
            tcp,
            slot,
            tls.get_inner(),
            Tracked {
                router: router.clone(),
                activity: Arc::new(Mutex::new(Activity {
                    in_flight: 0,
                    since: Instant::now(),
                })),
            },
            builder.clone(),
            limits,
            watching.clone(),
            alive.clone(),
        ));
    }
    drop(listener);
    drop(alive);
    let _ = phase.send(Phase::Draining);
    if tokio::time::timeout(drain, all_closed.recv())
        .await
        .is_err()
    {
        let _ = phase.send(Phase::Stopped);
        all_closed.recv().await;
    }
    Ok(())
}

/// One connection, from the TLS handshake to its close.
#[allow(clippy::too_many_arguments)]
async fn connection(
    tcp: TcpStream,
    _slot: Slot,
    tls: Arc<rustls::ServerConfig>,
    service: Tracked,
    builder: Arc<Builder<TokioExecutor>>,
    limits: Limits,
    mut phase: watch::Receiver<Phase>,
    _alive: mpsc::Sender<Infallible>,
) {
    // An answer is one small write; without TCP_NODELAY Nagle's algorithm can
    // hold it back until the client's delayed ACK (tens of milliseconds).
    let _ = tcp.set_nodelay(true);
    let handshake = tokio::time::timeout(
        HANDSHAKE_TIMEOUT,
        tokio_rustls::TlsAcceptor::from(tls).accept(tcp),
    );
    let stream = tokio::select! {
        done = handshake => match done {
            Ok(Ok(stream)) => stream,
            _ => return,
        },
        _ = phase.wait_for(|p| *p != Phase::Serving) => return,
    };
    let activity = service.activity.clone();
    let conn = builder.serve_connection(TokioIo::new(stream), TowerToHyperService::new(service));
    tokio::pin!(conn);
    // Serve until the connection ends, idles past the limit, or the server drains.
    let mut draining = false;
    loop {
        let wake = idle_at(&activity, limits.idle_timeout)
            .unwrap_or_else(|| Instant::now() + limits.idle_timeout);
        tokio::select! {
            _ = &mut conn => return,
            () = tokio::time::sleep_until(wake) => {
                if idle_at(&activity, limits.idle_timeout).is_some_and(|at| at <= Instant::now()) {
                    break;
                }
            }
            _ = phase.wait_for(|p| *p != Phase::Serving) => {
                draining = true;
                break;
            }
        }
    }
    // HTTP/2 gets GOAWAY; HTTP/1.1 closes after the request in flight, if any.
    conn.as_mut().graceful_shutdown();
    let grace = if draining {
        Duration::MAX
    } else {
        limits.timeout
    };
    tokio::select! {
        _ = &mut conn => {}
        _ = tokio::time::sleep(grace) => {}
        _ = phase.wait_for(|p| *p == Phase::Stopped) => {}
    }
}

//! A gRPC client stream as a reference for batchwire's `throughput` (issue 38): one
//! process streams N messages of S bytes to another over one client-streaming call; the
//! server checks every sequence number and answers once it has them all.
//!
//!     grpc-ref server --listen 127.0.0.1:7700 [--once]
//!     grpc-ref client --peer 127.0.0.1:7700 --messages 1000000 --size 1000 [--fresh]
//!
//! The client prints one line: `grpc SIZE B: N msgs in T s = R msgs/s (lost L, duplicated
//! D, reordered O)`, timed from just before the call until the server's answer came (so
//! the pipeline's fill and drain count, as in batchwire's throughput). The payload's first
//! 8 bytes are the sequence number, little-endian, as batchwire's bench stamps them. The
//! payloads are built before the clock starts, as there (slices of one buffer), or with
//! `--fresh` each as it is sent (faster for gRPC here at 1 KB and 10 KB: a payload just
//! written is in cache; `vs.py` runs both and compares with the faster). Both ends run on tokio's current-thread
//! runtime (one thread each), with HTTP/2 stream and connection windows of 16 MiB, frames
//! of up to 64 KiB and TCP_NODELAY, so neither flow control nor a thread hand-off is what
//! limits it.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use bytes::{BufMut, Bytes, BytesMut};
use tonic::codegen::{BoxFuture, Context, Poll, Service, http};
use tonic::{Request, Response, Status, Streaming};

/// One message: `bytes payload = 1`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Msg {
    #[prost(bytes = "bytes", tag = "1")]
    pub payload: Bytes,
}

/// The server's answer: what it received.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Summary {
    #[prost(uint64, tag = "1")]
    pub distinct: u64,
    #[prost(uint64, tag = "2")]
    pub duplicated: u64,
    #[prost(uint64, tag = "3")]
    pub reordered: u64,
}

const PATH: &str = "/bench.Sink/Stream";
const WINDOW: u32 = 16 << 20;
/// The largest HTTP/2 frame either end takes. The default, 16 KiB, gave 1.2-1.6 M msgs/s
/// at 1 KB here; 64 KiB 2.3-2.5 M; 256 KiB to 16 MiB no more (1.5-2.5 M, noisier); larger
/// encode buffers than tonic's (8 KiB, yielding at 32 KiB) no better either.
const FRAME: u32 = 64 << 10;

fn arg(args: &[String], name: &str) -> Option<String> {
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1).cloned())
}

fn need(args: &[String], name: &str) -> String {
    arg(args, name).unwrap_or_else(|| {
        eprintln!("missing {name} VALUE (see the top of scripts/grpc-ref/src/main.rs)");
        std::process::exit(2)
    })
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let args: Vec<String> = std::env::args().collect();
    let r = match args.get(1).map(String::as_str) {
        Some("server") => {
            server(
                need(&args, "--listen").parse().expect("--listen ADDR"),
                args.iter().any(|a| a == "--once"),
            )
            .await
        }
        Some("client") => {
            client(
                need(&args, "--peer").parse().expect("--peer ADDR"),
                need(&args, "--messages").parse().expect("--messages N"),
                need(&args, "--size").parse().expect("--size BYTES"),
                args.iter().any(|a| a == "--fresh"),
            )
            .await
        }
        _ => Err(
            "usage: grpc-ref server --listen ADDR | client --peer ADDR --messages N --size BYTES"
                .into(),
        ),
    };
    if let Err(e) = r {
        eprintln!("grpc-ref: {e}");
        std::process::exit(1);
    }
}

type Error = Box<dyn std::error::Error + Send + Sync>;

/// In-order check of the sequence numbers, as batchwire's bench does it.
#[derive(Default)]
struct Seq {
    next: u64,
    summary: Summary,
}

impl Seq {
    fn see(&mut self, p: &[u8]) {
        let k = p.get(..8).map_or(u64::MAX, |b| {
            u64::from_le_bytes(b.try_into().expect("8 bytes"))
        });
        match k.cmp(&self.next) {
            std::cmp::Ordering::Equal => {
                self.next += 1;
                self.summary.distinct += 1;
            }
            std::cmp::Ordering::Less => self.summary.duplicated += 1,
            std::cmp::Ordering::Greater => {
                self.summary.reordered += 1;
                self.summary.distinct += 1;
                self.next = k + 1;
            }
        }
    }
}

/// The call's handler: read the stream to its end, answer what came.
#[derive(Clone)]
struct Sink;

impl Service<Request<Streaming<Msg>>> for Sink {
    type Response = Response<Summary>;
    type Error = Status;
    type Future = BoxFuture<Response<Summary>, Status>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Status>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: Request<Streaming<Msg>>) -> Self::Future {
        Box::pin(async move {
            let mut s = req.into_inner();
            let mut seq = Seq::default();
            while let Some(m) = s.message().await? {
                seq.see(&m.payload);
            }
            Ok(Response::new(seq.summary))
        })
    }
}

/// The service as tonic's generated code would route it.
#[derive(Clone)]
struct SinkServer {
    /// Told when a call has been answered (`--once`).
    answered: std::sync::Arc<tokio::sync::Notify>,
}

impl tonic::server::NamedService for SinkServer {
    const NAME: &'static str = "bench.Sink";
}

impl<B> Service<http::Request<B>> for SinkServer
where
    B: tonic::codegen::Body + Send + 'static,
    B::Error: Into<tonic::codegen::StdError> + Send + 'static,
{
    type Response = http::Response<tonic::body::Body>;
    type Error = std::convert::Infallible;
    type Future = BoxFuture<Self::Response, Self::Error>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: http::Request<B>) -> Self::Future {
        let answered = self.answered.clone();
        Box::pin(async move {
            if req.uri().path() != PATH {
                return Ok(Status::unimplemented(req.uri().path().to_string()).into_http());
            }
            let mut grpc =
                tonic::server::Grpc::new(tonic_prost::ProstCodec::<Summary, Msg>::default());
            let response = grpc.client_streaming(Sink, req).await;
            answered.notify_one();
            Ok(response)
        })
    }
}

/// Serve until killed, or with `once` until one call was answered (then exit, so that a
/// profiler wrapping the process writes its output).
async fn server(listen: SocketAddr, once: bool) -> Result<(), Error> {
    let answered = std::sync::Arc::new(tokio::sync::Notify::new());
    let done = answered.clone();
    tonic::transport::Server::builder()
        .initial_stream_window_size(WINDOW)
        .initial_connection_window_size(WINDOW)
        .tcp_nodelay(true)
        .max_frame_size(FRAME)
        .add_service(SinkServer { answered })
        .serve_with_shutdown(listen, async move {
            if once {
                done.notified().await;
            } else {
                std::future::pending::<()>().await;
            }
        })
        .await?;
    Ok(())
}

async fn client(peer: SocketAddr, n: u64, size: usize, fresh: bool) -> Result<(), Error> {
    let size = size.max(8);
    let endpoint = tonic::transport::Endpoint::from_shared(format!("http://{peer}"))?
        .initial_stream_window_size(WINDOW)
        .initial_connection_window_size(WINDOW)
        .tcp_nodelay(true)
        .max_frame_size(FRAME);
    // The server may still be starting: try for up to 30 s.
    let deadline = Instant::now() + Duration::from_secs(30);
    let channel = loop {
        match endpoint.connect().await {
            Ok(c) => break c,
            Err(e) if Instant::now() > deadline => return Err(e.into()),
            Err(_) => tokio::time::sleep(Duration::from_millis(20)).await,
        }
    };
    let mut grpc = tonic::client::Grpc::new(channel);
    grpc.ready().await?;
    let msgs: Box<dyn Iterator<Item = Msg> + Send> = if fresh {
        // Each payload built as it is sent: a fresh 1 KB in cache each time (at 1 KB and
        // 10 KB this ran faster than slices of one cold buffer).
        Box::new((0..n).map(move |i| {
            let mut b = BytesMut::with_capacity(size);
            b.put_u64_le(i);
            b.put_bytes(0x5a, size - 8);
            Msg {
                payload: b.freeze(),
            }
        }))
    } else {
        // As batchwire's bench does below 512 MiB: every payload built before the clock
        // starts, in one buffer, each message a `Bytes` slice of it.
        let mut all = BytesMut::with_capacity(n as usize * size);
        for i in 0..n {
            all.put_u64_le(i);
            all.put_bytes(0x5a, size - 8);
        }
        let all = all.freeze();
        Box::new((0..n as usize).map(move |i| Msg {
            payload: all.slice(i * size..(i + 1) * size),
        }))
    };
    let msgs = tokio_stream::iter(msgs);
    let start = Instant::now();
    let answer = grpc
        .client_streaming(
            Request::new(msgs),
            http::uri::PathAndQuery::from_static(PATH),
            tonic_prost::ProstCodec::<Msg, Summary>::default(),
        )
        .await?
        .into_inner();
    let secs = start.elapsed().as_secs_f64();
    println!(
        "grpc{} {size} B: {n} msgs in {secs:.3} s = {:.0} msgs/s (lost {}, duplicated {}, reordered {})",
        if fresh { " fresh" } else { "" },
        answer.distinct as f64 / secs,
        n.saturating_sub(answer.distinct),
        answer.duplicated,
        answer.reordered
    );
    if answer.distinct != n || answer.duplicated != 0 || answer.reordered != 0 {
        return Err("the server did not get every message once, in order".into());
    }
    Ok(())
}

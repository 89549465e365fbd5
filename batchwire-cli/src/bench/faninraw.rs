//! `fan-in`'s `raw` ceiling: what a hand-written pipeline does with the same load, no node.
//!
//! The hand-written pipeline of the ceiling (application thread -> queue -> writer
//! draining everything -> socket -> reader), from S threads. On the sending side the S
//! threads of the scenario each build their share of the payloads and wait at the same
//! gate. Once released, each thread sends its payloads one per call: it locks one shared
//! queue (a `std` mutex over a byte buffer, bounded at 4 MiB as a node's send queue) and
//! encodes the message into the MESSAGES frame open at its end, as a node's lane does. A
//! thread that finds the queue full waits on a condvar; threads waiting are woken one at a
//! time as room is made. One writer thread takes everything queued at each turn (closing
//! its frame) and writes it to a plain TCP stream; the receiving process reads and decodes
//! the frames and checks every message as a node's receiver does (count, duplicates, each
//! thread's order). There is no window, acknowledgement, credit or mailbox: the difference
//! between this and a bundler's row is what batchwire costs on top of a queue, a writer
//! thread and a socket, from S threads at once.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::{Condvar, Mutex, MutexGuard};
use std::time::Duration;

use super::fanin::{SendReport, WorkerArgs};
use super::{Context, RecvReport, Verifier, now_ns, print_result, rawtcp, share};
use batchwire_core::codec::Name;
use batchwire_core::frame::{ListWriter, message_len};

/// The queue's bound: a node's default send queue.
const CAPACITY: usize = 4 << 20;

/// The longest the pipeline may stall once the threads are released (a full queue, an idle
/// writer, a stream that neither reads nor writes) before the run gives up with an error.
const IDLE: Duration = Duration::from_secs(10);

/// The longest the writer and the receiver wait for the first frame: the sending threads
/// build their payloads and meet at the gate first.
const START_WAIT: Duration = Duration::from_secs(60);

/// The longest the sender waits for the receiver's answer once its stream has ended.
const ACK_WAIT: Duration = Duration::from_secs(60);

/// The mailbox name in the frames (as the nodes' run uses).
const SINK: &str = "sink";

/// The shared queue of encoded messages.
struct Pipe {
    to: Name,
    from: Name,
    state: Mutex<PipeState>,
    /// The writer waits here for frames.
    not_empty: Condvar,
    /// Sending threads wait here for room.
    not_full: Condvar,
}

#[derive(Default)]
struct PipeState {
    /// MESSAGES frames; the last one open (`open`) until the writer takes them.
    buf: Vec<u8>,
    open: Option<ListWriter>,
    writer_waiting: bool,
    /// Sending threads waiting for room.
    waiting: usize,
    closed: bool,
    /// The writer stopped (an error): pushes are refused.
    failed: bool,
}

impl Pipe {
    fn new() -> Pipe {
        Pipe {
            to: Name::from_static(SINK),
            from: Name::from_static(""),
            state: Mutex::new(PipeState {
                buf: Vec::with_capacity(CAPACITY + rawtcp::FRAME_BYTES),
                ..PipeState::default()
            }),
            not_empty: Condvar::new(),
            not_full: Condvar::new(),
        }
    }

    fn lock(&self) -> MutexGuard<'_, PipeState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Queue one message, waiting (at most [`IDLE`] at a time) while the queue is full.
    fn push(&self, payload: &[u8]) -> Result<(), String> {
        let mut g = self.lock();
        if g.buf.len() >= CAPACITY && !g.failed {
            g.waiting += 1;
            while g.buf.len() >= CAPACITY && !g.failed {
                let (again, t) = self
                    .not_full
                    .wait_timeout(g, IDLE)
                    .unwrap_or_else(|p| p.into_inner());
                g = again;
                if t.timed_out() && g.buf.len() >= CAPACITY {
                    g.waiting -= 1;
                    return Err(format!("raw fan-in: the queue stayed full for {IDLE:?}"));
                }
            }
            g.waiting -= 1;
            // Room for this one: maybe for the next waiting thread too.
            if g.waiting > 0 {
                self.not_full.notify_one();
            }
        }
        if g.failed {
            return Err("raw fan-in: the writer stopped".into());
        }
        let len = message_len(&self.to, &self.from, payload.len());
        let PipeState { buf, open, .. } = &mut *g;
        let w = match open {
            Some(w) if w.len(buf) + len <= rawtcp::FRAME_BYTES => w,
            _ => {
                if let Some(w) = open.take() {
                    w.finish(buf);
                }
                open.insert(ListWriter::start(buf))
            }
        };
        w.push(buf, &self.to, &self.from, payload);
        if g.writer_waiting {
            g.writer_waiting = false;
            self.not_empty.notify_one();
        }
        Ok(())
    }

    /// Swap everything queued into `out` (empty), waiting at most `limit` for something:
    /// false once the queue is closed and empty.
    fn take(&self, out: &mut Vec<u8>, limit: Duration) -> Result<bool, String> {
        let mut g = self.lock();
        loop {
            if !g.buf.is_empty() {
                let PipeState { buf, open, .. } = &mut *g;
                if let Some(w) = open.take() {
                    w.finish(buf);
                }
                std::mem::swap(out, buf);
                if g.waiting > 0 {
                    self.not_full.notify_one();
                }
                return Ok(true);
            }
            if g.closed {
                return Ok(false);
            }
            g.writer_waiting = true;
            let (again, t) = self
                .not_empty
                .wait_timeout(g, limit)
                .unwrap_or_else(|p| p.into_inner());
            g = again;
            if t.timed_out() && g.buf.is_empty() && !g.closed {
                return Err(format!("raw fan-in: no frame came for {limit:?}"));
            }
        }
    }

    /// No more frames: the writer ends once it has taken what is queued.
    fn close(&self) {
        self.lock().closed = true;
        self.not_empty.notify_one();
    }

    /// The writer is gone: refuse pushes, and wake the threads waiting for room.
    fn fail(&self) {
        self.lock().failed = true;
        self.not_full.notify_all();
    }
}

/// Run a raw role (`raw-send` or `raw-recv`); prints its report line on stdout.
pub fn worker(a: &WorkerArgs) -> Result<(), String> {
    if let Some(cpu) = a.pin_cpu {
        super::fanin::pin_to_cpu(cpu)?;
    }
    match a.role.as_str() {
        "raw-recv" => recv(a),
        "raw-send" => send(a),
        other => Err(format!("unknown raw fan-in role {other:?}")),
    }
}

/// The sending process: connect, start the writer and the sending threads
/// ([`super::fanin::run_senders`], as a node's run does), release them.
fn send(a: &WorkerArgs) -> Result<(), String> {
    let mut s = rawtcp::connect_within(a.peer, Duration::from_secs(30))?;
    s.set_write_timeout(Some(IDLE)).ctx("raw connect")?;
    s.set_read_timeout(Some(ACK_WAIT)).ctx("raw connect")?;
    let pipe = Pipe::new();
    let pipe = &pipe;
    std::thread::scope(|sc| -> Result<(), String> {
        // The writer waits for frames before the senders are released, as a node's does.
        let writer = sc.spawn(move || -> Result<(), String> {
            let r = write_all(pipe, &mut s);
            if r.is_err() {
                // Senders waiting for room must not wait for a writer that is gone.
                pipe.fail();
            }
            r
        });
        let mut written = None;
        let start_ns = super::fanin::run_senders(a, &|p| pipe.push(&p), |_| {
            // Every thread has sent (or failed): the writer drains the queue, ends the
            // stream and waits for the receiver's word that it has read everything.
            pipe.close();
            written = Some(
                writer
                    .join()
                    .unwrap_or_else(|_| Err("the raw writer panicked".into())),
            );
        });
        if written.is_none() {
            // The threads did not start: nothing will be written.
            pipe.close();
        }
        let start_ns = start_ns?;
        written.ok_or("the raw fan-in run did not finish")??;
        print_result(&SendReport { start_ns })
    })
}

/// The writer: everything queued at each turn onto the stream; once the queue is closed and
/// empty, end the stream and wait for the receiver's answer (it has read all it will).
fn write_all(pipe: &Pipe, s: &mut TcpStream) -> Result<(), String> {
    let mut batch = Vec::with_capacity(CAPACITY + rawtcp::FRAME_BYTES);
    // The first frame comes once every sending thread is ready (they build their payloads
    // first); after that the senders keep the queue moving.
    let mut wait = START_WAIT;
    while pipe.take(&mut batch, wait)? {
        s.write_all(&batch).ctx("raw write")?;
        batch.clear();
        wait = IDLE;
    }
    s.shutdown(std::net::Shutdown::Write).ctx("raw write")?;
    let mut ack = [0u8; 1];
    s.read_exact(&mut ack).ctx("raw: the receiver's answer")?;
    Ok(())
}

/// The receiving process: accept one stream, read and check every message, answer.
fn recv(a: &WorkerArgs) -> Result<(), String> {
    let l = TcpListener::bind(a.listen).ctx(&format!("raw listen on {}", a.listen))?;
    let mut s = rawtcp::accept_within(&l, START_WAIT)?;
    // Generous for the first frame (the sending threads build their payloads and meet at
    // the gate first); then, as a node's receiver, 10 s without a byte ends the run with an
    // error. A stream that ends early (a sender thread failed) shows as lost messages.
    s.set_read_timeout(Some(START_WAIT)).ctx("raw accept")?;
    let handle = s.try_clone().ctx("raw accept")?;
    let mut v = Verifier::new(a.threads, share(a.messages, a.threads, 0));
    let mut cpu0 = None;
    rawtcp::read(
        &mut s,
        a.messages,
        || {
            cpu0 = Some(super::process_cpu_ns());
            let _ = handle.set_read_timeout(Some(IDLE));
        },
        |p| v.see_stamped(p),
    )?;
    let end_ns = now_ns();
    let cpu_ns = cpu0.map_or(0, |c| super::process_cpu_ns().saturating_sub(c));
    // Tell the sender it may end (it may have ended already if the stream broke).
    let _ = s.write_all(&[1]);
    print_result(&RecvReport::of(&v, end_ns, cpu_ns))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The payloads of the MESSAGES frames in `bytes`, in order.
    fn payloads(bytes: &[u8]) -> Vec<Vec<u8>> {
        let mut got = Vec::new();
        rawtcp::read(&mut &bytes[..], u64::MAX, || {}, |p| got.push(p.to_vec())).unwrap();
        got
    }

    #[test]
    fn the_pipe_hands_over_messages_in_order_and_ends_when_closed() {
        let pipe = Pipe::new();
        pipe.push(b"ab").unwrap();
        pipe.push(b"cd").unwrap();
        let mut out = Vec::new();
        assert!(pipe.take(&mut out, IDLE).unwrap());
        assert_eq!(
            payloads(&out),
            [b"ab".to_vec(), b"cd".to_vec()],
            "one frame, closed"
        );
        out.clear();
        // Past a frame's worth, a new frame starts; the receiver sees the same order.
        let big = vec![7u8; rawtcp::FRAME_BYTES / 3];
        for _ in 0..4 {
            pipe.push(&big).unwrap();
        }
        assert!(pipe.take(&mut out, IDLE).unwrap());
        assert_eq!(payloads(&out), vec![big.clone(); 4]);
        out.clear();
        pipe.close();
        assert!(!pipe.take(&mut out, IDLE).unwrap(), "closed and empty");
    }

    #[test]
    fn closing_wakes_the_writer_and_a_failed_writer_frees_its_senders() {
        let pipe = Pipe::new();
        std::thread::scope(|s| {
            let writer = s.spawn(|| pipe.take(&mut Vec::new(), IDLE));
            std::thread::sleep(Duration::from_millis(20));
            pipe.close();
            assert!(!writer.join().unwrap().unwrap(), "woken: closed and empty");
        });
        let pipe = Pipe::new();
        pipe.push(&vec![0u8; CAPACITY]).unwrap();
        std::thread::scope(|s| {
            let sender = s.spawn(|| pipe.push(b"x"));
            std::thread::sleep(Duration::from_millis(20));
            pipe.fail();
            let e = sender.join().unwrap().unwrap_err();
            assert!(e.contains("writer stopped"), "{e}");
        });
        assert!(pipe.push(b"y").is_err(), "refused once failed");
    }

    #[test]
    fn a_full_pipe_holds_its_senders_until_the_writer_takes() {
        let pipe = Pipe::new();
        pipe.push(&vec![0u8; CAPACITY]).unwrap();
        std::thread::scope(|s| {
            let sender = s.spawn(|| pipe.push(b"x"));
            std::thread::sleep(Duration::from_millis(50));
            assert!(!sender.is_finished(), "waits while the queue is full");
            let mut out = Vec::new();
            assert!(pipe.take(&mut out, IDLE).unwrap());
            assert_eq!(payloads(&out), [vec![0u8; CAPACITY]]);
            sender.join().unwrap().unwrap();
        });
        let mut out = Vec::new();
        assert!(pipe.take(&mut out, IDLE).unwrap());
        assert_eq!(payloads(&out), [b"x".to_vec()]);
    }
}

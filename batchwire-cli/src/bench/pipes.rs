//! The lines of many child processes, read by one thread: the membership bench starts a
//! thousand nodes, and a reader thread per node (each woken for every write, each line
//! its own allocation and hand-off) took about a tenth of the two CPUs from the nodes it
//! measured while they joined. One thread polls every pipe and reads what waits in large
//! chunks, then pauses ([`PAUSE`]) so that the next poll finds many pipes with much to
//! read: a poll of a thousand pipes costs the same for one line as for a thousand. Lines
//! go out as `(child index, when read, text)`, the text holding every whole line one read
//! brought, separated by newlines (one allocation and one hand-off per read, not per line:
//! a thousand nodes joining print a million lines); a child's lines stay in order. They may be
//! read up to a pause late: times that matter come from the children themselves
//! (`batchwire node --event-times`).

use std::io::Read;
use std::process::ChildStdout;
use std::sync::mpsc::{Receiver, Sender, TryRecvError, channel};
use std::time::{Duration, Instant};

/// The pause after each round of reads. The first reader polled again at once, found a
/// pipe or two ready each time, and took more CPU than a thread per pipe had.
const PAUSE: Duration = Duration::from_millis(10);

/// Where to hand new pipes to the reading thread.
pub struct Pipes {
    add: Sender<(usize, ChildStdout)>,
}

/// One child's pipe and its unfinished line.
struct Pipe {
    i: usize,
    out: ChildStdout,
    partial: Vec<u8>,
}

impl Pipes {
    /// Start the reading thread; it sends lines (a read's worth at a time) to `lines` and
    /// ends once `lines` is gone, or once this handle is dropped and every pipe has closed.
    pub fn start(lines: Sender<(usize, Instant, String)>) -> Pipes {
        let (add, added) = channel();
        std::thread::spawn(move || read_all(added, lines));
        Pipes { add }
    }

    /// Read the lines of child `i` from `out` from now on.
    pub fn add(&self, i: usize, out: ChildStdout) {
        let _ = self.add.send((i, out));
    }
}

fn read_all(added: Receiver<(usize, ChildStdout)>, lines: Sender<(usize, Instant, String)>) {
    let mut pipes: Vec<Pipe> = Vec::new();
    let mut open = true;
    let mut buf = vec![0u8; 1 << 16];
    while open || !pipes.is_empty() {
        loop {
            match added.try_recv() {
                Ok((i, out)) => pipes.push(Pipe {
                    i,
                    out,
                    partial: Vec::new(),
                }),
                Err(TryRecvError::Empty) => break,
                Err(TryRecvError::Disconnected) => {
                    open = false;
                    break;
                }
            }
        }
        // New pipes are picked up within this wait.
        let ready = crate::sys::readable(pipes.iter().map(|p| &p.out), Duration::from_millis(20));
        let mut closed = Vec::new();
        for k in ready {
            let p = &mut pipes[k];
            // Readable: one read does not block (it may return what a write left so far).
            let n = match p.out.read(&mut buf) {
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Ok(0) | Err(_) => {
                    // Closed: a last line without its newline is still a line.
                    if !p.partial.is_empty() {
                        let line = String::from_utf8_lossy(&p.partial).into_owned();
                        p.partial.clear();
                        if lines.send((p.i, Instant::now(), line)).is_err() {
                            return;
                        }
                    }
                    closed.push(k);
                    continue;
                }
                Ok(n) => n,
            };
            let at = Instant::now();
            p.partial.extend_from_slice(&buf[..n]);
            let Some(end) = p.partial.iter().rposition(|b| *b == b'\n') else {
                continue;
            };
            let text = String::from_utf8_lossy(&p.partial[..end]).into_owned();
            p.partial.drain(..=end);
            if lines.send((p.i, at, text)).is_err() {
                return;
            }
        }
        for k in closed.into_iter().rev() {
            pipes.swap_remove(k);
        }
        std::thread::sleep(PAUSE);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::process::{Command, Stdio};

    fn child(script: &str) -> std::process::Child {
        Command::new("sh")
            .args(["-c", script])
            .stdout(Stdio::piped())
            .spawn()
            .expect("sh")
    }

    /// Every line of every child, whole (a line written in two parts is one line, a last
    /// one without its newline too), in each child's order, tagged with the child's index;
    /// the thread ends when the children are done and the handle is dropped.
    #[test]
    fn every_line_of_every_child_whole_and_in_order() {
        let (tx, rx) = channel();
        let pipes = Pipes::start(tx);
        let mut kids = Vec::new();
        for i in 0..3 {
            let mut c = child(&format!(
                "printf 'x{i} one\\nx{i} tw'; sleep 0.1; printf 'o\\n\\nx{i} three\\nx{i} end'"
            ));
            pipes.add(i, c.stdout.take().unwrap());
            kids.push(c);
        }
        drop(pipes);
        let mut got: Vec<Vec<String>> = vec![Vec::new(); 3];
        let deadline = Instant::now() + Duration::from_secs(20);
        while let Ok((i, _, text)) =
            rx.recv_timeout(deadline.saturating_duration_since(Instant::now()))
        {
            got[i].extend(text.lines().filter(|l| !l.is_empty()).map(String::from));
        }
        for (i, lines) in got.iter().enumerate() {
            assert_eq!(
                lines,
                &[
                    format!("x{i} one"),
                    format!("x{i} two"),
                    format!("x{i} three"),
                    format!("x{i} end")
                ]
            );
        }
        for mut k in kids {
            k.wait().unwrap();
        }
    }
}

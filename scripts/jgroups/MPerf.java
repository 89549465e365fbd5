// An MPerf-style test for JGroups 2.12 (Debian's libjgroups-java), written for batchwire's
// comparison: N processes each multicast M messages of S bytes (dest null: every member,
// itself included); each counts what it receives, checking each sender's order and
// duplicates; its rate is received / (time from the round's start barrier to its last
// delivery). R rounds in one cluster (the first one warms the JIT up).
import org.jgroups.*;
import java.nio.ByteBuffer;
import java.util.concurrent.*;
import java.util.concurrent.atomic.*;

public class MPerf extends ReceiverAdapter {
    static final byte DATA = 0, READY = 1, DONE = 2;
    final int me, n, size, rounds;
    final long m;
    JChannel ch;
    final AtomicLong received = new AtomicLong();
    final AtomicLongArray next; // per sender: next expected seq
    final AtomicLong bad = new AtomicLong();
    volatile int round = 0;
    final ConcurrentHashMap<Integer, AtomicInteger> ready = new ConcurrentHashMap<>();
    final AtomicInteger done = new AtomicInteger();
    volatile long lastAt;
    // The round whose last message came: set after lastAt, so a reader that sees it sees
    // lastAt too.
    volatile int doneRound = 0;
    final Object lock = new Object();

    MPerf(int me, int n, long m, int size, int rounds) {
        this.me = me; this.n = n; this.m = m; this.size = Math.max(size, 17); this.rounds = rounds;
        next = new AtomicLongArray(n);
    }

    public void receive(Message msg) {
        byte[] b = msg.getRawBuffer();
        int off = msg.getOffset();
        ByteBuffer bb = ByteBuffer.wrap(b, off, msg.getLength());
        byte t = bb.get();
        int r = bb.getInt();
        if (t == DATA) {
            int from = bb.getInt();
            long seq = bb.getLong();
            if (r != round || from < 0 || from >= n) { bad.incrementAndGet(); return; }
            long exp = next.get(from);
            if (seq != exp) bad.incrementAndGet();
            next.set(from, seq + 1);
            long c = received.incrementAndGet();
            if (c == n * m) {
                lastAt = System.nanoTime();
                doneRound = r;
                synchronized (lock) { lock.notifyAll(); }
            }
        } else if (t == READY) {
            ready.computeIfAbsent(r, k -> new AtomicInteger()).incrementAndGet();
            synchronized (lock) { lock.notifyAll(); }
        } else if (t == DONE) {
            done.incrementAndGet();
            synchronized (lock) { lock.notifyAll(); }
        }
    }

    void ctl(byte t, int r) throws Exception {
        ByteBuffer bb = ByteBuffer.allocate(5);
        bb.put(t).putInt(r);
        Message msg = new Message(null, null, bb.array());
        // Past flow control: with 20,000 x 100 B a round (its credit, 2 MB, exactly), both
        // nodes once waited for credit in the DONE send for good.
        msg.setFlag(Message.NO_FC);
        ch.send(msg);
    }

    void await(java.util.function.BooleanSupplier c, long ms, String what) throws Exception {
        long end = System.currentTimeMillis() + ms;
        synchronized (lock) {
            while (!c.getAsBoolean()) {
                long left = end - System.currentTimeMillis();
                if (left <= 0) throw new RuntimeException("timed out: " + what);
                lock.wait(Math.min(left, 100));
            }
        }
    }

    void run() throws Exception {
        ch = new JChannel(System.getProperty("mperf.config", "tcp.xml"));
        ch.setReceiver(this);
        ch.connect("mperf");
        await(() -> ch.getView() != null && ch.getView().size() == n, 60000, "view of " + n);
        for (int r = 1; r <= rounds; r++) {
            // Payloads built before the clock, as batchwire's bench does.
            byte[][] p = new byte[(int) m][];
            for (int i = 0; i < m; i++) {
                ByteBuffer bb = ByteBuffer.allocate(size);
                bb.put(DATA).putInt(r).putInt(me).putLong(i);
                p[i] = bb.array();
            }
            received.set(0);
            bad.set(0);
            for (int j = 0; j < n; j++) next.set(j, 0);
            round = r;
            final int rr = r;
            ctl(READY, r);
            await(() -> ready.getOrDefault(rr, new AtomicInteger()).get() >= n, 60000, "ready " + r);
            long t0 = System.nanoTime();
            for (int i = 0; i < m; i++) ch.send(new Message(null, null, p[i]));
            await(() -> doneRound == rr, 300000, "all messages of round " + r);
            double secs = (lastAt - t0) / 1e9;
            System.out.printf("node %d round %d: %d msgs in %.3f s = %.0f msgs/s bad %d%n",
                    me, r, received.get(), secs, received.get() / secs, bad.get());
        }
        // Stay until every node has everything (they may still be reading from this one).
        // With rounds of about the flow-control credit (20,000 x 100 B), the DONEs were
        // once never delivered; each node had printed its figures by then, so the wait is
        // bounded and a node that gives up says so.
        ctl(DONE, 0);
        try {
            await(() -> done.get() >= n, 20000, "done");
        } catch (RuntimeException e) {
            System.err.println("node " + me + ": not every node said done within 20 s");
        }
        ch.close();
    }

    public static void main(String[] a) throws Exception {
        new MPerf(Integer.parseInt(a[0]), Integer.parseInt(a[1]), Long.parseLong(a[2]),
                Integer.parseInt(a[3]), Integer.parseInt(a[4])).run();
        System.exit(0);
    }
}

// JGroupsBench: the JGroups 2.12 side of scripts/peers/group-jgroups.sh (issue 18, section 3).
//
// N members (JChannels) in one JVM, each with its own UDP socket on 127.0.0.1, no IP
// multicast (a multicast is sent as one unicast per member, as cohort's UDP fan-out does);
// discovery by TCPPING over the members' fixed ports. The stack: SEQUENCER for total order,
// pbcast.NAKACK and UNICAST for reliability, UFC/MFC flow control, and (with --encrypt)
// ENCRYPT with AES and 128-bit keys. JGroups 2.12's ENCRYPT uses Cipher.getInstance("AES"),
// which is AES/ECB/PKCS5Padding in the JDK, with no MAC, and by default encrypts only the
// payload (headers travel in clear).
//
// Every member sends 1 KiB messages (configurable) as fast as flow control lets it, for a
// warm-up period and then for the measured period. Counting: a message counts only once it
// is delivered at every member, so the rate is the smallest per-member delivery count over
// the measured period divided by its wall time. Order is checked, not assumed: each payload
// carries (sender, per-sender sequence number); every member checks per-sender FIFO and
// keeps a running hash of the whole delivery sequence; after sending stops and every member
// has delivered every message sent, the hashes must be equal (one total order) or the run
// fails. A message missing at a member (JGroups 2.12's ENCRYPT has lost some here after an
// exception while decrypting: it sits above NAKACK, so a message it drops is never
// retransmitted) is counted as lost and as a gap, and the run is marked failed.
//
// Prints one line "RESULT key=value ..." for the script to parse.

import org.jgroups.JChannel;
import org.jgroups.Message;
import org.jgroups.ReceiverAdapter;
import org.jgroups.View;

import java.lang.management.ManagementFactory;
import java.nio.ByteBuffer;
import java.util.ArrayList;
import java.util.List;
import java.util.concurrent.atomic.AtomicBoolean;
import java.util.concurrent.atomic.AtomicLong;

public final class JGroupsBench {
    /** One member's delivery bookkeeping. */
    static final class Member extends ReceiverAdapter {
        final int index;
        final long[] nextSeq;
        long delivered;
        long orderHash = 17;
        /** Messages a sender sent that this member skipped (a later one came first). */
        long gaps;
        /** Messages that came again or after a later one. */
        long reordered;
        volatile View view;

        Member(int index, int n) {
            this.index = index;
            this.nextSeq = new long[n];
        }

        @Override
        public void receive(Message msg) {
            ByteBuffer buf = ByteBuffer.wrap(msg.getRawBuffer(), msg.getOffset(), msg.getLength());
            int sender = buf.getInt();
            long seq = buf.getLong();
            synchronized (this) {
                if (sender < 0 || sender >= nextSeq.length) {
                    reordered++;
                } else if (seq < nextSeq[sender]) {
                    reordered++;
                } else {
                    gaps += seq - nextSeq[sender];
                    nextSeq[sender] = seq + 1;
                }
                delivered++;
                orderHash = orderHash * 1_000_003L + ((long) sender << 40) + seq;
            }
        }

        @Override
        public void viewAccepted(View v) {
            view = v;
        }

        synchronized long delivered() {
            return delivered;
        }

        synchronized long orderHash() {
            return orderHash;
        }

        synchronized long gaps() {
            return gaps;
        }

        synchronized long reordered() {
            return reordered;
        }
    }

    static String stack(int n, int basePort, int index, boolean encrypt) {
        StringBuilder hosts = new StringBuilder();
        for (int i = 0; i < n; i++) {
            if (i > 0) {
                hosts.append(',');
            }
            hosts.append("127.0.0.1[").append(basePort + i).append(']');
        }
        StringBuilder s = new StringBuilder();
        s.append("UDP(bind_addr=127.0.0.1;bind_port=").append(basePort + index)
                .append(";port_range=0;ip_mcast=false;loopback=true;enable_bundling=true")
                .append(";max_bundle_size=64000;max_bundle_timeout=30;enable_diagnostics=false")
                .append(";ucast_recv_buf_size=20000000;ucast_send_buf_size=640000")
                .append(";thread_pool.min_threads=2;thread_pool.max_threads=8")
                .append(";thread_pool.queue_enabled=true;thread_pool.queue_max_size=10000")
                .append(";thread_pool.rejection_policy=discard")
                .append(";oob_thread_pool.min_threads=1;oob_thread_pool.max_threads=8")
                .append(";oob_thread_pool.queue_enabled=false;oob_thread_pool.rejection_policy=Run)");
        s.append(":TCPPING(initial_hosts=").append(hosts).append(";port_range=0;timeout=1000")
                .append(";num_initial_members=").append(n).append(")");
        // Generous failure detection: on a loaded 2-core machine, 16 members' heartbeats in
        // one JVM come late, and a false suspicion is not what this bench measures.
        s.append(":FD_ALL(timeout=30000;interval=5000)");
        s.append(":VERIFY_SUSPECT(timeout=5000)");
        s.append(":BARRIER");
        s.append(":pbcast.NAKACK(use_mcast_xmit=false;gc_lag=0;retransmit_timeout=300,600,1200")
                .append(";discard_delivered_msgs=true)");
        s.append(":UNICAST(timeout=300,600,1200)");
        s.append(":pbcast.STABLE(stability_delay=1000;desired_avg_gossip=50000;max_bytes=4000000)");
        if (encrypt) {
            // As the jar's encrypt.xml places it: below GMS, above NAKACK/UNICAST.
            s.append(":ENCRYPT(encrypt_entire_message=false;sym_init=128;sym_algorithm=AES")
                    .append(";asym_init=2048;asym_algorithm=RSA)");
        }
        s.append(":pbcast.GMS(print_local_addr=false;join_timeout=3000;view_bundling=true)");
        s.append(":SEQUENCER");
        s.append(":UFC(max_credits=2000000;min_threshold=0.4)");
        s.append(":MFC(max_credits=2000000;min_threshold=0.4)");
        s.append(":FRAG2(frag_size=60000)");
        return s.toString();
    }

    static long processCpuNanos() {
        java.lang.management.OperatingSystemMXBean os = ManagementFactory.getOperatingSystemMXBean();
        if (os instanceof com.sun.management.OperatingSystemMXBean) {
            return ((com.sun.management.OperatingSystemMXBean) os).getProcessCpuTime();
        }
        return -1;
    }

    static long minDelivered(List<Member> members) {
        long min = Long.MAX_VALUE;
        for (Member m : members) {
            min = Math.min(min, m.delivered());
        }
        return min;
    }

    public static void main(String[] args) throws Exception {
        int n = 4;
        int size = 1024;
        double warmup = 10;
        double seconds = 10;
        boolean encrypt = false;
        int basePort = 47800;
        for (int i = 0; i < args.length; i++) {
            switch (args[i]) {
                case "--members": n = Integer.parseInt(args[++i]); break;
                case "--size": size = Integer.parseInt(args[++i]); break;
                case "--warmup": warmup = Double.parseDouble(args[++i]); break;
                case "--seconds": seconds = Double.parseDouble(args[++i]); break;
                case "--encrypt": encrypt = true; break;
                case "--base-port": basePort = Integer.parseInt(args[++i]); break;
                default:
                    System.err.println("unknown argument " + args[i]);
                    System.exit(2);
            }
        }
        if (n < 2 || size < 12) {
            System.err.println("need --members >= 2 and --size >= 12");
            System.exit(2);
        }
        final int members = n;
        List<Member> states = new ArrayList<>();
        List<JChannel> channels = new ArrayList<>();
        long formStart = System.nanoTime();
        for (int i = 0; i < n; i++) {
            Member m = new Member(i, n);
            JChannel ch = new JChannel(stack(n, basePort, i, encrypt));
            ch.setReceiver(m);
            ch.connect("cohort-bench");
            states.add(m);
            channels.add(ch);
        }
        long deadline = System.nanoTime() + 60_000_000_000L;
        while (true) {
            boolean all = true;
            for (JChannel ch : channels) {
                View v = ch.getView();
                all &= v != null && v.size() == members;
            }
            if (all) {
                break;
            }
            if (System.nanoTime() > deadline) {
                System.err.println("no view of " + members + " within 60 s");
                System.exit(1);
            }
            Thread.sleep(10);
        }
        double viewMs = (System.nanoTime() - formStart) / 1e6;

        AtomicBoolean stop = new AtomicBoolean(false);
        AtomicLong sendErrors = new AtomicLong();
        long[] sent = new long[n];
        List<Thread> senders = new ArrayList<>();
        for (int i = 0; i < n; i++) {
            final int index = i;
            final JChannel ch = channels.get(i);
            final int len = size;
            Thread t = new Thread(() -> {
                long seq = 0;
                while (!stop.get()) {
                    byte[] data = new byte[len];
                    ByteBuffer.wrap(data).putInt(index).putLong(seq);
                    try {
                        ch.send(new Message(null, null, data));
                        seq++;
                    } catch (Exception e) {
                        sendErrors.incrementAndGet();
                        break;
                    }
                }
                synchronized (sent) {
                    sent[index] = seq;
                }
            }, "sender-" + i);
            senders.add(t);
        }
        for (Thread t : senders) {
            t.start();
        }
        Thread.sleep((long) (warmup * 1000));

        View[] viewsBefore = new View[n];
        for (int i = 0; i < n; i++) {
            viewsBefore[i] = channels.get(i).getView();
        }
        long before = minDelivered(states);
        long cpu0 = processCpuNanos();
        long t0 = System.nanoTime();
        Thread.sleep((long) (seconds * 1000));
        long after = minDelivered(states);
        long t1 = System.nanoTime();
        long cpu1 = processCpuNanos();
        boolean viewHeld = true;
        for (int i = 0; i < n; i++) {
            View v = channels.get(i).getView();
            viewHeld &= v != null && v.equals(viewsBefore[i]) && v.size() == members;
        }
        stop.set(true);
        for (Thread t : senders) {
            t.join(30_000);
        }
        long total = 0;
        synchronized (sent) {
            for (long s : sent) {
                total += s;
            }
        }
        // Every member must deliver every message sent, and in one order.
        long drainDeadline = System.nanoTime() + 60_000_000_000L;
        while (minDelivered(states) < total && System.nanoTime() < drainDeadline) {
            Thread.sleep(10);
        }
        boolean allDelivered = true;
        boolean sameOrder = true;
        long gaps = 0;
        long reordered = 0;
        long lost = 0;
        for (Member m : states) {
            allDelivered &= m.delivered() == total;
            lost += Math.max(0, total - m.delivered());
            // Equal hashes mean one order; with a message lost somewhere they cannot be.
            sameOrder &= m.orderHash() == states.get(0).orderHash();
            gaps += m.gaps();
            reordered += m.reordered();
        }
        double elapsed = (t1 - t0) / 1e9;
        double rate = (after - before) / elapsed;
        System.out.printf(
                "RESULT impl=jgroups-2.12 members=%d size=%d encrypt=%s warmup_s=%.1f seconds=%.2f "
                        + "view_ms=%.0f msgs_per_sec=%.0f cpu_s=%.2f cpu_per_wall=%.2f view_held=%s "
                        + "all_delivered=%s lost=%d same_order=%s gaps=%d reordered=%d send_errors=%d sent=%d%n",
                n, size, encrypt ? "AES-ECB(ENCRYPT)" : "none", warmup, elapsed, viewMs, rate,
                (cpu1 - cpu0) / 1e9, (cpu1 - cpu0) / 1e9 / elapsed, viewHeld, allDelivered,
                lost, sameOrder, gaps, reordered, sendErrors.get(), total);
        // No orderly leave: with 16 members it took longer than the run; exit ends them.
        boolean ok = viewHeld && allDelivered && sameOrder && gaps == 0 && reordered == 0
                && sendErrors.get() == 0;
        System.exit(ok ? 0 : 1);
    }
}

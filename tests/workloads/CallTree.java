// A Java call tree with known shares, for the HotSpot walk's tests.
//
// main -> run -> {parse, compute -> {matmul, reduce}, digest}. Each leaf calls the same `spin`
// until its share of a round's CPU time has passed on the thread's clock, so the shares of
// samples are set by time, on any CPU (parse 1, matmul 3, reduce 2, digest 1 parts of 7).
// `java CallTree.java SECONDS [THREADS]`: each thread runs the tree.
//
// A round's length varies at random around its mean: rounds of one fixed length would beat
// against a profiler's fixed sampling period and skew the shares it sees by a few points.

import java.lang.management.ManagementFactory;
import java.lang.management.ThreadMXBean;
import java.util.Random;

public class CallTree {
    // Iterations of one call of `spin`: a short call (tens of microseconds), so a leaf
    // overshoots its time by little, and the clock's read between calls is a small part.
    static final int CHUNK = 20_000;
    static final ThreadMXBean CLOCK = ManagementFactory.getThreadMXBean();

    static long now() {
        return CLOCK.getCurrentThreadCpuTime();
    }

    static long spin(int n) {
        long total = 0;
        for (int i = 0; i < n; i++) {
            total += (long) i * i ^ (total >>> 3);
        }
        return total;
    }

    static long parse(long nanos) {
        long total = 0, end = now() + nanos;
        while (now() < end) {
            total += spin(CHUNK);
        }
        return total;
    }

    static long matmul(long nanos) {
        long total = 0, end = now() + 3 * nanos;
        while (now() < end) {
            total += spin(CHUNK);
        }
        return total;
    }

    static long reduce(long nanos) {
        long total = 0, end = now() + 2 * nanos;
        while (now() < end) {
            total += spin(CHUNK);
        }
        return total;
    }

    static long compute(long nanos) {
        return matmul(nanos) + reduce(nanos);
    }

    static long digest(long nanos) {
        long total = 0, end = now() + nanos;
        while (now() < end) {
            total += spin(CHUNK);
        }
        return total;
    }

    static long run(double seconds, long mean, long seed) {
        Random rounds = new Random(seed);
        long total = 0, end = System.nanoTime() + (long) (seconds * 1e9);
        while (System.nanoTime() < end) {
            long part = mean / 2 + (long) (rounds.nextDouble() * mean);
            total += parse(part);
            total += compute(part);
            total += digest(part);
        }
        return total;
    }

    public static void main(String[] args) throws Exception {
        double seconds = args.length > 0 ? Double.parseDouble(args[0]) : 10.0;
        int threads = args.length > 1 ? Integer.parseInt(args[1]) : 1;
        // One part of seven: a round of about 14 ms of CPU time.
        long mean = 2_000_000;
        Thread[] workers = new Thread[threads];
        long[] totals = new long[threads];
        for (int t = 0; t < threads; t++) {
            final int index = t;
            workers[t] = new Thread(() -> totals[index] = run(seconds, mean, index + 1), "worker-" + t);
            workers[t].start();
        }
        long total = 0;
        for (int t = 0; t < threads; t++) {
            workers[t].join();
            total += totals[t];
        }
        System.out.println(total);
    }
}

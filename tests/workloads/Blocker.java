// A Java thread that blocks in known methods for known shares of its time, for the HotSpot
// walk's off-CPU test.
//
// main -> run -> {nap: Thread.sleep, 3 ms; park: LockSupport.parkNanos, 1 ms}, in a loop for
// SECONDS: `java Blocker.java SECONDS`. Off-CPU, nap holds about three quarters of the time
// the thread blocks and park one quarter.

import java.util.concurrent.locks.LockSupport;

public class Blocker {
    static void nap() throws InterruptedException {
        Thread.sleep(3);
    }

    static void park() {
        LockSupport.parkNanos(1_000_000);
    }

    static void run(double seconds) throws InterruptedException {
        long end = System.nanoTime() + (long) (seconds * 1e9);
        while (System.nanoTime() < end) {
            nap();
            park();
        }
    }

    public static void main(String[] args) throws Exception {
        run(args.length > 0 ? Double.parseDouble(args[0]) : 10.0);
    }
}

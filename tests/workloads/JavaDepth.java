// A Java stack of a set depth, for the HotSpot walk's cost bench (`cargo xtask bench --only
// jvm`): `java JavaDepth DEPTH SECONDS` runs main -> run -> Step.down x (DEPTH - 2), the
// deepest spinning, so a sample of its thread finds DEPTH Java frames, until SECONDS have
// passed.
//
// Every level is a compiled frame of its own under the JVM's default flags, as a service's
// deep stacks are. A recursion of one method would not do: C2 inlines a method into itself
// once, so two levels would share a frame. Here a level calls the next through an interface
// whose receiver, one of three classes, is drawn at random for each level of each round: every
// call site sees the three, C2 finds it megamorphic and makes a virtual call, inlining none.
//
// The stack is climbed and left again each round (a few hundred microseconds at the bottom),
// so the levels run often enough for C2 to compile them within the first seconds; a sample
// lands at the bottom, DEPTH frames deep, all but a small part of the time.

import java.util.Random;

public class JavaDepth {
    interface Step {
        long down(int n, long spins);
    }

    // Iterations of the bottom's loop each round: a few hundred microseconds once compiled.
    static final long SPINS = 400_000;
    static final Step[] STEPS = {new A(), new B(), new C()};
    // The class of each level this round.
    static int[] order = new int[0];

    static long spin(long n) {
        long total = 0;
        for (long i = 0; i < n; i++) {
            total += i * i ^ (total >>> 3);
        }
        return total;
    }

    static final class A implements Step {
        public long down(int n, long spins) {
            return n == 0 ? spin(spins) : STEPS[order[n - 1]].down(n - 1, spins) + 1;
        }
    }

    static final class B implements Step {
        public long down(int n, long spins) {
            return n == 0 ? spin(spins) : STEPS[order[n - 1]].down(n - 1, spins) + 2;
        }
    }

    static final class C implements Step {
        public long down(int n, long spins) {
            return n == 0 ? spin(spins) : STEPS[order[n - 1]].down(n - 1, spins) + 3;
        }
    }

    static long run(int levels, double seconds) {
        Random random = new Random(1);
        order = new int[levels];
        long total = 0, end = System.nanoTime() + (long) (seconds * 1e9);
        while (System.nanoTime() < end) {
            for (int i = 0; i < levels; i++) {
                order[i] = random.nextInt(STEPS.length);
            }
            total += STEPS[order[levels - 1]].down(levels - 1, SPINS);
        }
        return total;
    }

    public static void main(String[] args) {
        int depth = args.length > 0 ? Integer.parseInt(args[0]) : 50;
        double seconds = args.length > 1 ? Double.parseDouble(args[1]) : 30.0;
        // main and run are two of the frames.
        System.out.println(run(Math.max(depth - 2, 1), seconds));
    }
}

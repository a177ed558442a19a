// Classes loaded and unloaded in a loop, for the HotSpot walk's test that no frame is named
// with a method that did not run: each generation defines GenXXXXXX (compiled beside this
// file) under a class loader of its own, with its number in place of the X in the class's
// and the method's names, runs its method for a few milliseconds and drops the loader; a
// collection every few generations unloads the classes, so their methods' memory is freed
// and reused. `java Churn SECONDS` prints the generations and the classes unloaded.

import java.lang.management.ManagementFactory;
import java.nio.charset.StandardCharsets;

public class Churn {
    static final class OneShot extends ClassLoader {
        OneShot() {
            super(null);
        }

        Class<?> define(String name, byte[] bytes) {
            return defineClass(name, bytes, 0, bytes.length);
        }
    }

    // Replaces every `from` in `bytes` with `to`, of the same length.
    static byte[] patch(byte[] bytes, byte[] from, byte[] to) {
        byte[] out = bytes.clone();
        for (int i = 0; i + from.length <= out.length; i++) {
            boolean match = true;
            for (int j = 0; j < from.length && match; j++) {
                match = out[i + j] == from[j];
            }
            if (match) {
                System.arraycopy(to, 0, out, i, to.length);
            }
        }
        return out;
    }

    public static void main(String[] args) throws Exception {
        double seconds = args.length > 0 ? Double.parseDouble(args[0]) : 10.0;
        byte[] template;
        try (var in = Churn.class.getResourceAsStream("/GenXXXXXX.class")) {
            template = in.readAllBytes();
        }
        byte[] marker = "XXXXXX".getBytes(StandardCharsets.US_ASCII);
        long end = System.nanoTime() + (long) (seconds * 1e9);
        int generation = 0;
        long total = 0;
        while (System.nanoTime() < end) {
            String tag = String.format("%06d", generation);
            byte[] bytes = patch(template, marker, tag.getBytes(StandardCharsets.US_ASCII));
            Class<?> gen = new OneShot().define("Gen" + tag, bytes);
            total += (long) gen.getMethod("work" + tag, long.class).invoke(null, 3_000_000L);
            generation++;
            if (generation % 16 == 0) {
                System.gc();
            }
        }
        long unloaded = ManagementFactory.getClassLoadingMXBean().getUnloadedClassCount();
        System.out.println("generations " + generation + " unloaded " + unloaded + " " + (total & 1));
    }
}

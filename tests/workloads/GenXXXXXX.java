// The template of the classes Churn.java defines, one class loader each: Churn replaces the
// six X of the class's and the method's names in the compiled class's bytes with the
// generation's number, so each generation's frames say which one they are.
public class GenXXXXXX {
    public static long workXXXXXX(long nanos) {
        long total = 0, end = System.nanoTime() + nanos;
        while (System.nanoTime() < end) {
            for (int i = 0; i < 1000; i++) {
                total += (long) i * i ^ (total >>> 3);
            }
        }
        return total;
    }
}

// Deterministic test data shared by the Java tests (FlatmemTest, RankWorker):
// every process that asks for the same seed gets the same values, so each rank
// can rebuild the whole global batch its slice comes from.
final class TestData {
  private TestData() {}

  /** n values in [-1, 1) from a 64-bit LCG seeded with seed. */
  static double[] uniform(long seed, int n) {
    long s = seed * 0x9E3779B97F4A7C15L + 1;
    double[] out = new double[n];
    for (int i = 0; i < n; ++i) {
      s = s * 6364136223846793005L + 1442695040888963407L;
      out[i] = 2 * ((s >>> 11) / (double) (1L << 53)) - 1;
    }
    return out;
  }
}

package flatmem;

/**
 * A flatmem call refused its arguments: INVALID_ARGUMENT (the message names
 * the argument, its shape or value and what was expected; for communicators
 * also a closed handle, a message size mismatch, arguments that differ
 * between ranks), WORKSPACE_TOO_SMALL or NON_FINITE. An
 * IllegalArgumentException, so existing catch clauses keep working; the
 * message is "FLATMEM_STATUS_&lt;NAME&gt;: " followed by flatmem's text.
 */
public class FlatmemArgumentException extends IllegalArgumentException {
  private static final long serialVersionUID = 1L;
  private final int status;

  /** Thrown by the JNI wrapper: status is a flatmem_status value. */
  public FlatmemArgumentException(int status, String message) {
    super(message);
    this.status = status;
  }

  /** The flatmem_status number. */
  public int statusCode() { return status; }

  /** The status as the Status enum (null for a number this binding does not know). */
  public Status status() { return statusOf(status); }

  static Status statusOf(int status) {
    for (Status s : Status.values())
      if (s.swigValue() == status) return s;
    return null;
  }
}

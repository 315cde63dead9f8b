package flatmem;

/**
 * A flatmem call failed with a status that is not about its arguments:
 * UNSUPPORTED, INTERNAL, or a communicator's TIMEOUT, PEER_FAILURE and
 * COMM_POISONED (see flatmem.h and comm.h). The message is
 * "FLATMEM_STATUS_&lt;NAME&gt;: " followed by flatmem's own text, which names
 * the operation, the step and the peer rank ("all_reduce #3, step 1 of 4:
 * receive from rank 2: ..."). Argument errors are
 * {@link FlatmemArgumentException}, out of memory {@link OutOfMemoryError}.
 *
 * <pre>
 * try { comm.barrier(); }
 * catch (FlatmemException e) {
 *   if (e.status() == Status.STATUS_TIMEOUT) ...   // a peer is slow or wedged
 * }
 * </pre>
 */
public class FlatmemException extends RuntimeException {
  private static final long serialVersionUID = 1L;
  private final int status;

  /** Thrown by the JNI wrapper: status is a flatmem_status value. */
  public FlatmemException(int status, String message) {
    super(message);
    this.status = status;
  }

  /** The flatmem_status number. */
  public int statusCode() { return status; }

  /** The status as the Status enum (null for a number this binding does not know). */
  public Status status() { return FlatmemArgumentException.statusOf(status); }
}

package dev.leasehold.client;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import java.util.Map;

/** An error answer of the sidecar: {@code {"error": {"code": ..., "message": ...}}}. */
public class SidecarException extends Exception {
  private static final long serialVersionUID = 1L;

  private final String lock;
  private final int status;
  private final String code;
  private final String detail;

  public SidecarException(String lock, int status, String code, String detail) {
    super("lock " + lock + ": " + detail + " (" + status + " " + code + ")");
    this.lock = lock;
    this.status = status;
    this.code = code;
    this.detail = detail;
  }

  /** The lock the request named. */
  public String lock() {
    return lock;
  }

  /** The HTTP status. */
  public int status() {
    return status;
  }

  /** The API's error code, such as {@code timeout}; empty if the answer had none. */
  public String code() {
    return code;
  }

  /** The sidecar's message, naming the problem. */
  public String detail() {
    return detail;
  }

  /** Not granted within the wait ({@code timeout}). */
  public static final class LockTimeout extends SidecarException {
    private static final long serialVersionUID = 1L;

    public LockTimeout(String lock, int status, String code, String detail) {
      super(lock, status, code, detail);
    }
  }

  /** Granted, but lost before it could be reported ({@code lost}): never held. */
  public static final class LostBeforeReported extends SidecarException {
    private static final long serialVersionUID = 1L;

    public LostBeforeReported(String lock, int status, String code, String detail) {
      super(lock, status, code, detail);
    }
  }

  /** The lock name is not a DNS label ({@code invalid_lock_name}). */
  public static final class InvalidLockName extends SidecarException {
    private static final long serialVersionUID = 1L;

    public InvalidLockName(String lock, int status, String code, String detail) {
      super(lock, status, code, detail);
    }
  }

  /** No DistributedLock of that name in the pod's namespace ({@code unknown_lock}). */
  public static final class UnknownLock extends SidecarException {
    private static final long serialVersionUID = 1L;

    public UnknownLock(String lock, int status, String code, String detail) {
      super(lock, status, code, detail);
    }
  }

  /** RBAC or the guard refused the claim ({@code forbidden}). */
  public static final class Forbidden extends SidecarException {
    private static final long serialVersionUID = 1L;

    public Forbidden(String lock, int status, String code, String detail) {
      super(lock, status, code, detail);
    }
  }

  /** The sidecar is stopping and takes no new holds ({@code shutting_down}). */
  public static final class ShuttingDown extends SidecarException {
    private static final long serialVersionUID = 1L;

    public ShuttingDown(String lock, int status, String code, String detail) {
      super(lock, status, code, detail);
    }
  }

  @FunctionalInterface
  interface Factory {
    SidecarException make(String lock, int status, String code, String detail);
  }

  /** Error codes with a class of their own; every other code is a plain SidecarException. */
  static final Map<String, Factory> BY_CODE =
      Map.of(
          "timeout", LockTimeout::new,
          "lost", LostBeforeReported::new,
          "invalid_lock_name", InvalidLockName::new,
          "unknown_lock", UnknownLock::new,
          "forbidden", Forbidden::new,
          "shutting_down", ShuttingDown::new);

  /** The error an answer's status and body describe. */
  static SidecarException fromAnswer(ObjectMapper json, String lock, int status, String body) {
    String code = "";
    String message = body.strip();
    try {
      JsonNode error = json.readTree(body).path("error");
      if (error.path("code").isTextual() && error.path("message").isTextual()) {
        code = error.get("code").asText();
        message = error.get("message").asText();
      }
    } catch (Exception notJson) {
      // The text is the message.
    }
    return BY_CODE.getOrDefault(code, SidecarException::new).make(lock, status, code, message);
  }
}

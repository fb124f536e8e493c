package leasehold

import "fmt"

// The error codes of the API this client tells apart (see docs/sidecar-api.md).
const (
	CodeTimeout         = "timeout"           // not granted within the wait
	CodeLost            = "lost"              // granted, but lost before it could be reported
	CodeInvalidLockName = "invalid_lock_name" // not a DNS label
	CodeInvalidWait     = "invalid_wait"      // the wait is out of range
	CodeInvalidTTL      = "invalid_ttl"       // the TTL is out of range
	CodeUnknownLock     = "unknown_lock"      // no DistributedLock of that name
	CodeForbidden       = "forbidden"         // RBAC or the guard refused the claim
	CodeShuttingDown    = "shutting_down"     // the sidecar is stopping: no new holds
	CodeWrongHandle     = "wrong_handle"      // the handle names no hold of this lock
	CodeAPIServer       = "apiserver"         // the sidecar could not reach the apiserver
)

// Error is an error answer of the sidecar.
type Error struct {
	Lock    string
	Status  int    // the HTTP status
	Code    string // the API's error code, such as CodeTimeout
	Message string // the sidecar's message, naming the problem
}

func (e *Error) Error() string {
	return fmt.Sprintf("lock %s: %s (%d %s)", e.Lock, e.Message, e.Status, e.Code)
}

// Is matches an *Error with the same Code, so errors.Is(err, leasehold.ErrTimeout) works.
func (e *Error) Is(target error) bool {
	t, ok := target.(*Error)
	return ok && t.Code == e.Code && t.Lock == "" && t.Status == 0
}

// Errors to match with errors.Is.
var (
	ErrTimeout         = &Error{Code: CodeTimeout}
	ErrNotGranted      = &Error{Code: CodeLost}
	ErrInvalidLockName = &Error{Code: CodeInvalidLockName}
	ErrUnknownLock     = &Error{Code: CodeUnknownLock}
	ErrForbidden       = &Error{Code: CodeForbidden}
	ErrShuttingDown    = &Error{Code: CodeShuttingDown}
)

package instance

import (
	"errors"
	"fmt"
	"strings"
)

// Code is a stable, machine-readable error code, the same on every transport.
type Code string

// Error codes.
const (
	CodeUnauthenticated Code = "UNAUTHENTICATED"
	CodeForbidden       Code = "FORBIDDEN"
	CodeNotFound        Code = "NOT_FOUND"
	CodeBadUserInput    Code = "BAD_USER_INPUT"
	CodeConflict        Code = "CONFLICT"
	CodeUnprocessable   Code = "UNPROCESSABLE"
	CodeQuotaExceeded   Code = "QUOTA_EXCEEDED"
	CodeConsistency     Code = "CONSISTENCY"
	CodeUnavailable     Code = "UNAVAILABLE"
	CodeInternal        Code = "INTERNAL"
	// CodeCursorExpired: the position is older than the event log keeps; refetch.
	CodeCursorExpired Code = "CURSOR_EXPIRED"
	// CodeRateLimited: the principal sent more requests than its rate allows; retry later.
	CodeRateLimited Code = "RATE_LIMITED"
)

// Error is a failure of a whole operation (not of one input field), with a code and a
// message safe to show to the caller. Err, if set, is internal detail for logs only.
type Error struct {
	Code    Code
	Message string
	Err     error
}

func (e *Error) Error() string {
	if e.Err != nil {
		return fmt.Sprintf("%s: %s: %v", e.Code, e.Message, e.Err)
	}
	return fmt.Sprintf("%s: %s", e.Code, e.Message)
}

func (e *Error) Unwrap() error { return e.Err }

// Errorf returns an *Error with a formatted message.
func Errorf(code Code, format string, args ...any) *Error {
	return &Error{Code: code, Message: fmt.Sprintf(format, args...)}
}

// CodeOf returns the code of err: its *Error's code, or INTERNAL for anything else.
func CodeOf(err error) Code {
	var e *Error
	if errors.As(err, &e) {
		return e.Code
	}
	return CodeInternal
}

// ErrNotFound is returned by stores when a record does not exist.
var ErrNotFound = errors.New("not found")

// ErrStoreUnavailable is wrapped by a store error that passes (Redis loading its data, a
// replica not taking writes yet, a failover): the caller is told to retry.
var ErrStoreUnavailable = errors.New("the store is unavailable for now")

// FieldError is a validation or business-rule failure of one input field.
type FieldError struct {
	// Field is the path to the input field, e.g. ["input", "networking", "securityGroupIds", "1"].
	Field   []string
	Code    Code
	Message string
}

// Invalid is the error of an operation refused for its input: every problem found, at once.
type Invalid struct {
	Problems []FieldError
}

func (e *Invalid) Error() string {
	msgs := make([]string, len(e.Problems))
	for i, p := range e.Problems {
		msgs[i] = fmt.Sprintf("%s %s: %s", strings.Join(p.Field, "."), p.Code, p.Message)
	}
	return "invalid input: " + strings.Join(msgs, "; ")
}

// problems collects field errors under a common path prefix.
type problems struct {
	list []FieldError
}

func (p *problems) add(code Code, field []string, format string, args ...any) {
	p.list = append(p.list, FieldError{Field: field, Code: code, Message: fmt.Sprintf(format, args...)})
}

func (p *problems) any() bool { return len(p.list) > 0 }

func (p *problems) err() error {
	if len(p.list) == 0 {
		return nil
	}
	return &Invalid{Problems: p.list}
}

// path builds a field path below "input".
func path(elems ...string) []string { return append([]string{"input"}, elems...) }

// Package setting is how a package's Validate names the setting at fault,
// so each binary can report the variable that feeds it (LABKEEP_…,
// GUARDIAN_…) without the package knowing how it is configured.
package setting

import (
	"errors"
	"fmt"
	"time"
)

// Error is one invalid setting: Field is the Go field name in the
// package's config struct.
type Error struct {
	Field string
	Err   error
}

func (e *Error) Error() string { return e.Field + ": " + e.Err.Error() }
func (e *Error) Unwrap() error { return e.Err }

// Invalid returns an *Error for field with a formatted reason.
func Invalid(field, format string, args ...any) error {
	return &Error{Field: field, Err: fmt.Errorf(format, args...)}
}

// Rename rewrites every *Error in err (a single error or an errors.Join)
// with the name the binary knows the field by: name(field). Fields name
// does not know keep their Go name. Other errors pass through unchanged.
func Rename(err error, name func(field string) string) error {
	if err == nil {
		return nil
	}
	var errs []error
	if j, ok := err.(interface{ Unwrap() []error }); ok {
		errs = j.Unwrap()
	} else {
		errs = []error{err}
	}
	out := make([]error, 0, len(errs))
	for _, e := range errs {
		var se *Error
		if errors.As(e, &se) {
			if n := name(se.Field); n != "" {
				e = &Error{Field: n, Err: se.Err}
			}
		}
		out = append(out, e)
	}
	return errors.Join(out...)
}

// Positive is an *Error for field unless d > 0.
func Positive(field string, d time.Duration) error {
	if d > 0 {
		return nil
	}
	return Invalid(field, "must be positive, got %s", d)
}

// AtLeast is an *Error for field unless n >= min.
func AtLeast[N int | int32 | float32](field string, n, min N) error {
	if n >= min {
		return nil
	}
	return Invalid(field, "must be at least %v, got %v", min, n)
}

// Required is an *Error for field if s is empty.
func Required(field, s string) error {
	if s != "" {
		return nil
	}
	return Invalid(field, "is required")
}

package setting

import (
	"errors"
	"testing"
	"time"
)

// A package names its Go field; the binary's Rename turns every field it
// knows into its variable and leaves other errors alone.
func TestRename(t *testing.T) {
	other := errors.New("database unreachable")
	err := errors.Join(Positive("Wait", 0), AtLeast("Workers", 0, 1), Required("Image", ""), other, Positive("Fine", time.Second))
	got := Rename(err, func(f string) string {
		return map[string]string{"Wait": "X_WAIT", "Workers": "X_WORKERS"}[f]
	}).Error()
	want := "X_WAIT: must be positive, got 0s\nX_WORKERS: must be at least 1, got 0\nImage: is required\ndatabase unreachable"
	if got != want {
		t.Errorf("Rename =\n%s\nwant\n%s", got, want)
	}
	if Rename(nil, nil) != nil {
		t.Error("Rename(nil) is not nil")
	}
	var se *Error
	if !errors.As(Rename(Positive("Wait", -1), func(string) string { return "X_WAIT" }), &se) || se.Field != "X_WAIT" {
		t.Errorf("a single renamed error is not an *Error naming X_WAIT: %+v", se)
	}
}

package main

import (
	"io"
	"log/slog"
	"os"
	"strings"
	"testing"
)

// An invalid setting stops the server at start with the variable's name.
func TestRunFailsNamingTheVariable(t *testing.T) {
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	t.Setenv("LABKEEP_ENV", "")
	os.Unsetenv("LABKEEP_ENV")
	if err := run(log); err == nil || !strings.Contains(err.Error(), "LABKEEP_ENV") {
		t.Errorf("run without LABKEEP_ENV = %v", err)
	}
	t.Setenv("LABKEEP_ENV", "dev")
	t.Setenv("LABKEEP_DATABASE_URL", "postgres://nowhere/x")
	t.Setenv("LABKEEP_JWT_SECRET", strings.Repeat("x", 32))
	t.Setenv("LABKEEP_SCHEDULER_TOKEN", "")
	os.Unsetenv("LABKEEP_SCHEDULER_TOKEN")
	if err := run(log); err == nil || !strings.Contains(err.Error(), "LABKEEP_SCHEDULER_TOKEN") {
		t.Errorf("run without LABKEEP_SCHEDULER_TOKEN = %v", err)
	}
	t.Setenv("LABKEEP_SCHEDULER_TOKEN", strings.Repeat("t", 32))
	t.Setenv("LABKEEP_SESSION_MAX_LIFETIME", "10m")
	if err := run(log); err == nil || !strings.Contains(err.Error(), "LABKEEP_SESSION_MAX_LIFETIME") {
		t.Errorf("run with max lifetime below lifetime = %v", err)
	}
}

package reap

import (
	"strings"
	"testing"
	"time"
)

// Each setting of the run record and refused open retentions and the ghost
// confirmation is refused with a message naming it; the defaults (with an
// Env) are valid, and so is the shortest refused open retention.
func TestConfigValidate(t *testing.T) {
	valid := func() Config { c := DefaultConfig(); c.Env = "prod"; return c }
	if err := valid().Validate(); err != nil {
		t.Fatalf("defaults: %v", err)
	}
	shortest := valid()
	shortest.RefusedRetention = MinRefusedRetention
	if err := shortest.Validate(); err != nil {
		t.Fatalf("RefusedRetention = MinRefusedRetention: %v", err)
	}
	tests := []struct {
		name   string
		change func(*Config)
		want   string
	}{
		{"retention below a day", func(c *Config) { c.Retention = time.Hour }, "Retention: 1h0m0s is below 24h0m0s"},
		{"no retention batch", func(c *Config) { c.RetentionBatch = 0 }, "RetentionBatch:"},
		{"refused opens kept less than an hour", func(c *Config) { c.RefusedRetention = 59 * time.Minute },
			"RefusedRetention: 59m0s is below 1h0m0s: the open rate counts a student's recent refused opens"},
		{"refused opens not kept at all", func(c *Config) { c.RefusedRetention = 0 }, "RefusedRetention: 0s is below 1h0m0s"},
		{"zero absence confirmation", func(c *Config) { c.AbsentConfirm = 0 }, "AbsentConfirm: must be positive"},
		{"negative down grace", func(c *Config) { c.DownGrace = -time.Second }, "DownGrace: must be positive"},
		{"homes kept less than a week", func(c *Config) { c.HomeRetention = 6 * 24 * time.Hour }, "HomeRetention: 144h0m0s is below 168h0m0s"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c := valid()
			tc.change(&c)
			err := c.Validate()
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Validate() = %v, want it to say %q", err, tc.want)
			}
		})
	}
}

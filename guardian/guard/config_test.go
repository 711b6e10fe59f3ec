package guard

import (
	"testing"
	"time"
)

func TestConfigValidate(t *testing.T) {
	tests := []struct {
		name    string
		mutate  func(*Config)
		wantErr bool
	}{
		{"defaults", func(*Config) {}, false},
		{"kill fraction above max", func(c *Config) { c.KillFraction = 0.99 }, true},
		{"zero alert fraction", func(c *Config) { c.AlertFraction = 0 }, true},
		{"zero pids max", func(c *Config) { c.PidsMax = 0 }, true},
		{"zero probe interval", func(c *Config) { c.ProbeEvery = 0 }, true},
		{"SSH port out of range", func(c *Config) { c.SSHPort = 70000 }, true},
		{"alert fraction equal to kill fraction", func(c *Config) { c.AlertFraction, c.KillFraction = 0.96, 0.96 }, true},
		{"alert fraction above kill fraction", func(c *Config) { c.AlertFraction, c.KillFraction = 0.97, 0.95 }, true},
		{"alert fraction just below kill fraction", func(c *Config) { c.AlertFraction, c.KillFraction = 0.96, 0.97 }, false},
		{"zero hang alert step", func(c *Config) { c.Hang.AlertAfter = 0 }, true},
		{"hang alert at the kill-one step", func(c *Config) { c.Hang.AlertAfter = c.Hang.KillOne }, true},
		{"hang kill three before kill one", func(c *Config) { c.Hang.KillThree = c.Hang.KillOne - time.Second }, true},
		{"hang kill all equal to kill three", func(c *Config) { c.Hang.KillAll = c.Hang.KillThree }, true},
		{"hang steps one second apart", func(c *Config) {
			c.Hang.AlertAfter, c.Hang.KillOne, c.Hang.KillThree, c.Hang.KillAll = time.Second, 2*time.Second, 3*time.Second, 4*time.Second
		}, false},
		{"zero hang recovery", func(c *Config) { c.Hang.Recovery = 0 }, true},
		{"negative hang recovery", func(c *Config) { c.Hang.Recovery = -time.Second }, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := testConfig()
			tt.mutate(&c)
			if err := c.Validate(); (err != nil) != tt.wantErr {
				t.Errorf("Validate() = %v; want error %v", err, tt.wantErr)
			}
		})
	}
}

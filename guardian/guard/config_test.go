package guard

import "testing"

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

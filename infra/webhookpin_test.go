package infra

import (
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestWebhookPin(t *testing.T) {
	tests := []struct {
		name, url string
		want      string
		wantErr   bool
	}{
		{"an IPv4 address and port", "http://10.216.0.1:34567/guardianAlert", "10.216.0.1:34567", false},
		{"https without a port: 443", "https://203.0.113.7/guardianAlert", "203.0.113.7:443", false},
		{"http without a port: 80", "http://203.0.113.7/guardianAlert", "203.0.113.7:80", false},
		{"an IPv6 address", "http://[fd00::1]:8080/guardianAlert", "[fd00::1]:8080", false},
		{"a host name: no rule to pin", "https://labkeep.example/guardianAlert", "", false},
		{"unset: no rule", "", "", false},
		{"an address without port or known scheme", "ftp://10.0.0.1/x", "", true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := WebhookPin(tt.url)
			if (err != nil) != tt.wantErr {
				t.Fatalf("WebhookPin(%q) error = %v, want error %v", tt.url, err, tt.wantErr)
			}
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("WebhookPin(%q) (-want +got):\n%s", tt.url, diff)
			}
		})
	}
}

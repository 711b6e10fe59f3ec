package main

import "testing"

func TestBrowserURL(t *testing.T) {
	tests := []struct{ name, in, want string }{
		{"every address (:8080)", "http://[::]:8080", "http://localhost:8080"},
		{"every IPv4 address", "http://0.0.0.0:8080", "http://localhost:8080"},
		{"a chosen address stays", "http://127.0.0.1:9000", "http://127.0.0.1:9000"},
		{"a chosen IPv6 address stays", "http://[::1]:9000", "http://[::1]:9000"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := browserURL(tc.in); got != tc.want {
				t.Errorf("browserURL(%q) = %q, want %q", tc.in, got, tc.want)
			}
		})
	}
}
